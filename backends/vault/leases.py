"""Vault's leases and certificates as lifetimes (provider/mount/lifetimes.py holds them per pod),
and the login tokens that leases depend on.

A dynamic secret (`database/creds/<role>`, `aws/creds/<role>`) comes with a lease; Vault revokes
the lease at its end, and also when the token that created it expires or is revoked. So a
credential works until the earlier of its lease's end and its token's: `Lifetime.end`. When a
pod's poll finds it due, `renew` extends both as needed — the token with `auth/token/renew-self`
(the default policy allows it; one call per token however many leases it holds) and the lease
with `sys/leases/renew` — up to their max TTLs; past those, the mount layer issues a new one.
A renewal granted less than it asked has hit its max TTL: that end is final (`renewable` is
then False, so the mount layer replaces the credential at its renewal point measured from its
issue, before the token that cannot be renewed past its max TTL ends the lease it created).
A lease-creating read uses a token with at least RENEW_AT of its TTL left (renewed, else a new
login), so a new credential never starts out bound to a token about to expire. A certificate
(`pki/issue`: `expiration`, or the certificate's notAfter) has no lease unless the role asks for
one: it ends at notAfter and is re-issued with its key.

`release` revokes a lease with the token that created it (`sys/leases/revoke`, which the default
policy does not grant: a 403 is expected on many installations and counted by the caller).
"""

from __future__ import annotations

import asyncio
import datetime
import json
import math
import time
from collections.abc import Awaitable, Callable, Hashable, Mapping
from dataclasses import dataclass, field
from typing import Any

from backends.vault.client import Reply, VaultHTTP, status_error
from backends.vault.dialect import VaultStore
from provider.core.backend import BackendEnv
from provider.core.errors import BridgeError, PermissionDenied
from provider.core.memo import Memo
from provider.core.model import FetchContext, Lifetime

#: A lease-creating read wants its token to have this much of its TTL left.
RENEW_AT = 2 / 3
#: Refs remembered as creating leases (their reads get a fresh token).
KNOWN_REFS = 10_000
#: Seconds a renewal may grant under what it asked and still not count as capped by a max TTL
#: (Vault grants whole seconds).
CAPPED_SLACK = 1.0


@dataclass
class TokenLife:
    """A login token's clock; `renew-self` moves its end (mutable, shared by its leases)."""

    #: The TTL granted at login, asked again at each renewal; 0 for a token that never expires.
    ttl: float
    #: `time.monotonic()` at which Vault revokes it (and every lease it created).
    end: float
    renewable: bool
    #: The renewal in flight: concurrent polls of its leases share one call.
    renewing: asyncio.Future[None] | None = field(default=None, repr=False)

    def left(self, now: float) -> float:
        return self.end - now

    def worn(self, now: float) -> bool:
        """Less than RENEW_AT of its TTL left."""
        return self.ttl > 0 and self.left(now) < RENEW_AT * self.ttl


@dataclass(frozen=True)
class VaultLease:
    """`Lifetime.handle` of a Vault value: what renewing or revoking it needs. Never printed."""

    store: VaultStore
    token: str = field(repr=False)
    token_life: TokenLife = field(repr=False)
    lease_id: str = field(default="", repr=False)
    #: The lease's duration as issued (the increment asked at each renewal).
    ttl: float = 0.0
    lease_end: float = math.inf
    lease_renewable: bool = False
    cert_end: float = math.inf

    def _ends(self) -> list[tuple[float, bool]]:
        """Each end that binds the value, and whether a renewal can move it."""
        ends = [(self.lease_end, self.lease_renewable), (self.cert_end, False)]
        if self.lease_id:  # a lease dies with its token; a bare certificate does not
            ends.append((self.token_life.end, self.token_life.renewable))
        return ends

    def end(self) -> float:
        return min(end for end, _ in self._ends())

    def extendable(self) -> bool:
        """Whether a renewal can move `end`: every end that binds it can be moved."""
        end = self.end()
        return end < math.inf and all(ok for e, ok in self._ends() if e == end)


def lifetime_of(
    payload: Mapping[str, Any], store: VaultStore, token: str, life: TokenLife, now: float
) -> Lifetime | None:
    """The lifetime of a read's answer: a lease, a certificate, or None (a KV secret: KV v1's
    lease_duration is a refresh hint without a lease_id)."""
    lease_id = payload.get("lease_id")
    ttl = _seconds(payload.get("lease_duration"))
    has_lease = isinstance(lease_id, str) and bool(lease_id) and ttl > 0
    cert_left = _certificate_left(payload.get("data"))
    if not has_lease and cert_left is None:
        return None
    cert_end = math.inf if cert_left is None else now + cert_left
    if not has_lease:
        handle = VaultLease(store, token, life, cert_end=cert_end)
        return Lifetime("certificate", now, handle.end(), handle=handle, why="certificate notAfter")
    handle = VaultLease(
        store,
        token,
        life,
        lease_id=str(lease_id),
        ttl=ttl,
        lease_end=now + ttl,
        lease_renewable=payload.get("renewable") is True,
        cert_end=cert_end,
    )
    why = f"lease_id with lease_duration {ttl:.0f}s"
    if life.ttl:
        why += f", bound to its login token's {life.ttl:.0f}s TTL"
    return Lifetime(
        "lease", now, handle.end(), renewable=handle.extendable(), handle=handle, why=why
    )


def _seconds(value: object) -> float:
    """A positive number of seconds from Vault's JSON, else 0."""
    ok = isinstance(value, int | float) and not isinstance(value, bool) and value > 0
    return float(value) if ok else 0.0  # type: ignore[arg-type]


def _certificate_left(data: object) -> float | None:
    """Seconds until a certificate in the answer ends: `expiration` (PKI's epoch seconds), else
    the certificate's own notAfter; None when the answer holds no certificate."""
    if not isinstance(data, dict) or not isinstance(data.get("certificate"), str):
        return None
    expiration = _seconds(data.get("expiration"))
    if expiration:
        return expiration - time.time()
    from cryptography import x509  # only for answers with a certificate and no expiration

    try:
        cert = x509.load_pem_x509_certificate(data["certificate"].encode())
    except (ValueError, TypeError, UnicodeEncodeError):  # not a certificate: a plain value
        return None
    return (cert.not_valid_after_utc - datetime.datetime.now(datetime.UTC)).total_seconds()


class Leases:
    """Renewing and revoking a backend's leases, and keeping their tokens alive."""

    def __init__(self, env: BackendEnv[Any], http: VaultHTTP) -> None:
        self._env = env
        self._http = http
        #: Refs whose reads created leases (each counts 1 against the memo's size).
        self._leasing: Memo[Hashable, bool] = Memo(KNOWN_REFS, KNOWN_REFS)

    def creates_leases(self, ref: Hashable) -> bool:
        return bool(self._leasing.get(ref))

    def saw_lease(self, ref: Hashable) -> None:
        self._leasing.put(ref, True, 1)

    async def renew(self, lifetime: Lifetime, ctx: FetchContext) -> Lifetime | None:
        """The lifetime extended: the token renewed when it binds the end or is worn, the lease
        when it binds the end or has less than half its duration left."""
        lease = lifetime.handle
        if not isinstance(lease, VaultLease) or not lease.lease_id:
            return None
        now = time.monotonic()
        life = lease.token_life
        if life.renewable and (life.end <= lease.lease_end or life.worn(now)):
            await self.keep_token(lease.store, lease.token, life, ctx)
        lease_end, lease_renewable = lease.lease_end, lease.lease_renewable
        if lease_renewable and (lease_end <= life.end or lease_end - now < lease.ttl / 2):
            lease_end, lease_renewable = await self._renew_lease(lease, ctx)
        handle = VaultLease(
            lease.store,
            lease.token,
            life,
            lease_id=lease.lease_id,
            ttl=lease.ttl,
            lease_end=lease_end,
            lease_renewable=lease_renewable,
            cert_end=lease.cert_end,
        )
        return Lifetime(
            "lease",
            now,
            handle.end(),
            renewable=handle.extendable(),
            handle=handle,
            why=lifetime.why,
        )

    async def release(self, lifetime: Lifetime, ctx: FetchContext) -> bool:
        lease = lifetime.handle
        if not isinstance(lease, VaultLease) or not lease.lease_id:
            return False
        if lease.token_life.end <= time.monotonic():
            return True  # Vault revoked it with its token
        body = json.dumps({"lease_id": lease.lease_id})
        reply = await self._call(lease.store, lease.token, "sys/leases/revoke", body, ctx, "revoke")
        if reply.status == 403:
            return False
        if not 200 <= reply.status < 300:
            raise status_error(reply, _doing("revoking", lease), denied="")
        return True

    async def keep_token(
        self, store: VaultStore, token: str, life: TokenLife, ctx: FetchContext
    ) -> None:
        """`renew-self` once for all the callers that find the token worn at the same time;
        a token that cannot be renewed keeps its end (its leases are then re-issued)."""
        if life.renewing is None:
            life.renewing = asyncio.ensure_future(self._renew_token(store, token, life, ctx))
            life.renewing.add_done_callback(lambda _f: setattr(life, "renewing", None))
        await asyncio.shield(life.renewing)

    async def _renew_token(
        self, store: VaultStore, token: str, life: TokenLife, ctx: FetchContext
    ) -> None:
        body = json.dumps({"increment": f"{life.ttl:.0f}s"})
        try:
            reply = await self._call(store, token, "auth/token/renew-self", body, ctx, "renew-self")
        except BridgeError:
            return  # the lease's renewal decides; the token keeps its end
        auth = reply.json().get("auth") if reply.status == 200 else None
        granted = _seconds(auth.get("lease_duration")) if isinstance(auth, dict) else 0.0
        if granted:
            life.end = time.monotonic() + granted
        # Refused, or capped by the token's max TTL (granted less than asked): its end is final,
        # and asking again at every poll would not move it.
        if granted < life.ttl - CAPPED_SLACK:
            life.renewable = False

    async def _renew_lease(self, lease: VaultLease, ctx: FetchContext) -> tuple[float, bool]:
        """The lease's new end, and whether it can be renewed again (not at its max TTL)."""
        body = json.dumps({"lease_id": lease.lease_id, "increment": int(lease.ttl)})
        reply = await self._call(lease.store, lease.token, "sys/leases/renew", body, ctx, "renew")
        if reply.status == 403:
            raise PermissionDenied(
                f"{_doing('renewing', lease)}: Vault denied it ({reply.status_text()}); grant "
                "the role's policies update on sys/leases/renew (Vault's default policy does)"
            )
        if reply.status == 400 or _at_max_ttl(reply):  # revoked, expired, not renewable:
            return lease.lease_end, False  # the caller re-issues
        if not 200 <= reply.status < 300:
            raise status_error(reply, _doing("renewing", lease), denied="")
        duration = _seconds(reply.json().get("lease_duration"))
        if not duration:
            return lease.lease_end, False
        return time.monotonic() + duration, duration >= lease.ttl - CAPPED_SLACK

    async def _call(
        self,
        store: VaultStore,
        token: str,
        path: str,
        body: str,
        ctx: FetchContext,
        operation: str,
    ) -> Reply:
        doing = f"{operation} at Vault {store.address}"

        async def call() -> Reply:
            with self._env.metrics.backend_call("vault", operation):
                reply = await self._http.request(
                    store.address,
                    store.tls,
                    "PUT",
                    path,
                    deadline=ctx.deadline,
                    token=token,
                    namespace=store.namespace,
                    body=body,
                    doing=doing,
                )
            if _at_max_ttl(reply):
                return reply  # not a failure to retry: the caller keeps the old end
            if reply.status >= 500 or reply.status in (412, 429):
                raise status_error(reply, doing, denied="")
            return reply

        retried: Callable[[], Awaitable[Reply]] = call
        return await self._env.retry(retried, ctx)


def _at_max_ttl(reply: Reply) -> bool:
    return reply.status == 500 and "past the max TTL" in reply.errors()


def _doing(what: str, lease: VaultLease) -> str:
    path = lease.lease_id.rsplit("/", 1)[0]  # the lease id's path part, not its unique suffix
    return f"{what} a lease of {path} at Vault {lease.store.address}"
