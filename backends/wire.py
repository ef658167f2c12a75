"""What every store's HTTP wire shares: capped bodies, our own name resolution, bounded sessions
(the standard proxy environment: backends/proxies.py).

A SecretProviderClass names the store its pods read from, so whoever writes one can point the
provider at a server of their own. Such a server must not be able to make the provider read an
endless body, hold a thread that another namespace's mount needs, or keep a session (and its
file descriptors) per address it invents:

- `read_capped` / `CappedResponse`: a body is read up to a byte cap, then refused; the time
  cap is each caller's `ClientTimeout`. With `charge` (a fetch's FetchBytes.charge), the body
  is charged to the bytes in flight (provider/core/limits.py ReadBytes) before it is read when
  its Content-Length is declared, else chunk by chunk as it arrives.
- `loads_sliced` / `dumps_sliced`: JSON parsed and written by Python's own decoder and encoder,
  for large answers in a worker thread (see there).
- `Resolver`: host names are resolved on a small pool of the backend's own, with a timeout,
  never on the loop's default executor, which blocking work elsewhere in the process can fill.
- `SessionPool`: sessions keyed by origin (scheme, host, port) and TLS settings, at most
  `size`, the least recently used closed as soon as no request is using it.

Redirects are never followed by store calls (callers pass `allow_redirects=False`): a redirect
would carry the pod's token or login body to a host the class did not name.
"""

from __future__ import annotations

import asyncio
import json
import json.decoder
import json.scanner
import socket
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable, Hashable
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import aiohttp
from aiohttp.abc import AbstractResolver, ResolveResult
from yarl import URL

from provider.core.errors import LimitExceeded
from provider.core.limits import charge

K = TypeVar("K", bound=Hashable)

#: Default cap of a token endpoint's or a store's error answer (bytes).
MAX_SMALL_BODY = 64 * 1024
#: Sessions kept open per backend (origins x TLS settings in use on one node).
MAX_SESSIONS = 64
#: Threads resolving host names per backend, and how long one resolution may take.
RESOLVER_THREADS = 4
RESOLVE_TIMEOUT = 10.0
_CHUNK = 64 * 1024


#: Charges a fetch's bytes in flight (FetchBytes.charge): waits, or raises LimitExceeded.
Charge = Callable[[int], Awaitable[None]]


async def read_capped(
    response: aiohttp.ClientResponse, limit: int, what: str, charge: Charge | None = None
) -> bytes:
    """The whole body, or LimitExceeded as soon as it passes `limit` bytes (or `charge`
    refuses it)."""
    declared = response.content_length
    if declared is not None and declared > limit:
        raise LimitExceeded(f"{what}: the answer is over {limit} bytes")
    if charge is not None and declared is not None:
        await charge(declared)
    chunks: list[bytes] = []
    size = 0
    async for chunk in response.content.iter_chunked(_CHUNK):
        size += len(chunk)
        if size > limit or (declared is not None and size > declared):
            raise LimitExceeded(f"{what}: the answer is over {limit} bytes")
        if charge is not None and declared is None:
            await charge(len(chunk))
        chunks.append(chunk)
    return b"".join(chunks)


def _python_decoder() -> json.JSONDecoder:
    decoder = json.JSONDecoder()
    decoder.parse_string = json.decoder.py_scanstring  # type: ignore[attr-defined]
    decoder.scan_once = json.scanner.py_make_scanner(decoder)  # type: ignore[attr-defined]
    return decoder


_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False)


#: JSON values beyond which an answer is parsed by Python's decoder (`sliced`): the C one holds
#: the GIL about a quarter of a microsecond per value, so this is a few milliseconds.
SLICED_VALUES = 10_000


def sliced(body: bytes) -> bool:
    """Whether `body` holds enough JSON values (roughly: its `,` and `:`) that the C parser
    would hold the GIL for more than a few milliseconds: then `loads_sliced`/`dumps_sliced`."""
    return body.count(b",") + body.count(b":") > SLICED_VALUES


def loads_sliced(text: str | bytes) -> Any:
    """`json.loads(text)`, by Python's own decoder: for a large answer in a worker thread. The
    C decoder holds the GIL for a whole document, so a thread running it stalls the event loop
    as long as it runs on the loop (a 5 MB answer of 220,000 keys, tens of milliseconds); the
    Python one gives the GIL back every switch interval, at several times the CPU."""
    if isinstance(text, bytes):
        text = text.decode(json.detect_encoding(text), "surrogatepass")
    return _python_decoder().decode(text)  # its scanner's memo is its own: one per call


def dumps_sliced(value: Any) -> bytes:
    """Compact UTF-8 JSON as `json.dumps(value, separators=(",", ":"), ensure_ascii=False)`
    writes it, chunk by chunk (the C encoder's one call holds the GIL: `loads_sliced`)."""
    return "".join(_ENCODER.iterencode(value)).encode()


class BodyTooLarge(aiohttp.ClientPayloadError):
    """Raised inside an SDK's transport by CappedResponse (the SDK reports a payload error)."""


def capped_response(limit: int) -> type[aiohttp.ClientResponse]:
    """A response class whose `read()` stops at `limit` bytes, for sessions an SDK reads from
    (azure-core's transport calls `read()`; we cannot hand it `read_capped`)."""

    class CappedResponse(aiohttp.ClientResponse):
        async def read(self) -> bytes:
            if self._body is None:
                try:
                    # Charged to the fetch it is read for, if any (an SDK's store call).
                    self._body = await read_capped(self, limit, "the store's answer", charge)
                except LimitExceeded as exc:
                    self.close()
                    raise BodyTooLarge(str(exc)) from None
            return await super().read()

    return CappedResponse


def origin(address: str) -> tuple[str, str, int]:
    """(scheme, host, port) of a URL: what a session (and its connections) is good for."""
    url = URL(address)
    return (url.scheme.lower(), (url.host or "").lower(), url.port or 0)


class Resolver(AbstractResolver):
    """getaddrinfo on the backend's own threads, bounded in number and time."""

    def __init__(self, threads: int = RESOLVER_THREADS, timeout: float = RESOLVE_TIMEOUT) -> None:
        self._executor = ThreadPoolExecutor(threads, thread_name_prefix="secrets-bridge-dns")
        self._timeout = timeout

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        loop = asyncio.get_running_loop()

        def lookup() -> list[ResolveResult]:
            flags = socket.AI_ADDRCONFIG
            infos = socket.getaddrinfo(host, port, family, socket.SOCK_STREAM, flags=flags)
            return [_result(host, info) for info in infos if _usable(info)]

        try:
            async with asyncio.timeout(self._timeout):
                return await loop.run_in_executor(self._executor, lookup)
        except TimeoutError:
            raise OSError(f"resolving {host} took over {self._timeout:g}s") from None

    async def close(self) -> None:
        # Threads stuck in getaddrinfo cannot be interrupted; they end with the lookup.
        self._executor.shutdown(wait=False, cancel_futures=True)


def _usable(info: tuple[object, ...]) -> bool:
    family, address = info[0], info[4]
    # IPv6 without the full tuple means the host's Python has no IPv6 (as aiohttp skips them).
    return family == socket.AF_INET or (isinstance(address, tuple) and len(address) >= 4)


def _result(host: str, info: tuple[object, ...]) -> ResolveResult:
    family, _, proto, _, address = info
    assert isinstance(address, tuple) and isinstance(family, int) and isinstance(proto, int)
    resolved, port = str(address[0]), int(address[1])
    if family == socket.AF_INET6 and address[3]:
        # A link-local address needs its scope id in the host string (as aiohttp does).
        name, service = socket.getnameinfo(address, socket.NI_NUMERICHOST | socket.NI_NUMERICSERV)
        resolved, port = name, int(service)
    return ResolveResult(
        hostname=host,
        host=resolved,
        port=port,
        family=family,
        proto=proto,
        flags=socket.AI_NUMERICHOST | socket.AI_NUMERICSERV,
    )


#: OAuth 2.0 error codes (RFC 6749 5.2, RFC 8693, and Entra's interaction_required): the only
#: part of a token endpoint's refusal that is reported by name; the rest is never relayed.
OAUTH_ERRORS = frozenset(
    {
        "invalid_request",
        "invalid_client",
        "invalid_grant",
        "unauthorized_client",
        "unsupported_grant_type",
        "invalid_scope",
        "invalid_target",
        "access_denied",
        "interaction_required",
        "temporarily_unavailable",
        "server_error",
    }
)


@dataclass(eq=False)
class _Entry:
    session: aiohttp.ClientSession
    users: int = 0
    evicted: bool = False


class SessionPool(Generic[K]):
    """At most `size` sessions by key; the least recently used is closed once it is idle.

    A session evicted while requests use it stays open until the last of them finishes, so the
    bound is `size` plus the sessions of requests in flight.
    """

    def __init__(
        self, build: Callable[[K], Awaitable[aiohttp.ClientSession]], size: int = MAX_SESSIONS
    ) -> None:
        self._build = build
        self._size = max(1, size)
        self._entries: OrderedDict[K, _Entry] = OrderedDict()
        self._lock = asyncio.Lock()

    def __len__(self) -> int:
        return len(self._entries)

    @asynccontextmanager
    async def lease(self, key: K) -> AsyncIterator[aiohttp.ClientSession]:
        entry = await self._entry(key)
        entry.users += 1
        try:
            yield entry.session
        finally:
            entry.users -= 1
            if entry.evicted and entry.users == 0:
                await entry.session.close()

    async def _entry(self, key: K) -> _Entry:
        entry = self._entries.get(key)
        if entry is not None and not entry.session.closed:
            self._entries.move_to_end(key)
            return entry
        async with self._lock:  # concurrent first calls share one session
            entry = self._entries.get(key)
            if entry is None or entry.session.closed:
                entry = _Entry(await self._build(key))
                self._entries[key] = entry
            self._entries.move_to_end(key)
            while len(self._entries) > self._size:
                _, old = self._entries.popitem(last=False)
                old.evicted = True
                if old.users == 0:
                    await old.session.close()
            return entry

    async def close(self) -> None:
        entries, self._entries = list(self._entries.values()), OrderedDict()
        for entry in entries:
            await entry.session.close()
