"""No SDK exception escapes identify/fetch, whatever the wire brings; messages quote no payload."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from aiohttp import web

from backends.aws.errors import translate
from devkit.moto import MotoServer
from devkit.ports import closed_url, free_port
from provider.core.errors import BridgeError, DeadlineExceeded, StoreUnavailable
from tests.backends.aws.conftest import REGION, ROLE, MakeHarness

SECRET = "TOPSECRETVALUE"
OBJECTS = """
- {objectName: s, objectType: secretsmanager}
- {objectName: p, objectType: ssmparameter}
"""


class Garbage:
    """An HTTP server answering every AWS call with one kind of nonsense."""

    def __init__(self) -> None:
        self.mode = "html500"
        self.url = ""
        self._runner: web.AppRunner | None = None

    async def start(self) -> None:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, handle_signals=False, shutdown_timeout=0.2)
        await self._runner.setup()
        port = free_port()
        await web.TCPSite(self._runner, "127.0.0.1", port).start()
        self.url = f"http://127.0.0.1:{port}"

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        await request.read()
        mode = self.mode
        if mode == "html500":
            return web.Response(status=500, text="<html>oops</html>", content_type="text/html")
        if mode == "notjson200":
            return web.Response(status=200, text=f"not json {SECRET}")
        if mode == "truncated":
            return web.Response(
                status=200,
                text='{"SecretString": "' + SECRET,
                content_type="application/x-amz-json-1.1",
            )
        if mode == "wrongshape":
            return web.json_response({"SecretString": {"nested": SECRET}, "Parameters": "x"})
        if mode == "reset":
            assert request.transport is not None
            request.transport.close()
            return web.Response()
        if mode == "slow":
            await asyncio.sleep(5)
        if mode == "redirect":
            raise web.HTTPFound("http://127.0.0.1:1/")
        return web.Response(status=400)


@pytest.fixture
async def garbage() -> AsyncIterator[Garbage]:
    server = Garbage()
    await server.start()
    yield server
    await server.stop()


MODES = ["html500", "notjson200", "truncated", "wrongshape", "reset", "redirect", "empty400"]


@pytest.mark.parametrize("mode", MODES)
async def test_aws_no_sdk_exception_escapes_a_read(
    make_harness: MakeHarness, moto: MotoServer, garbage: Garbage, mode: str
) -> None:
    garbage.mode = mode
    h = make_harness(f"{REGION}={garbage.url}", sts_endpoint=moto.url)
    mounted = await h.mount({"roleArn": ROLE, "objects": OBJECTS}, seconds=1.5)
    for name in ("s", "p"):
        error = mounted.error(name)
        assert isinstance(error, BridgeError), repr(error)
        assert SECRET not in str(error)
        assert "s" in str(error) and REGION in str(error)


@pytest.mark.parametrize("mode", [*MODES, "closed"])
async def test_aws_no_sdk_exception_escapes_a_login(
    make_harness: MakeHarness, garbage: Garbage, mode: str
) -> None:
    garbage.mode = mode
    sts = closed_url() if mode == "closed" else garbage.url
    h = make_harness(sts_endpoint=sts)
    with pytest.raises(BridgeError) as caught:
        await h.mount({"roleArn": ROLE, "objects": OBJECTS}, seconds=1.5)
    assert SECRET not in str(caught.value)
    assert ROLE in str(caught.value)


async def test_aws_deadline_bounds_a_slow_store(
    make_harness: MakeHarness, moto: MotoServer, garbage: Garbage
) -> None:
    garbage.mode = "slow"
    h = make_harness(f"{REGION}={garbage.url}", sts_endpoint=moto.url)
    loop = asyncio.get_running_loop()
    start = loop.time()
    mounted = await h.mount({"roleArn": ROLE, "objects": OBJECTS}, seconds=1.0)
    assert loop.time() - start < 3
    assert isinstance(mounted.error("s"), DeadlineExceeded | StoreUnavailable)


def test_aws_translate_classifies_by_aws_code() -> None:
    from botocore.exceptions import ClientError, EndpointConnectionError

    def client_error(code: str, status: int, headers: dict[str, str] | None = None) -> Exception:
        response = {
            "Error": {"Code": code, "Message": "m"},
            "ResponseMetadata": {"HTTPStatusCode": status, "HTTPHeaders": headers or {}},
        }
        return ClientError(response, "GetSecretValue")  # type: ignore[arg-type]

    cases = {
        ("AccessDeniedException", 400): "PermissionDenied",
        ("ResourceNotFoundException", 400): "NotFound",
        ("ParameterNotFound", 400): "NotFound",
        ("ThrottlingException", 400): "StoreUnavailable",
        ("InternalServiceError", 500): "StoreUnavailable",
        ("Whatever", 503): "StoreUnavailable",
        ("InvalidRequestException", 400): "InvalidParameters",
    }
    for (code, status), expected in cases.items():
        error = translate(client_error(code, status), "read 's' in r")
        assert type(error).__mro__[0].__name__ in (expected, "AwsDenied"), (code, error)
        assert "read 's' in r" in str(error)
    throttled = translate(client_error("Throttling", 429, {"retry-after": "2"}), "x")
    assert isinstance(throttled, StoreUnavailable) and throttled.retry_after == 2.0
    down = translate(EndpointConnectionError(endpoint_url="http://x"), "x")
    assert isinstance(down, StoreUnavailable) and down.transient
