"""The mounter keeps parsed requests by their raw fields (provider/mount/mounting.py): exactly,
bounded, and never a request that does not parse or a class that is refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from devkit.testing import Harness, attributes
from provider.core.errors import InvalidParameters
from provider.core.memo import Memo
from provider.mount.mounting import MAX_REQUEST_BYTES, MAX_REQUESTS, Mounter, Request
from provider.mount.request import TOKENS

OBJECTS = [{"objectName": "api-key"}]
VOLUME = "/var/lib/kubelet/pods/x/volumes/kubernetes.io~csi/secrets/mount"


class Requests:
    """The mounter's requests as this test reads them: `prepare` and how many are kept."""

    def __init__(
        self,
        mounter: Mounter,
        *,
        max_entries: int = MAX_REQUESTS,
        max_bytes: int = MAX_REQUEST_BYTES,
    ) -> None:
        self._mounter = mounter
        mounter._requests = Memo(max_entries, max_bytes)

    async def prepare(self, *raw: str) -> Request:
        attributes, secrets, permission, target_path = raw
        return await self._mounter.prepare((attributes, secrets, permission, target_path))

    def __len__(self) -> int:
        return self._mounter.requests_kept()


def with_token(token: str) -> str:
    entry = {"vault": {"token": token, "expirationTimestamp": "2030-01-01T00:00:00Z"}}
    return attributes(OBJECTS, **{TOKENS: json.dumps(entry)})


async def test_the_same_fields_give_the_same_parsed_request_and_plan(tmp_path: Path) -> None:
    harness = Harness(tmp_path)
    requests = Requests(harness.mounter)
    first = await requests.prepare(attributes(OBJECTS), "null", "420", VOLUME)
    # New string objects with the same text: what the driver's next poll brings.
    again = await requests.prepare("".join(attributes(OBJECTS)), "nul" + "l", "42" + "0", VOLUME)
    assert again is first
    assert first.plan is harness.mounter.plan(first.input.params)
    assert first.fields == {
        "namespace": "default",
        "pod": "app-0",
        "serviceaccount": "app",
        "class": "spc",
    }
    assert first.backend == "fake"
    assert len(requests) == 1


async def test_a_request_differing_by_one_byte_is_parsed_for_itself(tmp_path: Path) -> None:
    """Two pods' tokens (or volumes, or permissions) never share a parsed request."""
    requests = Requests(Harness(tmp_path).mounter)
    one = await requests.prepare(with_token("token-a"), "null", "420", VOLUME)
    other = await requests.prepare(with_token("token-b"), "null", "420", VOLUME)
    assert one.input.pod.tokens["vault"].token == "token-a"
    assert other.input.pod.tokens["vault"].token == "token-b"
    narrower = await requests.prepare(with_token("token-a"), "null", "384", VOLUME)
    assert narrower.input.permission == 384
    assert await requests.prepare(with_token("token-a"), "null", "420", VOLUME + "2") is not one
    secret = await requests.prepare(with_token("token-a"), '{"clientSecret": "s"}', "420", VOLUME)
    assert secret.input.pod.node_publish_secret == {"clientSecret": "s"}
    assert one.input.pod.node_publish_secret == {}
    assert len(requests) == 5


async def test_a_request_that_does_not_parse_is_refused_each_time_and_not_kept(
    tmp_path: Path,
) -> None:
    requests = Requests(Harness(tmp_path).mounter)
    for _ in range(2):
        with pytest.raises(InvalidParameters, match="attributes: not valid JSON"):
            await requests.prepare('{"backend": ', "null", "420", VOLUME)
        with pytest.raises(InvalidParameters, match="permission"):
            await requests.prepare(attributes(OBJECTS), "null", "4200", VOLUME)
    assert len(requests) == 0


async def test_a_refused_class_is_not_kept_and_its_mount_raises_its_problems(
    tmp_path: Path,
) -> None:
    harness = Harness(tmp_path)
    requests = Requests(harness.mounter)
    raw = attributes([{"objectName": "a"}, {"objectName": "a"}])  # a duplicate objectName
    prepared = await requests.prepare(raw, "null", "420", VOLUME)
    assert prepared.plan is None
    assert prepared.fields["class"] == "spc"  # the failure's log line still names the pod
    assert len(requests) == 0
    with pytest.raises(InvalidParameters, match="objectName"):
        harness.mounter.plan(prepared.input.params)


async def test_entries_are_bounded_by_count_and_bytes(tmp_path: Path) -> None:
    mounter = Harness(tmp_path).mounter
    by_count = Requests(mounter, max_entries=2)
    for i in range(5):
        await by_count.prepare(with_token(f"token-{i}"), "null", "420", VOLUME)
    assert len(by_count) == 2
    size = len(with_token("token-0")) + len("null") + len("420") + len(VOLUME)
    by_bytes = Requests(mounter, max_bytes=3 * size)
    for i in range(5):
        await by_bytes.prepare(with_token(f"token-{i}"), "null", "420", VOLUME)
    assert len(by_bytes) == 3


async def test_a_huge_request_is_parsed_but_never_kept(tmp_path: Path) -> None:
    """A class of megabytes of unused parameters costs its own parse, not the memo's room."""
    requests = Requests(Harness(tmp_path).mounter)
    huge = attributes(OBJECTS, padding="x" * (2 * 1024 * 1024))
    for _ in range(2):
        prepared = await requests.prepare(huge, "null", "420", VOLUME)
        assert prepared.plan is not None
    assert len(requests) == 0
