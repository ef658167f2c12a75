"""The client pool: one client per (service, region, endpoint, credentials), bounded, closed."""

from __future__ import annotations

import pytest

from backends.aws import clients
from backends.aws.clients import ClientPool, Credentials
from backends.aws.options import Options

A = Credentials("ASIAAAAAAAAAAAAAAAAA", "secret-a", "token-a")
B = Credentials("ASIABBBBBBBBBBBBBBBB", "secret-b", "token-b")


async def test_aws_clients_are_shared_per_credentials_and_region() -> None:
    pool = ClientPool(Options(endpoints="us-east-1=http://127.0.0.1:1"))
    try:
        first = await pool.get("secretsmanager", "us-east-1", A)
        assert await pool.get("secretsmanager", "us-east-1", A) is first
        assert await pool.get("secretsmanager", "us-east-1", B) is not first
        assert await pool.get("secretsmanager", "eu-west-1", A) is not first
        assert first.meta.endpoint_url == "http://127.0.0.1:1"
        assert pool.endpoint("sts", "eu-west-1") is None  # botocore's own resolution
    finally:
        await pool.close()


async def test_aws_pool_retires_the_oldest_client(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(clients, "MAX_CLIENTS", 1)
    pool = ClientPool(Options())
    try:
        first = await pool.get("ssm", "us-east-1", A)
        await pool.get("ssm", "us-east-1", B)
        # Still open for calls in flight; a new request for A builds a new client.
        assert await pool.get("ssm", "us-east-1", A) is not first
    finally:
        await pool.close()


def test_aws_credentials_never_show_their_secrets() -> None:
    text = repr(A)
    assert "secret-a" not in text and "token-a" not in text
    assert "secret-a" not in A.fingerprint and A.fingerprint != B.fingerprint
