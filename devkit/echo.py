"""A bare gRPC server speaking the provider API: the floor `bench` compares Mount against.

Its Mount parses nothing and fetches nothing: it answers a fixed file. Run in its own process
(`python -m devkit.echo SOCKET`), like the provider, so both are measured the same way.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys

import grpc

from protos import provider_pb2, provider_pb2_grpc


class EchoServicer(provider_pb2_grpc.CSIDriverProviderServicer):  # type: ignore[misc]
    async def Version(self, request: object, context: object) -> object:
        return provider_pb2.VersionResponse(
            version="v1alpha1", runtime_name="echo", runtime_version="0.0.0"
        )

    async def Mount(self, request: object, context: object) -> object:
        return provider_pb2.MountResponse(
            object_version=[provider_pb2.ObjectVersion(id="echo", version="1")],
            files=[provider_pb2.File(path="echo", mode=0o644, contents=b"echo")],
        )


async def serve(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    server = grpc.aio.server()
    provider_pb2_grpc.add_CSIDriverProviderServicer_to_server(EchoServicer(), server)
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


if __name__ == "__main__":
    asyncio.run(serve(sys.argv[1]))
