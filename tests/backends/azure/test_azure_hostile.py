"""What a class's author can point the azure backend at (issue 20, store side): node files as
`cloudEnvFileName`, and a Key Vault answer that redirects, streams forever or echoes a secret."""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
from aiohttp import web
from aiohttp.payload import AsyncIterablePayload

from backends.azure.auth import MAX_CLOUD_FILE
from backends.azure.store import AzureBackend
from backends.clouds.azure import AUDIENCE
from devkit.azure import SUFFIX
from devkit.testing import fetch_ctx, make_pod
from provider.core.errors import BridgeError, InvalidParameters, StoreUnavailable
from tests.backends.azure.conftest import CLIENT, TENANT, Azure
from tests.backends.azure.test_azure_fetch import fetch, objects, plan

Answer = Callable[[web.Request], web.StreamResponse]


def hostile_paths(tmp_path: Path) -> list[str]:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    (tmp_path / "dir").mkdir()
    (tmp_path / "not-json").write_text("root:x:0:0:root:/root:/bin/bash\n")
    (tmp_path / "big").write_bytes(b" " * (MAX_CLOUD_FILE + 1))
    names = ["dir", "missing", "not-json", "big"]
    return ["/dev/zero", str(fifo), *(str(tmp_path / n) for n in names)]


async def test_cloud_env_file_tells_nothing_about_node_files(
    backend: AzureBackend, tmp_path: Path
) -> None:
    """AzureStackCloud with /dev/zero (read whole before), a FIFO (an open that never returns),
    a directory, a missing file, a non-JSON file, a file over the cap: one message for all, and
    no token is needed to ask, so it must be cheap."""
    messages = set()
    for path in hostile_paths(tmp_path):
        p = plan(
            objects("objectName: s\nobjectType: secret"),
            cloudName="AzureStackCloud",
            cloudEnvFileName=path,
        )
        started = time.monotonic()
        with pytest.raises(InvalidParameters) as err:
            async with asyncio.timeout(2):
                await backend.identify(p, make_pod())
        assert time.monotonic() - started < 1
        messages.add(str(err.value).replace(path, "<path>"))
    assert messages == {
        "cloudEnvFileName <path> cannot be used: not a readable regular file under 64 KiB "
        "holding JSON with activeDirectoryEndpoint and keyVaultDNSSuffix"
    }


def intercept(azure: Azure, answers: dict[str, Answer]) -> None:
    """Answer authenticated reads of the named secrets with `answers` (the fake does the rest,
    including the 401 challenge and Entra)."""
    original = azure.fake._vault

    def vault(name: str, request: web.Request) -> web.StreamResponse:
        secret = request.path.rstrip("/").split("/")[-1]
        if request.headers.get("Authorization") and secret in answers:
            return answers[secret](request)
        return original(name, request)

    azure.fake._vault = vault  # type: ignore[method-assign]


@pytest.fixture
def vault(azure: Azure):  # type: ignore[no-untyped-def]
    v = azure.fake.vault("kv1", TENANT)
    v.access[CLIENT] = "*"
    return v


async def test_key_vault_redirect_is_not_followed(
    azure: Azure, backend: AzureBackend, vault
) -> None:
    other = azure.fake.vault("kv2", TENANT)
    other.access[CLIENT] = "*"
    other.add("secret", "moved", {"value": "from-elsewhere"})

    def redirect(_request: web.Request) -> web.StreamResponse:
        return web.Response(status=307, headers={"Location": f"https://kv2.{SUFFIX}/secrets/moved"})

    intercept(azure, {"moved": redirect})
    p = plan(objects("objectName: moved\nobjectType: secret"))
    err = (await fetch(backend, p, seconds=3))[p.objects[0].ref]
    assert isinstance(err, StoreUnavailable) and "307" in str(err), err
    assert "redirect" in str(err) and not err.transient
    assert [c for c in azure.fake.calls.vault if c[0] == "kv2"] == []


async def test_endless_key_vault_answer_is_cut(azure: Azure, backend: AzureBackend, vault) -> None:
    async def spaces() -> AsyncIterator[bytes]:
        # 256 MiB at most (64 times the cap), and a turn of the loop between chunks: once the
        # client hangs up, this payload's writes no longer wait, and a generator that never
        # yields to the loop starved the test's own event loop (the client and this fake share
        # it) until pytest's 120 s timeout, on a loaded machine.
        for _ in range(4096):
            yield b" " * 65536
            await asyncio.sleep(0)

    def endless(_request: web.Request) -> web.StreamResponse:
        body = AsyncIterablePayload(spaces(), content_type="application/json")
        return web.Response(body=body)

    intercept(azure, {"endless": endless})
    p = plan(objects("objectName: endless\nobjectType: secret"))
    started = time.monotonic()
    err = (await fetch(backend, p, seconds=3))[p.objects[0].ref]
    assert isinstance(err, StoreUnavailable), err
    assert "endless" in str(err) and time.monotonic() - started < 2.5


async def test_key_vault_error_text_is_not_relayed(
    azure: Azure, backend: AzureBackend, vault, caplog: pytest.LogCaptureFixture
) -> None:
    def echo(_request: web.Request) -> web.StreamResponse:
        error = {
            "code": "BadParameter",
            "message": "value s3cr3t is not valid",
            "innererror": {"code": "pw-1"},
        }
        return web.json_response({"error": error}, status=400)

    intercept(azure, {"echo": echo})
    caplog.set_level(logging.DEBUG)
    p = plan(objects("objectName: echo\nobjectType: secret"))
    err = (await fetch(backend, p, seconds=3))[p.objects[0].ref]
    assert isinstance(err, InvalidParameters), err
    assert "(400 BadParameter)" in str(err)
    for text in [str(err), *(r.getMessage() for r in caplog.records)]:
        assert "s3cr3t" not in text and "pw-1" not in text


async def test_entra_refusal_carries_codes_only(azure: Azure, backend: AzureBackend, vault) -> None:
    vault.add("secret", "s", {"value": "x"})
    p = plan(objects("objectName: s\nobjectType: secret"))
    pod = make_pod(tokens={AUDIENCE: "not-federated"})
    identity = await backend.identify(p, pod)
    with pytest.raises(BridgeError) as err:
        await backend.fetch(p, identity, [p.objects[0].ref], fetch_ctx(3))
    text = str(err.value)
    assert "invalid_client" in text and "AADSTS700213" in text
    assert "No matching federated identity record" not in text
