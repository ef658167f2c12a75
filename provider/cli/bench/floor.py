"""The floor `bench` measures the provider against: a bare gRPC server speaking the provider API.

    python -m provider.cli.bench.floor [--loop asyncio|uvloop] SOCKET [RESPONSE_FILE]

It does what every Python gRPC server of this API must do and nothing else: the generated
servicer parses each MountRequest (the same pre-serialized bytes the provider gets) and answers
a fixed MountResponse — the provider's own answer captured by the bench when it gives the file
(so both serialize the same files), one small file otherwise. It runs in its own process so its
CPU time is counted by the OS exactly like the provider's. It ships in the wheel (unlike the
dev kit) because the load-test Job measures the floor on the node too.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import sys

import grpc

from protos import provider_pb2, provider_pb2_grpc
from provider.edge import loops


class FloorServicer(provider_pb2_grpc.CSIDriverProviderServicer):  # type: ignore[misc]
    def __init__(self, response: provider_pb2.MountResponse) -> None:
        self._response = response

    async def Version(self, request: object, context: object) -> object:
        return provider_pb2.VersionResponse(
            version="v1alpha1", runtime_name="echo", runtime_version="0.0.0"
        )

    async def Mount(self, request: object, context: object) -> object:
        return self._response


def default_response() -> provider_pb2.MountResponse:
    return provider_pb2.MountResponse(
        object_version=[provider_pb2.ObjectVersion(id="echo", version="1")],
        files=[provider_pb2.File(path="echo", mode=0o644, contents=b"echo")],
    )


async def serve(path: str, response: provider_pb2.MountResponse | None = None) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    server = grpc.aio.server(options=[("grpc.max_receive_message_length", 4 * 1024 * 1024)])
    servicer = FloorServicer(response or default_response())
    provider_pb2_grpc.add_CSIDriverProviderServicer_to_server(servicer, server)
    server.add_insecure_port(f"unix://{path}")
    await server.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_signal_handler(signal.SIGINT, stop.set)
    await stop.wait()
    await server.stop(None)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="python -m provider.cli.bench.floor")
    parser.add_argument("socket")
    parser.add_argument("response_file", nargs="?")
    parser.add_argument("--loop", choices=["asyncio", "uvloop"], default="asyncio")
    args = parser.parse_args(argv)
    response = None
    if args.response_file:
        with open(args.response_file, "rb") as fh:
            response = provider_pb2.MountResponse.FromString(fh.read())
    loops.run(serve(args.socket, response), args.loop)


if __name__ == "__main__":
    main(sys.argv[1:])
