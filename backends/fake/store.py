"""The in-memory fake store, for tests and demos (`serve --enable-fake-backend`).

Its secrets come from `--fake-store-file`, re-read whenever the file changes, so a test or the
demo can rotate a secret by rewriting the file. The file:

    secrets:
      db-creds: '{"username": "app", "password": "..."}'   # a string, or a map (stored as JSON)
    access:                      # optional: which namespace/serviceaccount may read a path
      db-creds: [default/app]
    failures:                    # optional: make a path fail: denied | notfound | unavailable
      broken: unavailable
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

import yaml

from backends.fake.dialect import FakeRef, FakeStore
from backends.fake.options import Options
from provider.core.backend import BackendEnv
from provider.core.errors import (
    BridgeError,
    InvalidParameters,
    NotFound,
    PermissionDenied,
    StoreUnavailable,
)
from provider.core.identity import pod_scope, pod_token
from provider.core.model import (
    FetchContext,
    Fetched,
    Identity,
    Pod,
    SecretValue,
    StorePlan,
    identity_key,
)

Plan = StorePlan[FakeStore, FakeRef]


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

    async def identify(self, plan: Plan, pod: Pod) -> Identity:
        store = plan.store
        credential = None
        if store.audience:
            credential = await pod_token(self._env, pod, store.audience)
        key = identity_key("fake", store.audience, pod_scope(self._env, pod))
        return Identity(key=key, subject=pod.subject, credential=credential)

    async def fetch(
        self, plan: Plan, identity: Identity, refs: Sequence[FakeRef], ctx: FetchContext
    ) -> Mapping[FakeRef, Fetched]:
        self.inflight += 1
        self.peak_inflight = max(self.peak_inflight, self.inflight)
        try:
            if self.latency:
                await asyncio.sleep(self.latency)
        finally:
            self.inflight -= 1
        data = self._load()
        results: dict[FakeRef, Fetched] = {}
        for ref in refs:
            results[ref] = self._read(data, ref.path, identity)
        return results

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
        if isinstance(value, bytes):
            content = value
        elif isinstance(value, str):
            content = value.encode()
        else:
            content = json.dumps(value, separators=(",", ":")).encode()
        return [SecretValue(content=content)]

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
                with open(self._file, encoding="utf-8") as fh:
                    loaded = yaml.safe_load(fh) or {}
            except (OSError, yaml.YAMLError) as exc:
                raise _config_error(self._file, exc) from None
            if not isinstance(loaded, dict):
                raise InvalidParameters(f"--fake-store-file {self._file}: expected a YAML map")
            self._data, self._stamp = loaded, stamp
        return self._data

    async def close(self) -> None:
        return None


def _config_error(path: str, exc: Exception) -> BridgeError:
    return StoreUnavailable(f"fake store file {path} cannot be read: {type(exc).__name__}")


def create(env: BackendEnv[Options]) -> FakeBackend:
    return FakeBackend(env)
