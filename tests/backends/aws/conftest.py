"""Fixtures of the aws tests: real moto_server processes, a counting proxy, wired backends."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Hashable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest

from backends.aws import dialect as params
from backends.aws.options import Options
from backends.aws.store import AwsBackend, create
from devkit.moto import CountingProxy, MotoServer, moto_server
from devkit.testing import fetch_ctx, make_env, make_pod
from provider.core.backend import BackendEnv
from provider.core.model import Fetched, Identity, ParseContext, Pod, StorePlan

REGION = "us-east-1"
FAILOVER = "us-west-2"
ROLE = "arn:aws:iam::123456789012:role/app"
POD_TOKEN = "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJ0ZXN0In0.c2lnbmF0dXJl"


@pytest.fixture(scope="session")
def moto_session() -> Iterator[MotoServer]:
    with moto_server() as server:
        yield server


@pytest.fixture(scope="session")
def moto2_session() -> Iterator[MotoServer]:
    with moto_server() as server:
        yield server


@pytest.fixture
def moto(moto_session: MotoServer) -> MotoServer:
    moto_session.reset()
    return moto_session


@pytest.fixture
def moto2(moto2_session: MotoServer) -> MotoServer:
    moto2_session.reset()
    return moto2_session


@pytest.fixture
async def proxy(moto: MotoServer) -> AsyncIterator[CountingProxy]:
    server = CountingProxy(moto.url)
    await server.start()
    yield server
    await server.stop()


def irsa_pod(namespace: str = "default", sa: str = "app", **kw: Any) -> Pod:
    return make_pod(
        namespace=namespace, service_account=sa, tokens={"sts.amazonaws.com": POD_TOKEN}, **kw
    )


@dataclass
class Mounted:
    """The outcome of one fetch, by file name."""

    plan: StorePlan
    identity: Identity
    results: Mapping[Hashable, Fetched]
    by_name: dict[str, Fetched] = field(default_factory=dict)

    def content(self, name: str) -> bytes:
        fetched = self.by_name[name]
        assert not isinstance(fetched, BaseException), f"{name}: {fetched}"
        return fetched[0].content

    def error(self, name: str) -> BaseException:
        fetched = self.by_name[name]
        assert isinstance(fetched, BaseException), f"{name} did not fail"
        return fetched


@dataclass
class Harness:
    backend: AwsBackend
    options: Options

    def parse(self, parameters: Mapping[str, str]) -> StorePlan:
        return params.parse(parameters, ParseContext(options=self.options))

    async def mount(
        self, parameters: Mapping[str, str], pod: Pod | None = None, seconds: float = 30.0
    ) -> Mounted:
        plan = self.parse(parameters)
        identity = await self.backend.identify(plan, pod or irsa_pod())
        refs = list(dict.fromkeys(spec.ref for spec in plan.objects))
        results = await self.backend.fetch(plan, identity, refs, fetch_ctx(seconds))
        assert set(results) == set(refs)
        by_name = {spec.name: results[spec.ref] for spec in plan.objects}
        return Mounted(plan, identity, results, by_name)


MakeHarness = Callable[..., Harness]


@pytest.fixture
async def make_harness() -> AsyncIterator[MakeHarness]:
    """make(endpoints, **settings): settings are Options fields or CoreSettings fields."""
    created: list[tuple[AwsBackend, BackendEnv]] = []

    def make(endpoints: str = "", **settings: Any) -> Harness:
        option_names = set(Options.__dataclass_fields__)
        opts = {k: v for k, v in settings.items() if k in option_names}
        core = {k: v for k, v in settings.items() if k not in option_names}
        options = Options(region=REGION, endpoints=endpoints or None, **opts)
        env = make_env("aws", options, **core)
        backend = create(env)
        created.append((backend, env))
        return Harness(backend, options)

    yield make
    for backend, env in created:
        await backend.close()
        await env.kube.close()


@pytest.fixture
def harness(make_harness: MakeHarness, proxy: CountingProxy) -> Harness:
    """A backend whose only region goes through the counting proxy to moto."""
    return make_harness(f"{REGION}={proxy.url}")
