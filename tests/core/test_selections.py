"""`Selections`: every poll reads every listed secret as the pod (a listing proves permission to
list, never to read: issue 40 item 4), deleted ones are left out, and nothing is held at rest."""

from __future__ import annotations

import gc
import tracemalloc
from collections.abc import Hashable, Mapping, Sequence

from provider.core.errors import BridgeError, NotFound, PermissionDenied
from provider.core.model import SecretValue
from provider.core.selection import Listed, Selections

READS: list[str] = []
DENIED: set[str] = set()


async def read(secrets: Sequence[Listed]) -> Mapping[Hashable, SecretValue | BridgeError]:
    READS.extend(str(s.handle) for s in secrets)
    out: dict[Hashable, SecretValue | BridgeError] = {}
    for s in secrets:
        if s.name == "gone":
            out[s.handle] = NotFound("gone")
        elif s.name in DENIED:
            out[s.handle] = PermissionDenied("denied")
        else:
            out[s.handle] = SecretValue(s.marker.encode())
    return out


async def test_every_listed_secret_is_read_at_every_poll_and_deleted_ones_left_out() -> None:
    held = Selections()
    READS.clear()
    first = [Listed("a", "1", "p/a"), Listed("b", "1", "p/b"), Listed("gone", "1", "p/gone")]
    got = await held.refresh("vault|x|ns/sa", "sel", first, read)
    assert not isinstance(got, BridgeError)
    assert [(v.suffix, v.content, v.version) for v in got] == [("a", b"1", "1"), ("b", b"1", "1")]
    READS.clear()
    second = [Listed("a", "1", "p/a"), Listed("b", "2", "p/b")]
    got = await held.refresh("vault|x|ns/sa", "sel", second, read)
    # "a"'s marker did not move: it is read again all the same.
    assert READS == ["p/a", "p/b"] and not isinstance(got, BridgeError)
    assert [(v.suffix, v.content) for v in got] == [("a", b"1"), ("b", b"2")]
    assert held.read == 5


async def test_a_revoked_read_fails_the_selection_though_its_marker_did_not_move() -> None:
    held = Selections()
    listed = [Listed("a", "1", "p/a"), Listed("one", "1", "p/one")]
    DENIED.clear()
    assert not isinstance(await held.refresh("vault|x|ns/sa", "sel", listed, read), BridgeError)
    DENIED.add("one")  # `read` revoked, `list` kept: the same listing, the same markers
    try:
        got = await held.refresh("vault|x|ns/sa", "sel", listed, read)
    finally:
        DENIED.clear()
    assert isinstance(got, PermissionDenied)


async def test_nothing_is_held_at_rest_after_many_polls() -> None:
    held = Selections()
    listed = [Listed(f"s{i}", "1", f"p/s{i}") for i in range(50)]

    async def big(secrets: Sequence[Listed]) -> Mapping[Hashable, SecretValue | BridgeError]:
        return {s.handle: SecretValue(b"x" * 100_000) for s in secrets}

    tracemalloc.start()
    try:
        gc.collect()
        before = tracemalloc.get_traced_memory()[0]
        for i in range(20):
            got = await held.refresh(f"vault|x|ns/sa{i}", "sel", listed, big)
            assert not isinstance(got, BridgeError) and len(got) == 50
            del got
        gc.collect()
        after = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    # 20 polls read 100 MB of values; what stays is a counter (a held value would be 100 kB).
    assert after - before < 64 * 1024
