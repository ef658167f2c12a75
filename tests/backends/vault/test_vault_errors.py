"""Failures on the wire become our error types, with useful messages, bounded retries, and no
token in any text; no aiohttp (or other library) exception escapes identify/fetch."""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import AsyncIterator, Hashable, Mapping
from types import FrameType

import aiohttp
import pytest
from aiohttp import web

from backends.vault.options import Options
from backends.vault.store import VaultBackend, create
from devkit.fakevault import (
    FAKE_TOKEN,
    FakeVault,
    drop,
    json_ok,
    login_ok,
    raw,
    redirect,
    slow,
    status,
)
from devkit.testing import fetch_ctx, make_env, make_pod
from provider.core.calls import watch_failures
from provider.core.errors import (
    BridgeError,
    DeadlineExceeded,
    LimitExceeded,
    NotFound,
    PermissionDenied,
    StoreUnavailable,
)
from provider.core.model import FetchContext, Identity, StorePlan
from tests.backends.vault.conftest import plan_for

POD_JWT = "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJzeXN0ZW06c2VydmljZWFjY291bnQifQ.c2lnbmF0dXJlLXRlc3Q"
LOGIN = ("POST", "auth/kubernetes/login")
READ = ("GET", "secret/data/app")


@pytest.fixture
async def fake() -> AsyncIterator[FakeVault]:
    server = await FakeVault.start()
    yield server
    await server.stop()


@pytest.fixture
async def backend() -> AsyncIterator[VaultBackend]:
    vault = create(make_env("vault", Options(max_connections=8)))
    yield vault
    await vault.close()


def plan_at(fake: FakeVault) -> StorePlan:
    return plan_for(
        "- {objectName: app, secretPath: secret/data/app}", vaultAddress=fake.addr, roleName="r"
    )


async def run(
    backend: VaultBackend, plan: StorePlan, ctx: FetchContext | None = None
) -> tuple[Identity, Mapping[Hashable, object]]:
    identity = await backend.identify(plan, make_pod(tokens={"vault": POD_JWT}))
    refs = [s.ref for s in plan.objects]
    return identity, await backend.fetch(plan, identity, refs, ctx or fetch_ctx(6))


def no_secrets(text: str) -> None:
    assert POD_JWT not in text
    assert FAKE_TOKEN not in text


async def test_request_shape(fake: FakeVault, backend: VaultBackend) -> None:
    fake.on(*LOGIN, login_ok())
    fake.on(*READ, json_ok({"data": {"k": "v"}}))
    plan = plan_for(
        "- {objectName: app, secretPath: secret/data/app}",
        vaultAddress=fake.addr,
        roleName="r",
        vaultNamespace="team",
    )
    await run(backend, plan)
    login_body = next(b for m, p, b in fake.bodies if (m, p) == LOGIN)
    assert login_body == b'{"role": "r", "jwt": "' + POD_JWT.encode() + b'"}'
    login_headers, read_headers = fake.headers
    assert "X-Vault-Token" not in login_headers
    assert login_headers["X-Vault-Namespace"] == read_headers["X-Vault-Namespace"] == "team"
    assert read_headers["X-Vault-Token"] == FAKE_TOKEN


async def test_sealed_vault_at_login_is_retried_then_unavailable(
    fake: FakeVault, backend: VaultBackend
) -> None:
    fake.on(*LOGIN, status(503, errors=["Vault is sealed"]))
    start = time.monotonic()
    with pytest.raises(StoreUnavailable) as info:
        await run(backend, plan_at(fake), fetch_ctx(3))
    assert time.monotonic() - start < 3
    assert fake.calls[LOGIN] > 1
    assert info.value.transient
    assert "sealed" in str(info.value) and "auth/kubernetes" in str(info.value)


async def test_throttling_honours_retry_after(fake: FakeVault, backend: VaultBackend) -> None:
    fake.on(*LOGIN, login_ok())
    fake.on(*READ, status(429, headers={"Retry-After": "0.3"}), json_ok({"data": {"k": "v"}}))
    start = time.monotonic()
    _, results = await run(backend, plan_at(fake))
    assert isinstance(results[plan_at(fake).objects[0].ref], list)
    assert time.monotonic() - start >= 0.3
    assert fake.calls[READ] == 2


async def test_cached_token_refused_once_logs_in_again(
    fake: FakeVault, backend: VaultBackend
) -> None:
    fake.on(*LOGIN, login_ok())
    fake.on(*READ, json_ok({"data": {"k": "v"}}))
    plan = plan_at(fake)
    await run(backend, plan)
    fake.on(*READ, status(403, errors=["permission denied"]), json_ok({"data": {"k": "v2"}}))
    _, results = await run(backend, plan)
    assert isinstance(results[plan.objects[0].ref], list)
    assert fake.calls[LOGIN] == 2


@pytest.mark.parametrize(
    ("handler", "expected", "needle"),
    [
        (status(500, errors=["internal error"]), StoreUnavailable, "HTTP 500"),
        (status(404), NotFound, "secret/data/app"),
        (status(400, errors=["bad args"]), BridgeError, "HTTP 400"),
        (raw(b"<html>proxy</html>"), StoreUnavailable, "does vaultAddress point at Vault"),
        (raw(b"", 204), NotFound, "no data"),
        (json_ok(None), NotFound, "no data"),
        (drop(), StoreUnavailable, "connection to Vault"),
        (raw(b"x" * (5 * 1024 * 1024), content_type="application/json"), LimitExceeded, "bytes"),
        (status(418, errors=[f"teapot {POD_JWT} {FAKE_TOKEN}"]), StoreUnavailable, "HTTP 418"),
    ],
    ids=["500", "404", "400", "html", "204", "null-data", "dropped", "too-big", "echoes-token"],
)
async def test_read_faults_are_per_object_errors(
    fake: FakeVault,
    backend: VaultBackend,
    handler: object,
    expected: type[BridgeError],
    needle: str,
) -> None:
    fake.on(*LOGIN, login_ok())
    fake.on(*READ, handler)  # type: ignore[arg-type]
    plan = plan_at(fake)
    _, results = await run(backend, plan, fetch_ctx(1.5))
    error = results[plan.objects[0].ref]
    assert isinstance(error, expected), error
    assert needle in str(error)
    assert "object 'app'" in str(error)
    no_secrets(str(error))


@pytest.mark.parametrize(
    ("handler", "expected"),
    [
        (status(400, errors=[f"invalid token {POD_JWT}"]), PermissionDenied),
        (status(403, errors=["permission denied"]), PermissionDenied),
        (json_ok(None), StoreUnavailable),
        (raw(b"not json"), StoreUnavailable),
        (drop(), StoreUnavailable),
        (status(404, errors=["namespace not found"]), NotFound),
        (json_ok(None, auth=["not", "a", "map"]), StoreUnavailable),
    ],
    ids=["400", "403", "no-auth", "garbage", "dropped", "404", "auth-not-a-map"],
)
async def test_login_faults_fail_the_whole_call(
    fake: FakeVault, backend: VaultBackend, handler: object, expected: type[BridgeError]
) -> None:
    fake.on(*LOGIN, handler)  # type: ignore[arg-type]
    with pytest.raises(BridgeError) as info:
        await run(backend, plan_at(fake), fetch_ctx(1.5))
    assert isinstance(info.value, expected), info.value
    assert "role 'r'" in str(info.value) and "auth/kubernetes" in str(info.value)
    no_secrets(str(info.value))
    assert fake.calls[READ] == 0


async def test_unreachable_vault(backend: VaultBackend) -> None:
    plan = plan_for(
        "- {objectName: a, secretPath: s/a}", vaultAddress="http://127.0.0.1:9", roleName="r"
    )
    with pytest.raises(StoreUnavailable, match=r"unreachable.*vaultAddress"):
        await run(backend, plan, fetch_ctx(1))


async def test_slow_vault_hits_the_deadline(fake: FakeVault, backend: VaultBackend) -> None:
    fake.on(*LOGIN, login_ok())
    fake.on(*READ, slow(5, json_ok({})))
    start = time.monotonic()
    plan = plan_at(fake)
    _, results = await run(backend, plan, fetch_ctx(1))
    assert time.monotonic() - start < 2
    assert isinstance(results[plan.objects[0].ref], DeadlineExceeded | StoreUnavailable)


async def test_redirect_to_the_active_node_is_followed(
    fake: FakeVault, backend: VaultBackend
) -> None:
    fake.on(*LOGIN, login_ok())
    fake.on(*READ, redirect(f"{fake.addr}/v1/secret/data/active"))
    fake.on("GET", "secret/data/active", json_ok({"data": {"k": "v"}}))
    plan = plan_at(fake)
    _, results = await run(backend, plan)
    assert isinstance(results[plan.objects[0].ref], list)


async def test_short_token_lease_is_renewed_by_login(
    fake: FakeVault, backend: VaultBackend
) -> None:
    # A 1 s lease with the default 20% margin is kept 0.8 s.
    fake.on(*LOGIN, login_ok(lease=1))
    fake.on(*READ, json_ok({"data": {"k": "v"}}))
    plan = plan_at(fake)
    await run(backend, plan)
    await run(backend, plan)
    assert fake.calls[LOGIN] == 1
    await asyncio.sleep(0.9)
    await run(backend, plan)
    assert fake.calls[LOGIN] == 2


async def test_hung_request_is_retried_within_the_retry_budget(fake: FakeVault) -> None:
    vault = create(make_env("vault", Options(request_timeout=0.3)))
    try:
        fake.on(*LOGIN, login_ok())
        fake.on(*READ, slow(5, json_ok({})), json_ok({"data": {"k": "v"}}))
        plan = plan_at(fake)
        start = time.monotonic()
        _, results = await run(vault, plan, fetch_ctx(6))
        assert isinstance(results[plan.objects[0].ref], list)
        assert time.monotonic() - start < 2
        assert fake.calls[READ] == 2
    finally:
        await vault.close()


async def test_a_request_cut_by_vaults_own_timer_is_silence_not_refusal(fake: FakeVault) -> None:
    # --vault-request-timeout shorter than --store-call-timeout: the hang is still a hang
    # (a mount without a stale copy waits for the store instead of failing at a third of its
    # deadline, as for a refusal).
    vault = create(make_env("vault", Options(request_timeout=0.2)))
    try:
        fake.on(*LOGIN, login_ok())
        fake.on(*READ, slow(5, json_ok({})))
        plan = plan_at(fake)
        seen = watch_failures()
        _, results = await run(vault, plan, fetch_ctx(1.5))
        assert isinstance(results[plan.objects[0].ref], StoreUnavailable)
        assert seen.latest is not None and seen.latest.silent and not seen.latest.refused
        assert "did not answer within 0.2s" in str(seen.latest.error)
    finally:
        await vault.close()


async def test_one_connection_pool_per_address_and_tls_settings(
    fake: FakeVault, backend: VaultBackend
) -> None:
    fake.on(*LOGIN, login_ok())
    fake.on(*READ, json_ok({"data": {"k": "v"}}))
    # Two classes, two roles (two identities), one address: one reused keep-alive connection.
    for role in ("r1", "r2", "r1"):
        plan = plan_for(
            "- {objectName: app, secretPath: secret/data/app}",
            vaultAddress=fake.addr,
            roleName=role,
        )
        await run(backend, plan)
    assert fake.calls[LOGIN] == 2 and fake.calls[READ] == 3
    assert len(set(fake.peers)) == 1


@pytest.mark.parametrize("lease", ["soon", None, -5, [1]])
async def test_odd_lease_durations_are_kept_briefly(
    fake: FakeVault, backend: VaultBackend, lease: object
) -> None:
    async def handler(_request: web.Request) -> web.StreamResponse:
        auth = {"client_token": FAKE_TOKEN, "lease_duration": lease}
        return web.json_response({"auth": auth})

    fake.on(*LOGIN, handler)
    fake.on(*READ, json_ok({"data": {"k": "v"}}))
    await run(backend, plan_at(fake))
    await run(backend, plan_at(fake))
    assert fake.calls[LOGIN] == 1


async def test_whole_response_keeps_utf8(fake: FakeVault, backend: VaultBackend) -> None:
    fake.on(*LOGIN, login_ok())
    fake.on(*READ, json_ok({"data": {"name": "Zoë ✓"}}))
    plan = plan_at(fake)
    _, results = await run(backend, plan)
    (value,) = results[plan.objects[0].ref]  # type: ignore[misc]
    assert "Zoë ✓".encode() in value.content


FAULTS = {
    "sealed": status(503, errors=["Vault is sealed"]),
    "throttled": status(429, headers={"Retry-After": "bogus"}),
    "html": raw(b"<html></html>"),
    "truncated-json": raw(b'{"data": {', content_type="application/json"),
    "json-list": raw(b"[1, 2]", content_type="application/json"),
    "dropped": drop(),
    "slow": slow(3, json_ok({})),
    "redirect-loop": redirect("/v1/secret/data/app"),
    "redirect-away": redirect("http://127.0.0.1:9/v1/x"),
}


@pytest.mark.parametrize("where", ["login", "read"])
@pytest.mark.parametrize("fault", sorted(FAULTS))
async def test_no_library_exception_escapes(
    fake: FakeVault, backend: VaultBackend, fault: str, where: str
) -> None:
    if where == "login":
        fake.on(*LOGIN, FAULTS[fault])
    else:
        fake.on(*LOGIN, login_ok())
        fake.on(*READ, FAULTS[fault])
    plan = plan_at(fake)
    try:
        _, results = await run(backend, plan, fetch_ctx(0.8))
    except Exception as exc:  # the assertion is about what this may be
        assert isinstance(exc, BridgeError), repr(exc)
        no_secrets(str(exc))
    else:
        for result in results.values():
            assert isinstance(result, BridgeError | list), repr(result)
            if isinstance(result, BridgeError):
                no_secrets(str(result))


async def test_a_failed_read_leaves_no_frames_for_the_cyclic_collector(
    fake: FakeVault, backend: VaultBackend
) -> None:
    """A dropped connection's error sits in a cycle with its frames (aiohttp's response queue
    keeps it; tenacity's frames keep the retry state keeping it): in an outage every failed
    call's frames, connections and buffers waited for a full collection. The retries drop the
    tracebacks of the errors they are done with, so those frames go with the call."""
    fake.on(*LOGIN, login_ok())
    fake.on(*READ, drop())
    plan = plan_at(fake)
    await run(backend, plan, fetch_ctx(1.5))  # the connection pool and login warmed up
    gc.collect()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        _, results = await run(backend, plan, fetch_ctx(1.5))
        error = results[plan.objects[0].ref]
        assert isinstance(error, StoreUnavailable) and "connection to Vault" in str(error)
        del error, results
        gc.collect()
        ours = [
            item
            for item in gc.garbage
            if (isinstance(item, FrameType) and _client_side(item.f_code.co_filename))
            or isinstance(item, (BridgeError, aiohttp.ClientError))
        ]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
    assert ours == []


def _client_side(filename: str) -> bool:
    """A frame of ours, of the retries, or of aiohttp's client (not the fake's server)."""
    parts = ("/backends/", "/provider/", "/tenacity/", "/aiohttp/client")
    return any(part in filename for part in parts)
