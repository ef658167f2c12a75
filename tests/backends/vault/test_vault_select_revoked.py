"""Issue 40 item 4, against the real OpenBao and the served provider as the driver calls it:
`read` revoked on one selected secret while `list` is kept. A listing proves permission to list,
never to read, so past the window the operator or the class chose for cached values no pod gets
the secret (with the defaults, `--cache-ttl 0`: the very next pod); within a class's
`refreshInterval` the selection cached for the identity is reused as any cached value is."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml

from backends.vault.options import Options
from devkit.openbao import OpenBao
from devkit.serving import serving
from devkit.testing import driver_request
from devkit.tokens import SigningKey
from provider.core.settings import CoreSettings

ROLE = "rev40"
GRANTS = """
path "secret/data/rev40/*" { capabilities = ["read"] }
path "secret/metadata/rev40/*" { capabilities = ["list"] }
path "secret/detailed-metadata/rev40/*" { capabilities = ["list"] }
"""


def revoke(openbao: OpenBao, folder: str) -> None:
    """`read` on the folder's `one` denied; `list` (plain and detailed) kept."""
    deny = f'path "secret/data/rev40/{folder}/one" {{ capabilities = ["deny"] }}\n'
    openbao.put_policy(ROLE, GRANTS + deny)


@pytest.fixture
def role(openbao: OpenBao) -> Iterator[None]:
    openbao.put_policy(ROLE, GRANTS)
    openbao.add_jwt_role("jwt", ROLE, namespace="default", service_account=ROLE, policies=[ROLE])
    yield
    openbao.put_policy(ROLE, GRANTS)


def request(key: SigningKey, folder: str, pod: str, **params: str) -> Any:
    selector = {"path": f"secret/rev40/{folder}", "directory": "d"}
    parameters = {
        "backend": "vault",
        "roleName": ROLE,
        "vaultAuthMountPath": "jwt",
        "select": yaml.safe_dump([selector]),
        **params,
    }
    token = key.pod_token("default", ROLE, pod=pod)
    return driver_request(parameters, tokens={"vault": token}, service_account=ROLE, pod=pod)


async def files(stub: Any, req: Any) -> dict[str, bytes]:
    reply = await stub.Mount(req, timeout=20)
    return {f.path: f.contents for f in reply.files}


def seed(openbao: OpenBao, folder: str) -> None:
    openbao.kv2_put("secret", f"rev40/{folder}/one", {"pw": f"one-secret-{folder}"})
    openbao.kv2_put("secret", f"rev40/{folder}/two", {"pw": f"two-secret-{folder}"})


async def test_a_revoked_read_is_refused_to_the_next_pod_with_the_default_flags(
    openbao: OpenBao, signing_key: SigningKey, tmp_path: Path, role: None
) -> None:
    seed(openbao, "a")
    options = {"vault": Options(addr=openbao.addr)}
    async with serving(tmp_path, backend_options=options, core=CoreSettings()) as served:
        assert set(await files(served.stub, request(signing_key, "a", "p0"))) == {"d/one", "d/two"}
        revoke(openbao, "a")
        openbao.audit_mark()
        for pod in ("p1", "p2", "p3"):  # new pods of the same identity
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await served.stub.Mount(request(signing_key, "a", pod), timeout=20)
            assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
            assert "one-secret" not in (refused.value.details() or "")
        # Each was refused by OpenBao at a read the pod's identity made, not from memory: the
        # unchanged listing, then the read of every listed secret (twice for the refused one:
        # on a 403 the store logs in again once and retries).
        counts = openbao.audit_counts()
        assert counts[("read", "secret/data/rev40/a/one")] == 2 * 3
        assert counts[("list", "secret/detailed-metadata/rev40/a/")] == 3


async def test_within_the_class_refresh_interval_the_selection_is_reused_then_refused(
    openbao: OpenBao, signing_key: SigningKey, tmp_path: Path, role: None
) -> None:
    seed(openbao, "b")
    options = {"vault": Options(addr=openbao.addr)}
    core = CoreSettings(min_refresh_interval=0.0)
    window = {"refreshInterval": "2s"}
    async with serving(tmp_path, backend_options=options, core=core) as served:
        first = await files(served.stub, request(signing_key, "b", "p0", **window))
        assert set(first) == {"d/one", "d/two"}
        started = time.monotonic()
        revoke(openbao, "b")
        openbao.audit_mark()
        # Within the window the class chose: the identity's cached selection, no store call.
        assert await files(served.stub, request(signing_key, "b", "p1", **window)) == first
        assert time.monotonic() - started < 2.0, "the machine was too slow for the window"
        assert openbao.audit_counts() == {}
        time.sleep(max(0.0, 2.1 - (time.monotonic() - started)))
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await served.stub.Mount(request(signing_key, "b", "p2", **window), timeout=20)
        assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
