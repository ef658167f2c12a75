"""A class's author points the vault backend at a server of their own (issue 20, store side).

Each test runs the hostile "Vault" as a local aiohttp server and checks that the provider
answers with a clear error, quickly, without following it elsewhere, relaying its text, reading
node files it should not, or keeping a session per address it invents.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest
from aiohttp import web

from backends.vault.client import VaultHTTP
from backends.vault.dialect import TLSConfig
from backends.vault.options import Options
from backends.vault.store import VaultBackend, create
from backends.wire import MAX_SESSIONS
from devkit.fakevault import FAKE_TOKEN, login_ok
from devkit.ports import closed_url, serve_app
from devkit.testing import fetch_ctx, make_env, make_pod
from provider.core.errors import (
    BridgeError,
    InvalidParameters,
    LimitExceeded,
    PermissionDenied,
    StoreUnavailable,
)
from provider.core.model import StorePlan
from tests.backends.vault.conftest import plan_for

POD_JWT = "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJzeXN0ZW06c2VydmljZWFjY291bnQ6ZGVmYXVsdDphcHAifQ.c2ln"
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class Server:
    """A local HTTP server: `handler` answers everything; `seen` records every request."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.seen: list[tuple[str, str, dict[str, str], bytes]] = []
        self.addr = ""
        self._runner: web.AppRunner | None = None

    async def start(self) -> Server:
        async def record(request: web.Request) -> web.StreamResponse:
            body = await request.read()
            self.seen.append((request.method, request.path_qs, dict(request.headers), body))
            return await self.handler(request)

        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", record)
        self._runner, port = await serve_app(app, shutdown_timeout=0.1)
        self.addr = f"http://127.0.0.1:{port}"
        return self

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()


@pytest.fixture
async def servers() -> AsyncIterator[Callable[[Handler], Awaitable[Server]]]:
    started: list[Server] = []

    async def start(handler: Handler) -> Server:
        started.append(await Server(handler).start())
        return started[-1]

    yield start
    for server in started:
        await server.stop()


@pytest.fixture
async def backend() -> AsyncIterator[VaultBackend]:
    vault = create(make_env("vault", Options(request_timeout=1.0)))
    yield vault
    await vault.close()


def plan_at(addr: str, **params: str) -> StorePlan:
    return plan_for(
        "- {objectName: app, secretPath: secret/data/app}",
        vaultAddress=addr,
        roleName="r",
        **params,
    )


async def fetch(backend: VaultBackend, plan: StorePlan, seconds: float = 3.0) -> object:
    """The one object's outcome (a raised error counts as the outcome)."""
    try:
        identity = await backend.identify(plan, make_pod(tokens={"vault": POD_JWT}))
        results = await backend.fetch(plan, identity, [plan.objects[0].ref], fetch_ctx(seconds))
        return results[plan.objects[0].ref]
    except BridgeError as exc:
        return exc


def is_login(request: web.Request) -> bool:
    return request.path.endswith("/login")


async def test_endless_body_is_cut_at_the_cap(
    backend: VaultBackend, servers: Callable[[Handler], Awaitable[Server]]
) -> None:
    async def endless(request: web.Request) -> web.StreamResponse:
        if is_login(request):
            return await login_ok()(request)
        response = web.StreamResponse()
        await response.prepare(request)
        chunk = b"x" * 65536
        while True:
            await response.write(chunk)

    server = await servers(endless)
    started = time.monotonic()
    outcome = await fetch(backend, plan_at(server.addr))
    assert isinstance(outcome, LimitExceeded), outcome
    assert "over" in str(outcome) and server.addr in str(outcome)
    assert time.monotonic() - started < 2.5


async def test_trickled_body_is_cut_in_time(
    backend: VaultBackend, servers: Callable[[Handler], Awaitable[Server]]
) -> None:
    async def trickle(request: web.Request) -> web.StreamResponse:
        if is_login(request):
            return await login_ok()(request)
        response = web.StreamResponse()
        await response.prepare(request)
        while True:
            await response.write(b" ")
            await asyncio.sleep(0.05)

    server = await servers(trickle)
    started = time.monotonic()
    outcome = await fetch(backend, plan_at(server.addr), seconds=1.5)
    assert isinstance(outcome, StoreUnavailable | BridgeError), outcome
    assert time.monotonic() - started < 2.5


@pytest.mark.parametrize("on_login", [False, True], ids=["read", "login"])
async def test_redirect_to_another_host_is_never_followed(
    backend: VaultBackend, servers: Callable[[Handler], Awaitable[Server]], on_login: bool
) -> None:
    """A 307 to another origin would re-send X-Vault-Token (or the pod's JWT in the login
    body) there and return that host's answer as the file: the second host must see nothing."""

    async def elsewhere(_request: web.Request) -> web.StreamResponse:
        return web.json_response({"data": {"k": "from-the-other-host"}})

    other = await servers(elsewhere)

    async def redirecting(request: web.Request) -> web.StreamResponse:
        if is_login(request) and not on_login:
            return await login_ok()(request)
        raise web.HTTPTemporaryRedirect(f"{other.addr}{request.path_qs}")

    hostile = await servers(redirecting)
    outcome = await fetch(backend, plan_at(hostile.addr))
    assert isinstance(outcome, StoreUnavailable), outcome
    assert "307" in str(outcome) and "redirect" in str(outcome) and hostile.addr in str(outcome)
    assert not outcome.transient
    assert other.seen == []
    for _method, _path, headers, _body in hostile.seen:
        assert headers.get("X-Vault-Token") in (None, FAKE_TOKEN)
    assert POD_JWT not in str(outcome) and FAKE_TOKEN not in str(outcome)


async def test_error_bodies_are_not_relayed(
    backend: VaultBackend,
    servers: Callable[[Handler], Awaitable[Server]],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A 400 whose errors echo a password, a 403 with Vault's known text beside it: the error
    carries the status and the known phrase only; the rest never reaches a log above DEBUG
    (and the suite's guard checks the DEBUG lines too)."""
    bodies = {
        "secret/data/a": (400, ["invalid value 's3cr3t' for field password"]),
        "secret/data/b": (403, ["1 error occurred: permission denied; pw-1 was rejected"]),
    }

    async def echoing(request: web.Request) -> web.StreamResponse:
        if is_login(request):
            return await login_ok()(request)
        status, errors = bodies[request.path.removeprefix("/v1/")]
        return web.json_response({"errors": errors}, status=status)

    server = await servers(echoing)
    caplog.set_level(logging.DEBUG)
    plan = plan_for(
        "- {objectName: a, secretPath: secret/data/a}\n"
        "- {objectName: b, secretPath: secret/data/b}",
        vaultAddress=server.addr,
        roleName="r",
    )
    identity = await backend.identify(plan, make_pod(tokens={"vault": POD_JWT}))
    results = await backend.fetch(plan, identity, [s.ref for s in plan.objects], fetch_ctx(3))
    bad, denied = (results[s.ref] for s in plan.objects)
    assert isinstance(bad, InvalidParameters) and "(HTTP 400)" in str(bad), bad
    assert isinstance(denied, PermissionDenied), denied
    assert "HTTP 403: permission denied" in str(denied)
    for text in [str(bad), str(denied), *(r.getMessage() for r in caplog.records)]:
        assert "s3cr3t" not in text and "pw-1" not in text


def node_files(tmp_path: Path) -> dict[str, str]:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    (tmp_path / "dir").mkdir()
    (tmp_path / "not-pem").write_text("root:x:0:0:root:/root:/bin/bash\n")
    return {
        "/dev/zero": "/dev/zero",
        "fifo": str(fifo),
        "directory": str(tmp_path / "dir"),
        "missing": str(tmp_path / "missing"),
        "not a certificate": str(tmp_path / "not-pem"),
    }


async def test_node_files_named_by_the_class_tell_nothing(tmp_path: Path) -> None:
    """/dev/zero, a FIFO, a directory, a missing path and a regular non-PEM file: the same
    message for each (only the path differs), and none of them hangs or is read whole."""
    http = VaultHTTP(max_connections=4, max_body_bytes=1024)
    paths = list(node_files(tmp_path).values())
    try:
        for field, tls in [
            ("vaultCACertPath", lambda p: TLSConfig(ca_cert=p)),
            ("vaultTLSClientCertPath", lambda p: TLSConfig(client_cert=p, client_key=p)),
        ]:
            messages = set()
            for path in paths:
                async with asyncio.timeout(2):
                    with pytest.raises(InvalidParameters) as err:
                        await http.request(
                            "https://127.0.0.1:1",
                            tls(path),
                            "GET",
                            "sys/health",
                            deadline=time.monotonic() + 2,
                        )
                assert field in str(err.value)
                messages.add(str(err.value).replace(path, "<path>"))
            assert len(messages) == 1, messages
            assert "not a readable regular file under 1024 KiB" in messages.pop()
    finally:
        await http.close()


async def test_sessions_are_keyed_by_origin_and_bounded(
    servers: Callable[[Handler], Awaitable[Server]],
) -> None:
    """3,000 path suffixes of one server are one session; 3 x MAX_SESSIONS servers leave at
    most MAX_SESSIONS open, and the process's file descriptors do not grow with them."""

    async def ok(_request: web.Request) -> web.StreamResponse:
        return web.json_response({"data": {}})

    server = await servers(ok)
    http = VaultHTTP(max_connections=8, max_body_bytes=4096)
    fds_before = len(os.listdir("/proc/self/fd"))
    tls = TLSConfig()
    try:
        limit = asyncio.Semaphore(32)

        async def call(address: str) -> int:
            async with limit:
                reply = await http.request(
                    address, tls, "GET", "sys/health", deadline=time.monotonic() + 10
                )
                return reply.status

        statuses = await asyncio.gather(*(call(f"{server.addr}/p{i}") for i in range(3000)))
        assert set(statuses) == {200}
        assert len(server.seen) == 3000
        assert http.open_sessions == 1

        refused = [closed_url() for _ in range(3 * MAX_SESSIONS)]
        outcomes = await asyncio.gather(*(call(a) for a in refused), return_exceptions=True)
        assert all(isinstance(o, StoreUnavailable) for o in outcomes)
        assert http.open_sessions <= MAX_SESSIONS
        assert len(os.listdir("/proc/self/fd")) - fds_before <= 8 + MAX_SESSIONS
    finally:
        await http.close()


@pytest.mark.parametrize("where", ["login", "read"])
async def test_deeply_nested_json_is_an_answer_like_any_other_not_a_crash(
    backend: VaultBackend, servers: Callable[[Handler], Awaitable[Server]], where: str
) -> None:
    """A tenant's own Vault answering 100,000 levels of `[`: the JSON decoder's recursion
    limit is a malformed answer (a one-line error), never a RecursionError (INTERNAL)."""
    nested = web.Response(body=b"[" * 100_000, content_type="application/json")

    async def deep(request: web.Request) -> web.StreamResponse:
        if is_login(request) and where == "read":
            return await login_ok()(request)
        return nested

    server = await servers(deep)
    outcome = await fetch(backend, plan_at(server.addr))
    assert isinstance(outcome, BridgeError), outcome
    assert "\n" not in str(outcome)
