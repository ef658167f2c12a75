"""AWS's change source against moto_server: EventBridge rules routing to SQS, the documented
event shapes sent straight to the queue, publish-then-delete, and the dialect's subjects."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
import yaml

from backends.aws import dialect
from backends.aws.changes import (
    LABEL_UPDATED,
    MAX_BATCH,
    RULE_PATTERNS,
    QueueSource,
    change_of,
    create,
)
from backends.aws.options import Options
from devkit.feeds import RecordingFeed
from devkit.moto import ACCOUNT, CountingProxy, MotoServer
from devkit.ports import free_port
from provider.core.changes import Change, Subject
from provider.core.model import ParseContext
from provider.core.parsing import Problems
from tests.backends.aws.conftest import REGION

Event = dict[str, Any]
SM_ARN = f"arn:aws:secretsmanager:{REGION}:{ACCOUNT}:secret:app/db-AbC123"


def cloudtrail(name: str, secret_id: str, *, key: str = "secretId", **detail: Any) -> Event:
    """A Secrets Manager API call as CloudTrail hands it to EventBridge (values are never in it)."""
    return {
        "version": "0",
        "id": f"ct-{name}",
        "detail-type": "AWS API Call via CloudTrail",
        "source": "aws.secretsmanager",
        "account": ACCOUNT,
        "time": "2026-12-03T16:00:00Z",
        "region": REGION,
        "resources": [],
        "detail": {
            "eventVersion": "1.08",
            "eventSource": "secretsmanager.amazonaws.com",
            "eventName": name,
            "awsRegion": REGION,
            "requestParameters": {key: secret_id},
            "responseElements": None,
            "readOnly": False,
            "eventType": "AwsApiCall",
            **detail,
        },
    }


def label_updated(name: str) -> Event:
    return {
        "version": "0",
        "id": "label-1",
        "detail-type": LABEL_UPDATED,
        "source": "aws.secretsmanager",
        "account": ACCOUNT,
        "time": "2026-12-03T16:00:00Z",
        "region": REGION,
        "resources": [f"arn:aws:secretsmanager:{REGION}:{ACCOUNT}:secret:{name}-a1b2c3"],
        "detail": {"name": name, "labelUpdated": "AWSCURRENT", "versionId": "v-2"},
    }


def parameter_change(name: str, operation: str = "Update") -> Event:
    return {
        "version": "0",
        "id": f"ssm-{operation}",
        "detail-type": "Parameter Store Change",
        "source": "aws.ssm",
        "account": ACCOUNT,
        "time": "2026-12-03T16:00:00Z",
        "region": REGION,
        "resources": [f"arn:aws:ssm:{REGION}:{ACCOUNT}:parameter/{name.lstrip('/')}"],
        "detail": {"operation": operation, "name": name, "type": "SecureString"},
    }


@pytest.fixture(autouse=True)
def sdk_credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    """The watcher's own chain: here, moto's test keys in the environment."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.delenv("AWS_SESSION_TOKEN", raising=False)


@pytest.fixture
def queue(moto: MotoServer) -> str:
    url: str = moto.client("sqs").create_queue(QueueName="changes")["QueueUrl"]
    return url


Running = Callable[..., Awaitable[tuple[QueueSource, RecordingFeed]]]


@pytest.fixture
async def running(moto: MotoServer) -> AsyncIterator[Running]:
    """start(queue_url, feed, until, **create kwargs): runs a source until `until(feed)` holds."""
    started: list[tuple[QueueSource, asyncio.Task[None]]] = []

    async def start(
        queue_url: str,
        feed: RecordingFeed,
        until: Callable[[RecordingFeed], bool],
        *,
        seconds: float = 8.0,
        **kwargs: Any,
    ) -> tuple[QueueSource, RecordingFeed]:
        kwargs.setdefault("endpoint", moto.url)
        source = create(queue_url=queue_url, region=REGION, wait=1, **kwargs)
        task = asyncio.create_task(source.run(feed))
        started.append((source, task))
        async with asyncio.timeout(seconds):
            while not until(feed):
                await asyncio.sleep(0.05)
        return source, feed

    yield start
    for source, task in started:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await source.close()


def send(moto: MotoServer, queue_url: str, *bodies: Any) -> None:
    sqs = moto.client("sqs")
    for body in bodies:
        text = body if isinstance(body, str) else json.dumps(body)
        sqs.send_message(QueueUrl=queue_url, MessageBody=text)


def left(moto: MotoServer, queue_url: str) -> int:
    attributes = moto.client("sqs").get_queue_attributes(
        QueueUrl=queue_url,
        AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"],
    )["Attributes"]
    return int(attributes["ApproximateNumberOfMessages"]) + int(
        attributes["ApproximateNumberOfMessagesNotVisible"]
    )


async def test_aws_eventbridge_rules_route_the_documented_events_to_the_queue(
    moto: MotoServer, queue: str, running: Running
) -> None:
    # moto's PutEvents matches each rule's pattern and sends the event to its SQS target (it
    # accepts the aws.* sources that real EventBridge keeps for AWS's own services).
    events = moto.client("events")
    queue_arn = moto.client("sqs").get_queue_attributes(
        QueueUrl=queue, AttributeNames=["QueueArn"]
    )["Attributes"]["QueueArn"]
    for index, pattern in enumerate(RULE_PATTERNS):
        events.put_rule(Name=f"secrets-bridge-{index}", EventPattern=json.dumps(pattern))
        events.put_targets(Rule=f"secrets-bridge-{index}", Targets=[{"Id": "q", "Arn": queue_arn}])
    sent = [
        cloudtrail("PutSecretValue", SM_ARN),
        cloudtrail("GetSecretValue", "app/read-only"),  # no rule matches it
        label_updated("app/rotated"),
        parameter_change("/app/config/url"),
    ]
    entries = [
        {
            "Source": event["source"],
            "DetailType": event["detail-type"],
            "Detail": json.dumps(event["detail"]),
        }
        for event in sent
    ]
    assert not events.put_events(Entries=entries).get("FailedEntryCount")

    source, feed = await running(
        queue, RecordingFeed(), lambda f: len(f.names) == 3 and not left(moto, queue)
    )

    assert sorted(feed.names) == ["sm:app/db", "sm:app/rotated", "ssm:app/config/url"]
    assert {change.scope for batch in feed.batches for change in batch} == {REGION}
    assert feed.ups >= 1 and not feed.downs
    assert source.skips.count == 0
    assert left(moto, queue) == 0


@pytest.mark.parametrize(
    ("event", "name"),
    [
        (cloudtrail("PutSecretValue", "app/db"), "sm:app/db"),
        (cloudtrail("UpdateSecret", SM_ARN), "sm:app/db"),
        (cloudtrail("RotateSecret", SM_ARN), "sm:app/db"),
        (cloudtrail("DeleteSecret", "app/db"), "sm:app/db"),
        (cloudtrail("RestoreSecret", "app/db"), "sm:app/db"),
        (cloudtrail("UpdateSecretVersionStage", SM_ARN), "sm:app/db"),
        (cloudtrail("CancelRotateSecret", "app/db"), "sm:app/db"),
        (cloudtrail("TagResource", SM_ARN), "sm:app/db"),
        (cloudtrail("CreateSecret", "app/new", key="name"), "sm:app/new"),
        (label_updated("app/db"), "sm:app/db"),
        (parameter_change("/app/config/url", "Create"), "ssm:app/config/url"),
        (parameter_change("plain", "Delete"), "ssm:plain"),
        (parameter_change("/app/config/url", "LabelParameterVersion"), "ssm:app/config/url"),
    ],
    ids=lambda value: (
        value["detail"].get("eventName") or value["detail-type"]
        if isinstance(value, dict)
        else value
    ),
)
async def test_aws_each_documented_event_sent_to_the_queue_names_its_secret(
    moto: MotoServer, queue: str, running: Running, event: Event, name: str
) -> None:
    send(moto, queue, event)
    _, feed = await running(queue, RecordingFeed(), lambda f: bool(f.batches))
    assert feed.batches == [[Change("aws", REGION, name, event["id"])]]


async def test_aws_publish_that_raises_leaves_the_batch_for_redelivery(
    moto: MotoServer, queue: str, running: Running
) -> None:
    send(moto, queue, cloudtrail("PutSecretValue", "app/db"), "not json at all")
    source, feed = await running(
        queue, RecordingFeed(refuse=1), lambda f: f.attempts >= 1, visibility=2
    )
    async with asyncio.timeout(2):
        while not source.counts.acknowledged:
            await asyncio.sleep(0.02)
    # The change stays in the queue (hidden for the visibility timeout); the bad one is gone.
    assert feed.batches == [] and source.counts.publish_failures == 1
    assert source.skips.count == source.counts.acknowledged == 1
    assert left(moto, queue) == 1

    # Once the visibility timeout ends, SQS delivers it again and this publish goes through.
    async with asyncio.timeout(8):
        while not feed.batches or left(moto, queue):
            await asyncio.sleep(0.1)
    assert feed.names == ["sm:app/db"]


async def test_aws_messages_that_are_no_event_are_deleted_and_counted(
    moto: MotoServer, queue: str, running: Running, caplog: pytest.LogCaptureFixture
) -> None:
    deep = "[" * 5000 + "]" * 5000
    bodies = [
        "x" * 100 + "not json",
        deep,
        json.dumps(["an", "array"]),
        json.dumps({"detail-type": "Parameter Store Change", "source": "aws.ssm"}),
        json.dumps(parameter_change("/app/db") | {"region": 7}),
        json.dumps({**parameter_change("/app/db"), "detail": {"operation": "Update"}}),
        json.dumps(cloudtrail("PutSecretValue", "app/db", requestParameters=None)),
    ]
    quiet = [
        cloudtrail("PutSecretValue", "app/denied", errorCode="AccessDenied"),
        cloudtrail("DescribeSecret", "app/db"),
        parameter_change("/app/db") | {"region": "eu-west-1"},  # not a region of the source
        {"detail-type": "Something", "source": "aws.ec2", "region": REGION, "detail": {}},
    ]
    send(moto, queue, *bodies, *quiet, parameter_change("/app/after"))
    source, _ = await running(
        queue, RecordingFeed(), lambda f: f.names == ["ssm:app/after"] and not left(moto, queue)
    )
    # The deletes are counted once DeleteMessageBatch returned, after the queue is empty.
    async with asyncio.timeout(5):
        while source.counts.acknowledged < len(bodies) + len(quiet) + 1:
            await asyncio.sleep(0.05)
    assert source.skips.count == 7 and source.counts.ignored == len(quiet)
    assert source.counts.acknowledged == len(bodies) + len(quiet) + 1
    lines = [r.getMessage() for r in caplog.records if "not EventBridge events" in r.getMessage()]
    assert len(lines) == 1  # one line a minute, whatever the number
    assert "not json" not in lines[0] and "app/db" not in lines[0]


async def test_aws_a_flood_is_read_in_bounded_batches(
    moto: MotoServer, queue: str, running: Running
) -> None:
    sqs = moto.client("sqs")
    events = [parameter_change(f"/flood/{i}") for i in range(35)]
    for start in range(0, len(events), 10):
        sqs.send_message_batch(
            QueueUrl=queue,
            Entries=[
                {"Id": str(i), "MessageBody": json.dumps(event)}
                for i, event in enumerate(events[start : start + 10])
            ],
        )
    send(moto, queue, *[parameter_change("/flood/0")] * 3)  # repeats of one parameter
    source, feed = await running(queue, RecordingFeed(), lambda f: not left(moto, queue))
    assert all(0 < len(batch) <= MAX_BATCH for batch in feed.batches)
    assert set(feed.names) == {f"ssm:flood/{i}" for i in range(35)}
    assert source.counts.messages == 38 and source.counts.receives >= 4


async def test_aws_a_queue_that_does_not_answer_is_down(queue: str, running: Running) -> None:
    closed = f"http://127.0.0.1:{free_port()}"
    _, feed = await running(
        queue, RecordingFeed(), lambda f: len(f.downs) >= 2, endpoint=closed, backoff=(0.05, 0.1)
    )
    assert feed.ups == 0 and "unreachable" in feed.downs[0] and "changes" in feed.downs[0]


async def test_aws_a_queue_that_does_not_exist_is_down(moto: MotoServer, running: Running) -> None:
    missing = f"{moto.url}/{ACCOUNT}/no-such-queue"
    _, feed = await running(missing, RecordingFeed(), lambda f: bool(f.downs), backoff=(0.05, 0.1))
    assert feed.ups == 0 and "no-such-queue" in feed.downs[0]


async def test_aws_a_queue_the_watcher_may_not_read_is_down(
    queue: str, proxy: CountingProxy, running: Running
) -> None:
    proxy.deny_operations.add("ReceiveMessage")
    _, feed = await running(
        queue, RecordingFeed(), lambda f: bool(f.downs), endpoint=proxy.url, backoff=(0.05, 0.1)
    )
    assert feed.ups == 0 and "denied" in feed.downs[0] and "sqs:ReceiveMessage" in feed.downs[0]


def _subject(objects: str = "", select: str = "") -> Subject:
    plan = dialect.parse(
        {"region": REGION, "objects": objects}, ParseContext(Options(REGION), selects=bool(select))
    )
    if not select:
        (ref,) = {spec.ref for spec in plan.objects}
        return dialect.subject(plan.store, ref)
    problems = Problems()
    found = dialect.selection(yaml.safe_load(select)[0], plan.store, 10, "select[0]", problems)
    problems.raise_if_any()
    assert found is not None
    return dialect.subject(plan.store, found)


@pytest.mark.parametrize(
    ("objects", "event"),
    [
        (
            "- {objectName: app/db, objectType: secretsmanager}",
            cloudtrail("PutSecretValue", SM_ARN),
        ),
        (f"- objectName: {SM_ARN}", cloudtrail("PutSecretValue", "app/db")),
        (f"- objectName: {SM_ARN}", cloudtrail("UpdateSecretVersionStage", SM_ARN)),
        (f"- objectName: {SM_ARN}", label_updated("app/db")),
        ("- {objectName: /app/url, objectType: ssmparameter}", parameter_change("/app/url")),
        ("- {objectName: app-url, objectType: ssmparameter}", parameter_change("app-url")),
        (
            f"- objectName: arn:aws:ssm:{REGION}:{ACCOUNT}:parameter/app/url",
            parameter_change("/app/url"),
        ),
    ],
)
def test_aws_subject_of_each_ref_is_the_name_its_events_give(objects: str, event: Event) -> None:
    change = _change(event)
    assert _subject(objects=objects) == Subject(change.scope, change.name)


@pytest.mark.parametrize(
    ("select", "event"),
    [
        ("- {namePrefix: app/}", cloudtrail("PutSecretValue", SM_ARN)),
        ("- {namePrefix: app/, tags: {team: payments}}", cloudtrail("TagResource", SM_ARN)),
        ("- {tags: {team: payments}}", cloudtrail("CreateSecret", "other", key="name")),
        ("- {objectType: ssmparameter, path: /app}", parameter_change("/app/url")),
        ("- {objectType: ssmparameter, path: /, recursive: true}", parameter_change("/a/b")),
    ],
)
def test_aws_subject_of_each_selection_prefixes_its_members_events(
    select: str, event: Event
) -> None:
    change = _change(event)
    found = _subject(select=select)
    assert found.prefix and found.scope == change.scope and change.name.startswith(found.name)


def test_aws_subject_keeps_secrets_and_parameters_apart() -> None:
    secret = _subject(objects="- {objectName: app/url, objectType: secretsmanager}")
    path = _subject(select="- {objectType: ssmparameter, path: /app}")
    assert secret.name == "sm:app/url"
    assert _change(parameter_change("/app/url")).name != secret.name
    assert not _change(cloudtrail("PutSecretValue", "app/url")).name.startswith(path.name)


def _change(event: Event) -> Change:
    change = change_of(json.dumps(event), frozenset({REGION}))
    assert change is not None
    return change
