"""What a parsed AWS class describes: the store settings and the reference of each read.

Frozen and hashable: the core keys caches and de-duplicates reads by them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from provider.core.model import hashed_once

Service = Literal["secretsmanager", "ssm"]


@dataclass(frozen=True)
class AwsStore:
    """Class-level settings: where to read and as whom."""

    region: str
    failover_region: str = ""
    role_arn: str = ""
    use_pod_identity: bool = False
    address_type: Literal["auto", "ipv4", "ipv6"] = "auto"

    @property
    def regions(self) -> tuple[str, ...]:
        return (self.region, self.failover_region) if self.failover_region else (self.region,)

    def describe(self) -> str:
        """Regions and role, as the audit trail names the store."""
        where = ",".join(self.regions)
        return f"aws {where}" + (f" as {self.role_arn}" if self.role_arn else "")


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
