"""`hashed_once`: a ref's hash is the generated one, computed once; equality is unchanged."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from backends.aws.refs import AwsRef, Target
from backends.vault.objects import VaultRef
from provider.core.model import hashed_once


class CountedPart:
    """A field value that counts how often it is hashed."""

    def __init__(self) -> None:
        self.hashes = 0

    def __hash__(self) -> int:
        self.hashes += 1
        return 7


@hashed_once
@dataclass(frozen=True)
class Ref:
    part: CountedPart
    name: str = ""


def test_the_hash_is_computed_once_per_object() -> None:
    part = CountedPart()
    ref = Ref(part, "a")
    first = hash(ref)
    assert [hash(ref) for _ in range(5)] == [first] * 5
    assert part.hashes == 1
    assert hash(Ref(part, "a")) == first  # an equal object: its own first hash, the same number
    assert part.hashes == 2


def test_the_hash_is_the_generated_hash_of_the_fields() -> None:
    @dataclass(frozen=True)
    class Plain:
        path: str
        method: str = "GET"
        query: tuple[tuple[str, str], ...] = ()
        body: str = ""

    for args in [("secret/data/a",), ("secret/data/a", "POST", (("q", "1"),), '{"a":1}')]:
        assert hash(VaultRef(*args)) == hash(Plain(*args))


def test_equal_refs_are_one_key_and_unequal_ones_two() -> None:
    a, b = VaultRef("secret/data/a"), VaultRef("secret/data/a")
    hash(a)  # one of the two has its hash cached, the other not yet
    assert {a: 1, b: 2} == {a: 2}
    assert len({VaultRef("x"), VaultRef("x", "POST")}) == 2
    target = Target("name")
    assert AwsRef("ssm", target) == AwsRef("ssm", Target("name"))
    assert len({AwsRef("ssm", target), AwsRef("secretsmanager", target)}) == 2


def test_the_cached_hash_is_not_a_field() -> None:
    ref = VaultRef("secret/data/a")
    hash(ref)
    assert repr(ref) == "VaultRef(path='secret/data/a', method='GET', query=(), body='')"
    assert dataclasses.replace(ref, path="secret/data/b") == VaultRef("secret/data/b")
    assert dataclasses.astuple(ref) == ("secret/data/a", "GET", (), "")
    assert ref == VaultRef("secret/data/a")  # one hashed, one not: still equal
