"""Parameter Manager over gRPC: RenderParameterVersion, on the channel handling of
backends/gcp/client.py (one channel per endpoint, an LRU, the identity's token per call).

As the GCP provider does (server/parameter_version_fetcher.go), each entry is one
RenderParameterVersion and the file gets the *rendered* payload: the parameter's
`__REF__(//secretmanager.googleapis.com/...)` secret references resolved by Google. Parameters
under `locations/global` go to the global endpoint, others to `parametermanager.<location>.rep`.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import grpc

from backends.gcp.client import CALL_TIMEOUT, Accessed, SecretManager
from backends.gcp.dialect import GcpRef
from backends.gcp.errors import PARAMETER_MANAGER, translated
from provider.core.errors import DeadlineExceeded
from provider.core.limits import charge

# As for Secret Manager: the generated client logs metadata (our bearer token) at DEBUG.
logging.getLogger("google.cloud.parametermanager_v1").setLevel(logging.WARNING)

#: A parameter version's payload is at most 1 MiB; rendering can only add the secrets it
#: references, each at most 64 KiB.
_MAX_RENDERED = 4 * 1024 * 1024


class ParameterManager(SecretManager):
    max_message = _MAX_RENDERED

    def endpoint(self, ref: GcpRef) -> str:
        if ref.location is None:
            return str(self._options.parametermanager_endpoint)
        endpoint = str(self._options.parametermanager_regional_endpoint)
        return endpoint.replace("{location}", ref.location)

    def _make_client(self, channel: grpc.aio.Channel) -> Any:
        # Imported on the first parameter read: a provider reading only Secret Manager would
        # otherwise carry the generated package's memory for its whole life
        # (measured: BENCHMARKS.md, "SDK packages imported on first use").
        from google.cloud.parametermanager_v1.services.parameter_manager import (
            ParameterManagerAsyncClient,
        )
        from google.cloud.parametermanager_v1.services.parameter_manager.transports import (
            ParameterManagerGrpcAsyncIOTransport,
        )

        transport = ParameterManagerGrpcAsyncIOTransport(channel=channel)
        return ParameterManagerAsyncClient(transport=transport)

    async def render(self, ref: GcpRef, token: str, subject: str, deadline: float) -> Accessed:
        """The rendered payload and the parameter version Google rendered."""
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise DeadlineExceeded(f"no time left to read {ref.name} before the mount's deadline")
        client = await self._client(self.endpoint(ref))
        with translated(ref.name, subject, PARAMETER_MANAGER):
            response = await client.render_parameter_version(
                request={"name": ref.name},
                metadata=[("authorization", f"Bearer {token}")],
                retry=None,
                timeout=min(CALL_TIMEOUT, remaining),
            )
        data = bytes(response.rendered_payload)
        # Charged once received: a parameter version's payload is at most 1 MiB, and rendering
        # adds at most the secrets it references (each 64 KiB).
        await charge(len(data))
        return Accessed(data, str(response.parameter_version))
