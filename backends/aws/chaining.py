"""Role chaining: the class's second role (`assumeRoleArn`), assumed with the pod's credentials.

The first hop's credentials (IRSA, EKS Pod Identity, or the node's own where the namespace may
use them) sign one STS AssumeRole; aiobotocore signs it. backends/aws/auth.py caches both hops:
the first under its own identity key, shared by every class of that pod identity, the second
under the class's key, which names the second role and a digest of what else is sent with it.
Each is kept until shortly before its own expiry.
"""

from __future__ import annotations

from typing import Any

from backends.aws.clients import ClientPool
from backends.aws.errors import translated
from backends.aws.options import Options
from backends.aws.refs import AssumeRole, AwsStore
from backends.clouds.aws import Credentials, failover, sts_credentials
from provider.core.backend import BackendEnv
from provider.core.model import FetchContext


class Chainer:
    def __init__(self, env: BackendEnv[Options], pool: ClientPool) -> None:
        self._env = env
        self._pool = pool

    async def assume(
        self,
        store: AwsStore,
        role: AssumeRole,
        base: Credentials | None,
        session_name: str,
        who: str,
        principal: str,
        ctx: FetchContext,
    ) -> Credentials:
        """AssumeRole of `role` signed with `base` (None: the provider's own chain).

        `who` describes the pod and its first hop, `principal` the identity that role's trust
        policy must allow; both go into messages, with the role and the fix.
        """

        async def assume(region: str) -> Credentials:
            return await self._assume_in(region, role, base, session_name, who, principal)

        async def attempt() -> Credentials:
            # STS in the failover region when the primary's is unreachable, as the first hop.
            return await failover(store.regions, assume)

        return await self._env.retry(attempt, ctx)

    async def _assume_in(
        self,
        region: str,
        role: AssumeRole,
        base: Credentials | None,
        session_name: str,
        who: str,
        principal: str,
    ) -> Credentials:
        what = f"AssumeRole of {role.role_arn} in {region} (pod {who})"
        kwargs: dict[str, Any] = {"RoleArn": role.role_arn, "RoleSessionName": session_name}
        if role.external_id is not None:
            kwargs["ExternalId"] = role.external_id.value
        if role.session_tags:
            kwargs["Tags"] = [{"Key": k, "Value": v} for k, v in role.session_tags]
        if role.duration_seconds:
            kwargs["DurationSeconds"] = role.duration_seconds
        with (
            self._env.metrics.backend_call("aws", "AssumeRole"),
            translated(what, refusal_hint(role, principal)),
        ):
            client = await self._pool.get("sts", region, base)
            response = await client.assume_role(**kwargs)
            return sts_credentials(response["Credentials"])


def refusal_hint(role: AssumeRole, principal: str) -> str:
    """What to fix when STS refuses: AWS says only AccessDenied, whichever check failed."""
    allow = "sts:AssumeRole and sts:TagSession" if role.session_tags else "sts:AssumeRole"
    hint = f"; the trust policy of {role.role_arn} must allow {principal} to call {allow}"
    if role.external_id is not None:
        hint += (
            ", and its sts:ExternalId condition must equal the class's assumeRoleExternalId "
            f"(not shown; its sha256 begins {role.external_id.digest})"
        )
    return hint + f"; {principal} needs sts:AssumeRole on {role.role_arn} in its own policy"
