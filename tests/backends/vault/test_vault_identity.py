"""Where the pod's token comes from: the driver's tokens, or the TokenRequest fallback; and the
provider-level address flag with its VAULT_ADDR alias."""

from __future__ import annotations

import argparse
from collections.abc import AsyncIterator

import pytest

from backends.vault.options import Options
from backends.vault.store import create
from devkit.kube import TokenRequestStub
from devkit.openbao import OpenBao
from devkit.testing import fetch_ctx, make_env, make_pod
from devkit.tokens import SigningKey
from provider.core.errors import MissingCredential
from provider.core.settings import add_options_flags, options_from_args
from tests.backends.vault.conftest import plan_for


@pytest.fixture
async def token_requests(signing_key: SigningKey) -> AsyncIterator[TokenRequestStub]:
    stub = TokenRequestStub(signing_key)
    await stub.start()
    yield stub
    await stub.stop()


async def test_token_request_fallback_mints_the_pod_token(
    openbao: OpenBao, token_requests: TokenRequestStub
) -> None:
    openbao.kv2_put("secret", "app/fallback", {"k": "v"})
    env = make_env(
        "vault",
        Options(addr=openbao.addr),
        token_request_fallback=True,
        kube_api_url=token_requests.url,
    )
    backend = create(env)
    try:
        plan = plan_for(
            "- {objectName: f, secretPath: secret/data/app/fallback}",
            roleName="app",
            vaultAuthMountPath="jwt",
            vaultAddress=openbao.addr,
        )
        identity = await backend.identify(plan, make_pod(tokens={}))
        ref = plan.objects[0].ref
        fetched = (await backend.fetch(plan, identity, [ref], fetch_ctx()))[ref]
        assert isinstance(fetched, list) and fetched[0].view() == {"k": "v"}
        (request,) = token_requests.requests
        assert request["spec"]["audiences"] == ["vault"]
        assert request["spec"]["boundObjectRef"]["kind"] == "Pod"
    finally:
        await backend.close()
        await env.kube.close()


async def test_without_fallback_a_missing_token_names_the_audience(openbao: OpenBao) -> None:
    backend = create(make_env("vault", Options(addr=openbao.addr)))
    try:
        plan = plan_for(
            "- {objectName: f, secretPath: secret/data/app/x}",
            roleName="app",
            baoRoleName="",
            vaultAddress=openbao.addr,
        )
        plan_openbao = plan_for(
            "- {objectName: f, secretPath: s/x}", openbaoRoleName="app", openbaoAddress=openbao.addr
        )
        with pytest.raises(MissingCredential, match="audience 'vault'"):
            await backend.identify(plan, make_pod(tokens={}))
        with pytest.raises(MissingCredential, match="audience 'openbao'"):
            await backend.identify(plan_openbao, make_pod(tokens={"vault": "x"}))
    finally:
        await backend.close()


@pytest.mark.parametrize(
    ("env", "argv", "addr"),
    [
        ({"VAULT_ADDR": "http://from-vault-addr:8200"}, [], "http://from-vault-addr:8200"),
        ({"BAO_ADDR": "http://from-bao-addr:8200"}, [], "http://from-bao-addr:8200"),
        (
            {"SECRETS_BRIDGE_VAULT_ADDR": "http://ours:8200", "VAULT_ADDR": "http://theirs:8200"},
            [],
            "http://ours:8200",
        ),
        (
            {"VAULT_ADDR": "http://env:8200"},
            ["--vault-addr", "http://flag:8200"],
            "http://flag:8200",
        ),
    ],
)
def test_address_flag_and_environment(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], argv: list[str], addr: str
) -> None:
    for name in ("VAULT_ADDR", "BAO_ADDR", "SECRETS_BRIDGE_VAULT_ADDR"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    parser = argparse.ArgumentParser()
    add_options_flags(parser, "vault", Options)
    options = options_from_args(parser.parse_args(argv), "vault", Options)
    assert options.addr == addr
