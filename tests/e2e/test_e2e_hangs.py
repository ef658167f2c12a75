"""A real OpenBao behind a proxy that hangs (accepts, never answers) or answers late (issue 21),
and one namespace's hanging Vault beside another's healthy one (issue 20)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml

from backends.vault.options import Options as VaultOptions
from devkit.hangs import HangProxy, is_read
from devkit.openbao import OpenBao, read_policy
from devkit.serving import Serving, serving
from devkit.testing import driver_request
from devkit.tokens import SigningKey
from provider.core.settings import CoreSettings

#: Latency under load: run alone after the parallel run (Makefile, `make test`).
pytestmark = pytest.mark.serial

OBJECTS = [
    {"objectName": f"o{i}", "secretPath": f"secret/data/a/s{i}", "secretKey": "pw"}
    for i in range(3)
]
B_ACCOUNTS = [f"b{i}" for i in range(20)]
#: Namespaces whose classes point at a Vault of their own that never answers a read.
HOSTILE = ("b", "c", "d", "e")


@pytest.fixture(scope="module")
def signing_key() -> SigningKey:
    return SigningKey.generate()


@pytest.fixture(scope="module")
def bao(tmp_path_factory: pytest.TempPathFactory, signing_key: SigningKey) -> Iterator[OpenBao]:
    server = OpenBao.start(Path(tmp_path_factory.mktemp("openbao")))
    try:
        server.configure_jwt_auth("jwt", signing_key.public_pem)
        for ns, accounts in (("a", ["app"]), *((h, B_ACCOUNTS) for h in HOSTILE)):
            server.put_policy(ns, read_policy([f"secret/data/{ns}/*"]))
            server.add_jwt_role("jwt", ns, namespace=ns, service_account=accounts, policies=[ns])
            for i in range(3):
                server.kv2_put("secret", f"{ns}/s{i}", {"pw": f"{ns}-secret-{i}"})
        yield server
    finally:
        server.stop()


@pytest.fixture
async def proxy(bao: OpenBao) -> AsyncIterator[HangProxy]:
    hang = HangProxy(bao.addr)
    await hang.start()
    try:
        yield hang
    finally:
        await hang.stop()


@contextlib.asynccontextmanager
async def provider(tmp_path: Path, addr: str, **core: Any) -> AsyncIterator[Serving]:
    options = {"vault": VaultOptions(addr=addr)}
    async with serving(tmp_path, backend_options=options, core=CoreSettings(**core)) as running:
        yield running


def request(
    key: SigningKey, namespace: str = "a", account: str = "app", pod: str = "p0", **extra: str
) -> Any:
    objects = [
        {**o, "secretPath": o["secretPath"].replace("/a/", f"/{namespace}/")} for o in OBJECTS
    ]
    params = {
        "backend": "vault",
        "roleName": namespace,
        "vaultAuthMountPath": "jwt",
        "objects": yaml.safe_dump(objects),
        **extra,
    }
    token = key.pod_token(namespace, account, "vault")
    return driver_request(
        params, tokens={"vault": token}, namespace=namespace, service_account=account, pod=pod
    )


def contents(reply: Any) -> dict[str, bytes]:
    return {f.path: f.contents for f in reply.files}


def tracebacks(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]


async def test_hung_store_with_serve_stale_answers_every_mount_within_the_stale_wait(
    tmp_path: Path, proxy: HangProxy, signing_key: SigningKey
) -> None:
    async with provider(
        tmp_path, proxy.url, serve_stale_max_age=600, serve_stale_wait=0.5, store_call_timeout=2
    ) as running:
        known = contents(await running.stub.Mount(request(signing_key), timeout=10))
        assert known["o0"] == b"a-secret-0"
        proxy.hang()
        start = time.monotonic()
        replies = await asyncio.gather(
            *(running.stub.Mount(request(signing_key, pod=f"p{i}"), timeout=10) for i in range(30))
        )
        assert time.monotonic() - start < 1.5
        assert all(contents(r) == known for r in replies)
        assert proxy.held <= 3  # one refresh per object, not one per mount
        proxy.release()


async def test_hung_store_without_stale_fails_each_mount_at_its_own_deadline(
    tmp_path: Path, proxy: HangProxy, signing_key: SigningKey
) -> None:
    async with provider(tmp_path, proxy.url, store_call_timeout=1.0) as running:
        await running.stub.Mount(request(signing_key), timeout=10)  # logged in
        proxy.hang(when=is_read)

        async def timed(timeout: float, pod: str) -> tuple[float, grpc.aio.AioRpcError]:
            start = time.monotonic()
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await running.stub.Mount(request(signing_key, pod=pod), timeout=timeout)
            return time.monotonic() - start, info.value

        first = asyncio.create_task(timed(2.0, "p1"))
        await asyncio.sleep(0.7)
        late, error = await timed(3.0, "p2")  # joins the first mount's pending reads
        early, _ = await first
        assert 1.2 <= early < 2.0
        # Its own deadline (less the margin kept for the answer), not the first mount's.
        assert 2.0 <= late < 3.0
        assert error.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        details = error.details() or ""
        assert "vault store did not answer" in details and proxy.url in details
        proxy.release()


async def test_mounts_joining_a_slow_read_late_get_its_answer(
    tmp_path: Path, proxy: HangProxy, signing_key: SigningKey
) -> None:
    async with provider(tmp_path, proxy.url, store_call_timeout=5) as running:
        await running.stub.Mount(request(signing_key), timeout=10)
        proxy.slow(2.0, when=is_read)
        calls = proxy.calls
        first = asyncio.ensure_future(
            running.stub.Mount(request(signing_key, pod="p1"), timeout=1.2)
        )
        await asyncio.sleep(0.3)
        reply = await running.stub.Mount(request(signing_key, pod="p2"), timeout=6)
        assert contents(reply)["o2"] == b"a-secret-2"
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await first
        assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        assert proxy.calls - calls == 3  # the late mount waited for the same three reads


async def test_a_driver_cancelled_mount_logs_no_traceback(
    tmp_path: Path, proxy: HangProxy, signing_key: SigningKey, caplog: pytest.LogCaptureFixture
) -> None:
    async with provider(tmp_path, proxy.url) as running:
        proxy.hang()
        call = running.stub.Mount(request(signing_key), timeout=30)
        await asyncio.sleep(0.5)
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        await asyncio.sleep(0.3)
        assert not tracebacks(caplog)
        assert any("driver cancelled" in r.getMessage() for r in caplog.records)
        proxy.release()


async def test_a_namespace_hanging_its_own_vault_does_not_delay_another_namespace(
    tmp_path: Path, bao: OpenBao, proxy: HangProxy, signing_key: SigningKey
) -> None:
    # B's classes point at B's own "Vault" (the proxy): it accepts the login, never a read.
    async with provider(
        tmp_path,
        bao.addr,
        store_call_timeout=30,
        max_concurrent_fetches=8,
        max_concurrent_fetches_per_namespace=2,
    ) as running:
        proxy.hang(when=is_read)
        attack = [
            running.stub.Mount(
                request(signing_key, "b", account, pod=account, vaultAddress=proxy.url),
                timeout=30,
            )
            for account in B_ACCOUNTS
        ]
        await asyncio.sleep(1.0)
        assert proxy.held == 2 * 3  # B's share: two fetches of three reads each
        start = time.monotonic()
        reply = await running.stub.Mount(request(signing_key), timeout=5)
        assert time.monotonic() - start < 1.0
        assert contents(reply)["o0"] == b"a-secret-0"
        for call in attack:
            call.cancel()
        await asyncio.gather(*attack, return_exceptions=True)
        proxy.release()


async def test_several_namespaces_hanging_their_own_vaults_do_not_delay_another(
    tmp_path: Path, bao: OpenBao, proxy: HangProxy, signing_key: SigningKey
) -> None:
    """Issue 32, attack 1, with the default shares (64 slots, 16 a namespace): four namespaces
    of 20 volumes each hang 64 loads on their own Vault; a fifth namespace's mounts go on."""
    async with provider(tmp_path, bao.addr, store_call_timeout=30) as running:
        proxy.hang(when=is_read)
        attack = [
            asyncio.ensure_future(
                running.stub.Mount(
                    request(signing_key, ns, account, pod=account, vaultAddress=proxy.url),
                    timeout=30,
                )
            )
            for ns in HOSTILE
            for account in B_ACCOUNTS
        ]
        await asyncio.sleep(2.0)
        assert proxy.held >= 64  # every slot of the backend is held by a hung read
        latencies = []
        for i in range(20):
            start = time.monotonic()
            reply = await running.stub.Mount(request(signing_key, pod=f"v{i}"), timeout=5)
            latencies.append(time.monotonic() - start)
            assert contents(reply)["o0"] == b"a-secret-0"
        latencies.sort()
        print(
            f"victim during the attack: p50 {latencies[9] * 1e3:.1f} ms, "
            f"p99 {latencies[-1] * 1e3:.1f} ms ({proxy.held} reads held)"
        )
        assert latencies[-1] < 1.0
        for call in attack:
            call.cancel()
        await asyncio.gather(*attack, return_exceptions=True)
        proxy.release()
