"""RSS per Mount in flight: the provider waiting out an outage against a bare grpc server that
holds the same calls (a benchmark).

    python -m devkit.probes.inflight_memory [--calls 150] [--pairs 3]

In issue 16's soak, mounts pile up while the store is down and RSS steps with them. This tells
how much of that step any grpc server would take for the same calls. Each measurement runs in a
fresh process: the bench's OpenBao rig (5 objects, `--cache-ttl 0`), a gRPC server on a Unix
socket, and a client in its own process sending the bench's pre-serialized requests. The client
first sends `--calls` mounts that are answered (grpc's per-call sizes settle), then the server
stops answering — the provider because its store is cut off (connections reset, as when OpenBao
is killed), the floor because its handler waits — and the client sends `--calls` more at once.
RSS from /proc is read before them and a second after, while every call still waits (the run
refuses to report otherwise). Floor and provider alternate, `--pairs` times.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import grpc

from devkit import rigs
from devkit.inprocess import serving
from protos import provider_pb2_grpc
from provider.cli.bench.floor import FloorServicer, default_response
from provider.edge.server import build_server

MOUNT = "/v1alpha1.CSIDriverProvider/Mount"
_SEP = b"\0--\0"


def rss_kib() -> float:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * 4


class HoldingFloor(FloorServicer):
    """The bench's echo floor, except that once `hold` is set a Mount never answers."""

    hold = asyncio.Event()

    async def Mount(self, request: object, context: object) -> object:
        if self.hold.is_set():
            await asyncio.Event().wait()
        return await super().Mount(request, context)


async def client(socket: str, requests_file: str, calls: int) -> None:
    """The client process: a batch answered, a batch held, then how many of those ended."""
    requests = Path(requests_file).read_bytes().split(_SEP)
    async with grpc.aio.insecure_channel(
        f"unix://{socket}", options=[("grpc.default_authority", "localhost")]
    ) as channel:
        mount = channel.unary_unary(MOUNT, request_serializer=None, response_deserializer=None)

        def send() -> list[asyncio.Future[Any]]:
            return [
                asyncio.ensure_future(mount(requests[i % len(requests)], timeout=120))
                for i in range(calls)
            ]

        sys.stdin.readline()
        answered = await asyncio.gather(*send(), return_exceptions=True)
        print(sum(isinstance(a, BaseException) for a in answered), flush=True)
        sys.stdin.readline()
        held = send()
        await asyncio.sleep(0.2)  # every call written to the socket
        print("sent", flush=True)
        sys.stdin.readline()
        print(sum(f.done() for f in held), flush=True)
        for future in held:
            future.cancel()


async def measure(kind: str, calls: int, work: Path) -> float:
    """KiB of RSS per held call for `kind` ("floor" or "provider")."""
    socket = str(work / "provider.sock")
    async with serving("openbao", work, 100, cache_ttl=0) as (rig, provider, requests):
        assert isinstance(rig, rigs.OpenBaoRig) and rig.forwarder is not None
        requests_file = work / "requests"
        requests_file.write_bytes(_SEP.join(r.SerializeToString() for r in requests))
        if kind == "floor":
            server = grpc.aio.server(options=[("grpc.max_receive_message_length", 4 << 20)])
            provider_pb2_grpc.add_CSIDriverProviderServicer_to_server(
                HoldingFloor(default_response()), server
            )
        else:
            server = build_server(provider, max_send_bytes=64 << 20)
        server.add_insecure_port(f"unix://{socket}")
        await server.start()
        child = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "devkit.probes.inflight_memory", "--client", socket,
            str(requests_file), str(calls),
            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        )  # fmt: skip
        assert child.stdin is not None and child.stdout is not None

        async def ask() -> str:
            assert child.stdin is not None and child.stdout is not None
            child.stdin.write(b"\n")
            await child.stdin.drain()
            return (await child.stdout.readline()).decode().strip()

        try:
            failed = await ask()
            if failed != "0":
                raise SystemExit(f"{kind}: {failed} of {calls} warm-up mounts failed")
            if kind == "floor":
                HoldingFloor.hold.set()
            else:
                rig.forwarder.upstream = None
                rig.forwarder.drop()
            await asyncio.sleep(0.5)
            before = rss_kib()
            await ask()
            await asyncio.sleep(1.0)
            after = rss_kib()
            ended = await ask()
            if ended != "0":
                raise SystemExit(f"{kind}: {ended} of {calls} held mounts ended before the count")
        finally:
            if child.returncode is None:
                child.kill()
            await child.wait()
            await server.stop(None)
        return (after - before) / calls


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--calls", type=int, default=150)
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--one", choices=["floor", "provider"], help=argparse.SUPPRESS)
    parser.add_argument("--client", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.client:
        socket, requests_file, calls = args.client
        asyncio.run(client(socket, requests_file, int(calls)))
        return
    if args.one:
        with tempfile.TemporaryDirectory() as work:
            print(f"{asyncio.run(measure(args.one, args.calls, Path(work))):.1f}")
        return
    figures: dict[str, list[float]] = {"floor": [], "provider": []}
    for _ in range(args.pairs):
        for kind in figures:
            run = subprocess.run(
                [sys.executable, "-m", "devkit.probes.inflight_memory", "--one", kind,
                 "--calls", str(args.calls)],
                capture_output=True, text=True, check=False,
            )  # fmt: skip
            if run.returncode != 0:
                raise SystemExit(run.stderr.strip().splitlines()[-1])
            figures[kind].append(float(run.stdout.strip().splitlines()[-1]))
    for kind, values in figures.items():
        shown = ", ".join(f"{v:.1f}" for v in values)
        print(
            f"{kind:8s} {statistics.median(values):5.1f} KiB of RSS per call in flight "
            f"(median of {args.pairs}: {shown}; {args.calls} calls held)"
        )


if __name__ == "__main__":
    main()
