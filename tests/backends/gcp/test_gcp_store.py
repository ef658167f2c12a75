"""The gcp backend against a fake Google on the wire: workload identity, reads, errors."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Hashable, Mapping
from pathlib import Path

import grpc
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from backends.gcp.dialect import GcpRef
from backends.gcp.exchange import GSA_ANNOTATION
from provider.core.errors import (
    BridgeError,
    InvalidParameters,
    MissingCredential,
    NotFound,
    PermissionDenied,
    StoreUnavailable,
)
from provider.core.model import Fetched, Pod, SecretValue, StorePlan
from tests.backends.gcp.conftest import STS_AUDIENCE, Stack
from tests.backends.gcp.fake_google import POOL
from tests.helpers import fetch_ctx, make_pod

DB = "projects/proj/secrets/db"
KSA = "ksa:default/app"


def spc(*entries: str) -> dict[str, str]:
    """A `secrets` parameter: one `resourceName` per entry, written to file0, file1, ..."""
    lines = [f"- resourceName: {e}\n  path: file{i}" for i, e in enumerate(entries)]
    return {"secrets": "\n".join(lines)}


async def read(stack: Stack, plan: StorePlan, pod: Pod) -> Mapping[Hashable, Fetched]:
    identity = await stack.backend.identify(plan, pod)
    refs = list(dict.fromkeys(o.ref for o in plan.objects))
    return await stack.backend.fetch(plan, identity, refs, fetch_ctx(6))


def values(result: Fetched) -> SecretValue:
    assert not isinstance(result, BaseException), result
    [value] = result
    return value


async def test_gcp_sts_exchange_carries_pod_token_and_audience(stack: Stack) -> None:
    name = stack.google.add_version(DB, '{"user":"u"}', KSA)
    plan = stack.plan(spc(name))
    got = await read(stack, plan, stack.pod())
    value = values(got[GcpRef(name)])
    assert value.content == b'{"user":"u"}'
    assert value.version == name
    [sts] = stack.google.sts_requests
    assert sts == {
        "grant_type": "urn:ietf:params:oauth:grant-type:token-exchange",
        "audience": STS_AUDIENCE,
        "scope": "https://www.googleapis.com/auth/cloud-platform",
        "requested_token_type": "urn:ietf:params:oauth:token-type:access_token",
        "subject_token": "pod-token-default-app",
        "subject_token_type": "urn:ietf:params:oauth:token-type:jwt",
    }
    # No annotation: the federated token reads directly, no impersonation.
    assert stack.google.iam_requests == []
    assert stack.google.reads == [("global", name, KSA)]


async def test_gcp_impersonates_annotated_service_account(stack: Stack) -> None:
    gsa = "reader@proj.iam.gserviceaccount.com"
    name = stack.google.add_version(DB, "pw", f"gsa:{gsa}")  # only the GSA may read
    pod = stack.pod()
    stack.google.annotations["default/app"] = {
        GSA_ANNOTATION: gsa,
        "iam.gke.io/gcp-service-account-delegates": json.dumps(
            ["mid@proj.iam.gserviceaccount.com"]
        ),
    }
    stack.google.impersonators[gsa] = {KSA}
    got = await read(stack, stack.plan(spc(name)), pod)
    assert values(got[GcpRef(name)]).content == b"pw"
    [iam] = stack.google.iam_requests
    assert iam["gsa"] == gsa and iam["caller"] == KSA
    assert iam["body"]["scope"] == ["https://www.googleapis.com/auth/cloud-platform"]
    assert iam["body"]["delegates"] == [
        "projects/-/serviceAccounts/mid@proj.iam.gserviceaccount.com"
    ]
    assert stack.google.reads[-1][2] == f"gsa:{gsa}"


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


async def test_gcp_regional_names_use_the_regional_endpoint(stack: Stack) -> None:
    regional = "projects/proj/locations/europe-west4/secrets/db"
    name = stack.google.add_version(regional, "eu", KSA)
    global_name = stack.google.add_version(DB, "global", KSA)
    got = await read(stack, stack.plan(spc(name, global_name)), stack.pod())
    assert values(got[GcpRef(name, "europe-west4")]).content == b"eu"
    assert values(got[GcpRef(global_name)]).content == b"global"
    assert sorted(stack.google.reads) == [("global", global_name, KSA), ("regional", name, KSA)]


def test_gcp_regional_endpoint_template(stack: Stack) -> None:
    backend = stack.rebuild(regional_endpoint="secretmanager.{location}.rep.googleapis.com:443")
    ref = GcpRef("projects/p/locations/us-east1/secrets/s/versions/1", "us-east1")
    assert backend._secrets.endpoint(ref) == "secretmanager.us-east1.rep.googleapis.com:443"
    assert backend._secrets.endpoint(GcpRef("projects/p/secrets/s/versions/1")) == (
        stack.options.secretmanager_endpoint
    )


async def test_gcp_latest_resolves_and_rotates(stack: Stack) -> None:
    stack.google.add_version(DB, "one", KSA)
    stack.google.add_version(DB, "two", KSA)
    plan = stack.plan(spc(f"{DB}/versions/latest", f"{DB}/versions/1"))
    pod = stack.pod()
    got = await read(stack, plan, pod)
    latest, first = (
        values(got[GcpRef(f"{DB}/versions/latest")]),
        values(got[GcpRef(f"{DB}/versions/1")]),
    )
    assert (latest.content, latest.version) == (b"two", f"{DB}/versions/2")
    assert (first.content, first.version) == (b"one", f"{DB}/versions/1")
    again = values((await read(stack, plan, pod))[GcpRef(f"{DB}/versions/latest")])
    assert again.version == latest.version  # stable while nothing changes
    stack.google.add_version(DB, "three", KSA)
    rotated = values((await read(stack, plan, pod))[GcpRef(f"{DB}/versions/latest")])
    assert (rotated.content, rotated.version) == (b"three", f"{DB}/versions/3")


async def test_gcp_same_version_twice_is_one_call(stack: Stack) -> None:
    name = stack.google.add_version(DB, '{"a":"1","b":"2"}', KSA)
    plan = stack.plan(
        {
            "secrets": f"- {{resourceName: {name}, path: a, extractJSONKey: a}}\n"
            f"- {{resourceName: {name}, path: b, extractYAMLKey: b}}\n"
        }
    )
    assert plan.objects[0].ref == plan.objects[1].ref
    await read(stack, plan, stack.pod())
    assert len(stack.google.reads) == 1


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


async def test_gcp_one_identity_never_gets_anothers_value(stack: Stack) -> None:
    stack.google.add_version("projects/proj/secrets/a", "alpha", "ksa:team-a/app")
    stack.google.add_version("projects/proj/secrets/b", "beta", "ksa:team-b/app")
    plan = stack.plan(
        spc("projects/proj/secrets/a/versions/1", "projects/proj/secrets/b/versions/1")
    )
    pod_a, pod_b = stack.pod("team-a"), stack.pod("team-b")
    ref_a, ref_b = (
        GcpRef("projects/proj/secrets/a/versions/1"),
        GcpRef("projects/proj/secrets/b/versions/1"),
    )
    # Concurrently, so a shared login or channel would show.
    got_a, got_b = await asyncio.gather(read(stack, plan, pod_a), read(stack, plan, pod_b))
    assert values(got_a[ref_a]).content == b"alpha"
    assert isinstance(got_a[ref_b], PermissionDenied)
    assert values(got_b[ref_b]).content == b"beta"
    assert isinstance(got_b[ref_a], PermissionDenied)
    assert "team-b/app" in str(got_b[ref_a])
    id_a = await stack.backend.identify(plan, pod_a)
    id_b = await stack.backend.identify(plan, pod_b)
    assert id_a.key != id_b.key
    assert "pod-token" not in id_a.key + repr(id_a)
    # Each identity logged in once; the second mounts of each used the cached tokens.
    assert len(stack.google.sts_requests) == 2
    await asyncio.gather(read(stack, plan, pod_a), read(stack, plan, pod_b))
    assert len(stack.google.sts_requests) == 2


async def test_gcp_identity_key_parts(stack: Stack) -> None:
    plan = stack.plan(spc(f"{DB}/versions/1"))
    identity = await stack.backend.identify(plan, stack.pod())
    assert identity.key == f"gcp|pod-adc|{STS_AUDIENCE}|default/app"
    assert identity.subject == "default/app"
    per_pod = stack.rebuild(core={"cache_scope": "pod"})
    one = await per_pod.identify(plan, stack.pod(uid="u1"))
    two = await per_pod.identify(plan, stack.pod(uid="u2"))
    assert one.key.endswith("default/app/pod:u1") and one.key != two.key
    await per_pod.close()


async def test_gcp_no_token_no_answer_even_when_cached(stack: Stack) -> None:
    name = stack.google.add_version(DB, "x", KSA)
    plan = stack.plan(spc(name))
    await read(stack, plan, stack.pod())  # the identity now has a cached access token
    tokenless = make_pod(tokens={"vault": "t"})
    with pytest.raises(MissingCredential) as err:
        await stack.backend.identify(plan, tokenless)
    assert repr(POOL) in str(err.value)
    assert "tokenRequests" in str(err.value)


async def test_gcp_token_cached_until_shortly_before_expiry(stack: Stack) -> None:
    stack.google.lifetime = 2  # seconds: cached for ~1.5 s (a quarter as margin)
    name = stack.google.add_version(DB, "x", KSA)
    plan, pod = stack.plan(spc(name)), stack.pod()
    await read(stack, plan, pod)
    await read(stack, plan, pod)
    assert len(stack.google.sts_requests) == 1
    await asyncio.sleep(1.6)
    await read(stack, plan, pod)
    assert len(stack.google.sts_requests) == 2


async def test_gcp_rejected_token_logs_in_again_once(stack: Stack) -> None:
    name = stack.google.add_version(DB, "x", KSA)
    other = stack.google.add_version("projects/proj/secrets/other", "y", KSA)
    plan, pod = stack.plan(spc(name, other)), stack.pod()
    await read(stack, plan, pod)
    stack.google.revoke_all()
    got = await read(stack, plan, pod)
    assert values(got[GcpRef(name)]).content == b"x"
    assert values(got[GcpRef(other)]).content == b"y"
    # Both readers saw the rejection; they shared one new login.
    assert len(stack.google.sts_requests) == 2


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


async def test_gcp_provider_adc_is_node_identity(
    stack: Stack, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    node = "node@proj.iam.gserviceaccount.com"
    name = stack.google.add_version(DB, "node-value", f"gsa:{node}")
    plan = stack.plan({"auth": "provider-adc", **spc(name)})
    with pytest.raises(PermissionDenied) as err:
        await stack.backend.identify(plan, stack.pod())
    assert "--allow-node-identity-namespaces" in str(err.value)
    assert stack.google.oauth_requests == []
    # The provider's own Application Default Credentials: here a key file whose token_uri is
    # the fake Google, found through GOOGLE_APPLICATION_CREDENTIALS as on a real node.
    adc = tmp_path / "adc.json"
    adc.write_text(service_account_key(f"{stack.http}/oauth2/token", node))
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(adc))
    allowed = stack.rebuild(core={"allow_node_identity_namespaces": frozenset({"default"})})
    pod = make_pod()  # no pod token is needed for node identity
    identity = await allowed.identify(plan, pod)
    assert identity.key == "gcp|provider-adc|default/app"
    got = await allowed.fetch(plan, identity, [GcpRef(name)], fetch_ctx())
    assert values(got[GcpRef(name)]).content == b"node-value"
    assert len(stack.google.oauth_requests) == 1
    assert stack.google.sts_requests == []


def service_account_key(token_uri: str, email: str) -> str:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ).decode()
    return json.dumps(
        {
            "type": "service_account",
            "project_id": "proj",
            "private_key_id": "k1",
            "private_key": pem,
            "client_email": email,
            "client_id": "1",
            "token_uri": token_uri,
        }
    )


async def test_gcp_node_publish_secret_key_json(stack: Stack) -> None:
    email = "keyed@proj.iam.gserviceaccount.com"
    name = stack.google.add_version(DB, "keyed", f"gsa:{email}")
    plan = stack.plan(spc(name))
    key_json = service_account_key(f"{stack.http}/oauth2/token", email)
    pod = make_pod(secrets={"key.json": key_json})  # no pod token needed with a key
    identity = await stack.backend.identify(plan, pod)
    assert identity.key.startswith("gcp|key|cred:")
    assert "PRIVATE" not in identity.key + repr(identity)
    got = await stack.backend.fetch(plan, identity, [GcpRef(name)], fetch_ctx())
    assert values(got[GcpRef(name)]).content == b"keyed"
    assert stack.google.sts_requests == []
    # Upstream refuses a class that also chooses auth explicitly.
    explicit = stack.plan({"auth": "pod-adc", **spc(name)})
    with pytest.raises(InvalidParameters, match="nodePublishSecretRef"):
        await stack.backend.identify(explicit, pod)


@pytest.mark.parametrize(
    ("annotations", "message"),
    [
        ({GSA_ANNOTATION: "x@y/../../v1/other"}, "must be a Google service account email"),
        (
            {
                GSA_ANNOTATION: "r@proj.iam.gserviceaccount.com",
                "iam.gke.io/gcp-service-account-delegates": "not-json",
            },
            "iam.gke.io/gcp-service-account-delegates must be a JSON list",
        ),
    ],
)
async def test_gcp_bad_service_account_annotations(
    stack: Stack, annotations: dict[str, str], message: str
) -> None:
    name = stack.google.add_version(DB, "x", KSA)
    plan, pod = stack.plan(spc(name)), stack.pod()
    stack.google.annotations["default/app"] = annotations
    identity = await stack.backend.identify(plan, pod)
    with pytest.raises(InvalidParameters) as err:
        await stack.backend.fetch(plan, identity, [GcpRef(name)], fetch_ctx())
    assert message in str(err.value) and "default/app" in str(err.value)
    assert stack.google.iam_requests == []


async def test_gcp_debug_logging_never_shows_tokens_or_values(
    stack: Stack, caplog: pytest.LogCaptureFixture
) -> None:
    """The generated client logs metadata and payloads at DEBUG; the backend keeps it quiet."""
    logging.getLogger("google").setLevel(logging.DEBUG)
    caplog.set_level(logging.DEBUG)
    try:
        email = "keyed@proj.iam.gserviceaccount.com"
        name = stack.google.add_version(DB, "s3cret-value", KSA, f"gsa:{email}")
        plan = stack.plan(spc(name))
        await read(stack, plan, stack.pod())
        key_json = service_account_key(f"{stack.http}/oauth2/token", email)
        await read(stack, plan, make_pod(secrets={"key.json": key_json}))
    finally:
        logging.getLogger("google").setLevel(logging.NOTSET)
    assert len(stack.google.reads) == 2
    dumped = " ".join(repr(r.__dict__) for r in caplog.records)
    for secret in ("s3cret-value", "pod-token-default-app", "ya29.fake", "PRIVATE KEY"):
        assert secret not in dumped


async def test_gcp_rollout_logs_in_once_and_reuses_channels(stack: Stack) -> None:
    """Twenty pods of one ServiceAccount starting together: one STS call, one channel each."""
    name = stack.google.add_version(DB, "x", KSA)
    regional = stack.google.add_version("projects/proj/locations/us-east1/secrets/r", "y", KSA)
    plan = stack.plan(spc(name, regional))
    pods = [stack.pod(uid=f"uid-{i}", name=f"app-{i}") for i in range(20)]
    results = await asyncio.gather(*(read(stack, plan, pod) for pod in pods))
    assert all(values(r[GcpRef(name)]).content == b"x" for r in results)
    assert len(stack.google.sts_requests) == 1
    assert len(stack.google.reads) == 40
    assert len(stack.backend._secrets._clients) == 2  # one per endpoint, shared by all
