"""The AWS selections (docs/selectors.md): list with metadata, then read every listed secret.

Secrets Manager: ListSecrets (100 a page) narrowed by AWS's filters — the name prefix, one tag
key and one tag value, each a prefix match, several filters ANDed, and a tag key and a tag value
matched on any tags, not as a pair — so every tag is checked exactly on the listing's own `Tags`.
The marker is the AWSCURRENT version id (the value's version); the secrets are read with
BatchGetSecretValue (20 a call), or with GetSecretValue each when the role may not call it
(remembered a while).

SSM: DescribeParameters (50 a page, no values) marks each parameter with its version, and they
are read with GetParameters (10 a call, decrypted); GetParametersByPath (10 a page, every value
decrypted) would list and read in one. ssm:DescribeParameters cannot be scoped to a
path, so a role without it gets GetParametersByPath instead (remembered a while).

Listing is bounded: refused past the selection's limit, and after that many pages plus a few
(AWS may answer short or empty pages with a NextToken), so a store that pages forever ends.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Hashable, Sequence
from typing import Any

from backends.aws.errors import STALE_CREDENTIALS, AwsDenied, answered
from backends.aws.reading import Reader, pack
from backends.aws.refs import AwsRef, AwsSelection, AwsStore, Target
from provider.core.caching import ExpiringCache
from provider.core.errors import BridgeError, LimitExceeded, StoreUnavailable
from provider.core.model import Fetched, Identity, SecretValue
from provider.core.selection import Listed, Selections, too_many

log = logging.getLogger("secrets_bridge.aws")

LIST_SECRETS_PAGE = 100
DESCRIBE_PAGE = 50
BY_PATH_PAGE = 10
BATCH_GET = 20
#: Pages a listing may take beyond the ones its limit needs (short or empty pages).
EXTRA_PAGES = 10
#: Seconds an identity refused BatchGetSecretValue or DescribeParameters is not asked again.
DENIED_FOR = 300.0
HELD_IDENTITIES = 10_000

Values = dict[Hashable, SecretValue | BridgeError]


class Selector:
    """The selections of one backend: what each identity's last poll read, and which
    identities may not batch or describe."""

    def __init__(self) -> None:
        self.selections = Selections()
        self._no_batch: ExpiringCache[bool] = ExpiringCache(max_entries=HELD_IDENTITIES)
        self._no_describe: ExpiringCache[bool] = ExpiringCache(max_entries=HELD_IDENTITIES)

    async def select(
        self, reader: Reader, store: AwsStore, identity: Identity, sel: AwsSelection
    ) -> Fetched:
        try:
            if sel.service == "ssm":
                return await self._parameters(reader, store, identity, sel)
            return await self._secrets(reader, store, identity, sel)
        except BridgeError as exc:
            return exc

    # -- Secrets Manager ---------------------------------------------------------------------

    async def _secrets(
        self, reader: Reader, store: AwsStore, identity: Identity, sel: AwsSelection
    ) -> Fetched:
        hint = "; allow secretsmanager:ListSecrets"
        filters = _filters(sel)

        async def listing(index: int) -> list[Listed]:
            kwargs: dict[str, Any] = {"Filters": filters} if filters else {}
            return await _pages(
                reader, index, sel, "secretsmanager", "ListSecrets", "SecretList",
                LIST_SECRETS_PAGE, hint, kwargs, lambda item: _secret_entry(sel, item),
            )  # fmt: skip

        listed, index = await reader.with_failover(listing)

        async def read(secrets: Sequence[Listed]) -> Values:
            return await self._read_secrets(reader, identity, secrets, index)

        return await self.selections.refresh(identity.key, (store, sel), listed, read)

    async def _read_secrets(
        self, reader: Reader, identity: Identity, secrets: Sequence[Listed], index: int
    ) -> Values:
        if self._no_batch.get(identity.key) is None:
            try:
                return await _batches(reader, secrets, index)
            except AwsDenied as exc:
                if exc.aws_code in STALE_CREDENTIALS:
                    raise
                # Without secretsmanager:BatchGetSecretValue: one GetSecretValue per secret.
                log.info("aws: BatchGetSecretValue denied; reading the selection one by one")
                self._no_batch.put(identity.key, True, DENIED_FOR)
        return await _singles(reader, secrets, index)

    # -- SSM Parameter Store -----------------------------------------------------------------

    async def _parameters(
        self, reader: Reader, store: AwsStore, identity: Identity, sel: AwsSelection
    ) -> Fetched:
        option = "Recursive" if sel.recursive else "OneLevel"
        path_filter = [{"Key": "Path", "Option": option, "Values": [sel.prefix]}]
        if self._no_describe.get(identity.key) is None:
            hint = "; allow ssm:DescribeParameters"

            async def describe(index: int) -> list[Listed]:
                return await _pages(
                    reader, index, sel, "ssm", "DescribeParameters", "Parameters",
                    DESCRIBE_PAGE, hint, {"ParameterFilters": path_filter},
                    lambda item: _parameter_entry(sel, item),
                )  # fmt: skip

            try:
                listed, index = await reader.with_failover(describe)
            except AwsDenied as exc:
                if exc.aws_code in STALE_CREDENTIALS:
                    raise
                log.info("aws: DescribeParameters denied; listing with GetParametersByPath")
                self._no_describe.put(identity.key, True, DENIED_FOR)
            else:

                async def read(secrets: Sequence[Listed]) -> Values:
                    return await _read_parameters(reader, secrets, index)

                return await self.selections.refresh(identity.key, (store, sel), listed, read)
        return await self._by_path(reader, store, identity, sel)

    async def _by_path(
        self, reader: Reader, store: AwsStore, identity: Identity, sel: AwsSelection
    ) -> Fetched:
        hint = (
            "; allow ssm:GetParametersByPath on the path, or ssm:DescribeParameters for "
            "cheaper polls (and kms:Decrypt for SecureString)"
        )
        values: Values = {}

        def entry(item: Any) -> Listed | None:
            found = _parameter_entry(sel, item)
            value = item.get("Value")
            if found is None or not isinstance(value, str):
                return None
            values[found.handle] = SecretValue(value.encode(), version=found.marker)
            return found

        async def listing(index: int) -> list[Listed]:
            values.clear()
            kwargs = {"Path": sel.prefix, "Recursive": sel.recursive, "WithDecryption": True}
            return await _pages(
                reader, index, sel, "ssm", "GetParametersByPath", "Parameters",
                BY_PATH_PAGE, hint, kwargs, entry,
            )  # fmt: skip

        listed, _ = await reader.with_failover(listing)

        async def read(secrets: Sequence[Listed]) -> Values:
            return {s.handle: values[s.handle] for s in secrets}

        return await self.selections.refresh(identity.key, (store, sel), listed, read)


async def _pages(
    reader: Reader,
    index: int,
    sel: AwsSelection,
    service: str,
    operation: str,
    items: str,
    page_size: int,
    hint: str,
    kwargs: dict[str, Any],
    accept: Callable[[Any], Listed | None],
) -> list[Listed]:
    """Every entry `accept` takes, page by page, refused as soon as more than the limit."""
    where = f"the selector {sel.describe()}"
    what = reader.about(where, index)
    found: list[Listed] = []
    token = ""
    most = sel.limit // page_size + 1 + EXTRA_PAGES
    for _page in range(most):
        args = dict(kwargs, MaxResults=page_size, **({"NextToken": token} if token else {}))
        response = await reader.call(service, reader.region(index), operation, what, hint, **args)
        page = response.get(items)
        if not isinstance(page, list):
            raise StoreUnavailable(f"{what}: the answer holds no {items} list")
        found.extend(entry for item in page if isinstance(item, dict) and (entry := accept(item)))
        token = response.get("NextToken") or ""
        if len(found) > sel.limit:
            raise too_many(where, len(found), sel.limit, exact=not token)
        if not token:
            return found
    raise LimitExceeded(
        f"{what}: the listing did not end after {most} pages of {operation} ({len(found)} "
        "matched so far): AWS kept answering with a NextToken; narrow the selector"
    )


def _filters(sel: AwsSelection) -> list[dict[str, Any]]:
    """ListSecrets filters that narrow the listing; the exact match is `_secret_entry`'s."""
    filters: list[dict[str, Any]] = []
    if sel.prefix:
        filters.append({"Key": "name", "Values": [sel.prefix]})
    if sel.tags:
        filters.append({"Key": "tag-key", "Values": [sel.tags[0][0]]})
        values = [value for _key, value in sel.tags if value]
        if values:
            filters.append({"Key": "tag-value", "Values": [values[0]]})
    return filters


def _secret_entry(sel: AwsSelection, item: Any) -> Listed | None:
    """A secret of the listing that has the prefix, every tag, and a current version."""
    name, arn = item.get("Name"), item.get("ARN")
    if not (isinstance(name, str) and isinstance(arn, str) and name.startswith(sel.prefix)):
        return None
    tags = {t.get("Key"): t.get("Value") for t in item.get("Tags") or [] if isinstance(t, dict)}
    for key, value in sel.tags:
        if key not in tags or (value is not None and tags[key] != value):
            return None
    stages = item.get("SecretVersionsToStages") or {}
    current = sorted(v for v, names in stages.items() if "AWSCURRENT" in (names or []))
    relative = name[len(sel.prefix) :]
    # A secret without a current version has no value to mount.
    return Listed(relative, current[0], arn) if current and relative else None


def _parameter_entry(sel: AwsSelection, item: Any) -> Listed | None:
    """A parameter under the path, named relative to it (`/app/db/pass` under `/app`:
    `db/pass`), marked by its version."""
    name, version = item.get("Name"), item.get("Version")
    if not isinstance(name, str) or version is None:
        return None
    full = name if name.startswith("/") else "/" + name
    base = sel.prefix.rstrip("/") + "/"
    if not full.startswith(base) or full == base:
        return None
    return Listed(full[len(base) :], str(version), name)


async def _batches(reader: Reader, secrets: Sequence[Listed], index: int) -> Values:
    async def group(start: int) -> Values:
        part = secrets[start : start + BATCH_GET]
        return await reader.in_region(index, lambda i: _batch(reader, part, i))

    parts = await asyncio.gather(*(group(i) for i in range(0, len(secrets), BATCH_GET)))
    return {handle: value for part in parts for handle, value in part.items()}


async def _batch(reader: Reader, group: Sequence[Listed], index: int) -> Values:
    """One BatchGetSecretValue; a transient error of any secret retries the call."""
    names = {str(s.handle): s for s in group}
    what = reader.about(f"Secrets Manager secrets {', '.join(repr(s.name) for s in group)}", index)
    hint = "; allow secretsmanager:BatchGetSecretValue (and kms:Decrypt on their keys)"
    response = await reader.call(
        "secretsmanager", reader.region(index), "BatchGetSecretValue", what, hint,
        SecretIdList=list(names),
    )  # fmt: skip
    out: Values = {}
    for item in response.get("SecretValues") or []:
        secret = names.get(str(item.get("ARN"))) if isinstance(item, dict) else None
        if secret is None:
            continue
        text, binary = item.get("SecretString"), item.get("SecretBinary")
        content = text.encode() if isinstance(text, str) else binary
        if isinstance(content, bytes):
            out[secret.handle] = SecretValue(content, version=item.get("VersionId"))
    for item in response.get("Errors") or []:
        secret = names.get(str(item.get("SecretId"))) if isinstance(item, dict) else None
        if secret is None:
            continue
        one = reader.about(f"Secrets Manager secret {str(secret.handle)!r}", index)
        error = answered(str(item.get("ErrorCode") or ""), one, hint)
        if error.transient:
            raise error
        out[secret.handle] = error
    for secret in group:
        if secret.handle not in out:
            out[secret.handle] = StoreUnavailable(f"{what}: the answer leaves out {secret.name!r}")
    return out


async def _singles(reader: Reader, secrets: Sequence[Listed], index: int) -> Values:
    async def one(secret: Listed) -> SecretValue | BridgeError:
        ref = AwsRef("secretsmanager", Target(str(secret.handle)))
        try:
            return await reader.in_region(index, lambda i: reader.secret_value(ref, i))
        except BridgeError as exc:
            return exc

    values = await asyncio.gather(*(one(secret) for secret in secrets))
    return {s.handle: v for s, v in zip(secrets, values, strict=True)}


async def _read_parameters(reader: Reader, secrets: Sequence[Listed], index: int) -> Values:
    refs = {AwsRef("ssm", Target(str(s.handle))): s.handle for s in secrets}
    out: Values = {}

    async def batch(group: list[AwsRef]) -> None:
        try:
            got = await reader.in_region(index, lambda i: reader.parameters(group, i))
        except BridgeError as exc:
            out.update((refs[ref], exc) for ref in group)
            return
        for ref, fetched in got.items():
            out[refs[ref]] = fetched if isinstance(fetched, BridgeError) else fetched[0]

    await asyncio.gather(*(batch(group) for group in pack(list(refs), index)))
    return out
