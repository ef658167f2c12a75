"""Parameter Manager for the Google wire fake (devkit/google.py): RenderParameterVersion over
gRPC with the client library's own message types, authorised by the bearer token like Secret
Manager, on a global or a regional server.

Rendering resolves `__REF__("//secretmanager.googleapis.com/projects/p/secrets/s/versions/v")`
from the fake's secrets, as Google does with the parameter's own service identity (so the pod's
principal needs no access to the referenced secret, only to the parameter).
"""

from __future__ import annotations

import re
from typing import Any

import grpc
from google.cloud.parametermanager_v1.types import service

from devkit.google import FakeGoogle, admit

SERVICE = "google.cloud.parametermanager.v1.ParameterManager"
_REF = re.compile(rb'__REF__\("//secretmanager\.googleapis\.com/([^"]+)"\)')


def _secret_version(google: FakeGoogle, name: str) -> bytes | None:
    secret, _, version = name.rpartition("/versions/")
    versions = google.secrets.get(secret)
    if not versions:
        return None
    number = len(versions) if version == "latest" else int(version) if version.isdigit() else 0
    return versions[number - 1] if 1 <= number <= len(versions) else None


def parameter_manager_handler(google: FakeGoogle, label: str, regional: bool) -> Any:
    async def render(
        request: service.RenderParameterVersionRequest, context: grpc.aio.ServicerContext
    ) -> service.RenderParameterVersionResponse:
        name = request.name
        principal = await admit(google, context, label, name)
        parameter, _, version = name.rpartition("/versions/")
        if ("/locations/global/" not in parameter) == (not regional):
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, f"{name} is not served by this endpoint"
            )
        versions = google.parameters.get(parameter)
        if versions is None or principal not in google.readers.get(parameter, set()):
            await context.abort(
                grpc.StatusCode.PERMISSION_DENIED,
                f"Permission 'parametermanager.parameterVersions.render' denied on '{name}'",
            )
        assert versions is not None
        if version == "latest" and versions:
            version = list(versions)[-1]
        if version not in versions:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"Parameter version [{name}] not found.")
        payload = versions[version]

        def resolve(match: re.Match[bytes]) -> bytes:
            value = _secret_version(google, match.group(1).decode())
            if value is None:
                raise LookupError(match.group(1).decode())
            return value

        try:
            rendered = _REF.sub(resolve, payload)
        except LookupError as missing:
            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION, f"cannot render reference {missing}"
            )
            raise  # abort raises; this line satisfies the type checker
        return service.RenderParameterVersionResponse(
            parameter_version=f"{parameter}/versions/{version}",
            payload={"data": payload},
            rendered_payload=rendered,
        )

    return grpc.method_handlers_generic_handler(
        SERVICE,
        {
            "RenderParameterVersion": grpc.unary_unary_rpc_method_handler(
                render,
                request_deserializer=service.RenderParameterVersionRequest.deserialize,
                response_serializer=service.RenderParameterVersionResponse.serialize,
            )
        },
    )


async def start_parameter_manager(
    google: FakeGoogle, label: str, regional: bool
) -> tuple[Any, int]:
    """A Parameter Manager on 127.0.0.1 with gRPC local credentials."""
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((parameter_manager_handler(google, label, regional),))
    creds = grpc.local_server_credentials(grpc.LocalConnectionType.LOCAL_TCP)
    port = server.add_secure_port("127.0.0.1:0", creds)
    await server.start()
    return server, port
