"""The table from the errors' neutral statuses to gRPC codes (provider/edge/status.py)."""

from __future__ import annotations

import grpc
import pytest

from provider.core import errors
from provider.core.errors import BridgeError, MountFailed, NotFound, Status, StoreUnavailable
from provider.edge.status import GRPC_CODE, grpc_code


def test_every_status_maps_to_a_distinct_grpc_code_of_the_same_name() -> None:
    assert set(GRPC_CODE) == set(Status)
    assert len(set(GRPC_CODE.values())) == len(Status)
    for status in Status:
        assert grpc_code(status) is GRPC_CODE[status]
        # Logged code names, metric labels and audit records read `.name`: the same either side.
        assert grpc_code(status).name == status.name


@pytest.mark.parametrize(
    "kind", [k for k in vars(errors).values() if isinstance(k, type) and issubclass(k, BridgeError)]
)
def test_every_error_class_has_a_status_the_edge_maps(kind: type[BridgeError]) -> None:
    assert isinstance(kind.code, Status)
    assert kind.code in GRPC_CODE


def test_a_mount_of_several_failures_is_reported_with_a_mapped_status() -> None:
    failed = MountFailed([("a", StoreUnavailable("down")), ("b", NotFound("gone"))])
    assert failed.code is Status.NOT_FOUND
    assert grpc_code(failed.code) == grpc.StatusCode.NOT_FOUND
    assert MountFailed([]).code is Status.INTERNAL
