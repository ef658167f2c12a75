"""A wire-level stand-in for Google Pub/Sub: Publisher.Publish and Subscriber.Pull, Acknowledge
and ModifyAckDeadline over gRPC on 127.0.0.1, with the client library's own message types.

No Pub/Sub emulator runs here, so this one checks what Pub/Sub checks: a bearer token on every
call (UNAUTHENTICATED), the topic or subscription exists (NOT_FOUND), `max_messages` above 0
and ack deadlines within 0..600 s (INVALID_ARGUMENT). Delivery is at least once: a message
pulled and not acknowledged within its lease (the subscription's ack deadline, 10..600 s, or
what ModifyAckDeadline set) is delivered again with a new ack id and a `delivery_attempt` one
higher (Pub/Sub counts attempts only under a dead-letter policy; here always); an ack id of an
expired lease is ignored, as Pub/Sub ignores it; `duplicates` hands messages out twice in a
batch; each batch is shuffled, since Pub/Sub does not order messages without ordering keys.
A Pull with nothing to deliver is held until the caller's deadline, as Pub/Sub holds it
(`hold` seconds instead answers empty).

Time is `time.monotonic()` plus `advance(seconds)`, so a test sees a lease expire without
waiting ten seconds. Faults: `paused` answers every call UNAVAILABLE; stopping the server (the
handle `start_pubsub` returns) drops the connections.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import itertools
import random
import secrets
import time
from dataclasses import dataclass, field
from typing import Any

import grpc
from google.protobuf import empty_pb2
from google.pubsub_v1.types import pubsub

PUBLISHER = "google.pubsub.v1.Publisher"
SUBSCRIBER = "google.pubsub.v1.Subscriber"
#: The ack deadlines a subscription may have, and the most ModifyAckDeadline may set.
MIN_ACK_DEADLINE, MAX_ACK_DEADLINE = 10, 600
#: How often a held Pull looks again for a lease that expired (fake time may jump).
_RECHECK = 0.05


@dataclass
class Held:
    """A message of a subscription, until acknowledged."""

    message: pubsub.PubsubMessage
    attempts: int = 0
    #: When it may be delivered (again): its lease's end, or 0.
    available_at: float = 0.0


@dataclass
class Subscription:
    topic: str
    ack_deadline: int = MIN_ACK_DEADLINE
    messages: dict[str, Held] = field(default_factory=dict)


@dataclass
class Counts:
    pulls: int = 0
    #: Deliveries handed out (a redelivery or a duplicate counts again).
    delivered: int = 0
    redelivered: int = 0
    acked: int = 0
    #: Ack ids acknowledged after their lease ended (or unknown): ignored.
    ignored_acks: int = 0
    modified: int = 0
    published: int = 0
    #: Calls refused (any status other than OK).
    refused: int = 0


@dataclass
class FakePubSub:
    #: topic name ("projects/p/topics/t") -> its subscriptions' names.
    topics: dict[str, list[str]] = field(default_factory=dict)
    subscriptions: dict[str, Subscription] = field(default_factory=dict)
    #: Bearer tokens accepted; None accepts any (a token must still be sent).
    tokens: set[str] | None = None
    #: The chance a delivered message is handed out twice in its batch (at-least-once).
    duplicates: float = 0.0
    #: Answer every call UNAVAILABLE (the service unreachable, its port open).
    paused: bool = False
    #: Seconds a Pull with nothing to deliver waits before answering empty; None: until the
    #: caller's deadline, as Pub/Sub.
    hold: float | None = None
    counts: Counts = field(default_factory=Counts)
    #: The authorization header of each call.
    callers: list[str] = field(default_factory=list)
    rng: random.Random = field(default_factory=lambda: random.Random(43))
    _offset: float = 0.0
    #: ack id -> (subscription, message id, lease end).
    _leases: dict[str, tuple[str, str, float]] = field(default_factory=dict)
    _ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))
    _arrived: asyncio.Event = field(default_factory=asyncio.Event)

    def now(self) -> float:
        return time.monotonic() + self._offset

    def advance(self, seconds: float) -> None:
        """Move the fake's clock on: leases that end meanwhile have expired."""
        self._offset += seconds
        self._arrived.set()

    def add_subscription(
        self, name: str, topic: str, ack_deadline: int = MIN_ACK_DEADLINE
    ) -> Subscription:
        if not MIN_ACK_DEADLINE <= ack_deadline <= MAX_ACK_DEADLINE:
            raise ValueError(f"ack deadline {ack_deadline}: Pub/Sub allows 10..600 seconds")
        self.topics.setdefault(topic, []).append(name)
        self.subscriptions[name] = Subscription(topic, ack_deadline)
        return self.subscriptions[name]

    def publish(self, topic: str, data: bytes = b"", **attributes: str) -> str:
        """Publish one message (what Publisher.Publish does for each of its messages)."""
        message_id = str(next(self._ids))
        for name in self.topics[topic]:
            message = pubsub.PubsubMessage(
                data=data,
                attributes=attributes,
                message_id=message_id,
                publish_time=datetime.datetime.now(datetime.UTC),
            )
            self.subscriptions[name].messages[message_id] = Held(message)
        self.counts.published += 1
        self._arrived.set()
        return message_id

    def outstanding(self, subscription: str) -> int:
        """Messages not acknowledged yet (leased or waiting)."""
        return len(self.subscriptions[subscription].messages)

    def take(self, name: str, limit: int) -> list[pubsub.ReceivedMessage]:
        """Lease up to `limit` deliverable messages of a subscription, shuffled."""
        sub = self.subscriptions[name]
        now = self.now()
        batch: list[pubsub.ReceivedMessage] = []
        for message_id, held in sub.messages.items():
            if len(batch) >= limit:
                break
            if held.available_at > now:
                continue
            copies = 2 if self.rng.random() < self.duplicates and len(batch) + 2 <= limit else 1
            held.attempts += 1
            held.available_at = now + sub.ack_deadline
            if held.attempts > 1:
                self.counts.redelivered += 1
            for _ in range(copies):
                ack_id = f"ack-{secrets.token_hex(12)}"
                self._leases[ack_id] = (name, message_id, held.available_at)
                batch.append(
                    pubsub.ReceivedMessage(
                        ack_id=ack_id, message=held.message, delivery_attempt=held.attempts
                    )
                )
        self.counts.delivered += len(batch)
        self.rng.shuffle(batch)
        return batch

    def lease(self, ack_id: str) -> tuple[Subscription, str] | None:
        """The subscription and message an ack id holds, while its lease lasts."""
        lease = self._leases.get(ack_id)
        if lease is None or lease[2] <= self.now():
            self._leases.pop(ack_id, None)
            return None
        sub = self.subscriptions.get(lease[0])
        if sub is None or lease[1] not in sub.messages:
            return None
        return sub, lease[1]

    async def wait(self, seconds: float) -> None:
        """Until a message is published, the clock moves or `seconds` pass."""
        self._arrived.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._arrived.wait(), seconds)


async def _admit(fake: FakePubSub, context: grpc.aio.ServicerContext) -> None:
    """Pub/Sub's checks of every call: the service answers, a bearer token is sent."""
    metadata = dict(context.invocation_metadata() or ())
    auth = str(metadata.get("authorization", ""))
    fake.callers.append(auth)
    if fake.paused:
        await _refuse(
            fake,
            context,
            grpc.StatusCode.UNAVAILABLE,
            "The service was unable to fulfill your request.",
        )
    token = auth.removeprefix("Bearer ")
    if (
        not auth.startswith("Bearer ")
        or not token
        or (fake.tokens is not None and token not in fake.tokens)
    ):
        await _refuse(
            fake,
            context,
            grpc.StatusCode.UNAUTHENTICATED,
            "Request is missing required authentication credential.",
        )


async def _refuse(
    fake: FakePubSub, context: grpc.aio.ServicerContext, code: grpc.StatusCode, text: str
) -> None:
    fake.counts.refused += 1
    await context.abort(code, text)


async def _subscription(
    fake: FakePubSub, context: grpc.aio.ServicerContext, name: str
) -> Subscription:
    await _admit(fake, context)
    sub = fake.subscriptions.get(name)
    if sub is None:
        await _refuse(
            fake, context, grpc.StatusCode.NOT_FOUND, f"Resource not found (resource={name})."
        )
    assert sub is not None
    return sub


def subscriber_handler(fake: FakePubSub) -> grpc.GenericRpcHandler:
    async def pull(
        request: pubsub.PullRequest, context: grpc.aio.ServicerContext
    ) -> pubsub.PullResponse:
        await _subscription(fake, context, request.subscription)
        if request.max_messages <= 0:
            await _refuse(
                fake, context, grpc.StatusCode.INVALID_ARGUMENT, "max_messages must be positive."
            )
        fake.counts.pulls += 1
        held_until = None if fake.hold is None else fake.now() + fake.hold
        while not (batch := fake.take(request.subscription, request.max_messages)):
            if request.return_immediately or (held_until is not None and fake.now() >= held_until):
                break
            await fake.wait(_RECHECK)  # cancelled at the caller's deadline
        return pubsub.PullResponse(received_messages=batch)

    async def acknowledge(
        request: pubsub.AcknowledgeRequest, context: grpc.aio.ServicerContext
    ) -> empty_pb2.Empty:
        await _subscription(fake, context, request.subscription)
        if not request.ack_ids:
            await _refuse(fake, context, grpc.StatusCode.INVALID_ARGUMENT, "No ack ids given.")
        for ack_id in request.ack_ids:
            found = fake.lease(ack_id)
            if found is None:
                fake.counts.ignored_acks += 1
                continue
            sub, message_id = found
            del sub.messages[message_id]
            fake.counts.acked += 1
        return empty_pb2.Empty()

    async def modify(
        request: pubsub.ModifyAckDeadlineRequest, context: grpc.aio.ServicerContext
    ) -> empty_pb2.Empty:
        await _subscription(fake, context, request.subscription)
        seconds = request.ack_deadline_seconds
        if not request.ack_ids or not 0 <= seconds <= MAX_ACK_DEADLINE:
            await _refuse(
                fake,
                context,
                grpc.StatusCode.INVALID_ARGUMENT,
                f"Invalid ack deadline {seconds}: expected ack ids and 0..600 seconds.",
            )
        for ack_id in request.ack_ids:
            found = fake.lease(ack_id)
            if found is None:
                continue
            sub, message_id = found
            end = fake.now() + seconds
            sub.messages[message_id].available_at = end
            fake._leases[ack_id] = (request.subscription, message_id, end)
            fake.counts.modified += 1
        fake._arrived.set()
        return empty_pb2.Empty()

    return grpc.method_handlers_generic_handler(
        SUBSCRIBER,
        {
            "Pull": _unary(pull, pubsub.PullRequest, pubsub.PullResponse),
            "Acknowledge": _empty(acknowledge, pubsub.AcknowledgeRequest),
            "ModifyAckDeadline": _empty(modify, pubsub.ModifyAckDeadlineRequest),
        },
    )


def publisher_handler(fake: FakePubSub) -> grpc.GenericRpcHandler:
    async def publish(
        request: pubsub.PublishRequest, context: grpc.aio.ServicerContext
    ) -> pubsub.PublishResponse:
        await _admit(fake, context)
        if request.topic not in fake.topics:
            await _refuse(
                fake,
                context,
                grpc.StatusCode.NOT_FOUND,
                f"Resource not found (resource={request.topic}).",
            )
        if not request.messages or any(not (m.data or m.attributes) for m in request.messages):
            await _refuse(
                fake,
                context,
                grpc.StatusCode.INVALID_ARGUMENT,
                "Each message must have data or attributes.",
            )
        ids = [fake.publish(request.topic, m.data, **dict(m.attributes)) for m in request.messages]
        return pubsub.PublishResponse(message_ids=ids)

    return grpc.method_handlers_generic_handler(
        PUBLISHER, {"Publish": _unary(publish, pubsub.PublishRequest, pubsub.PublishResponse)}
    )


def _unary(handler: Any, request: Any, response: Any) -> grpc.RpcMethodHandler:
    return grpc.unary_unary_rpc_method_handler(
        handler, request_deserializer=request.deserialize, response_serializer=response.serialize
    )


def _empty(handler: Any, request: Any) -> grpc.RpcMethodHandler:
    return grpc.unary_unary_rpc_method_handler(
        handler,
        request_deserializer=request.deserialize,
        response_serializer=empty_pb2.Empty.SerializeToString,
    )


async def start_pubsub(fake: FakePubSub) -> tuple[grpc.aio.Server, int]:
    """Pub/Sub on 127.0.0.1 over gRPC local credentials (which carry call credentials, so the
    client's bearer token arrives as from Google); returns the server and its port."""
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((subscriber_handler(fake), publisher_handler(fake)))
    port = server.add_secure_port(
        "127.0.0.1:0", grpc.local_server_credentials(grpc.LocalConnectionType.LOCAL_TCP)
    )
    await server.start()
    return server, port
