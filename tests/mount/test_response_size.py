"""Issue 33: --max-response-bytes counts the answer as the driver receives it.

`provider.core.files.wire_size` computes the serialized MountResponse's size from the dataclasses
(the mount layer never imports the stubs); here it is checked against the generated stubs'
`SerializeToString` for many shapes, and the mount's refusal is checked at its edge.
(tests/edge/test_response_size.py measures the answer on a real socket at the driver's limit.)
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from devkit.leaks import leaks_in_text
from devkit.testing import Harness
from protos import provider_pb2
from provider.core.errors import LimitExceeded
from provider.core.files import File, ObjectVersion, wire_size

INT32 = st.integers(min_value=-(2**31), max_value=2**31 - 1)


def serialized(files: list[File], versions: list[ObjectVersion]) -> int:
    message = provider_pb2.MountResponse(
        object_version=[provider_pb2.ObjectVersion(id=v.id, version=v.version) for v in versions],
        files=[provider_pb2.File(path=f.path, mode=f.mode, contents=f.contents) for f in files],
    )
    return len(message.SerializeToString())


#: Lengths on both sides of every varint width a 4 MiB answer can reach (7, 14, 21, 28 bits).
EDGES = [0, 1, 2, 125, 126, 127, 128, 129, 16_381, 16_383, 16_384, 2_097_151, 2_097_152]
MODES = [0, 1, 127, 128, 0o400, 0o644, 0o777, 16_383, 16_384, 2**31 - 1, -1, -(2**31)]


@pytest.mark.parametrize("length", EDGES)
def test_contents_lengths(length: int) -> None:
    files = [File("a", 0o644, b"x" * length)]
    versions = [ObjectVersion("a", "v" * 32)]
    assert wire_size(files, versions) == serialized(files, versions)


@pytest.mark.parametrize("mode", MODES)
def test_modes(mode: int) -> None:
    files = [File("f", mode, b"c")]
    assert wire_size(files, []) == serialized(files, [])


@pytest.mark.parametrize("length", [n for n in EDGES if n <= 16_384])
def test_path_and_version_lengths(length: int) -> None:
    # Paths of any length (the driver's rules are not the formula's business), ids and
    # versions around the varint edges, empty strings (left out by proto3) included.
    files = [File("p" * length, 0o600, b"")]
    versions = [ObjectVersion("i" * length, "v" * length), ObjectVersion("", "")]
    assert wire_size(files, versions) == serialized(files, versions)


@pytest.mark.parametrize("body", range(120, 136))
def test_message_lengths_around_one_byte(body: int) -> None:
    # The File and ObjectVersion messages themselves cross 127/128 bytes: their own length
    # prefix grows from one byte to two.
    files = [File("ab", 0o644, b"y" * (body - 7))]
    versions = [ObjectVersion("ab", "z" * (body - 6))]
    assert wire_size(files, versions) == serialized(files, versions)


def test_unicode_paths_count_their_utf8_bytes() -> None:
    files = [File("sécret/ключ/秘密/🔑", 0o644, b"v"), File("ü" * 64, 0o400, b"w" * 128)]
    versions = [ObjectVersion("sécret/ключ/秘密/🔑", "é" * 40), ObjectVersion("ü" * 64, "1")]
    assert wire_size(files, versions) == serialized(files, versions)


def test_nothing_is_nothing() -> None:
    assert wire_size([], []) == serialized([], []) == 0


def test_a_big_answer() -> None:
    files = [File(f"dir/o{i}", 0o644, b"q" * (4096 + i)) for i in range(1000)]
    versions = [ObjectVersion(f"dir/o{i}", f"{i:032x}") for i in range(1000)]
    assert wire_size(files, versions) == serialized(files, versions)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.builds(File, st.text(max_size=300), INT32, st.binary(max_size=300)),
        max_size=6,
    ),
    st.lists(st.builds(ObjectVersion, st.text(max_size=200), st.text(max_size=200)), max_size=6),
)
def test_any_shape(files: list[File], versions: list[ObjectVersion]) -> None:
    assert wire_size(files, versions) == serialized(files, versions)


def harness(tmp_path: Path, limit: int, secrets: dict[str, str]) -> Harness:
    tmp_path.mkdir()
    made = Harness(tmp_path, max_response_bytes=limit, max_objects=1000)
    made.write({"secrets": secrets})
    return made


@pytest.mark.parametrize("count", [1, 3, 120])
async def test_the_mount_is_refused_one_byte_over(tmp_path: Path, count: int) -> None:
    # 200 bytes per value: the old count (paths + contents) was far under the limit used here.
    secrets = {f"s{i}": "s3cr3t" + "x" * 194 for i in range(count)}
    objects = [{"objectName": f"o{i}", "secretPath": f"s{i}"} for i in range(count)]
    big = harness(tmp_path / "big", 1 << 20, secrets)
    result = await big.mounter.mount(big.request(objects))
    size = wire_size(result.files, result.versions)
    assert size == serialized(list(result.files), list(result.versions))
    assert size > sum(len(f.path) + len(f.contents) for f in result.files) + 50 * count

    at = harness(tmp_path / "at", size, secrets)
    assert len((await at.mounter.mount(at.request(objects))).files) == count

    over = harness(tmp_path / "over", size - 1, secrets)
    with pytest.raises(LimitExceeded) as info:
        await over.mounter.mount(over.request(objects))
    message = str(info.value)
    contents = 200 * count
    noun = "object" if count == 1 else "objects"
    files = "file" if count == 1 else "files"
    assert message.startswith(
        f"the answer would be {size} bytes as sent to the driver ({count} {noun}, "
        f"{count} {files}: {contents} bytes of contents, {size - contents} of paths, "
        f"modes, versions and framing), over the provider's limit of {size - 1} "
        "(--max-response-bytes)"
    )
    assert "--max-call-recv-msg-size (default 4194304)" in message
    assert "\n" not in message
    assert not leaks_in_text(message)
    assert info.value.code.name == "RESOURCE_EXHAUSTED"


async def test_templates_are_counted_and_named(tmp_path: Path) -> None:
    secrets = {"s": json.dumps({"user": "app", "password": "s3cr3t"})}
    objects = [{"objectName": "o", "secretPath": "s", "file": False}]
    templates = "- path: t\n  template: 'user=${o}'\n"
    big = harness(tmp_path / "big", 1 << 20, secrets)
    result = await big.mounter.mount(big.request(objects, templates=templates))
    size = wire_size(result.files, result.versions)
    over = harness(tmp_path / "over", size - 1, secrets)
    with pytest.raises(LimitExceeded) as info:
        await over.mounter.mount(over.request(objects, templates=templates))
    assert f"would be {size} bytes as sent to the driver (1 object and 1 template, 1 file:" in (
        str(info.value)
    )
    assert not leaks_in_text(str(info.value))
