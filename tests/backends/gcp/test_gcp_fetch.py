"""The gcp backend against a fake Google on the wire: reads, versions, routing, one identity's
values never served to another."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Hashable, Mapping

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from backends.gcp.dialect import GcpRef
from devkit.testing import fetch_ctx, make_pod
from provider.core.errors import PermissionDenied
from provider.core.model import Fetched, Pod, SecretValue, StorePlan
from tests.backends.gcp.conftest import Stack

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
