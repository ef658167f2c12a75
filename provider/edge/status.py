"""The one table from the errors' neutral `Status` (provider/core/errors.py) to gRPC's status
codes: what the server reports a BridgeError with. The names are the same on both sides, so
the names logged, counted and audited do not depend on which side they are read from."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

import grpc

from provider.core.errors import Status

GRPC_CODE: Mapping[Status, grpc.StatusCode] = MappingProxyType(
    {
        Status.INVALID_ARGUMENT: grpc.StatusCode.INVALID_ARGUMENT,
        Status.RESOURCE_EXHAUSTED: grpc.StatusCode.RESOURCE_EXHAUSTED,
        Status.FAILED_PRECONDITION: grpc.StatusCode.FAILED_PRECONDITION,
        Status.PERMISSION_DENIED: grpc.StatusCode.PERMISSION_DENIED,
        Status.NOT_FOUND: grpc.StatusCode.NOT_FOUND,
        Status.UNAVAILABLE: grpc.StatusCode.UNAVAILABLE,
        Status.DEADLINE_EXCEEDED: grpc.StatusCode.DEADLINE_EXCEEDED,
        Status.INTERNAL: grpc.StatusCode.INTERNAL,
    }
)


def grpc_code(status: Status) -> grpc.StatusCode:
    """The gRPC status code a BridgeError whose `code` is `status` is reported with."""
    return GRPC_CODE[status]
