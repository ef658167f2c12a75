"""What `Selections` holds of each identity's selections: re-reads only what changed, and one
namespace's churn does not evict another's."""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence

from provider.core.errors import BridgeError, NotFound
from provider.core.model import SecretValue
from provider.core.selection import Listed, Selections

READS: list[str] = []


async def read(secrets: Sequence[Listed]) -> Mapping[Hashable, SecretValue | BridgeError]:
    READS.extend(str(s.handle) for s in secrets)
    return {
        s.handle: NotFound("gone") if s.name == "gone" else SecretValue(s.marker.encode())
        for s in secrets
    }


async def test_only_changed_secrets_are_read_again_and_deleted_ones_left_out() -> None:
    held = Selections()
    READS.clear()
    first = [Listed("a", "1", "p/a"), Listed("b", "1", "p/b"), Listed("gone", "1", "p/gone")]
    got = await held.refresh("vault|x|ns/sa", "sel", first, read)
    assert not isinstance(got, BridgeError)
    assert [(v.suffix, v.content) for v in got] == [("a", b"1"), ("b", b"1")]
    READS.clear()
    second = [Listed("a", "1", "p/a"), Listed("b", "2", "p/b")]
    got = await held.refresh("vault|x|ns/sa", "sel", second, read)
    assert READS == ["p/b"] and not isinstance(got, BridgeError)
    assert [(v.suffix, v.content) for v in got] == [("a", b"1"), ("b", b"2")]
    assert (held.read, held.reused) == (4, 1)


async def test_one_namespace_cannot_evict_another() -> None:
    held = Selections(max_entries=4)
    one = [Listed("a", "1", "p/a")]
    await held.refresh("vault|x|quiet/sa", "sel", one, read)
    for i in range(20):  # another namespace churns through selections
        await held.refresh("vault|x|noisy/sa", f"sel{i}", one, read)
    READS.clear()
    await held.refresh("vault|x|quiet/sa", "sel", one, read)
    assert READS == []  # still held: nothing read again
