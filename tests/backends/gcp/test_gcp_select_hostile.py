"""Selectors of the gcp store against hostile input: too many secrets, a store that pages for
ever, names that are no secret names, colliding files, bad selector keys."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from backends.gcp.selecting import max_pages
from provider.core.errors import InvalidParameters
from provider.mount.planning import parse_plan
from tests.backends.gcp.conftest import Stack
from tests.backends.gcp.test_gcp_select import (
    KSA,
    PROJECT,
    Provider,
    calls,
    mount,
    providing,
    select,
)


@pytest.fixture
def provider(stack: Stack, tmp_path: Path) -> Provider:
    return providing(stack, tmp_path)


@pytest.fixture
async def stub(provider: Provider) -> AsyncIterator[Any]:
    async with provider() as served:
        yield served.stub


async def refused(stub: Any, params: dict[str, str]) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await mount(stub, params)
    return err.value


async def test_more_secrets_than_max_objects_are_refused_after_one_page(
    stack: Stack, provider: Provider
) -> None:
    for i in range(5):
        stack.google.add_secret(f"{PROJECT}/secrets/many-{i}", str(i), KSA)
    async with provider(max_objects=3) as served:
        chosen = select({"project": "proj", "namePrefix": "many-", "directory": "m"})
        err = await refused(served.stub, chosen)
    assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "matches 5 secrets, over this provider's limit of 3" in (err.details() or "")
    assert calls(stack.google) == {"ListSecrets": 1}  # no version listed, nothing read


async def test_a_selector_matching_thousands_is_refused_in_bounded_time(
    stack: Stack, stub: Any
) -> None:
    for i in range(3000):
        stack.google.add_secret(f"{PROJECT}/secrets/bulk-{i:05}", "x", KSA)
    started = time.monotonic()
    chosen = select({"project": "proj", "namePrefix": "bulk-", "directory": "b"})
    err = await refused(stub, chosen)
    assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "more than 100 secrets" in (err.details() or "")
    assert calls(stack.google) == {"ListSecrets": 2}  # pages of 100: refused at the 101st
    assert time.monotonic() - started < 5


async def test_a_store_that_pages_forever_is_refused(stack: Stack, stub: Any) -> None:
    stack.google.endless_pages = True
    err = await refused(stub, select({"project": "proj", "namePrefix": "x-", "directory": "x"}))
    assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    pages = max_pages(100)
    assert f"did not end after {pages} pages of ListSecrets (0 secrets listed" in (
        err.details() or ""
    )
    assert calls(stack.google) == {"ListSecrets": pages}


async def test_a_listed_name_that_is_no_secret_name_is_refused(stack: Stack, stub: Any) -> None:
    # Google never lists such a name; a store (or a proxy) that does is not trusted with paths.
    stack.google.add_secret(f"{PROJECT}/secrets/t-../../etc/passwd", "x", KSA)
    err = await refused(stub, select({"project": "proj", "namePrefix": "t-", "directory": "t"}))
    assert err.code() == grpc.StatusCode.UNAVAILABLE
    assert "which is no name of it; the listing is refused" in (err.details() or "")
    assert stack.google.reads == []


async def test_colliding_files_are_refused_with_both_names(stack: Stack, stub: Any) -> None:
    stack.google.add_secret(f"{PROJECT}/secrets/c-a", "1", KSA)
    listed = f"- {{resourceName: {PROJECT}/secrets/c-a/versions/latest, path: a}}"
    err = await refused(stub, select({"project": "proj", "namePrefix": "c-"}, secrets=listed))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "two files would be written to 'a'" in (err.details() or "")


async def test_a_transient_listing_failure_is_retried(stack: Stack, stub: Any) -> None:
    stack.google.add_secret(f"{PROJECT}/secrets/r-a", "1", KSA)
    stack.google.failures[PROJECT] = [grpc.StatusCode.UNAVAILABLE]
    chosen = select({"project": "proj", "namePrefix": "r-", "directory": "r"})
    assert await mount(stub, chosen) == {"r/a": b"1"}
    assert calls(stack.google) == {
        "ListSecrets": 2,
        "ListSecretVersions": 1,
        "AccessSecretVersion": 1,
    }


BAD_SELECTORS: list[tuple[dict[str, Any], str]] = [
    ({"namePrefix": "a-"}, r"select\[0\]\.project is required"),
    ({"project": "proj"}, r"select\[0\]: give namePrefix, labels or both"),
    ({"project": "p/secrets", "namePrefix": "a"}, r"project: 'p/secrets' is not a project id"),
    ({"project": "proj", "namePrefix": "a/b"}, r"namePrefix: 'a/b' cannot start a secret id"),
    ({"project": "proj", "namePrefix": "x" * 300}, r"namePrefix: 'x{80}' cannot start"),
    (
        {"project": "proj", "namePrefix": "a", "location": "evil.example:443#"},
        r"location: 'evil.example:443#' is not a Secret Manager location",
    ),
    (
        {"project": "proj", "namePrefix": "a", "location": "global"},
        r"location: global secrets have no location",
    ),
    ({"project": "proj", "labels": "team=pay"}, r"select\[0\]\.labels: expected a map"),
    ({"project": "proj", "labels": {}}, r"labels: empty"),
    ({"project": "proj", "labels": {"Team": "pay"}}, r"the key 'Team' is not a label key"),
    ({"project": "proj", "labels": {"t": "Pay Roll"}}, r"the value of 't' is not a label value"),
    (
        {"project": "proj", "labels": {f"k{i}": "v" for i in range(65)}},
        r"65 labels, over Google's 64 per secret",
    ),
    ({"project": "proj", "namePrefix": "a", "tags": {"a": "b"}}, r"select\[0\]\.tags"),
]


@pytest.mark.parametrize(("entry", "message"), BAD_SELECTORS)
def test_bad_selectors_are_refused_naming_the_key(entry: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidParameters, match=message):
        parse_plan(select(entry), options_for=None, enable_test_stores=False)


def test_a_selector_parses_without_secrets_and_names_its_filter() -> None:
    entry = {
        "project": "proj",
        "namePrefix": "app-",
        "labels": {"team": "pay", "env": ""},
        "directory": "app",
    }
    plan = parse_plan(select(entry), options_for=None, enable_test_stores=False)
    [spec] = plan.objects
    assert spec.ref.describe() == "projects/proj/secrets/app-* labels env=,team=pay"
    assert spec.ref.list_filter() == "name:app- AND labels.env:* AND labels.team=pay"
    assert spec.transforms.optional  # a selector that matches nothing is no error
