"""Role chaining (`assumeRoleArn`, issue 36) against moto.

Two servers. One with moto's IAM checks on (`enforce_auth`): signatures, each role's own policy
and, for sts:AssumeRole, the second role's trust policy with its StringEquals sts:ExternalId —
there the second role alone may read the secret, and its trust policy names the first hop's
session. The shared one, through the counting proxy, for what is seen on the wire: the
AssumeRole request's fields and who signed it, the calls each cache saves.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import hashlib
import json
import re
from collections.abc import Iterator

import boto3
import pytest

from devkit.eks import PodIdentityAgent
from devkit.kube import ServiceAccounts
from devkit.moto import CountingProxy, MotoServer, moto_server
from devkit.testing import make_pod
from provider.core.errors import PermissionDenied
from tests.backends.aws.conftest import REGION, ROLE, Harness, MakeHarness, irsa_pod

ACCOUNT = "123456789012"
ROLE_B = f"arn:aws:iam::{ACCOUNT}:role/secrets-reader"
ROLE_C = f"arn:aws:iam::{ACCOUNT}:role/other-reader"
SESSION = "secrets-bridge-default-app"
#: The first hop as STS names it: the session of role `app` that AssumeRoleWithWebIdentity made.
FIRST_HOP = f"arn:aws:sts::{ACCOUNT}:assumed-role/app/{SESSION}"
EXTERNAL_ID = "team-a-7f3c-external"
OBJECTS = "- {objectName: s, objectType: secretsmanager}"
CHAINED = {
    "roleArn": ROLE,
    "assumeRoleArn": ROLE_B,
    "assumeRoleExternalId": EXTERNAL_ID,
    "objects": OBJECTS,
}


def _policy(*statements: dict[str, object]) -> str:
    return json.dumps({"Version": "2012-10-17", "Statement": list(statements)})


@pytest.fixture(scope="module")
def strict_session() -> Iterator[MotoServer]:
    with moto_server() as server:
        yield server


@pytest.fixture
def strict(strict_session: MotoServer) -> Iterator[MotoServer]:
    """Role `app` (the pod's, IRSA) may only assume role B; role B trusts `app`'s session with
    the external id and alone may read the secret. Checked from the second action on: the
    first is the unsigned AssumeRoleWithWebIdentity, which moto's checks cannot take."""
    moto = strict_session
    moto.relax_auth()
    moto.reset()
    iam = moto.client("iam")
    anyone = _policy({"Effect": "Allow", "Principal": {"AWS": "*"}, "Action": "sts:*"})
    iam.create_role(RoleName="app", AssumeRolePolicyDocument=anyone)
    iam.put_role_policy(
        RoleName="app",
        PolicyName="chain",
        PolicyDocument=_policy({"Effect": "Allow", "Action": "sts:AssumeRole", "Resource": ROLE_B}),
    )
    trust = _policy(
        {
            "Effect": "Allow",
            "Principal": {"AWS": FIRST_HOP},
            "Action": "sts:AssumeRole",
            "Condition": {"StringEquals": {"sts:ExternalId": EXTERNAL_ID}},
        }
    )
    iam.create_role(RoleName="secrets-reader", AssumeRolePolicyDocument=trust)
    iam.put_role_policy(
        RoleName="secrets-reader",
        PolicyName="read",
        PolicyDocument=_policy({"Effect": "Allow", "Action": "secretsmanager:*", "Resource": "*"}),
    )
    moto.client("secretsmanager").create_secret(Name="s", SecretString="value")
    moto.enforce_auth(after=1)
    yield moto
    moto.relax_auth()


@pytest.fixture
def seeded(moto: MotoServer) -> MotoServer:
    moto.client("secretsmanager").create_secret(Name="s", SecretString="value")
    return moto


def _caller(moto: MotoServer, harness: Harness, key: str) -> str:
    """The ARN STS names for the credentials cached under `key`."""
    creds = harness.backend._env.credentials.get(key)
    sts = boto3.client(
        "sts",
        region_name=REGION,
        endpoint_url=moto.url,
        aws_access_key_id=creds.access_key_id,
        aws_secret_access_key=creds.secret_access_key,
        aws_session_token=creds.session_token,
    )
    return str(sts.get_caller_identity()["Arn"])


# -- trust enforced (moto's IAM checks) -------------------------------------------------------


async def test_aws_chained_mount_reads_as_the_second_role(
    make_harness: MakeHarness, strict: MotoServer
) -> None:
    h = make_harness(f"{REGION}={strict.url}")
    mounted = await h.mount(CHAINED)
    assert mounted.content("s") == b"value"
    assert _caller(strict, h, mounted.identity.key) == (
        f"arn:aws:sts::{ACCOUNT}:assumed-role/secrets-reader/{SESSION}"
    )
    # The first hop alone (its credentials cached, shared) may not read it: role B did.
    alone = await h.mount({"roleArn": ROLE, "objects": OBJECTS})
    assert isinstance(alone.error("s"), PermissionDenied)


async def test_aws_wrong_external_id_is_refused_and_named(
    make_harness: MakeHarness, strict: MotoServer, caplog: pytest.LogCaptureFixture
) -> None:
    h = make_harness(f"{REGION}={strict.url}")
    with pytest.raises(PermissionDenied) as caught:
        await h.mount({**CHAINED, "assumeRoleExternalId": "not-the-agreed-id"})
    text = str(caught.value)
    assert (
        f"AssumeRole of {ROLE_B}" in text
        and "pod default/app-0 (service account app) as role " + ROLE in text
    )
    assert f"trust policy of {ROLE_B} must allow role {ROLE}" in text
    assert "assumeRoleExternalId" in text and "not-the-agreed-id" not in text
    assert all("not-the-agreed-id" not in r.getMessage() for r in caplog.records)


async def test_aws_second_role_refuses_a_first_hop_it_does_not_trust(
    make_harness: MakeHarness, strict: MotoServer
) -> None:
    h = make_harness(f"{REGION}={strict.url}")
    with pytest.raises(PermissionDenied) as caught:
        await h.mount(CHAINED, irsa_pod(sa="intruder"))  # session ...-default-intruder
    text = str(caught.value)
    assert (
        "pod default/app-0 (service account intruder)" in text
        and f"trust policy of {ROLE_B}" in text
    )
    assert EXTERNAL_ID not in text


# -- on the wire (the shared moto, through the counting proxy) ----------------------------------


async def test_aws_assume_role_request_carries_the_class_chain(
    harness: Harness, seeded: MotoServer, proxy: CountingProxy
) -> None:
    parameters = {
        **CHAINED,
        "assumeRoleDurationSeconds": "900",
        "assumeRoleSessionTags": "{team: payments, env: prod}",
    }
    mounted = await harness.mount(parameters)
    assert mounted.content("s") == b"value"
    (form,) = proxy.forms["AssumeRole"]
    assert form["RoleArn"] == [ROLE_B] and form["RoleSessionName"] == [SESSION]
    assert form["ExternalId"] == [EXTERNAL_ID] and form["DurationSeconds"] == ["900"]
    tags = {form[f"Tags.member.{i}.Key"][0]: form[f"Tags.member.{i}.Value"][0] for i in (1, 2)}
    assert tags == {"env": "prod", "team": "payments"}
    # Signed by the first hop's credentials; the read by the second's.
    cache = harness.backend._env.credentials
    first = cache.get(mounted.identity.credential.base_key)
    second = cache.get(mounted.identity.key)
    assert proxy.signers["AssumeRoleWithWebIdentity"] == [""]
    assert proxy.signers["AssumeRole"] == [first.access_key_id]
    assert proxy.signers["GetSecretValue"] == [second.access_key_id] != [first.access_key_id]
    await harness.mount(parameters)
    assert proxy.counts["AssumeRoleWithWebIdentity"] == proxy.counts["AssumeRole"] == 1


async def test_aws_classes_with_different_chains_share_no_credentials(
    harness: Harness, seeded: MotoServer, proxy: CountingProxy
) -> None:
    classes = [
        CHAINED,
        {**CHAINED, "assumeRoleExternalId": "another-external-id"},
        {**CHAINED, "assumeRoleSessionTags": "{team: payments}"},
        {**CHAINED, "assumeRoleDurationSeconds": "1800"},
        {**CHAINED, "assumeRoleArn": ROLE_C},
    ]
    mounts = [await harness.mount(c) for c in classes]
    keys = {m.identity.key for m in mounts}
    assert len(keys) == len(classes)
    assert all(EXTERNAL_ID not in key for key in keys)
    assert proxy.counts["AssumeRole"] == len(classes)
    assert len(set(proxy.signers["GetSecretValue"])) == len(classes)
    # The first hop is the pod's whatever comes next: logged in once, shared.
    assert proxy.counts["AssumeRoleWithWebIdentity"] == 1
    assert len({m.identity.credential.base_key for m in mounts}) == 1
    for c in classes:
        await harness.mount(c)
    assert proxy.counts["AssumeRole"] == len(classes)


async def test_aws_pod_identity_then_a_second_role(
    make_harness: MakeHarness, seeded: MotoServer, proxy: CountingProxy
) -> None:
    agent = PodIdentityAgent(token="pod-identity-token")
    await agent.start()
    try:
        h = make_harness(
            f"{REGION}={proxy.url}", pod_identity_endpoint=f"{agent.url}/v1/credentials"
        )
        parameters = {"usePodIdentity": "true", "assumeRoleArn": ROLE_B, "objects": OBJECTS}
        pod = make_pod(tokens={"pods.eks.amazonaws.com": "pod-identity-token"})
        mounted = await h.mount(parameters, pod)
        assert mounted.content("s") == b"value"
        assert proxy.signers["AssumeRole"] == ["ASIAPODIDENTITYTEST1"]
        assert "pod-identity:auto" in mounted.identity.key
        assert f"assume:{ROLE_B}#" in mounted.identity.key
        proxy.deny_operations.add("AssumeRole")
        other = make_pod(
            service_account="b", tokens={"pods.eks.amazonaws.com": "pod-identity-token"}
        )
        with pytest.raises(PermissionDenied) as caught:
            await h.mount(parameters, other)
        assert "EKS Pod Identity role of ServiceAccount default/b" in str(caught.value)
    finally:
        await agent.stop()


async def test_aws_node_identity_chains_only_where_node_identity_is_allowed(
    make_harness: MakeHarness,
    seeded: MotoServer,
    proxy: CountingProxy,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIANODEIDENTITY0001")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "node-secret")
    kube = ServiceAccounts({("default", "plain"): {}, ("ops", "plain"): {}})
    await kube.start()
    try:
        h = make_harness(
            f"{REGION}={proxy.url}",
            kube_api_url=kube.url,
            allow_node_identity_namespaces=frozenset({"ops"}),
        )
        parameters = {"assumeRoleArn": ROLE_B, "objects": OBJECTS}
        with pytest.raises(PermissionDenied, match="--allow-node-identity-namespaces"):
            await h.mount(parameters, make_pod(service_account="plain"))
        mounted = await h.mount(parameters, make_pod(namespace="ops", service_account="plain"))
    finally:
        await kube.stop()
    assert mounted.content("s") == b"value"
    assert proxy.signers["AssumeRole"] == ["AKIANODEIDENTITY0001"]
    assert mounted.identity.key.endswith("|ops/plain") and "|node|assume:" in mounted.identity.key


async def test_aws_chained_credentials_are_renewed_before_they_expire(
    harness: Harness, seeded: MotoServer, proxy: CountingProxy
) -> None:
    # STS grants at least 15 minutes: the answer is edited on the wire to expire in 2 s.
    def soon(body: bytes) -> bytes:
        when = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=2)
        stamp = when.strftime("%Y-%m-%dT%H:%M:%S.%fZ").encode()
        return re.sub(
            rb"<Expiration>[^<]*</Expiration>", b"<Expiration>%s</Expiration>" % stamp, body
        )

    proxy.rewrite["AssumeRole"] = soon
    await harness.mount(CHAINED)
    await harness.mount(CHAINED)
    assert proxy.counts["AssumeRole"] == 1
    await asyncio.sleep(2.0)
    await harness.mount(CHAINED)
    assert proxy.counts["AssumeRole"] == 2
    assert proxy.counts["AssumeRoleWithWebIdentity"] == 1  # the first hop lives an hour


async def test_aws_stale_first_hop_is_renewed_once_for_the_second(
    harness: Harness, seeded: MotoServer, proxy: CountingProxy
) -> None:
    proxy.inject["AssumeRole"].append((400, "ExpiredToken"))
    mounted = await harness.mount(CHAINED)
    assert mounted.content("s") == b"value"
    assert proxy.counts["AssumeRoleWithWebIdentity"] == proxy.counts["AssumeRole"] == 2


async def test_aws_refused_second_role_names_what_to_fix(
    harness: Harness, seeded: MotoServer, proxy: CountingProxy, caplog: pytest.LogCaptureFixture
) -> None:
    proxy.deny_operations.add("AssumeRole")
    with pytest.raises(PermissionDenied) as caught:
        await harness.mount({**CHAINED, "assumeRoleSessionTags": "{team: payments}"})
    text = str(caught.value)
    pod = "pod default/app-0 (service account app)"
    assert f"AssumeRole of {ROLE_B} in {REGION} ({pod} as role {ROLE})" in text
    assert "sts:AssumeRole and sts:TagSession" in text
    assert f"role {ROLE} needs sts:AssumeRole on {ROLE_B}" in text
    # The external id's digest, to compare with the trust policy's, never the value.
    assert hashlib.sha256(EXTERNAL_ID.encode()).hexdigest()[:12] in text
    assert EXTERNAL_ID not in text
    assert all(EXTERNAL_ID not in r.getMessage() for r in caplog.records)
    assert proxy.counts["GetSecretValue"] == 0
