"""Azure Key Vault's change source: the vaults' Event Grid events, delivered by an Event Grid
subscription to a Storage queue and received from it (provider/core/changes.py,
docs/change-feed.md).

Event Grid puts one event per queue message, the message text the event's JSON in base64 (plain
JSON in older deliveries: both are read), in the Event Grid schema (`eventType`, `data`) or the
CloudEvents 1.0 schema (`type`, `data`) as the subscription's delivery schema says. Key Vault's
event types are `Microsoft.KeyVault.{Secret,Key,Certificate}{NewVersionCreated,NearExpiry,
Expired}` and `Microsoft.KeyVault.VaultAccessPolicyChanged`; it sends none when an object is
deleted, disabled or its tags change. `data` names the object: `VaultName`, `ObjectType`
(Secret, Key, Certificate), `ObjectName`, `Version` (keys matched ignoring case). A new version
or an expiry changes what a read answers, so each becomes
`Change("azure", <vault>, object_name(kind, name))` (backends/azure/dialect.py), as does any
other Key Vault type naming an object (one added later); a near expiry and an access policy
change are no new value and are deleted quietly. A certificate is also a secret (its PFX or PEM
with the key) and a key of the same name, which classes may read as such: its event is named by
all three.

Each receive takes at most `batch` messages, hidden for `visibility` seconds; the batch's
changes are published, and only then are its messages deleted. A batch whose publish raised is
left to reappear after the visibility timeout. Messages that do not parse, name another vault or
have been delivered `max_dequeue` times already are deleted and counted, with one log line a
minute that never shows them. A Storage queue answers at once, so an empty receive is followed
by a wait of `poll` seconds.

Credentials are the watcher's own: its workload identity through azure-identity's
DefaultAzureCredential (the role Storage Queue Data Message Processor on the queue, nothing of
Key Vault), or a Storage connection string (Azurite in tests).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import logging
from collections.abc import Iterable, Sequence
from typing import Any
from urllib.parse import urlsplit

from azure.core.credentials_async import AsyncTokenCredential
from azure.core.exceptions import (
    AzureError,
    ClientAuthenticationError,
    HttpResponseError,
    ResourceNotFoundError,
)
from azure.storage.queue import QueueMessage
from azure.storage.queue.aio import QueueClient

from backends.azure.dialect import object_name
from provider.core.changes import POLL_BACKOFF, Backoff, Change, Feed, PullCounts, Skips

log = logging.getLogger("secrets_bridge.azure")
# azure-core logs each request's headers at INFO.
logging.getLogger("azure").setLevel(logging.WARNING)

STORE = "azure"
#: Messages per receive (a Storage queue hands out at most 32 at once).
MAX_BATCH = 32
#: Characters of one message: a Storage queue holds at most 64 KiB.
MAX_MESSAGE = 64 * 1024
#: Events one message may hold (Event Grid puts one; a JSON array of a few is read too).
MAX_EVENTS = 16
#: Characters of an object's name and version (Key Vault's own limits are 127 and 32).
MAX_FIELD = 256
VISIBILITY = 60
POLL = 5.0
MAX_DEQUEUE = 20
PREFIX = "Microsoft.KeyVault."
#: Key Vault events that announce no new value.
QUIET = frozenset(
    PREFIX + t
    for t in (
        "SecretNearExpiry",
        "KeyNearExpiry",
        "CertificateNearExpiry",
        "VaultAccessPolicyChanged",
    )
)
#: An event's ObjectType (lowercased) → the kinds of ref that read it (dialect `object_name`).
KINDS = {"secret": ("secret",), "key": ("key",), "certificate": ("cert", "secret", "key")}
#: No retries of the SDK's own (its default waits 15 s and more): `run` backs off, reporting down.
_CLIENT: dict[str, Any] = {"retry_total": 0, "connection_timeout": 10, "read_timeout": 30}
#: What a refusal means to the watcher's operator (Azure's own text is never shown).
_REASONS = {
    401: "the watcher's credentials were refused",
    403: "the watcher may not read the queue (Storage Queue Data Message Processor)",
    404: "the queue does not exist",
}


class BadEvent(ValueError):
    """A message that is not a Key Vault event (its text is never shown)."""


def events_of(content: str) -> list[dict[str, Any]]:
    """The events of a message's text: base64 of JSON, or JSON; one event or a short list."""
    if len(content) > MAX_MESSAGE:
        raise BadEvent(f"over {MAX_MESSAGE} characters")
    text = content.strip()
    if not text.startswith(("{", "[")):
        try:
            text = base64.b64decode(text, validate=True).decode()
        except (binascii.Error, UnicodeDecodeError):
            raise BadEvent("neither JSON nor base64 of JSON") from None
    try:
        body = json.loads(text)
    except ValueError:
        raise BadEvent("not JSON") from None
    events = body if isinstance(body, list) else [body]
    if not 0 < len(events) <= MAX_EVENTS or not all(isinstance(e, dict) for e in events):
        raise BadEvent(f"expected an event or a list of at most {MAX_EVENTS}")
    return events


def changes_of(event: dict[str, Any]) -> tuple[str, list[Change]]:
    """(vault, changes) of one event: none for a quiet type."""
    kind = event.get("eventType", event.get("type"))
    if not isinstance(kind, str) or not kind.startswith(PREFIX) or len(kind) > MAX_FIELD:
        raise BadEvent("no Microsoft.KeyVault event type")
    data = event.get("data")
    if not isinstance(data, dict):
        raise BadEvent("no data")
    # The wire spells the keys VaultName, ObjectName...; the SDKs' models vaultName...
    fields = {k.lower(): v for k, v in data.items() if isinstance(k, str) and isinstance(v, str)}
    vault = fields.get("vaultname", "").lower()
    if not 3 <= len(vault) <= 24:
        raise BadEvent("no VaultName")
    if kind in QUIET:
        return vault, []
    name, version = fields.get("objectname", ""), fields.get("version", "")[:MAX_FIELD]
    kinds = KINDS.get(fields.get("objecttype", "").lower())
    if kinds is None or not 0 < len(name) <= MAX_FIELD or "/" in name:
        raise BadEvent("no ObjectType and ObjectName of a secret, key or certificate")
    marker = f"{kind.removeprefix(PREFIX)} {version}".strip()
    return vault, [Change.of(STORE, vault, object_name(k, name), marker) for k in kinds]


class QueueSource:
    """The `Source` of one Storage queue an Event Grid subscription of Key Vaults feeds."""

    store = STORE
    pulled = True

    def __init__(
        self,
        client: QueueClient,
        *,
        vaults: Iterable[str],
        credential: AsyncTokenCredential | None = None,
        name: str = "azure",
        batch: int = MAX_BATCH,
        visibility: int = VISIBILITY,
        poll: float = POLL,
        max_dequeue: int = MAX_DEQUEUE,
        backoff: tuple[float, float] = POLL_BACKOFF,
    ) -> None:
        self.name = name
        #: Key Vault names compare ignoring case; events and subjects name them lowercased.
        self.scopes = frozenset(v.lower() for v in vaults)
        if not self.scopes:
            raise ValueError("a queue source covers at least one Key Vault")
        if not 1 <= batch <= MAX_BATCH:
            raise ValueError(f"batch: expected 1..{MAX_BATCH} messages")
        self.counts = PullCounts()
        self._client = client
        self._credential = credential
        self._batch = batch
        self._visibility = visibility
        self._poll = poll
        self._max_dequeue = max_dequeue
        self._backoff = backoff
        #: Messages deleted unread, logged once a minute.
        self.skips = Skips(
            log, f"azure {name}", "deleted", "messages that are no Key Vault event to publish"
        )

    async def run(self, feed: Feed) -> None:
        backoff = Backoff(*self._backoff)
        while True:
            problem = await self._receive_once(feed)
            if problem is None:
                backoff.reset()
                continue
            feed.down(f"queue {self._client.queue_name}: {problem}")
            await backoff.wait()

    async def close(self) -> None:
        await self._client.close()
        if self._credential is not None:
            await self._credential.close()

    async def _receive_once(self, feed: Feed) -> str | None:
        """One receive and what follows it; the reason it failed, or None."""
        self.counts.receives += 1
        try:
            pages = self._client.receive_messages(
                messages_per_page=self._batch,
                max_messages=self._batch,
                visibility_timeout=self._visibility,
            )
            received = [m async for m in pages][: self._batch]
        except AzureError as exc:
            return _reason(exc)
        feed.up()
        if not received:
            await asyncio.sleep(self._poll)
            return None
        return await self._handle(feed, received)

    async def _handle(self, feed: Feed, received: Sequence[QueueMessage]) -> str | None:
        """Publish a batch's changes, then delete its messages (only those that yield no change
        when the publish raised: the rest reappear after the visibility timeout)."""
        changes: dict[str, Change] = {}
        announcing, spare = [], []
        for message in received:
            self.counts.messages += 1
            found = self._changes(message)
            if found:
                announcing.append(message)
                for change in found:
                    changes[change.name] = change  # repeats of one object: one record
            else:
                spare.append(message)
        if not await self.counts.published(feed, changes.values(), log, f"azure {self.name}"):
            announcing = []  # they reappear after the visibility timeout
        for message in [*announcing, *spare]:
            try:
                await self._client.delete_message(message)
            except ResourceNotFoundError:
                pass  # deleted already, or its receipt expired: it is delivered again
            except AzureError as exc:
                return f"deleting: {_reason(exc)} (the batch is delivered again)"
            self.counts.acknowledged += 1
        return None

    def _changes(self, message: QueueMessage) -> list[Change]:
        """The changes a message announces; none (and counted) for one to delete unread."""
        if (message.dequeue_count or 0) > self._max_dequeue:
            self.skips.add(f"delivered over {self._max_dequeue} times")
            return []
        found: list[Change] = []
        try:
            for event in events_of(message.content if isinstance(message.content, str) else ""):
                vault, changes = changes_of(event)
                if vault not in self.scopes:
                    raise BadEvent("a vault the source does not cover")
                found.extend(changes)
        except BadEvent as bad:
            self.skips.add(str(bad))
            return []
        return found


def _reason(exc: AzureError) -> str:
    """The status or error kind and what it means; Azure's own text stays out of the health."""
    if isinstance(exc, HttpResponseError) and exc.status_code:
        return f"HTTP {exc.status_code}: {_REASONS.get(exc.status_code, 'refused')}"
    if isinstance(exc, ClientAuthenticationError):
        return "no credentials for the queue (the watcher's workload identity)"
    return f"{type(exc).__name__}: the queue did not answer"


def create(
    *,
    queue_url: str,
    vaults: Sequence[str],
    connection_string_file: str = "",
    credential: AsyncTokenCredential | None = None,
    name: str = "azure",
    batch: int = MAX_BATCH,
    visibility: int = VISIBILITY,
    poll: float = POLL,
    max_dequeue: int = MAX_DEQUEUE,
    backoff: tuple[float, float] = POLL_BACKOFF,
) -> QueueSource:
    """The watcher's Azure source. `queue_url`: `https://<account>.queue.core.windows.net/
    <queue>`; `vaults`: the Key Vault names whose events the queue receives (the scopes);
    `connection_string_file`: a file holding a Storage connection string, which then names the
    account and its endpoint (the URL's last segment still names the queue); else `credential`,
    default azure-identity's DefaultAzureCredential (the watcher's workload identity); `batch`:
    messages per receive (at most 32); `visibility`: seconds a received message stays hidden;
    `poll`: seconds to wait after an empty receive; `max_dequeue`: deliveries after which a
    message is deleted unread; `backoff`: the first and the longest wait after a failure."""
    if connection_string_file:
        with open(connection_string_file) as fh:
            connection = fh.read().strip()
        queue = urlsplit(queue_url).path.rstrip("/").rpartition("/")[2]
        client = QueueClient.from_connection_string(connection, queue, **_CLIENT)
    else:
        if credential is None:
            from azure.identity.aio import DefaultAzureCredential

            credential = DefaultAzureCredential()
        client = QueueClient.from_queue_url(queue_url, credential=credential, **_CLIENT)
    return QueueSource(
        client,
        vaults=vaults,
        credential=credential,
        name=name,
        batch=batch,
        visibility=visibility,
        poll=poll,
        max_dequeue=max_dequeue,
        backoff=backoff,
    )
