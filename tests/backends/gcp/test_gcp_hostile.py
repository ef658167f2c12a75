"""A nodePublishSecretRef key.json whose token_uri is a server of its author's (issue 20).

The hostile token endpoint is a local aiohttp server. The key's grant must go only to Google's
endpoints or the provider's configured ones, be read in capped bytes and time, follow no
redirect, relay no body, and hold no thread: eight mounts stuck on it leave another namespace's
Vault mount by host name (`localhost`) as fast as ever, even with the loop's default executor
full.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from functools import cache

import pytest
from aiohttp import web
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from backends.gcp.dialect import GcpRef
from backends.gcp.options import GOOGLE_TOKEN_URIS
from backends.vault.options import Options as VaultOptions
from backends.vault.store import create as create_vault
from devkit.fakevault import FakeVault, json_ok, login_ok
from devkit.ports import serve_app
from devkit.testing import fetch_ctx, make_env, make_pod
from provider.core.errors import (
    BridgeError,
    DeadlineExceeded,
    InvalidParameters,
    LimitExceeded,
    PermissionDenied,
    StoreUnavailable,
)
from provider.core.model import Fetched, StorePlan
from tests.backends.gcp.conftest import Stack
from tests.backends.vault.conftest import plan_for as vault_plan

EMAIL = "keyed@proj.iam.gserviceaccount.com"
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@cache
def private_key_pem() -> str:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ).decode()


def key_json(token_uri: str, key_id: str = "k1") -> str:
    return json.dumps(
        {
            "type": "service_account",
            "private_key_id": key_id,
            "private_key": private_key_pem(),
            "client_email": EMAIL,
            "token_uri": token_uri,
        }
    )


class Endpoint:
    """A local token endpoint: `handler` answers; `seen` counts the requests it got."""

    def __init__(self, handler: Handler) -> None:
        self.handler, self.seen, self.url = handler, 0, ""
        self.runner: web.AppRunner | None = None

    async def start(self) -> Endpoint:
        async def record(request: web.Request) -> web.StreamResponse:
            self.seen += 1
            return await self.handler(request)

        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", record)
        self.runner, port = await serve_app(app, shutdown_timeout=0.1)
        self.url = f"http://127.0.0.1:{port}/token"
        return self


@pytest.fixture
async def endpoints() -> AsyncIterator[Callable[[Handler], Awaitable[Endpoint]]]:
    started: list[Endpoint] = []

    async def start(handler: Handler) -> Endpoint:
        started.append(await Endpoint(handler).start())
        return started[-1]

    yield start
    for endpoint in started:
        assert endpoint.runner is not None
        await endpoint.runner.cleanup()


def plan(stack: Stack) -> StorePlan:
    name = stack.google.add_version("projects/proj/secrets/db", "v", f"gsa:{EMAIL}")
    return stack.plan({"secrets": f"- resourceName: {name}\n  path: db"})


async def read_with_key(
    stack: Stack, token_uri: str, seconds: float = 3.0, **options: str
) -> Fetched:
    backend = stack.rebuild(**options) if options else stack.backend
    p = plan(stack)
    try:
        identity = await backend.identify(p, make_pod(secrets={"key.json": key_json(token_uri)}))
        ref: GcpRef = p.objects[0].ref
        return (await backend.fetch(p, identity, [ref], fetch_ctx(seconds)))[ref]
    except BridgeError as exc:
        return exc


async def test_token_uri_elsewhere_is_refused_before_any_request(
    stack: Stack, endpoints: Callable[[Handler], Awaitable[Endpoint]]
) -> None:
    async def answer(_request: web.Request) -> web.StreamResponse:
        return web.json_response({"access_token": "x", "expires_in": 3600})

    internal = await endpoints(answer)
    outcome = await read_with_key(stack, internal.url)
    assert isinstance(outcome, InvalidParameters), outcome
    assert "token_uri" in str(outcome) and "key.json" in str(outcome)
    assert all(uri in str(outcome) for uri in GOOGLE_TOKEN_URIS)
    assert internal.seen == 0


async def test_endless_token_answer_is_cut_at_the_cap(
    stack: Stack, endpoints: Callable[[Handler], Awaitable[Endpoint]]
) -> None:
    async def endless(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse()
        await response.prepare(request)
        while True:
            await response.write(b"x" * 65536)

    hostile = await endpoints(endless)
    started = time.monotonic()
    outcome = await read_with_key(stack, hostile.url, token_uris=hostile.url)
    assert isinstance(outcome, LimitExceeded), outcome
    assert time.monotonic() - started < 2


async def test_token_endpoint_redirect_is_not_followed(
    stack: Stack, endpoints: Callable[[Handler], Awaitable[Endpoint]]
) -> None:
    async def target(_request: web.Request) -> web.StreamResponse:
        return web.json_response({"access_token": "x", "expires_in": 3600})

    other = await endpoints(target)

    async def redirect(_request: web.Request) -> web.StreamResponse:
        raise web.HTTPTemporaryRedirect(other.url)

    hostile = await endpoints(redirect)
    outcome = await read_with_key(stack, hostile.url, token_uris=hostile.url)
    assert isinstance(outcome, BridgeError) and "307" in str(outcome), outcome
    assert other.seen == 0


async def test_token_endpoint_error_body_is_not_relayed(
    stack: Stack,
    endpoints: Callable[[Handler], Awaitable[Endpoint]],
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def refuse(_request: web.Request) -> web.StreamResponse:
        body = {"error": "invalid_grant", "error_description": "internal note: s3cr3t pw-1"}
        return web.json_response(body, status=400)

    hostile = await endpoints(refuse)
    caplog.set_level(logging.DEBUG)
    outcome = await read_with_key(stack, hostile.url, token_uris=hostile.url)
    assert isinstance(outcome, PermissionDenied), outcome
    assert "HTTP 400: invalid_grant" in str(outcome)
    for text in [str(outcome), *(r.getMessage() for r in caplog.records)]:
        assert "s3cr3t" not in text and "pw-1" not in text


async def test_stuck_token_endpoints_hold_no_thread_another_store_needs(
    stack: Stack, endpoints: Callable[[Handler], Awaitable[Endpoint]]
) -> None:
    """Eight key.json mounts whose token_uri never answers, and the loop's default executor
    full besides: another namespace's Vault mount by host name still answers in normal time,
    and the stuck mounts end as soon as they are given up."""
    never = asyncio.Event()

    async def hang(_request: web.Request) -> web.StreamResponse:
        await never.wait()
        return web.Response()

    hostile = await endpoints(hang)
    backend = stack.rebuild(token_uris=hostile.url)
    p = plan(stack)
    ref: GcpRef = p.objects[0].ref

    async def stuck(i: int) -> None:
        # Eight keys (a key's mounts share one login): eight logins in flight at once.
        pod = make_pod(secrets={"key.json": key_json(hostile.url, f"k{i}")})
        identity = await backend.identify(p, pod)
        await backend.fetch(p, identity, [ref], fetch_ctx(30))

    vault = await FakeVault.start()
    release = threading.Event()
    loop = asyncio.get_running_loop()
    # Whatever else may fill the default executor (its size is min(32, cpus + 4)).
    blockers = [loop.run_in_executor(None, release.wait, 5) for _ in range(32)]
    tasks = [asyncio.create_task(stuck(i)) for i in range(8)]
    vault_backend = create_vault(make_env("vault", VaultOptions()))
    try:
        async with asyncio.timeout(2):  # each key is loaded on the backend's threads first
            while hostile.seen < 8:
                await asyncio.sleep(0.02)
        vault.on("POST", "auth/kubernetes/login", login_ok())
        vault.on("GET", "secret/data/a", json_ok({"k": "v"}))
        address = vault.addr.replace("127.0.0.1", "localhost")
        vplan = vault_plan(
            "- {objectName: a, secretPath: secret/data/a}", vaultAddress=address, roleName="r"
        )
        pod = make_pod(namespace="other", tokens={"vault": "eyJhbGciOi.eyJzdWIiOi.c2ln"})
        started = time.monotonic()
        identity = await vault_backend.identify(vplan, pod)
        got = await vault_backend.fetch(vplan, identity, [vplan.objects[0].ref], fetch_ctx(5))
        assert isinstance(got[vplan.objects[0].ref], list)
        assert time.monotonic() - started < 1.0
    finally:
        for task in tasks:
            task.cancel()
        started = time.monotonic()
        outcomes = await asyncio.gather(*tasks, return_exceptions=True)
        assert time.monotonic() - started < 0.5
        assert all(isinstance(o, asyncio.CancelledError) for o in outcomes)
        release.set()
        await asyncio.gather(*blockers)
        await vault_backend.close()
        await vault.stop()


async def test_stuck_token_endpoint_ends_at_the_deadline(
    stack: Stack, endpoints: Callable[[Handler], Awaitable[Endpoint]]
) -> None:
    async def hang(_request: web.Request) -> web.StreamResponse:
        await asyncio.sleep(30)
        return web.Response()

    hostile = await endpoints(hang)
    started = time.monotonic()
    outcome = await read_with_key(stack, hostile.url, seconds=1.5, token_uris=hostile.url)
    assert isinstance(outcome, StoreUnavailable | DeadlineExceeded), outcome
    assert time.monotonic() - started < 2.5
