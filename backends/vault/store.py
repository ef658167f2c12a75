"""The Vault/OpenBao backend: identity from the pod's token, reads through the HTTP API.

Each unique ref (path, query, method, body) is requested once per fetch, concurrently. Reads
that fail return that ref's error; only a refused login fails the whole call. A 403 on a cached
token triggers one shared re-login and one more attempt, as vault-csi-provider does, because the
token may have been revoked since it was cached. A selection (`select`) is listed and its
secrets read by backends/vault/selected.py, through the same calls.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from backends.vault import dialect, leases
from backends.vault.auth import Authenticator, VaultToken
from backends.vault.awslogin import AwsPod, AwsSigner
from backends.vault.client import Reply, VaultHTTP, status_error
from backends.vault.dialect import Ref, VaultStore
from backends.vault.gcplogin import GcpPod
from backends.vault.leases import Leases
from backends.vault.objects import VaultRef
from backends.vault.options import Options
from backends.vault.selected import KVSelector
from backends.vault.selectors import VaultSelection
from backends.wire import Charge, dumps_sliced, loads_sliced, sliced
from provider.core.backend import INLINE_PARSE_BYTES, Backend, BackendEnv, Dialect
from provider.core.errors import BridgeError, NotFound, StoreUnavailable
from provider.core.identity import pod_scope
from provider.core.limits import FetchBytes
from provider.core.model import (
    DataAt,
    FetchContext,
    Fetched,
    Identity,
    Lifetime,
    Pod,
    SecretValue,
    StorePlan,
    identity_key,
)
from provider.core.selection import Selecting

Plan = StorePlan[VaultStore, Ref]

_KV2_HINT = "Invalid path for a versioned K/V"


class VaultBackend:
    name = "vault"

    def __init__(self, env: BackendEnv[Options]) -> None:
        self._env = env
        options = env.options
        self._http = VaultHTTP(
            max_connections=options.max_connections,
            # A little above the response limit: the core reports the exact overflow itself.
            max_body_bytes=env.core.max_response_bytes + 64 * 1024,
            request_timeout=options.request_timeout,
        )
        self._aws = AwsSigner(env)
        self._auth = Authenticator(env, self._http, options.token_renew_margin, self._aws)
        self._leases = Leases(env, self._http)
        #: Selections: the KV mounts under their paths, and what each identity's held.
        self.selector = KVSelector()

    async def identify(self, plan: Plan, pod: Pod) -> Identity:
        store = plan.store
        # The pod's token, or its cloud identity and what the login is bound to (auth.py).
        credential, cloud = await self._auth.who(store, pod)
        key = identity_key(
            "vault",
            store.address,
            store.namespace or "-",
            store.mount,
            store.role,
            store.audience,
            *cloud,
            pod_scope(self._env, pod),
        )
        # A cloud login whose principal a ServiceAccount annotation named holds until that is
        # read again (`Identity.expires`).
        until = credential.until if isinstance(credential, AwsPod | GcpPod) else math.inf
        return Identity(key, pod.subject, credential, until)

    async def fetch(
        self, plan: Plan, identity: Identity, refs: Sequence[Ref], ctx: FetchContext
    ) -> Mapping[Ref, Fetched]:
        store = plan.store
        started = time.monotonic()
        token = await self._auth.token(store, identity, ctx)
        if any(self._leases.creates_leases(ref) for ref in refs):
            token = await self._fresh(store, identity, token, ctx)
        names = _object_names(plan)

        async def one(ref: Ref, held: FetchBytes) -> tuple[Fetched]:
            # Wrapped in a tuple: a returned per-ref error must not look like a raised one.
            if isinstance(ref, VaultSelection):
                return (await self._select(store, identity, token, ref, ctx, started, held),)
            return (await self._read(store, identity, token, ref, names, ctx, started, held),)

        # Every answer is charged to the mount's budget and the bytes in flight as it is read:
        # a mount over its answer budget is refused when it spends it, not after every read.
        async with self._env.reads.fetch(identity.key) as held:
            outcomes = await held.gather(*(one(ref, held) for ref in refs))
        results: dict[Ref, Fetched] = {}
        for ref, outcome in zip(refs, outcomes, strict=True):
            if isinstance(outcome, BaseException):
                # Only a refused re-login (or a bug) gets here: it fails the whole Mount, after
                # every other read has finished (nothing is left running behind our answer).
                raise outcome
            results[ref] = outcome[0]
        return results

    async def _fresh(
        self, store: VaultStore, identity: Identity, token: VaultToken, ctx: FetchContext
    ) -> VaultToken:
        """A token with at least two thirds of its TTL left, for reads that create leases: a
        new credential is bound to its token, and should not start out about to die with it."""
        life = token.life
        if not life.worn(time.monotonic()):
            return token
        if life.renewable:
            await self._leases.keep_token(store, token.token, life, ctx)
            if not life.worn(time.monotonic()):
                return token
        return await self._auth.relogin(store, identity, token, ctx)

    async def renew(self, lifetime: Lifetime, ctx: FetchContext) -> Lifetime | None:
        return await self._leases.renew(lifetime, ctx)

    async def release(self, lifetime: Lifetime, ctx: FetchContext) -> bool:
        return await self._leases.release(lifetime, ctx)

    async def _read(
        self,
        store: VaultStore,
        identity: Identity,
        token: VaultToken,
        ref: VaultRef,
        names: Mapping[Ref, str],
        ctx: FetchContext,
        started: float,
        held: FetchBytes,
    ) -> Fetched:
        doing = (
            f"reading {ref.describe()} for {names.get(ref, 'object')} as {identity.subject} "
            f"(role {store.role!r}, auth/{store.mount})"
        )
        reply = await self._attempt(store, token, ref, ctx, doing, charge=held.charge)
        # A token logged in during this fetch cannot have been revoked since: its 403 is a
        # policy denial, and logging in again would only double the load of a misconfiguration.
        if isinstance(reply, Reply) and reply.status == 403 and token.obtained < started:
            token = await self._auth.relogin(store, identity, token, ctx)
            reply = await self._attempt(store, token, ref, ctx, doing, charge=held.charge)
        if isinstance(reply, BridgeError):
            return reply
        if not 200 <= reply.status < 300:
            return _read_error(reply, doing, store, ref)
        value = await self._parsed(identity, reply, doing, ctx)
        if isinstance(value, BridgeError):
            return value
        lifetime = leases.lifetime_of(
            value.payload, store, token.token, token.life, time.monotonic()
        )
        if lifetime is None:
            return [value.value]
        if lifetime.kind == "lease":
            self._leases.saw_lease(ref)
        return [dataclasses.replace(value.value, lifetime=lifetime)]

    async def _select(
        self,
        store: VaultStore,
        identity: Identity,
        token: VaultToken,
        sel: VaultSelection,
        ctx: FetchContext,
        started: float,
        budget: FetchBytes,
    ) -> Fetched:
        """A selection's listing and reads, each call as `_read` makes it (one shared re-login
        when a token cached before this fetch is refused)."""
        held = [token]
        charge = budget.charge

        async def call(request: VaultRef, doing: str, operation: str) -> Reply | BridgeError:
            used = held[0]
            reply = await self._attempt(
                store, used, request, ctx, doing, operation, quote=True, charge=charge
            )
            if isinstance(reply, Reply) and reply.status == 403 and used.obtained < started:
                if held[0] is used:
                    held[0] = await self._auth.relogin(store, identity, used, ctx)
                reply = await self._attempt(
                    store, held[0], request, ctx, doing, operation, quote=True, charge=charge
                )
            return reply

        async def value_of(
            reply: Reply, doing: str
        ) -> tuple[SecretValue, dict[str, Any]] | BridgeError:
            read = await self._parsed(identity, reply, doing, ctx)
            return read if isinstance(read, BridgeError) else (read.value, read.payload)

        async def parse(reply: Reply, doing: str) -> dict[str, Any]:
            work = functools.partial(_json_of, reply.body)
            return await self._env.parsed(identity.key, len(reply.body), work, ctx, doing)

        who = f"as {identity.subject} (role {store.role!r}, auth/{store.mount})"
        return await self.selector.read(sel, identity.key, call, value_of, who, parse)

    async def _parsed(
        self, identity: Identity, reply: Reply, doing: str, ctx: FetchContext
    ) -> _Read | BridgeError:
        """A read's answer as its value: a large one parsed off the event loop, in the
        namespace's parse share."""
        work = functools.partial(_value, reply, doing)
        return await self._env.parsed(identity.key, len(reply.body), work, ctx, doing)

    async def _attempt(
        self,
        store: VaultStore,
        token: VaultToken,
        ref: VaultRef,
        ctx: FetchContext,
        doing: str,
        operation: str = "read",
        *,
        quote: bool = False,
        charge: Charge | None = None,
    ) -> Reply | BridgeError:
        async def call() -> Reply:
            with self._env.metrics.backend_call("vault", operation):
                reply = await self._http.request(
                    store.address,
                    store.tls,
                    ref.method,
                    ref.path,
                    deadline=ctx.deadline,
                    token=token.token,
                    namespace=store.namespace,
                    query=ref.query,
                    body=ref.body,
                    doing=doing,
                    quote=quote,
                    charge=charge,
                )
            if reply.status >= 500 or reply.status in (412, 429):
                raise status_error(reply, doing, denied="")
            return reply

        try:
            return await self._env.retry(call, ctx)
        except BridgeError as exc:
            return exc

    async def close(self) -> None:
        await self._http.close()


def _read_error(reply: Reply, doing: str, store: VaultStore, ref: VaultRef) -> BridgeError:
    mount, _, rest = ref.path.partition("/")
    kv2_path = f"{mount}/data/{rest}"
    not_found = ""
    if _KV2_HINT in reply.errors():
        not_found = f"the mount is KV version 2: use secretPath {kv2_path}"
    denied = (
        f"grant the policies of role {store.role!r} "
        f"{'update' if ref.method != 'GET' else 'read'} on {ref.path}"
    )
    # The commonest mistake: a KV v2 secret read by its v1-style path, which policies on
    # <mount>/data/... do not cover. We cannot see the mount type without extra permissions.
    if ref.method == "GET" and rest and not rest.startswith("data/"):
        denied += f" (or, if {mount}/ is a KV version 2 mount, read secretPath {kv2_path})"
    return status_error(reply, doing, denied=denied, not_found=not_found)


@dataclass(frozen=True)
class _Read:
    value: SecretValue
    #: The parsed answer without its data, but for what a lifetime and a selection's version
    #: read of it (`_kept`): the data map itself is let go with the parse.
    payload: dict[str, Any] = field(repr=False)


#: What of an answer's `data` is kept beside its value: a PKI certificate's end and a KV v2
#: secret's metadata (its version). The data map itself is parsed again from the content by
#: the transforms that need it (`DataAt`).
_KEPT_DATA = ("certificate", "expiration", "metadata")


def _value(reply: Reply, doing: str) -> _Read | BridgeError:
    """The whole response as the file (upstream), `data` (or KV v2's `data.data`) for keys."""
    if not reply.body.strip():
        return NotFound(f"{doing}: Vault answered HTTP {reply.status} with no data")
    # A large answer is parsed in a worker thread (`_parsed`), where the C parser would still
    # hold the GIL through an answer of many values: see loads_sliced.
    large = len(reply.body) > INLINE_PARSE_BYTES and sliced(reply.body)
    try:
        payload: Any = loads_sliced(reply.body) if large else json.loads(reply.body)
    except (ValueError, RecursionError):
        payload = None
    if not isinstance(payload, dict):
        error = StoreUnavailable(
            f"{doing}: the answer is not Vault's JSON; does vaultAddress point at Vault?"
        )
        error.transient = False  # a proxy or a wrong address will not change within a Mount
        return error
    if payload.get("data") is None and not payload.get("auth"):
        warnings = (reply.errors() if payload.get("warnings") else "") or "no data"
        return NotFound(f"{doing}: Vault returned no data ({warnings})")
    # request_id differs on every read; without it, an unchanged secret keeps its version.
    payload.pop("request_id", None)
    # Compact and UTF-8 as Go's json.Marshal writes it (upstream marshals the response).
    dump: Callable[[Any], bytes] = dumps_sliced if large else _dumps
    content = dump(payload)
    data = payload.get("data")
    inner = data.get("data") if isinstance(data, dict) else None
    # Transforms parse the data map from the content when they need it, at this path: a
    # parsed map keeps several times its bytes alive in every cached copy (issue 40, item 2).
    at = DataAt(("data", "data") if isinstance(inner, dict) else ("data",))
    value = SecretValue(content=content, data=at)
    return _Read(value, _kept(payload))


def _dumps(payload: Any) -> bytes:
    return json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode()


def _kept(payload: dict[str, Any]) -> dict[str, Any]:
    """The answer without its data map, but for the data fields lifetimes and versions read."""
    kept = {k: v for k, v in payload.items() if k != "data"}
    data = payload.get("data")
    if isinstance(data, dict):
        kept["data"] = {k: data[k] for k in _KEPT_DATA if k in data}
    return kept


def _json_of(body: bytes) -> dict[str, Any]:
    """A listing's answer parsed (`Reply.json`), by Python's decoder when it is large."""
    if len(body) <= INLINE_PARSE_BYTES or not sliced(body):
        return Reply(200, body).json()
    try:
        value = loads_sliced(body) if body else {}
    except (ValueError, RecursionError):
        return {}
    return value if isinstance(value, dict) else {}


def _object_names(plan: Plan) -> dict[Ref, str]:
    names: dict[Ref, list[str]] = {}
    for spec in plan.objects:
        names.setdefault(spec.ref, []).append(spec.name)
    return {
        ref: ("objects " if len(n) > 1 else "object ") + ", ".join(repr(x) for x in n)
        for ref, n in names.items()
    }


def create(env: BackendEnv[Options]) -> Backend[VaultStore, Ref]:
    """The store's backend, typed as the protocol so that mypy checks it against it."""
    return VaultBackend(env)


#: The dialect module, checked by mypy against the Dialect protocol (provider/core/backend.py).
DIALECT: Dialect[VaultStore, Ref, Options] = dialect
#: ... and against the Selecting protocol (provider/core/selection.py).
SELECTING: Selecting[VaultStore, Ref] = dialect
