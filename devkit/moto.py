"""Real AWS-API servers for tests, bench rigs and perf scripts: moto_server, and a counting
proxy before it.

    with moto_server() as moto:             # a real `moto_server` on 127.0.0.1:<free port>
        moto.client("secretsmanager").create_secret(Name="db", SecretString="...")
        moto.reset()                        # forget every resource (POST /moto-api/reset)
        moto.enforce_auth(after=1)          # IAM checks (signatures, policies, trust policies)
                                            # from the second action on; relax_auth() ends them

    proxy = CountingProxy(moto.url)         # aiohttp, in the caller's event loop
    await proxy.start()                     # proxy.url: point the backend here
    proxy.counts["GetParameters"]           # requests seen, by AWS operation
    proxy.deny.add("forbidden")             # 400 AccessDeniedException for bodies naming it
    proxy.deny_operations.add("DescribeSecret")  # ... or for every call of an operation
    proxy.unavailable = True                # 503 ServiceUnavailable for everything
    proxy.inject["GetSecretValue"].append((400, "ExpiredTokenException"))  # once
    proxy.access_keys                       # the access key id that signed each request
    proxy.signers["AssumeRole"]             # ... of each request of one operation
    proxy.forms["AssumeRole"]               # query-protocol (STS) request fields, parsed
    proxy.rewrite["AssumeRole"] = edit      # edit(body) -> body, for that operation's answers
    await proxy.stop()

The proxy sits on the real wire between the SDK and moto, so counts are what AWS would bill; it
passes bodies through byte for byte (no decompression). Seed data through `moto.client` (boto3,
synchronous), never through the proxy: the proxy runs in the caller's event loop, which a
synchronous call would block. moto_server runs with the caller's environment minus MOTO_*
variables, plus MOTO_ALLOW_NONEXISTENT_REGION (tests use made-up regions).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

from aiohttp import ClientSession, web

from devkit.ports import PortTaken, free_port, port_taken, retrying, serve_app

REGION = "us-east-1"
ACCOUNT = "123456789012"
_MOTO = Path(sys.executable).with_name("moto_server")


class MotoServer:
    """One `moto_server` process on 127.0.0.1."""

    def __init__(self, port: int, process: subprocess.Popen[bytes]) -> None:
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.process = process

    @classmethod
    def start(cls, log: Path | None = None, timeout: float = 30.0) -> MotoServer:
        """Start it (output to `log`, else to a scratch file read only if it fails) and wait
        until it answers."""
        return retrying(lambda: cls._start_once(log, timeout))

    @classmethod
    def _start_once(cls, log: Path | None, timeout: float) -> MotoServer:
        port = free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith("MOTO_")}
        env["MOTO_ALLOW_NONEXISTENT_REGION"] = "true"
        with open(log, "w+b") if log else tempfile.TemporaryFile() as out:
            process = subprocess.Popen(
                [str(_MOTO), "-H", "127.0.0.1", "-p", str(port)],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
            )
            server = cls(port, process)
            try:
                server._wait_ready(timeout, out)
            except BaseException:
                server.stop()
                raise
        return server

    def _wait_ready(self, timeout: float, output: IO[bytes]) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                output.seek(0)
                text = output.read()[-2000:].decode(errors="replace")
                error = PortTaken if port_taken(text) else RuntimeError
                raise error(f"moto_server exited with {self.process.returncode}: {text}")
            try:
                with urllib.request.urlopen(f"{self.url}/moto-api/", timeout=1):
                    return
            except OSError:
                time.sleep(0.1)
        raise RuntimeError(f"moto_server did not answer on {self.url} within {timeout}s")

    def client(self, service: str, region: str = REGION) -> Any:
        import boto3  # with moto (test extras); seeding only

        return boto3.client(
            service,
            region_name=region,
            endpoint_url=self.url,
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
        )

    def reset(self) -> None:
        request = urllib.request.Request(f"{self.url}/moto-api/reset", method="POST")
        with urllib.request.urlopen(request, timeout=10):
            pass

    def enforce_auth(self, after: int = 0) -> None:
        """Check every action as AWS would (moto's IAM emulation: signatures, identity policies,
        and for sts:AssumeRole the role's trust policy with its StringEquals sts:ExternalId),
        except the next `after` actions (seed first, or leave an unsigned call through).
        Process-wide: use a server of your own, not a shared one."""
        self._reset_auth(str(after))

    def relax_auth(self) -> None:
        """Back to moto's default: nothing is checked."""
        self._reset_auth("inf")

    def _reset_auth(self, count: str) -> None:
        # Not form-encoded (urllib's default), or Flask hands moto an empty body.
        request = urllib.request.Request(
            f"{self.url}/moto-api/reset-auth",
            data=count.encode(),
            headers={"Content-Type": "text/plain"},
            method="POST",
        )
        with urllib.request.urlopen(request, timeout=10):
            pass

    def stop(self) -> None:
        if self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


@contextlib.contextmanager
def moto_server(start_timeout: float = 30.0) -> Iterator[MotoServer]:
    server = MotoServer.start(timeout=start_timeout)
    try:
        yield server
    finally:
        server.stop()


def operation(headers: Any, body: bytes) -> str:
    """The AWS operation of a request: X-Amz-Target (JSON APIs) or Action= (query APIs)."""
    target = headers.get("X-Amz-Target", "")
    if target:
        return str(target).rpartition(".")[2]
    for pair in body.decode(errors="replace").split("&"):
        key, _, value = pair.partition("=")
        if key == "Action":
            return value
    return "unknown"


class CountingProxy:
    """A proxy to moto (`target`) that counts, inspects and, on demand, fails requests."""

    def __init__(self, target: str) -> None:
        self.target = target
        self.counts: collections.Counter[str] = collections.Counter()
        #: Request bodies seen, by operation (tests inspect batch sizes).
        self.bodies: dict[str, list[Any]] = collections.defaultdict(list)
        self.deny: set[str] = set()
        #: Operations answered with AccessDeniedException whatever they name.
        self.deny_operations: set[str] = set()
        self.unavailable = False
        #: Errors to answer once each, by operation: (HTTP status, AWS error code).
        self.inject: dict[str, list[tuple[int, str]]] = collections.defaultdict(list)
        #: The access key id that signed each request ("" when unsigned).
        self.access_keys: list[str] = []
        #: The same, by operation.
        self.signers: dict[str, list[str]] = collections.defaultdict(list)
        #: Query-protocol (STS) request fields by operation: {field: [values]}.
        self.forms: dict[str, list[dict[str, list[str]]]] = collections.defaultdict(list)
        #: Edits of moto's answers, by operation (e.g. an earlier credentials expiry).
        self.rewrite: dict[str, Callable[[bytes], bytes]] = {}
        #: Seconds each forwarded request is held (makes concurrency observable).
        self.delay = 0.0
        #: Most requests in flight at once.
        self.max_inflight = 0
        self._inflight = 0
        self.url = ""
        self._runner: web.AppRunner | None = None
        self._http: ClientSession | None = None

    async def start(self) -> str:
        app = web.Application(client_max_size=16 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner, port = await serve_app(app)
        self._http = ClientSession(auto_decompress=False)
        self.url = f"http://127.0.0.1:{port}"
        return self.url

    async def stop(self) -> None:
        if self._http is not None:
            await self._http.close()
        if self._runner is not None:
            await self._runner.cleanup()

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        op = operation(request.headers, body)
        self.counts[op] += 1
        with contextlib.suppress(ValueError):
            self.bodies[op].append(json.loads(body or b"null"))
        self.access_keys.append(_access_key(request.headers.get("Authorization", "")))
        self.signers[op].append(self.access_keys[-1])
        query = "X-Amz-Target" not in request.headers  # STS: query protocol, XML errors
        if query:
            self.forms[op].append(urllib.parse.parse_qs(body.decode(errors="replace")))
        if self.inject.get(op):
            status, code = self.inject[op].pop(0)
            return _aws_error(status, code, "injected by the test", query)
        if self.unavailable:
            return _aws_error(503, "ServiceUnavailable", "the test made this unavailable", query)
        text = body.decode(errors="replace")
        if op in self.deny_operations or any(word in text for word in self.deny):
            code = "AccessDenied" if query else "AccessDeniedException"
            return _aws_error(400 if not query else 403, code, "the test denies this", query)
        self._inflight += 1
        self.max_inflight = max(self.max_inflight, self._inflight)
        try:
            if self.delay:
                await asyncio.sleep(self.delay)
            return await self._forward(request, body, self.rewrite.get(op))
        finally:
            self._inflight -= 1

    async def _forward(
        self, request: web.Request, body: bytes, edit: Callable[[bytes], bytes] | None = None
    ) -> web.Response:
        assert self._http is not None
        headers = {k: v for k, v in request.headers.items() if k.lower() != "host"}
        async with self._http.request(
            request.method, self.target + request.path_qs, data=body, headers=headers
        ) as upstream:
            payload = await upstream.read()
            if edit is not None:
                payload = edit(payload)
            keep = {
                k: v
                for k, v in upstream.headers.items()
                if k.lower() not in ("content-length", "transfer-encoding", "connection")
            }
            return web.Response(status=upstream.status, body=payload, headers=keep)


def _access_key(authorization: str) -> str:
    _, found, rest = authorization.partition("Credential=")
    return rest.split("/", 1)[0] if found else ""


def _aws_error(status: int, code: str, message: str, query: bool = False) -> web.Response:
    if query:
        xml = (
            f"<ErrorResponse><Error><Type>Sender</Type><Code>{code}</Code>"
            f"<Message>{message}</Message></Error><RequestId>r</RequestId></ErrorResponse>"
        )
        return web.Response(status=status, text=xml, content_type="text/xml")
    body = json.dumps({"__type": code, "message": message})
    return web.Response(status=status, text=body, content_type="application/x-amz-json-1.1")
