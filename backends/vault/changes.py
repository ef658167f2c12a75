"""Vault's (OpenBao's) change source: the JSON lines of its `socket` audit device over TCP
(provider/core/changes.py, docs/change-feed.md).

    audit "socket" "secrets-bridge" {       # in the server's configuration: OpenBao creates
      options {                             # audit devices through the API only when unsafe
        address     = "secrets-bridge-watch.secrets-bridge:8201"
        socket_type = "tcp"
        format      = "json"                # log_raw must stay false: values stay HMAC'd
        skip_test   = "true"                # unseal while the watcher is not listening
      }
    }

Vault fails a request only when every audit device fails to record it, so keep a file (or
other) device beside this one: then an unreachable watcher costs no request, only changes
(Vault drops the entry whose write found the connection gone, and dials again at the next).

Each successful write of a KV secret (a response entry without `error`, operation create,
update, patch or delete, on a `kv` mount, in any of KV v2's data/, metadata/, delete/, destroy/,
undelete/ forms) becomes `Change("vault", <address>, kv_name(namespace, path))`. Paths, the
namespace and the operation are not HMAC'd by the audit device; values and tokens are, and
nothing of them is kept. Anyone who can connect can send lines: each is bounded (`MAX_LINE`),
a forged one costs the nodes a read, and the connections are few (`MAX_CONNECTIONS`, the
oldest closed for a newcomer, since Vault dials again whenever a write fails).

The canary (a token file given) reads `cubbyhole/secrets-bridge-canary/<nonce>` every
interval: the read is audited even when it finds nothing, so its path coming back through the
stream proves the whole path from Vault to here (`feed.up()`), and its absence does not
(`feed.down`). Without a token, each entry read counts as Vault answering.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import secrets
import ssl
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from backends.vault.dialect import kv_name
from provider.core.changes import Backoff, Change, Feed, Skips

log = logging.getLogger("secrets_bridge.vault")

STORE = "vault"
#: Bytes of one audit line: a KV write's entry is its HMAC'd keys (about 80 bytes each) and
#: some metadata, so this holds a secret of some 2,500 keys. A longer line is skipped, counted.
MAX_LINE = 256 * 1024
READ_CHUNK = 64 * 1024
#: Changes per publish, and changes waiting for one (past this they are dropped, and the
#: source reports itself down until the backlog is published).
MAX_BATCH = 128
MAX_PENDING = 4096
MAX_CONNECTIONS = 8
MAX_TOKEN_FILE = 8192
CANARY_PREFIX = "cubbyhole/secrets-bridge-canary/"
WRITES = frozenset({"create", "update", "patch", "delete"})
KV_MOUNTS = frozenset({"kv", "generic"})


def change_of(entry: Any, scope: str) -> Change | None:
    """The change an audit entry announces: a successful write of a KV secret, else None."""
    if not isinstance(entry, dict) or entry.get("type") != "response" or entry.get("error"):
        return None
    request = entry.get("request")
    if (
        not isinstance(request, dict)
        or request.get("operation") not in WRITES
        or request.get("mount_type") not in KV_MOUNTS
    ):
        return None
    path, namespace = request.get("path"), request.get("namespace")
    ns_path = namespace.get("path", "") if isinstance(namespace, dict) else ""
    if not isinstance(path, str) or not path or not isinstance(ns_path, str):
        return None
    response = entry.get("response")
    data = response.get("data") if isinstance(response, dict) else None
    version = data.get("version") if isinstance(data, dict) else None
    if isinstance(version, int) and not isinstance(version, bool):
        marker = f"v{version}"
    else:
        marker = str(request.get("id", ""))
    return Change.of(STORE, scope, kv_name(ns_path, path), marker)


def _request_path(entry: Any) -> str:
    request = entry.get("request") if isinstance(entry, dict) else None
    path = request.get("path") if isinstance(request, dict) else None
    return path if isinstance(path, str) else ""


class Lines:
    """A byte stream cut into lines of at most `limit` bytes; a longer line is skipped up to its
    newline and counted in `overlong`, so a peer that never sends one holds `limit` bytes."""

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._buffer = bytearray()
        self._skipping = False
        self.overlong = 0

    def feed(self, data: bytes) -> list[bytes]:
        lines = []
        start = 0
        while (end := data.find(b"\n", start)) >= 0:
            if not self._skipping:
                self._buffer += data[start:end]
                if len(self._buffer) <= self._limit:
                    lines.append(bytes(self._buffer))
                else:
                    self.overlong += 1
            self._skipping = False
            self._buffer.clear()
            start = end + 1
        if not self._skipping:
            self._buffer += data[start:]
            if len(self._buffer) > self._limit:
                self._buffer.clear()
                self._skipping = True
                self.overlong += 1
        return lines


@dataclass(frozen=True)
class Canary:
    """The periodic audited read: Vault's `address`, the token to read with (a file, read at
    each check, so it may be rotated), its namespace, the CA of an https address."""

    address: str
    token_file: str
    namespace: str = ""
    ca_file: str = ""
    interval: float = 30.0
    timeout: float = 10.0


@dataclass
class Counts:
    entries: int = 0
    changes: int = 0
    overlong: int = 0
    evicted: int = 0
    dropped: int = 0


class AuditSource:
    """The `Source` of one Vault: a TCP server its socket audit device connects to."""

    store = STORE
    pulled = False

    def __init__(
        self,
        *,
        listen: tuple[str | None, int],
        addresses: Sequence[str],
        name: str = "vault",
        canary: Canary | None = None,
        max_line: int = MAX_LINE,
    ) -> None:
        if not addresses:
            raise ValueError("an audit source covers at least one Vault address")
        self.name = name
        #: Every spelling of the address classes write; records carry the first.
        self.scopes = frozenset(a.rstrip("/") for a in addresses)
        self.scope = addresses[0].rstrip("/")
        self.counts = Counts()
        self._listen = listen
        self._canary = canary
        self._max_line = max_line
        self._server: asyncio.Server | None = None
        self._connections: dict[asyncio.Task[Any], asyncio.StreamWriter] = {}
        self._pending: dict[str, Change] = {}
        self._wake = asyncio.Event()
        self._feed: Feed | None = None
        self._awaited: dict[str, asyncio.Future[None]] = {}
        #: Changes were dropped: down until the backlog is published.
        self._dropping = False
        #: Lines that are not audit entries (overlong ones too), logged once a minute.
        self.skips = Skips(
            log,
            "vault audit stream",
            "skipped",
            f"lines that are not JSON audit entries of at most {max_line} bytes",
        )

    async def start(self) -> tuple[str, int]:
        """Listen (once); returns the address bound (port 0 picks one)."""
        if self._server is None:
            host, port = self._listen
            self._server = await asyncio.start_server(self._serve, host, port, limit=READ_CHUNK)
        bound = self._server.sockets[0].getsockname()
        return str(bound[0]), int(bound[1])

    async def run(self, feed: Feed) -> None:
        self._feed = feed
        await self.start()
        canary = None
        if self._canary is not None:
            canary = asyncio.create_task(self._canary_loop(feed, self._canary))
        try:
            await self._publish_loop(feed)
        finally:
            if canary is not None:
                canary.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await canary

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for writer in list(self._connections.values()):
            writer.close()
        tasks = list(self._connections)
        if tasks:
            await asyncio.wait(tasks, timeout=5)
        if self._server is not None:
            await self._server.wait_closed()

    # -- reading -------------------------------------------------------------------------------

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        if len(self._connections) >= MAX_CONNECTIONS:
            # The newcomer is most likely Vault dialling again after its old connection died.
            self._connections.pop(next(iter(self._connections))).close()
            self.counts.evicted += 1
        self._connections[task] = writer
        lines = Lines(self._max_line)
        try:
            while data := await reader.read(READ_CHUNK):
                overlong = lines.overlong
                read = sum(self._entry(line) for line in lines.feed(data))
                if lines.overlong > overlong:
                    self.counts.overlong += lines.overlong - overlong
                    self.skips.add("over the size", lines.overlong - overlong)
                if read and self._canary is None:
                    self._up()
        except OSError:
            pass  # a reset connection: Vault dials again at its next entry
        finally:
            self._connections.pop(task, None)
            writer.close()
            if not self._connections and self._canary is None and self._feed is not None:
                self._feed.down("no audit connection from Vault")

    def _entry(self, line: bytes) -> bool:
        """One line: True when it is a JSON object (an entry, announcing a change or not)."""
        if not line.strip():
            return False
        try:
            entry = json.loads(line)
        except (ValueError, RecursionError):
            entry = None
        if not isinstance(entry, dict):
            self.skips.add("not a JSON object")
            return False
        self.counts.entries += 1
        if self._awaited:
            seen = self._awaited.get(_request_path(entry))
            if seen is not None and not seen.done():
                seen.set_result(None)
        change = change_of(entry, self.scope)
        if change is not None:
            self._add(change)
        return True

    def _add(self, change: Change) -> None:
        if len(self._pending) >= MAX_PENDING and change.name not in self._pending:
            self.counts.dropped += 1
            if not self._dropping and self._feed is not None:
                self._feed.down(f"over {MAX_PENDING} changes waiting to be published: dropped")
            self._dropping = True
            return
        self.counts.changes += 1
        self._pending[change.name] = change
        self._wake.set()

    def _up(self) -> None:
        if self._feed is not None and not self._dropping:
            self._feed.up()

    # -- publishing ----------------------------------------------------------------------------

    async def _publish_loop(self, feed: Feed) -> None:
        backoff = Backoff(0.5, 30.0)
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._pending:
                names = list(self._pending)[:MAX_BATCH]
                batch = [self._pending.pop(name) for name in names]
                try:
                    await feed.publish(batch)
                except Exception as exc:  # the feed says why; the batch waits for the next try
                    log.warning("vault audit stream: publishing %d changes: %s", len(batch), exc)
                    self._pending = {**{c.name: c for c in batch}, **self._pending}
                    await backoff.wait()
                    continue
                backoff.reset()
            if self._dropping:
                self._dropping = False
                if self._canary is None:
                    feed.up()

    # -- the canary ----------------------------------------------------------------------------

    async def _canary_loop(self, feed: Feed, canary: Canary) -> None:
        ctx = None
        if canary.address.startswith("https://"):
            ctx = await asyncio.to_thread(ssl.create_default_context, cafile=canary.ca_file or None)
        connector = aiohttp.TCPConnector(ssl=ctx if ctx else True)
        async with aiohttp.ClientSession(connector=connector) as session:
            while True:
                problem = await self._probe(session, canary)
                if problem is None:
                    self._up()
                else:
                    feed.down(problem)
                await asyncio.sleep(canary.interval)

    async def _probe(self, session: aiohttp.ClientSession, canary: Canary) -> str | None:
        """One audited read; None when its path came back through the stream in time."""
        path = CANARY_PREFIX + secrets.token_hex(16)
        seen = asyncio.get_running_loop().create_future()
        self._awaited[path] = seen
        deadline = time.monotonic() + canary.timeout
        try:
            try:
                token = await asyncio.to_thread(_read_token, canary.token_file)
            except OSError:
                return f"canary: the token file {canary.token_file} cannot be read"
            headers = {"X-Vault-Token": token, "X-Vault-Request": "true"}
            if canary.namespace:
                headers["X-Vault-Namespace"] = canary.namespace
            try:
                async with session.get(
                    f"{canary.address.rstrip('/')}/v1/{path}",
                    headers=headers,
                    timeout=aiohttp.ClientTimeout(total=canary.timeout),
                    allow_redirects=False,
                ) as resp:
                    await resp.content.read(READ_CHUNK)  # any status: the read is audited
            except (aiohttp.ClientError, TimeoutError, OSError):
                return f"canary: Vault at {canary.address} did not answer"
            wait = f"{canary.timeout:g}s"
            try:
                await asyncio.wait_for(seen, max(deadline - time.monotonic(), 0.001))
            except TimeoutError:
                return f"canary: its read did not come back through the audit stream in {wait}"
            return None
        finally:
            del self._awaited[path]


def _read_token(path: str) -> str:
    with open(Path(path), "rb") as fh:
        return fh.read(MAX_TOKEN_FILE).decode(errors="replace").strip()


def create(
    *,
    listen: str,
    addresses: Sequence[str],
    name: str = "vault",
    token_file: str = "",
    canary_address: str = "",
    namespace: str = "",
    ca_file: str = "",
    canary_interval: float = 30.0,
    canary_timeout: float = 10.0,
) -> AuditSource:
    """The watcher's Vault source. `listen`: [host]:port for the socket audit device to dial
    (no host: every interface);
    `addresses`: Vault's address as classes write `vaultAddress` (every spelling; the first is
    the records' scope); `token_file`: enables the canary, reading with that token at
    `canary_address` (default the first address) in `namespace`, trusting `ca_file` for https,
    every `canary_interval` seconds, down when the read is not seen within `canary_timeout`."""
    host, _, port = listen.rpartition(":")
    canary = None
    if token_file:
        canary = Canary(
            canary_address or addresses[0],
            token_file,
            namespace,
            ca_file,
            canary_interval,
            canary_timeout,
        )
    return AuditSource(
        listen=(host.strip("[]") or None, int(port)),
        addresses=addresses,
        name=name,
        canary=canary,
    )
