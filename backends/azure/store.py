"""The Azure Key Vault backend: identify the pod, then read secrets, keys and certificates.

Per identity key one `VaultSession` (credential + an aio client per object type it reads) is
cached in `env.credentials`; the SDK credential inside keeps its Entra token until shortly
before it expires, so a rollout of many pods with one service account logs in once.

A selection (`select`) is the vault's listing, matched as it arrives (listing.py), and a GET of
each matched secret, as the pod, at every poll past the class's reuse window (`Selections`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Hashable, Mapping, Sequence
from typing import Any

from backends.azure import auth, binding, dialect, listing
from backends.azure.client import VaultReader, VaultSession
from backends.azure.dialect import AzureStore, Ref
from backends.azure.objects import AzureRef
from backends.azure.options import Options
from backends.azure.selectors import AzureSelection
from backends.azure.transport import SharedSession
from provider.core.backend import Backend, BackendEnv, Dialect
from provider.core.errors import BridgeError
from provider.core.model import FetchContext, Fetched, Identity, Pod, SecretValue, StorePlan
from provider.core.selection import Listed, Selecting, Selections

#: How long a session is reused before it is rebuilt (its credential refreshes tokens itself).
SESSION_TTL = 3000.0
#: Concurrent Key Vault reads per provider process: a rollout stays under the vault's quota
#: (4,000 GETs per 10 s per vault) without serialising one pod's objects.
MAX_CONCURRENT_READS = 32

Plan = StorePlan[AzureStore, Ref]


class AzureBackend:
    name = "azure"

    def __init__(self, env: BackendEnv[Options]) -> None:
        self._env = env
        self._proxy = binding.ProxySettings(env.options or Options())
        self._http = SharedSession(env.options, direct=frozenset({self._proxy.host}))
        self._reads = asyncio.Semaphore(MAX_CONCURRENT_READS)
        #: What each identity's selections held at its last poll.
        self.selections = Selections()

    async def identify(self, plan: Plan, pod: Pod) -> Identity:
        return await auth.identify(self._env, plan.store, pod, self._token_proxy)

    async def _token_proxy(self) -> binding.TokenProxy:
        return await self._proxy.resolve(self._http.resolver())

    async def fetch(
        self, plan: Plan, identity: Identity, refs: Sequence[Ref], ctx: FetchContext
    ) -> Mapping[Ref, Fetched]:
        store = plan.store
        login: auth.Login = identity.credential  # what auth.identify put there
        session = await self._env.credentials.get_or_load(
            identity.key, lambda: self._open(store, login, identity)
        )
        session.assertion.token = login.assertion
        reader = VaultReader(session, identity, ctx, self._env)
        # Every answer's body is charged to the mount's budget and the bytes in flight as it is
        # read (backends/wire.py capped_response); once spent, the reads still waiting stop.
        async with self._env.reads.fetch(identity.key) as held:
            outcomes = await held.gather(
                *(self._fetch_one(reader, ref, identity.key) for ref in refs)
            )
        results: dict[Ref, Fetched] = {}
        for ref, outcome in zip(refs, outcomes, strict=True):
            if isinstance(outcome, auth.LoginRefused | binding.ProxyUntrusted):
                # A refused login fails the whole Mount; the next one builds a fresh session
                # (and, through the token proxy, reads its CA file again).
                self._env.credentials.invalidate(identity.key, session)
                raise outcome
            if isinstance(outcome, BaseException) and not isinstance(outcome, BridgeError):
                raise outcome
            results[ref] = outcome
        return results

    async def _fetch_one(self, reader: VaultReader, ref: Ref, identity_key: str) -> Fetched:
        if isinstance(ref, AzureSelection):
            return await self._select(reader, ref, identity_key)
        return await self._read(reader, ref)

    async def _read(self, reader: VaultReader, ref: AzureRef) -> list[SecretValue]:
        async with self._reads:
            return await reader.read(ref)

    async def _select(
        self, reader: VaultReader, selection: AzureSelection, identity_key: str
    ) -> Fetched:
        """The listing (one GET a page), then a GET of each matched secret."""
        found = await listing.listed(reader, selection)

        async def read(changed: Sequence[Listed]) -> dict[Hashable, SecretValue | BridgeError]:
            refs = [AzureRef("secret", str(s.handle)) for s in changed]
            got = await asyncio.gather(
                *(self._read(reader, r) for r in refs), return_exceptions=True
            )
            out: dict[Hashable, SecretValue | BridgeError] = {}
            for secret, outcome in zip(changed, got, strict=True):
                if isinstance(outcome, auth.LoginRefused | binding.ProxyUntrusted):
                    raise outcome  # the whole Mount's, as for a listed object
                if isinstance(outcome, BaseException) and not isinstance(outcome, BridgeError):
                    raise outcome
                out[secret.handle] = outcome if isinstance(outcome, BridgeError) else outcome[0]
            return out

        return await self.selections.refresh(identity_key, selection, found, read)

    async def _open(
        self, store: AzureStore, login: auth.Login, identity: Identity
    ) -> tuple[VaultSession, float]:
        source = auth.AssertionSource()
        source.token = login.assertion
        if login.proxy is not None:
            login_transport = await binding.transport(login.proxy, await self._http.session())
        else:
            login_transport = await self._http.transport()
        inner = auth.build_credential(store, login, login_transport, source)
        credential = auth.CheckedCredential(
            inner, store, identity.subject, self._env.credentials, identity.key, login.proxy
        )
        url = login.endpoints.vault_url

        async def build_client(object_type: str) -> Any:
            cls = _client_class(object_type)
            # retry_total=0: retry_transient is the only retry loop (see client.py).
            # permit_redirects=False: a redirect would take the read (and the answer we write
            # into the pod) to another host; the SDK would follow up to 30 by default.
            transport = await self._http.transport()
            return cls(url, credential, transport=transport, retry_total=0, permit_redirects=False)

        session = VaultSession(store.vault_name, url, credential, build_client, source)
        return session, SESSION_TTL

    async def close(self) -> None:
        await self._http.close()


def _client_class(object_type: str) -> Any:
    """The SDK client class of an object type, imported when a class first reads that type: each
    azure-keyvault package stays in memory for the process's life, and most classes read only
    secrets (measured: BENCHMARKS.md, "SDK packages imported on first use")."""
    if object_type == "key":
        from azure.keyvault.keys.aio import KeyClient

        return KeyClient
    if object_type == "cert":
        from azure.keyvault.certificates.aio import CertificateClient

        return CertificateClient
    from azure.keyvault.secrets.aio import SecretClient

    return SecretClient


def create(env: BackendEnv[Options]) -> Backend[AzureStore, Ref]:
    """The store's backend, typed as the protocol so that mypy checks it against it."""
    return AzureBackend(env)


#: The dialect module, checked by mypy against the Dialect protocol (provider/core/backend.py).
DIALECT: Dialect[AzureStore, Ref, Options] = dialect
#: ... and against the Selecting protocol (provider/core/selection.py).
SELECTING: Selecting[AzureStore, Ref] = dialect
