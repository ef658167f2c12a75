"""The servers a bench run measures, and how it reaches them.

A target is a provider already serving (`remote`: `--socket`, the team's classes and tokens) or
one the bench starts as a `serve` subprocess on the dev kit's store rigs (`started`: `--store`).
The floor is the bare echo server (`floor`), started for every run. `probe` is the one mount
before the load, whose answer the floor then serves.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from provider.cli.bench import load, targets
from provider.cli.mount import Unusable, provider_socket
from provider.core.errors import InvalidParameters
from provider.edge.server import dial


def _devkit() -> Any:
    """The store rigs live in the dev kit (a source checkout), not in the wheel."""
    try:
        from devkit import ports, rigs
    except ImportError:
        raise SystemExit(
            "secrets-bridge bench: --store needs the dev kit: run `python -m provider.cli.main "
            "bench ...` at the root of a source checkout with the test extras installed; "
            "against a running provider use --socket"
        ) from None
    return ports, rigs


@dataclass
class Target:
    socket: str
    requests: list[bytes]
    pid: int | None = None
    metrics_url: str | None = None
    rigs: list[Any] = field(default_factory=list)
    ready_s: float | None = None
    log: Path | None = None


def _accounts(args: argparse.Namespace, default: str) -> list[str]:
    value = args.service_accounts or (str(args.identities) if args.identities else default)
    return targets.service_accounts(value)


@contextlib.asynccontextmanager
async def remote(args: argparse.Namespace, pods: int) -> AsyncIterator[Target]:
    if not args.classes:
        raise InvalidParameters("--socket needs at least one --class SPC.yaml")
    socket = provider_socket(args.socket, "--socket")
    tokens = targets.token_source(args.token, args.token_command, args.audience)
    classes = targets.class_files(args.classes, tokens)
    reqs = targets.requests(
        classes, pods=pods, namespace=args.namespace, accounts=_accounts(args, "default")
    )
    yield Target(socket, reqs, metrics_url=args.metrics_url)


@contextlib.asynccontextmanager
async def started(args: argparse.Namespace, pods: int, work: Path) -> AsyncIterator[Target]:
    """A `serve` subprocess on the dev kit's store rigs."""
    if args.classes:
        raise InvalidParameters("--class needs --socket (the rigs bring their own classes)")
    ports, rig_kit = _devkit()
    health = ports.free_port()
    accounts = _accounts(args, "1")
    rigs = rig_kit.make_rigs(
        (args.store or "fake").split(","),
        work,
        objects=args.objects,
        identities=len(accounts),
        health_port=health,
        error_rate=args.store_error_rate,
        service_accounts=accounts,
    )
    async with contextlib.AsyncExitStack() as stack:
        for rig in rigs:
            await rig.start()
            stack.push_async_callback(rig.stop)
        classes = [
            targets.BenchClass("bench", "bench", rig.params, 1, _rig_tokens(rig)) for rig in rigs
        ]
        reqs = targets.requests(classes, pods=pods, namespace=None, accounts=accounts)
        socket, key, log = work / "provider.sock", work / "hmac.key", work / "provider.log"
        key.write_bytes(os.urandom(32))
        cmd = [
            sys.executable, "-m", "provider.cli.main", "serve",
            "--socket", str(socket), "--health-addr", f"127.0.0.1:{health}",
            "--hmac-key-file", str(key),
            "--cache-ttl", str(args.cache_ttl),
            *(a for rig in rigs for a in rig.provider_args), *args.provider_arg,
        ]  # fmt: skip
        begin = time.monotonic()
        with log.open("wb") as out:
            # The provider's log goes to a file: a failing run must not flood the report.
            proc = subprocess.Popen(cmd, stderr=out)  # noqa: ASYNC220 - before any load
        try:
            try:
                await wait_ready(str(socket), proc)
            except RuntimeError as exc:
                raise Unusable(f"the provider the bench started: {exc}{_last_line(log)}") from None
            yield Target(
                str(socket), reqs, proc.pid, f"http://127.0.0.1:{health}/metrics", rigs,
                time.monotonic() - begin, log,
            )  # fmt: skip
        finally:
            proc.terminate()
            await asyncio.to_thread(proc.wait, 15)


def _last_line(log: Path) -> str:
    """The last line the provider wrote (its one-line reason, when it refused to start)."""
    lines = log.read_text(errors="replace").strip().splitlines() if log.exists() else []
    return f": {lines[-1]}" if lines else ""


def _rig_tokens(rig: Any) -> targets.TokenSource:
    return lambda namespace, pod, account: rig.tokens(account)


async def wait_ready(socket: str, proc: subprocess.Popen[bytes], limit: float = 30) -> float:
    """Seconds until a Version call on `socket` answers (the process must stay up)."""
    start = time.monotonic()
    while time.monotonic() - start < limit:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with {proc.returncode} before it was ready")
        if os.path.exists(socket):  # noqa: ASYNC240 - a stat on a local socket path
            async with dial(socket) as channel:
                version = channel.unary_unary(load.VERSION)
                with contextlib.suppress(grpc.aio.AioRpcError):
                    await version(b"", timeout=1)
                    return time.monotonic() - start
        await asyncio.sleep(0.01)
    raise RuntimeError("the server did not become ready")


async def probe(socket: str, request: bytes, deadline: float) -> bytes:
    """One mount before the load: the run stops here, with the provider's message, when the
    class or the tokens are wrong."""
    async with dial(socket) as channel:
        mount = channel.unary_unary(load.MOUNT)
        try:
            answer: bytes = await mount(request, timeout=deadline, wait_for_ready=True)
        except grpc.aio.AioRpcError as exc:
            raise Unusable(f"the first mount failed: {exc.code().name}: {exc.details()}") from None
        return answer


@contextlib.asynccontextmanager
async def floor(
    work: Path, answer: bytes | None, loop: str = "asyncio"
) -> AsyncIterator[tuple[str, int]]:
    socket = str(work / "floor.sock")
    cmd = [sys.executable, "-m", "provider.cli.bench.floor", "--loop", loop, socket]
    if answer is not None:
        (work / "answer.bin").write_bytes(answer)
        cmd.append(str(work / "answer.bin"))
    proc = subprocess.Popen(cmd)  # noqa: ASYNC220 - before any load
    try:
        await wait_ready(socket, proc)
        yield socket, proc.pid
    finally:
        proc.terminate()
        await asyncio.to_thread(proc.wait, 15)
