"""What a parsed AWS class describes: the store settings and the reference of each read.

Frozen and hashable: the core keys caches and de-duplicates reads by them.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any, Literal

from provider.core.model import hashed_once

Service = Literal["secretsmanager", "ssm"]


class Hidden:
    """A value sent to AWS and shown nowhere else (an external id): reprs, `check --json` and
    messages say only that it is set, with a short digest to tell two classes' values apart."""

    __slots__ = ("value",)

    def __init__(self, value: str) -> None:
        self.value = value

    @property
    def digest(self) -> str:
        return hashlib.sha256(self.value.encode()).hexdigest()[:12]

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Hidden) and other.value == self.value

    def __hash__(self) -> int:
        return hash(("hidden", self.value))

    def __repr__(self) -> str:
        return f"Hidden(sha256:{self.digest})"

    def __str__(self) -> str:
        return f"set (sha256:{self.digest})"

    def __deepcopy__(self, memo: Any) -> Hidden:
        return self  # dataclasses.asdict copies fields: keep this one opaque


@dataclass(frozen=True)
class AssumeRole:
    """The role assumed with the pod's own credentials after its login (role chaining)."""

    role_arn: str
    external_id: Hidden | None = None
    session_tags: tuple[tuple[str, str], ...] = ()
    #: 0: STS's default (one hour, the most a chained role session may last).
    duration_seconds: int = 0

    @property
    def key_part(self) -> str:
        """Its part of the identity key: the role, and a digest of everything else it sends
        (two classes that differ in external id, tags or duration never share credentials)."""
        digest = hashlib.sha256()
        digest.update((self.external_id.value if self.external_id else "").encode() + b"\0")
        for key, value in self.session_tags:
            digest.update(key.encode() + b"\0" + value.encode() + b"\0")
        digest.update(str(self.duration_seconds).encode())
        return f"assume:{self.role_arn}#{digest.hexdigest()[:16]}"


@dataclass(frozen=True)
class AwsStore:
    """Class-level settings: where to read and as whom."""

    region: str
    failover_region: str = ""
    role_arn: str = ""
    use_pod_identity: bool = False
    address_type: Literal["auto", "ipv4", "ipv6"] = "auto"
    #: A second role assumed with the first's credentials (`assumeRoleArn`, cross-account).
    assume_role: AssumeRole | None = None

    @property
    def regions(self) -> tuple[str, ...]:
        return (self.region, self.failover_region) if self.failover_region else (self.region,)

    def describe(self) -> str:
        """Regions and role, as the audit trail names the store."""
        where = ",".join(self.regions)
        text = f"aws {where}" + (f" as {self.role_arn}" if self.role_arn else "")
        return text + (f" then {self.assume_role.role_arn}" if self.assume_role else "")


@dataclass(frozen=True)
class Target:
    """What to read in one region."""

    name: str
    version: str = ""
    label: str = ""

    def describe(self) -> str:
        version = f" version {self.version}" if self.version else ""
        return self.name + version + (f" label {self.label}" if self.label else "")


@hashed_once
@dataclass(frozen=True)
class AwsRef:
    """One read: the object in the primary region, and what to read in the failover region."""

    service: Service
    primary: Target
    failover: Target | None = None

    def target(self, index: int) -> Target:
        return self.primary if index == 0 or self.failover is None else self.failover

    def describe(self) -> str:
        """The name (or ARN) read, and its failover's: never a value."""
        failover = f" (failover {self.failover.describe()})" if self.failover else ""
        return f"{self.service} {self.primary.describe()}{failover}"


@hashed_once
@dataclass(frozen=True)
class AwsSelection:
    """A `select` entry: every Secrets Manager secret with a name prefix and all the given tags,
    or every SSM parameter under a path (backends/aws/selectors.py); at most `limit` of them."""

    service: Service
    #: Secrets Manager: the name prefix ("" for tags only); SSM: the path.
    prefix: str
    #: (key, value) sorted by key; a value of None: the tag key with any value.
    tags: tuple[tuple[str, str | None], ...] = ()
    recursive: bool = False
    limit: int = 100

    def describe(self) -> str:
        """The filter, never a value."""
        if self.service == "ssm":
            return f"ssm path {self.prefix!r}" + (" (recursive)" if self.recursive else "")
        parts = [f"namePrefix {self.prefix!r}"] if self.prefix else []
        if self.tags:
            shown = ", ".join(k if v is None else f"{k}={v}" for k, v in self.tags)
            parts.append(f"tags {{{shown}}}")
        return "secretsmanager " + " ".join(parts)

    def member(self, name: str) -> str:
        """One selected secret as the audit trail names it (`name` is relative to the
        selector): as a listed object of the same secret is named."""
        if self.service == "ssm":
            return f"ssm {self.prefix.rstrip('/')}/{name}"
        return f"secretsmanager {self.prefix}{name}"


#: What an AWS object or selector reads.
Ref = AwsRef | AwsSelection
