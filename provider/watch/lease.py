"""Leader election on a coordination.k8s.io/v1 Lease, as client-go's leaderelection does it.

One watcher replica leads (runs the pull sources and publishes); the other waits, ready. The
Lease's spec carries holderIdentity, leaseDurationSeconds, acquireTime, renewTime and
leaseTransitions; every write is a compare-and-swap on its resourceVersion, so two replicas
never both win one round. A replica that does not hold the Lease takes it over only once it
has seen the same record unchanged for leaseDurationSeconds on its own clock: clocks of two
machines are never compared, renewTime is for people. The holder renews every `retry_period`
and stops leading once `renew_deadline` has passed since its last renewal (before the
lease's duration ends, so the two never lead at once); cancelled, it releases the Lease
(holderIdentity empty, as client-go's ReleaseOnCancel) so the standby takes over at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import random
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

from provider.core.errors import BridgeError
from provider.core.kube import Conflict, KubeClient, Object, leases

log = logging.getLogger("secrets_bridge.watch.lease")


class Elector:
    def __init__(
        self,
        client: KubeClient,
        namespace: str,
        name: str,
        identity: str,
        *,
        lease_duration: float = 15.0,
        renew_deadline: float = 10.0,
        retry_period: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not retry_period < renew_deadline < lease_duration:
            raise ValueError("expected retry_period < renew_deadline < lease_duration")
        self._client = client
        self._collection = leases(namespace)
        self._path = leases(namespace, name)
        self._name = name
        self.identity = identity
        self._duration = lease_duration
        self._renew_deadline = renew_deadline
        self._retry = retry_period
        self._clock = clock
        #: The Lease as last read or written, and when (our clock) its spec was first seen so.
        self._lease: Object | None = None
        self._observed_at = 0.0
        self._leading = False

    @property
    def leading(self) -> bool:
        return self._leading

    async def run(self, lead: Callable[[], Awaitable[None]]) -> None:
        """Until cancelled: acquire the Lease, run `lead()` while it is held, cancel it when the
        Lease cannot be renewed in time, and try again. If `lead()` returns or raises, the
        Lease is released and run returns or raises with it."""
        try:
            while True:
                await self._acquire()
                self._leading = True
                log.info("leading: %s holds Lease %s", self.identity, self._name)
                task = asyncio.ensure_future(lead())
                try:
                    await self._renew(task)
                finally:
                    self._leading = False
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await task
                if task.done() and not task.cancelled():
                    task.result()  # lead() ended by itself: raise what it raised
                    return
                log.warning("stopped leading: Lease %s not renewed in time", self._name)
        finally:
            await self._release()

    async def _acquire(self) -> None:
        while True:
            if await self._attempt():
                return
            await asyncio.sleep(self._retry * random.uniform(1.0, 1.2))  # noqa: S311

    async def _renew(self, task: asyncio.Future[None]) -> None:
        """Renew every retry period; return once renewal failed past the deadline, another
        holder was seen, or `task` ended."""
        renewed = self._clock()
        while not task.done():
            await asyncio.wait({task}, timeout=self._retry)
            if task.done():
                return
            left = renewed + self._renew_deadline - self._clock()
            while left > 0:
                if await self._attempt(left):
                    break
                if self._holder() not in ("", self.identity):
                    return  # someone else holds it now
                await asyncio.sleep(min(self._retry, left))
                left = renewed + self._renew_deadline - self._clock()
            else:
                return
            renewed = self._clock()

    async def _attempt(self, within: float | None = None) -> bool:
        """One try to acquire or renew, bounded by `within` seconds (the renew deadline)."""
        try:
            async with asyncio.timeout(within if within is not None else self._renew_deadline):
                return await self._try()
        except (BridgeError, TimeoutError) as exc:
            log.debug("Lease %s: %s", self._name, exc or "no answer in time")
            return False

    async def _try(self) -> bool:
        lease = await self._client.get(self._path)
        now = _micro_time()
        if lease is None:
            body = {"metadata": {"name": self._name}, "spec": self._spec(now, now, 0)}
            return await self._write(self._client.create(self._collection, body))
        self._observe(lease)
        spec: dict[str, Any] = dict(lease.get("spec") or {})
        holder = self._holder()
        if holder and holder != self.identity and self._valid(spec):
            return False
        if holder == self.identity:
            new = self._spec(spec.get("acquireTime") or now, now, _count(spec))
        else:
            new = self._spec(now, now, _count(spec) + 1)
        return await self._write(self._client.replace(self._path, {**lease, "spec": new}))

    async def _write(self, call: Awaitable[Object]) -> bool:
        try:
            self._observe(await call)
        except Conflict:
            return False  # the other replica wrote first: read again next round
        return True

    async def _release(self) -> None:
        """Hand the Lease back (holder empty, 1 s) if we hold it, within the renew deadline."""
        if self._lease is None or self._holder() != self.identity:
            return
        now = _micro_time()
        spec = {**self._spec(now, now, _count(self._lease.get("spec") or {})), "holderIdentity": ""}
        spec["leaseDurationSeconds"] = 1
        try:
            async with asyncio.timeout(self._renew_deadline):
                await self._client.replace(self._path, {**self._lease, "spec": spec})
            log.info("released Lease %s", self._name)
        except (BridgeError, TimeoutError) as exc:
            log.warning("could not release Lease %s: %s", self._name, exc or "no answer in time")

    def _spec(self, acquired: str, renewed: str, transitions: int) -> dict[str, Any]:
        return {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": max(1, math.ceil(self._duration)),
            "acquireTime": acquired,
            "renewTime": renewed,
            "leaseTransitions": transitions,
        }

    def _observe(self, lease: Object) -> None:
        if self._lease is None or lease.get("spec") != self._lease.get("spec"):
            self._observed_at = self._clock()
        self._lease = lease

    def _valid(self, spec: dict[str, Any]) -> bool:
        """Whether the holder's term is still running, by our own clock since we saw it so."""
        duration = spec.get("leaseDurationSeconds")
        seconds = duration if isinstance(duration, int) and duration > 0 else self._duration
        return self._clock() < self._observed_at + seconds

    def _holder(self) -> str:
        spec = (self._lease or {}).get("spec") or {}
        holder = spec.get("holderIdentity")
        return holder if isinstance(holder, str) else ""


def _count(spec: dict[str, Any]) -> int:
    value = spec.get("leaseTransitions")
    return value if isinstance(value, int) and value >= 0 else 0


def _micro_time() -> str:
    """A MicroTime, as the API server stores renewTime and acquireTime."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
