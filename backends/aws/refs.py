"""What a parsed AWS class describes: the store settings and the reference of each read.

Frozen and hashable: the core keys caches and de-duplicates reads by them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

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


@dataclass(frozen=True)
class Target:
    """What to read in one region."""

    name: str
    version: str = ""
    label: str = ""


@dataclass(frozen=True)
class AwsRef:
    """One read: the object in the primary region, and what to read in the failover region."""

    service: Service
    primary: Target
    failover: Target | None = None

    def target(self, index: int) -> Target:
        return self.primary if index == 0 or self.failover is None else self.failover
