"""failoverRegion against two real moto servers: transient failures fail over, 4xx do not."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from devkit.moto import CountingProxy, MotoServer
from devkit.ports import closed_url
from provider.core.errors import NotFound, StoreUnavailable
from tests.backends.aws.conftest import FAILOVER, REGION, ROLE, MakeHarness

OBJECTS = """
- objectName: app/db
  objectType: secretsmanager
  objectAlias: db
  failoverObject: {objectName: app/db-replica}
- {objectName: /app/flag, objectType: ssmparameter, objectAlias: flag}
"""
PARAMETERS = {
    "region": REGION,
    "failoverRegion": FAILOVER,
    "roleArn": ROLE,
    "objects": OBJECTS,
}


def seed(moto: MotoServer, region: str, suffix: str) -> None:
    name = "app/db" if region == REGION else "app/db-replica"
    moto.client("secretsmanager", region).create_secret(Name=name, SecretString=f"db-{suffix}")
    moto.client("ssm", region).put_parameter(
        Name="/app/flag", Value=f"flag-{suffix}", Type="String"
    )


@pytest.fixture
async def replica(moto2: MotoServer) -> AsyncIterator[CountingProxy]:
    seed(moto2, FAILOVER, "replica")
    proxy = CountingProxy(moto2.url)
    await proxy.start()
    yield proxy
    await proxy.stop()


async def test_aws_failover_when_the_primary_is_down(
    make_harness: MakeHarness, replica: CountingProxy
) -> None:
    h = make_harness(f"{REGION}={closed_url()},{FAILOVER}={replica.url}")
    mounted = await h.mount(PARAMETERS)
    assert mounted.content("db") == b"db-replica"
    assert mounted.content("flag") == b"flag-replica"
    # STS failed over too: the primary region's STS was as unreachable as the rest.
    assert replica.counts["AssumeRoleWithWebIdentity"] == 1
    assert replica.counts["GetSecretValue"] == 1
    assert replica.counts["GetParameters"] == 1


async def test_aws_failover_on_server_errors(
    make_harness: MakeHarness, moto: MotoServer, proxy: CountingProxy, replica: CountingProxy
) -> None:
    seed(moto, REGION, "primary")
    h = make_harness(f"{REGION}={proxy.url},{FAILOVER}={replica.url}")
    assert (await h.mount(PARAMETERS)).content("db") == b"db-primary"
    proxy.unavailable = True
    mounted = await h.mount(PARAMETERS)
    assert mounted.content("db") == b"db-replica"
    assert mounted.content("flag") == b"flag-replica"


async def test_aws_client_errors_in_the_primary_are_not_masked(
    make_harness: MakeHarness, moto: MotoServer, proxy: CountingProxy, replica: CountingProxy
) -> None:
    # Nothing seeded in the primary: NotFound there is the answer, even though the replica has it.
    h = make_harness(f"{REGION}={proxy.url},{FAILOVER}={replica.url}")
    mounted = await h.mount(PARAMETERS)
    for name in ("db", "flag"):
        error = mounted.error(name)
        assert isinstance(error, NotFound) and REGION in str(error)
    assert replica.counts["GetSecretValue"] == 0
    assert replica.counts["GetParameters"] == 0


async def test_aws_both_regions_down_is_unavailable_naming_both(
    make_harness: MakeHarness, moto: MotoServer, proxy: CountingProxy, replica: CountingProxy
) -> None:
    seed(moto, REGION, "primary")
    h = make_harness(f"{REGION}={proxy.url},{FAILOVER}={replica.url}")
    await h.mount(PARAMETERS)  # logged in while STS answered
    proxy.unavailable = replica.unavailable = True
    mounted = await h.mount(PARAMETERS, seconds=1.5)
    for name in ("db", "flag"):
        error = mounted.error(name)
        assert isinstance(error, StoreUnavailable)
        assert REGION in str(error) and FAILOVER in str(error)
    # Retried within a third of the deadline, not once per SDK default.
    assert 1 <= replica.counts["GetSecretValue"] <= 6
