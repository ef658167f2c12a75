"""`secrets-bridge watch` with an SQS source (moto) and the API-server fake: the Lease holder
publishes the queue's events into the feed and deletes them only then; its standby, cut off
from nothing, takes over when the holder can no longer reach the API server, and no change is
lost (a batch may come twice)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from devkit.kubeapi import KubeApi, eventually
from devkit.moto import MotoServer
from devkit.ports import free_port
from provider.core.changes import parse_health, parse_records
from provider.watch.run import SourceSpec, WatchSettings, watch
from tests.backends.aws.test_aws_changes import left, parameter_change, send

pytestmark = pytest.mark.timeout(60)

NS = "secrets-bridge"
CONFIGMAPS = f"/api/v1/namespaces/{NS}/configmaps"


def settings(kube: KubeApi, token_file: Path, moto: MotoServer, queue: str, i: int) -> Any:
    # A short visibility timeout: a batch the cut-off holder received but could not publish
    # comes back after it (60 s by default, docs/change-feed.md).
    spec = SourceSpec(
        "aws",
        {
            "queue_url": queue,
            "region": "us-east-1",
            "endpoint": moto.url,
            "wait": 1,
            "visibility": 3,
        },
    )
    return WatchSettings(
        namespace=NS,
        identity=f"watch-{i}",
        sources=(spec,),
        heartbeat=0.5,
        metrics_address=f"127.0.0.1:{free_port()}",
        kube_api_url=kube.url,
        kube_api_token_file=str(token_file),
        lease_duration=3.0,
        renew_deadline=2.0,
        retry_period=0.5,
    )


def names(kube: KubeApi) -> list[str]:
    found = kube.object(CONFIGMAPS, "secrets-bridge-feed-aws-us-east-1")
    if found is None:
        return []
    return [name for _seq, name, _marker in parse_records(found["data"]).records]


@pytest.fixture(autouse=True)
def sdk_credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")


async def test_the_holder_publishes_then_deletes_and_a_takeover_loses_nothing(
    moto: MotoServer, tmp_path: Path
) -> None:
    queue: str = moto.client("sqs").create_queue(QueueName="feed")["QueueUrl"]
    kube = await KubeApi().start()
    tokens = []
    for i in range(2):  # one token per replica, so one can be cut off alone
        token = f"replica-{i}"
        kube.tokens.add(token)
        tokens.append(tmp_path / f"token-{i}")
        tokens[-1].write_text(token)
    stops = [asyncio.Event(), asyncio.Event()]
    tasks = [
        asyncio.create_task(watch(settings(kube, tokens[i], moto, queue, i), stop=stops[i]))
        for i in range(2)
    ]
    try:
        send(moto, queue, parameter_change("/app/db"))
        await eventually(lambda: names(kube) == ["ssm:app/db"], 15)
        await eventually(lambda: left(moto, queue) == 0, 5)
        health = parse_health(kube.object(CONFIGMAPS, "secrets-bridge-feed-health")["data"])
        assert health.sources["aws-us-east-1"].up
        assert health.sources["aws-us-east-1"].scopes == frozenset({"us-east-1"})
        lease = kube.object(
            f"/apis/coordination.k8s.io/v1/namespaces/{NS}/leases", "secrets-bridge-watch"
        )
        holder = int(lease["spec"]["holderIdentity"].rsplit("-", 1)[1])

        # The holder loses the API server (as a partition would): it stops leading by its
        # renew deadline, the standby takes the Lease after its duration, and what is sent
        # meanwhile is published by the new holder (the old one may still have received it,
        # but cannot publish it, so it never deletes it).
        kube.tokens.discard(f"replica-{holder}")
        send(moto, queue, parameter_change("/app/api-key"), parameter_change("/app/cert"))
        await eventually(lambda: {"ssm:app/api-key", "ssm:app/cert"} <= set(names(kube)), 30)
        await eventually(lambda: left(moto, queue) == 0, 15)
        lease = kube.object(
            f"/apis/coordination.k8s.io/v1/namespaces/{NS}/leases", "secrets-bridge-watch"
        )
        assert lease["spec"]["holderIdentity"] == f"watch-{1 - holder}"
        records = parse_records(
            kube.object(CONFIGMAPS, "secrets-bridge-feed-aws-us-east-1")["data"]
        )
        assert records.seq >= 3
        assert json.dumps(records.encode()).count("testing") == 0
    finally:
        for stop in stops:
            stop.set()
        kube.tokens.update(f"replica-{i}" for i in range(2))
        await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 15)
        await kube.close()
