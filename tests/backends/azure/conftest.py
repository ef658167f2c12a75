"""Fixtures: the fake Entra + Key Vault HTTPS server, and an Azure backend pointed at it."""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass

import pytest

from backends.azure.options import Options
from backends.azure.store import AzureBackend, create
from devkit.azure import FakeAzure, server_tls, start
from devkit.testing import make_env

TENANT = "11111111-2222-3333-4444-555555555555"
CLIENT = "aaaaaaaa-0000-0000-0000-000000000001"
POD_TOKEN = "pod-token-default-app"


@dataclass
class Tls:
    ca_file: str
    context: ssl.SSLContext


@pytest.fixture(scope="session")
def tls(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Tls]:
    server = server_tls(tmp_path_factory.mktemp("azure-tls"))
    yield Tls(str(server.ca_file), server.context())


@dataclass
class Azure:
    fake: FakeAzure
    port: int
    options: Options


@pytest.fixture
async def azure(tls: Tls) -> AsyncIterator[Azure]:
    fake = FakeAzure()
    fake.federated[(TENANT, CLIENT)] = {POD_TOKEN}
    runner, port = await start(fake, tls.context)
    try:
        yield Azure(fake, port, Options(ca_file=tls.ca_file, connect_to=f"127.0.0.1:{port}"))
    finally:
        await runner.cleanup()


@pytest.fixture
async def backend(azure: Azure) -> AsyncIterator[AzureBackend]:
    b = create(make_env("azure", azure.options))
    try:
        yield b
    finally:
        await b.close()
