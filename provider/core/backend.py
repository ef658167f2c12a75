"""The one interface every store implements, and what the composition root builds it with.

Each store package `backends/<name>/` has the same file roles:
  - `dialect.py`: the `Dialect` protocol below — KEYS (every parameter name of the dialect),
                  `parse(params, ctx: ParseContext[Options]) -> StorePlan[Store, Ref]`,
                  `audiences(store)`, `lifetime(ref)` and `listed(items)` (object entries
                  as the parameters this dialect reads: the multi-store shape); imports no
                  SDK, so `check` and start-up stay fast.
  - `options.py`: `Options`, a frozen dataclass of provider-level flags (provider/core/settings.py
                  turns each field into `--<name>-<field>` and `SECRETS_BRIDGE_<NAME>_<FIELD>`);
                  every field has a default, so `Options()` is the store's defaults.
  - `auth.py`:    who the pod is for the store (identity key, login, credential cache).
  - `client.py`:  the wire, and the one place the store's errors are translated into
                  provider/core/errors.py (some stores keep the translation table in `errors.py`).
  - `store.py`:   `create(env: BackendEnv[Options]) -> Backend[Store, Ref]`, the SDK loaded lazily,
                  and `DIALECT: Dialect[Store, Ref, Options] = dialect`: mypy checks both
                  modules against these protocols.
A folder with a `dialect` and a `store` module is a store: backends/registry.py finds it there
(the one list of stores), and nothing outside the folder names it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar, runtime_checkable

from provider.core import calls
from provider.core.caching import ExpiringCache
from provider.core.calls import Failure
from provider.core.errors import BridgeError, DeadlineExceeded, StoreSilent, StoreUnavailable
from provider.core.limits import PARSE_SHARE, PARSE_WINDOW, ReadBytes, WorkShares, namespace_of
from provider.core.metrics import Metrics
from provider.core.model import (
    FetchContext,
    Fetched,
    Identity,
    Lifetime,
    OptionsT,
    ParseContext,
    Pod,
    RefT,
    StorePlan,
    StoreT,
)
from provider.core.retrying import retry_reason, retry_transient
from provider.core.settings import CoreSettings

if TYPE_CHECKING:  # the client (and aiohttp) is loaded by the composition root, not by `check`
    from provider.core.kube import KubeClient

T = TypeVar("T")

#: Seconds kept between a store call's cut-off and the deadline it runs under, so what follows
#: a timed-out call (a retry's verdict, a stale copy, an error naming the store) still fits.
CALL_MARGIN = 0.25
#: The core's timeout fires this much after the attempt's cut-off: a store client with a
#: timeout of its own (Vault's) cuts first, with a message naming its address; the core's is
#: the backstop for SDKs without one.
BACKSTOP_GRACE = 0.1
#: Store answers up to this size are parsed on the event loop (about a millisecond at most:
#: handing them to a thread would cost more); larger ones in the namespace's parse share.
INLINE_PARSE_BYTES = 64 * 1024


@dataclass(frozen=True)
class BackendEnv(Generic[OptionsT]):
    """Everything a backend is built with (the composition root fills it)."""

    name: str
    core: CoreSettings
    #: The store's Options: from the flags under `serve`/`mount`, else `Options()`.
    options: OptionsT
    kube: KubeClient
    metrics: Metrics
    #: Cache for credentials (tokens, STS credentials) keyed by Identity.key.
    credentials: ExpiringCache[Any]
    #: The bytes of store answers in flight, one pool for every backend (issue 40, item 1):
    #: each fetch charges its answers here (`async with env.reads.fetch(identity.key)`).
    reads: ReadBytes = field(default_factory=ReadBytes.unbounded)
    #: The namespaces' shares of CPU-bound work off the event loop, shared with class parsing.
    work: WorkShares = field(default_factory=lambda: WorkShares(PARSE_SHARE, PARSE_WINDOW))

    async def parsed(
        self, key: str, size: int, work: Callable[[], T], ctx: FetchContext, what: str
    ) -> T:
        """`work()` (parsing a store answer of `size` bytes for identity key `key`): inline
        when small, else in a worker thread within the namespace's share (WorkShares), so a
        tenant's large answers never hold the loop that every other tenant's mounts need."""
        if size <= INLINE_PARSE_BYTES:
            return work()
        return await self.work.run(namespace_of(key), work, ctx.deadline, what)

    async def retry(self, call: Callable[[], Awaitable[T]], ctx: FetchContext) -> T:
        """`call`, with transient failures retried within the retry deadline and each retry
        counted for this store (throttled or unavailable), the same way for every store.

        Every attempt is cut off after `--store-call-timeout` (or sooner, just before
        `ctx.deadline`): a store that accepts and never answers — the usual outage — then
        fails like one that refuses, as StoreUnavailable: retried, eligible for serve-stale,
        counted as "unavailable".
        """

        def count(exc: BaseException) -> None:
            self.metrics.retries.labels(self.name, retry_reason(exc)).inc()

        async def attempt() -> T:
            now = time.monotonic()
            limit = min(self.core.store_call_timeout, ctx.deadline - CALL_MARGIN - now)
            if limit <= 0:
                raise DeadlineExceeded(
                    f"no time left for a call to the {self.name} store before the deadline"
                )
            try:
                with calls.cut_off_at(now + limit):
                    async with asyncio.timeout(limit + BACKSTOP_GRACE):
                        return await call()
            except TimeoutError:
                error = StoreUnavailable(
                    f"the {self.name} store did not answer within {limit:.1f}s "
                    "(--store-call-timeout)"
                )
                calls.note(Failure(error, silent=True))
                raise error from None
            except BridgeError as exc:
                # A client's own timer (Vault's) that cut the call, before or at the cut-off,
                # is silence too.
                silent = isinstance(exc, StoreSilent) or time.monotonic() >= now + limit - 0.01
                calls.note(Failure(exc, silent=silent))
                raise

        return await retry_transient(attempt, ctx, on_retry=count)


class Backend(Protocol[StoreT, RefT]):
    """A secret store, generic over its dialect's store and ref types."""

    name: str

    async def identify(self, plan: StorePlan[StoreT, RefT], pod: Pod) -> Identity:
        """Resolve the identity the pod uses for this store.

        Must raise MissingCredential when the pod brought no token for the store's audience (and
        no nodePublishSecretRef credentials, and the TokenRequest fallback is off), and
        PermissionDenied for node identity outside the allowed namespaces — before any cache.
        """
        ...

    async def fetch(
        self,
        plan: StorePlan[StoreT, RefT],
        identity: Identity,
        refs: Sequence[RefT],
        ctx: FetchContext,
    ) -> Mapping[RefT, Fetched]:
        """Fetch each ref (unique) once; per-ref errors are returned, not raised."""
        ...

    async def close(self) -> None: ...


@runtime_checkable
class Renewing(Protocol):
    """What a store that issues leases also does (Vault): extend one, or give it up.

    A backend without these methods has lifetimes that end at their end (certificates): the
    mount layer re-issues those instead (provider/mount/lifetimes.py).
    """

    async def renew(self, lifetime: Lifetime, ctx: FetchContext) -> Lifetime | None:
        """The lifetime extended as far as the store allows (the lease, and the login token
        that created it), or None when it cannot be extended at all; raises BridgeError when
        the store fails."""
        ...

    async def release(self, lifetime: Lifetime, ctx: FetchContext) -> bool:
        """Revoke it now (its pod stopped polling); False when the store refused (a policy
        without `sys/leases/revoke`): it then ends at its own end."""
        ...


class Dialect(Protocol[StoreT, RefT, OptionsT]):
    """What every `backends/<name>/dialect.py` module is. Each store's `store.py` assigns its
    dialect module to a `Dialect[Store, Ref, Options]`, so mypy checks the module against this;
    the registry hands dialects out as this type."""

    #: Every top-level parameter the dialect reads (the rest are warned about as unused).
    KEYS: frozenset[str]

    def parse(
        self, params: Mapping[str, str], ctx: ParseContext[OptionsT]
    ) -> StorePlan[StoreT, RefT]:
        """The class's parameters as a plan; InvalidParameters naming every problem."""
        ...

    def audiences(self, store: StoreT) -> tuple[str, ...]:
        """The audiences of the pod tokens a mount of this store needs (`check`, `mount`,
        the multi-store message for a missing token)."""
        ...

    def lifetime(self, ref: RefT) -> tuple[str, str] | None:
        """What `check --json` says of an object: ("lease" or "certificate", why) when its
        answer is expected to be a credential with a lifetime; None for a plain secret."""
        ...

    def listed(self, items: list[dict[str, Any]]) -> dict[str, str]:
        """The parameters that give these object entries, in the shape this dialect reads: a
        class of several stores lists each store's objects as maps in one `objects` list
        (provider/mount/stores.py), and hands them to `parse` re-serialized by this."""
        ...


#: How the store-neutral layers (mount, edge) hold any store.
AnyBackend = Backend[Any, Any]
AnyDialect = Dialect[Any, Any, Any]
