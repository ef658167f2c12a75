"""Issue 32, attack 5: access the store revoked stays revoked through a later outage.

Serve-stale answers a mount with the last good copy while the store is unavailable. A copy read
before the identity's access was revoked must not be that answer: the store's denial (or a
not-found) drops the copies and cached values of what it answered, at once."""

from __future__ import annotations

import grpc
import pytest

from devkit.openbao import read_policy
from tests.e2e.conftest import Stack

STALE = {"serve_stale_max_age": 600, "serve_stale_wait": 0.2}


@pytest.mark.parametrize("stack", [STALE], indirect=True)
async def test_a_denial_drops_the_copies_an_outage_would_have_served(stack: Stack) -> None:
    await stack.stub.Mount(stack.request(), timeout=10)  # read, and kept as stale copies
    stack.bao.put_policy("e2e", read_policy(["secret/data/elsewhere/*"]))  # access revoked
    with pytest.raises(grpc.aio.AioRpcError) as denied:
        await stack.stub.Mount(stack.request(pod="p1"), timeout=10)
    assert denied.value.code() == grpc.StatusCode.PERMISSION_DENIED
    stack.proxy.error_rate, stack.proxy.status = 1.0, 503  # then the store goes down
    with pytest.raises(grpc.aio.AioRpcError) as outage:
        await stack.stub.Mount(stack.request(pod="p2"), timeout=6)
    assert outage.value.code() == grpc.StatusCode.UNAVAILABLE


@pytest.mark.parametrize("stack", [STALE], indirect=True)
async def test_an_outage_alone_still_serves_the_copies(stack: Stack) -> None:
    """The contrast: without a denial in between, the same outage is ridden through."""
    await stack.stub.Mount(stack.request(), timeout=10)
    stack.proxy.error_rate, stack.proxy.status = 1.0, 503
    await stack.stub.Mount(stack.request(pod="p2"), timeout=6)
