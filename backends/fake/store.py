"""The in-memory fake store, for tests and demos (`serve --enable-fake-backend`).

Its secrets come from `--fake-store-file`, re-read whenever the file changes, so a test or the
demo can rotate a secret by rewriting the file. The file:

    secrets:
      db-creds: '{"username": "app", "password": "..."}'   # a string, or a map (stored as JSON)
    access:                      # optional: which namespace/serviceaccount may read a path
      db-creds: [default/app]
    failures:                    # optional: make a path fail: denied | notfound | unavailable
      broken: unavailable
    leases:                      # optional: paths issued as leases, a new credential per read
      db-creds: {ttl: 9, max_ttl: 30, renewable: true, revoke: true}

A selector (`select: [{prefix: app/}]`) lists the paths under its prefix (counted in `reads`
as `list:<prefix>`), each marked by its content's digest, and reads again only the ones that
changed since the identity's last poll (provider/core/selection.py).

A leased path answers `{"lease_id": "fake/<path>/<n>", "data": <value>}` with a Lifetime of
`ttl` seconds, renewable (`renew`) up to `max_ttl` after its issue; `release` revokes it unless
`revoke: false` (a policy without revoke). A path's failure applies to its renewals too.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import json
import os
import time
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from backends.fake import dialect
from backends.fake.dialect import FakeSelection, FakeStore, Ref
from backends.fake.options import Options, load_store_file
from provider.core.backend import Backend, BackendEnv, Dialect
from provider.core.errors import (
    BridgeError,
    InvalidParameters,
    LimitExceeded,
    NotFound,
    PermissionDenied,
    StoreUnavailable,
)
from provider.core.identity import pod_scope, pod_token
from provider.core.limits import FetchBytes
from provider.core.model import (
    FetchContext,
    Fetched,
    Identity,
    Lifetime,
    Pod,
    SecretValue,
    StorePlan,
    identity_key,
)
from provider.core.selection import Listed, Selecting, Selections, too_many

Plan = StorePlan[FakeStore, Ref]


@dataclass(frozen=True)
class FakeLease:
    """`Lifetime.handle` of a leased fake value."""

    path: str
    lease_id: str
    ttl: float
    max_end: float


class FakeBackend:
    name = "fake"

    def __init__(self, env: BackendEnv[Options]) -> None:
        self._env = env
        self._file = env.options.store_file
        self._stamp: tuple[float, int] | None = None
        self._data: Mapping[str, Any] = {}
        #: Reads served, by path: tests count store calls with it.
        self.reads: dict[str, int] = {}
        #: Seconds each read takes (tests of coalescing and deadlines set it).
        self.latency = env.options.latency
        #: Fetch calls in flight now, and the most seen at once (tests of concurrency limits).
        self.inflight = 0
        self.peak_inflight = 0
        #: Leases issued, renewed and revoked, by lease id (tests read them).
        self.renewals: dict[str, int] = {}
        self.revoked: list[str] = []
        self._serial = itertools.count(1)
        #: Reads each selection's listed secrets (and counts them).
        self.selections = Selections()

    async def identify(self, plan: Plan, pod: Pod) -> Identity:
        store = plan.store
        credential = None
        if store.audience:
            credential = await pod_token(self._env, pod, store.audience)
        key = identity_key("fake", store.audience, pod_scope(self._env, pod))
        return Identity(key=key, subject=pod.subject, credential=credential)

    async def fetch(
        self, plan: Plan, identity: Identity, refs: Sequence[Ref], ctx: FetchContext
    ) -> Mapping[Ref, Fetched]:
        started = time.perf_counter()
        self.inflight += 1
        self.peak_inflight = max(self.peak_inflight, self.inflight)
        try:
            if self.latency:
                await asyncio.sleep(self.latency)
        finally:
            self.inflight -= 1
        data = self._load()
        results: dict[Ref, Fetched] = {}
        # Charged as every store's answers are (provider/core/limits.py ReadBytes): a mount over
        # its answer budget is refused, with the store's reads stopped there.
        async with self._env.reads.fetch(identity.key) as held:
            for ref in refs:
                if isinstance(ref, FakeSelection):
                    results[ref] = await self._select(data, ref, identity, held)
                else:
                    results[ref] = await _charged(held, self._read(data, ref.path, identity))
                if held.refusal is not None:
                    break
        # Each read's duration, as every store records its calls (the reads of one fetch run
        # together, so each took the fetch's time).
        elapsed = time.perf_counter() - started
        duration = self._env.metrics.backend_duration.labels("fake", "read")
        for _ref in refs:
            duration.observe(elapsed)
        return results

    async def _select(
        self, data: Mapping[str, Any], ref: FakeSelection, identity: Identity, held: FetchBytes
    ) -> Fetched:
        self.reads[f"list:{ref.prefix}"] = self.reads.get(f"list:{ref.prefix}", 0) + 1
        paths = sorted(p for p in (data.get("secrets") or {}) if p.startswith(ref.prefix))
        if len(paths) > ref.limit:
            return too_many(f"the selector {ref.prefix!r}*", len(paths), ref.limit)
        listed = [
            Listed(p[len(ref.prefix) :], _marker(data["secrets"][p]), p)
            for p in paths
            if p[len(ref.prefix) :]
        ]

        async def read(secrets: Sequence[Listed]) -> dict[Hashable, SecretValue | BridgeError]:
            out: dict[Hashable, SecretValue | BridgeError] = {}
            for secret in secrets:
                got = await _charged(held, self._read(data, str(secret.handle), identity))
                out[secret.handle] = got if isinstance(got, BridgeError) else got[0]
            return out

        return await self.selections.refresh(identity.key, ref, listed, read)

    def _read(self, data: Mapping[str, Any], path: str, identity: Identity) -> Fetched:
        self.reads[path] = self.reads.get(path, 0) + 1
        result = self._lookup(data, path, identity)
        # The outcome label as every other store reports it: "ok" or the error's type name.
        outcome = type(result).__name__ if isinstance(result, BridgeError) else "ok"
        self._env.metrics.backend_calls.labels("fake", "read", outcome).inc()
        return result

    def _lookup(self, data: Mapping[str, Any], path: str, identity: Identity) -> Fetched:
        failure = (data.get("failures") or {}).get(path)
        if failure == "unavailable":
            return StoreUnavailable(f"fake store: {path!r} is unavailable")
        allowed = (data.get("access") or {}).get(path)
        if failure == "denied" or (allowed is not None and identity.subject not in allowed):
            return PermissionDenied(f"fake store: {identity.subject} may not read {path!r}")
        secrets = data.get("secrets") or {}
        if failure == "notfound" or path not in secrets:
            return NotFound(f"fake store: no secret at {path!r}")
        value = secrets[path]
        lease = (data.get("leases") or {}).get(path)
        if isinstance(lease, dict):
            return [self._issue(path, value, lease)]
        if isinstance(value, bytes):
            content = value
        elif isinstance(value, str):
            content = value.encode()
        else:
            content = json.dumps(value, separators=(",", ":")).encode()
        return [SecretValue(content=content)]

    def _issue(self, path: str, value: Any, lease: Mapping[str, Any]) -> SecretValue:
        now = time.monotonic()
        lease_id = f"fake/{path}/{next(self._serial)}"
        ttl = float(lease.get("ttl", 60))
        handle = FakeLease(path, lease_id, ttl, now + float(lease.get("max_ttl", ttl)))
        lifetime = Lifetime(
            "lease",
            now,
            now + ttl,
            renewable=bool(lease.get("renewable", True)),
            handle=handle,
            why=f"a fake lease of {ttl:g}s",
        )
        content = json.dumps({"lease_id": lease_id, "data": value}, separators=(",", ":"))
        return SecretValue(content=content.encode(), lifetime=lifetime)

    async def renew(self, lifetime: Lifetime, ctx: FetchContext) -> Lifetime | None:
        lease = lifetime.handle
        if not isinstance(lease, FakeLease):
            return None
        data = self._load()
        if (data.get("failures") or {}).get(lease.path) == "unavailable":
            raise StoreUnavailable(f"fake store: {lease.path!r} is unavailable")
        if lease.lease_id in self.revoked:
            return None
        self.renewals[lease.lease_id] = self.renewals.get(lease.lease_id, 0) + 1
        now = time.monotonic()
        end = min(now + lease.ttl, lease.max_end)
        return Lifetime("lease", now, end, renewable=True, handle=lease, why=lifetime.why)

    async def release(self, lifetime: Lifetime, ctx: FetchContext) -> bool:
        lease = lifetime.handle
        if not isinstance(lease, FakeLease):
            return False
        settings = (self._load().get("leases") or {}).get(lease.path) or {}
        if settings.get("revoke", True) is False:
            return False
        self.revoked.append(lease.lease_id)
        return True

    def _load(self) -> Mapping[str, Any]:
        if not self._file:
            return self._data
        try:
            st = os.stat(self._file)
        except OSError as exc:
            raise _config_error(self._file, exc) from None
        stamp = (st.st_mtime, st.st_size)
        if stamp != self._stamp:
            try:
                loaded = load_store_file(self._file)
            except InvalidParameters as exc:
                # Broken after start (checked then): the same line as at start, on the mount.
                raise StoreUnavailable(str(exc)) from None
            self._data, self._stamp = loaded, stamp
        return self._data

    async def close(self) -> None:
        return None


def _config_error(path: str, exc: Exception) -> BridgeError:
    return StoreUnavailable(f"fake store file {path} cannot be read: {type(exc).__name__}")


def _marker(value: Any) -> str:
    """A fake secret's change marker: the digest of what it holds (the real stores use their
    metadata's version or last-changed time)."""
    return hashlib.sha256(repr(value).encode()).hexdigest()[:16]


def create(env: BackendEnv[Options]) -> Backend[FakeStore, Ref]:
    """The store's backend, typed as the protocol so that mypy checks it against it."""
    return FakeBackend(env)


#: The dialect module, checked by mypy against the Dialect protocol (provider/core/backend.py).
DIALECT: Dialect[FakeStore, Ref, Options] = dialect
#: ... and against the Selecting protocol (provider/core/selection.py).
SELECTING: Selecting[FakeStore, Ref] = dialect


async def _charged(held: FetchBytes, fetched: Fetched) -> Fetched:
    """A read's values, charged to the fetch's bytes in flight; its refusal instead."""
    if isinstance(fetched, BridgeError):
        return fetched
    try:
        await held.charge(sum(len(v.content) for v in fetched))
    except LimitExceeded as exc:
        return exc
    return fetched
