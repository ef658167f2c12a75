"""The AWS side of issue 20: AWS's error text and the Pod Identity agent's answers.

AWS endpoints are not a class's choice (region is a validated name, endpoints are flags), but
the same rules hold: an error carries AWS's code and status, never its message, and the agent's
answer is capped, never followed through a redirect, and never relayed.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator

import pytest
from aiohttp import web
from botocore.exceptions import ClientError

from backends.aws.auth import Authenticator, Login
from backends.aws.clients import ClientPool
from backends.aws.errors import translate
from backends.aws.options import Options
from devkit.ports import serve_app
from devkit.testing import make_env
from provider.core.errors import LimitExceeded, PermissionDenied, StoreUnavailable


def test_aws_error_message_is_not_relayed(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    response = {
        "Error": {"Code": "ValidationException", "Message": "value s3cr3t at 'name' is bad"},
        "ResponseMetadata": {"HTTPStatusCode": 400},
    }
    error = translate(ClientError(response, "GetSecretValue"), "reading 's' in r")  # type: ignore[arg-type]
    assert "ValidationException" in str(error) and "s3cr3t" not in str(error)
    assert all("s3cr3t" not in r.getMessage() for r in caplog.records)


class Agent:
    def __init__(self) -> None:
        self.mode = "endless"
        self.elsewhere = 0

    async def handle(self, request: web.Request) -> web.StreamResponse:
        if request.path == "/elsewhere":
            self.elsewhere += 1
            return web.json_response({"AccessKeyId": "AKIA", "SecretAccessKey": "x"})
        if self.mode == "redirect":
            raise web.HTTPTemporaryRedirect("/elsewhere")
        if self.mode == "refuse":
            return web.json_response({"message": "token pw-1 is not valid"}, status=400)
        response = web.StreamResponse()
        await response.prepare(request)
        while True:
            await response.write(b"x" * 65536)


@pytest.fixture
async def agent() -> AsyncIterator[tuple[Agent, str]]:
    fake = Agent()
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", fake.handle)
    runner, port = await serve_app(app, shutdown_timeout=0.1)
    yield fake, f"http://127.0.0.1:{port}/v1/credentials"
    await runner.cleanup()


@pytest.mark.parametrize("mode", ["endless", "redirect", "refuse"])
async def test_pod_identity_agent_answers_are_bounded(
    agent: tuple[Agent, str], mode: str, caplog: pytest.LogCaptureFixture
) -> None:
    fake, url = agent
    fake.mode = mode
    options = Options(connect_timeout=1.0, read_timeout=1.0)
    auth = Authenticator(make_env("aws", options), options, ClientPool(options))
    caplog.set_level(logging.DEBUG)
    started = time.monotonic()
    with pytest.raises((LimitExceeded, PermissionDenied, StoreUnavailable)) as err:
        await auth._ask_agent(url, Login("pod-identity", token="tok"), "default/app")
    assert time.monotonic() - started < 2.5
    assert fake.elsewhere == 0
    expected = {"endless": LimitExceeded, "redirect": StoreUnavailable, "refuse": PermissionDenied}
    assert isinstance(err.value, expected[mode]), err.value
    for text in [str(err.value), *(r.getMessage() for r in caplog.records)]:
        assert "pw-1" not in text
