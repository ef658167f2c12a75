"""The gcp backend's failures: denials and missing secrets named with resource and identity, gRPC
status codes mapped to our errors, retries of transient ones, no SDK exception escaping."""

from __future__ import annotations

import grpc
import pytest

from backends.clouds.names import GSA_ANNOTATION
from backends.gcp.dialect import GcpRef
from devkit.google import POOL
from devkit.testing import fetch_ctx, make_pod
from provider.core.errors import (
    BridgeError,
    InvalidParameters,
    NotFound,
    PermissionDenied,
    StoreUnavailable,
)
from tests.backends.gcp.conftest import STS_AUDIENCE, Stack
from tests.backends.gcp.test_gcp_fetch import DB, KSA, read, spc, values


async def test_gcp_impersonation_refused_names_the_fix(stack: Stack) -> None:
    gsa = "reader@proj.iam.gserviceaccount.com"
    name = stack.google.add_version(DB, "pw", f"gsa:{gsa}")
    pod = stack.pod()
    stack.google.annotations["default/app"] = {GSA_ANNOTATION: gsa}
    plan = stack.plan(spc(name))
    identity = await stack.backend.identify(plan, pod)
    with pytest.raises(PermissionDenied) as err:
        await stack.backend.fetch(plan, identity, [GcpRef(name)], fetch_ctx())
    text = str(err.value)
    assert gsa in text and "default/app" in text and "roles/iam.workloadIdentityUser" in text
    assert "ya29" not in text and "pod-token" not in text


async def test_gcp_denied_and_not_found_name_resource_and_identity(stack: Stack) -> None:
    denied = stack.google.add_version(DB, "x", "ksa:other/app")
    stack.google.add_version("projects/proj/secrets/mine", "m", KSA)
    missing = "projects/proj/secrets/mine/versions/9"
    plan = stack.plan(spc(denied, missing))
    got = await read(stack, plan, stack.pod())
    deny, gone = got[GcpRef(denied)], got[GcpRef(missing)]
    assert isinstance(deny, PermissionDenied)
    assert denied in str(deny) and "default/app" in str(deny)
    assert "roles/secretmanager.secretAccessor" in str(deny)
    assert isinstance(gone, NotFound)
    assert missing in str(gone)
    for err in (deny, gone):
        assert "ya29" not in str(err) and "pod-token" not in str(err)


async def test_gcp_transient_failures_are_retried(stack: Stack) -> None:
    name = stack.google.add_version(DB, "x", KSA)
    stack.google.failures[name] = [grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED]
    stack.google.sts_failures = [503]
    got = await read(stack, stack.plan(spc(name)), stack.pod())
    assert values(got[GcpRef(name)]).content == b"x"
    assert len(stack.google.reads) == 3
    assert len(stack.google.sts_requests) == 2


@pytest.mark.parametrize(
    ("code", "kind"),
    [
        (grpc.StatusCode.UNAVAILABLE, StoreUnavailable),
        (grpc.StatusCode.DEADLINE_EXCEEDED, StoreUnavailable),
        (grpc.StatusCode.FAILED_PRECONDITION, NotFound),
        (grpc.StatusCode.INVALID_ARGUMENT, InvalidParameters),
        (grpc.StatusCode.UNIMPLEMENTED, StoreUnavailable),
        (grpc.StatusCode.DATA_LOSS, StoreUnavailable),
    ],
)
async def test_gcp_status_codes_map_to_our_errors(
    stack: Stack, code: grpc.StatusCode, kind: type[BridgeError]
) -> None:
    name = stack.google.add_version(DB, "x", KSA)
    stack.google.failures[name] = [code] * 20
    plan, pod = stack.plan(spc(name)), stack.pod()
    identity = await stack.backend.identify(plan, pod)
    got = await stack.backend.fetch(plan, identity, [GcpRef(name)], fetch_ctx(0.9))
    err = got[GcpRef(name)]
    assert type(err) is kind, err
    assert name in str(err) and code.name in str(err) and "default/app" in str(err)


async def test_gcp_no_sdk_exception_escapes(stack: Stack) -> None:
    """Unreachable Secret Manager, STS and Kubernetes API: only our errors come out."""
    name = stack.google.add_version(DB, "x", KSA)
    plan, pod = stack.plan(spc(name)), stack.pod()
    dead = stack.rebuild(secretmanager_endpoint="127.0.0.1:9")
    identity = await dead.identify(plan, pod)
    got = await dead.fetch(plan, identity, [GcpRef(name)], fetch_ctx(0.9))
    assert isinstance(got[GcpRef(name)], StoreUnavailable)
    await dead.close()

    no_sts = stack.rebuild(sts_endpoint="http://127.0.0.1:9/v1/token")
    with pytest.raises(StoreUnavailable):
        await no_sts.fetch(plan, await no_sts.identify(plan, pod), [GcpRef(name)], fetch_ctx(0.9))
    await no_sts.close()

    garbage = stack.rebuild(
        sts_endpoint=f"{stack.http}/api/v1/namespaces/default/serviceaccounts/app"
    )
    with pytest.raises(BridgeError):
        await garbage.fetch(plan, await garbage.identify(plan, pod), [GcpRef(name)], fetch_ctx(0.9))
    await garbage.close()

    stack.google.annotations.pop("default/app")  # the ServiceAccount is gone (HTTP 404)
    fresh = stack.rebuild()
    with pytest.raises(BridgeError):
        await fresh.fetch(plan, await fresh.identify(plan, pod), [GcpRef(name)], fetch_ctx(0.9))
    await fresh.close()


async def test_gcp_sts_refusal_names_audience_and_fix(stack: Stack) -> None:
    name = stack.google.add_version(DB, "x", KSA)
    plan = stack.plan(spc(name))
    pod = make_pod(tokens={POOL: "a-token-sts-does-not-know"})
    identity = await stack.backend.identify(plan, pod)
    with pytest.raises(PermissionDenied) as err:
        await stack.backend.fetch(plan, identity, [GcpRef(name)], fetch_ctx())
    text = str(err.value)
    assert STS_AUDIENCE in text and "default/app" in text and "--gcp-cluster" in text
    assert "a-token-sts-does-not-know" not in text
