"""The thin gRPC edge: the only module that touches grpc and the generated stubs (with
status.py, the table of status codes).

request -> the mounter: the request it kept by these raw fields and its answer, while that is
fresh (`Mounter.recall`, `answered`); else `prepare` and `answer` -> response, kept with the
answer. Every BridgeError becomes its status code (its `Status`, mapped by
provider/edge/status.py) with its (secret-free) message; anything else becomes INTERNAL with a
fixed text, and the traceback goes to the log only.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import time
from typing import Any

import grpc

from backends import registry
from protos import provider_pb2, provider_pb2_grpc
from provider import __version__
from provider.core.errors import INTERNAL_TEXT, BridgeError, DeadlineExceeded, Status
from provider.core.metrics import Metrics
from provider.edge.audit import UNWRITABLE_TEXT, AuditTrail
from provider.edge.logs import TENANT
from provider.edge.repeats import Repeats
from provider.edge.status import grpc_code
from provider.edge.watchdog import Watchdog
from provider.mount.mounting import DEFAULT_DEADLINE, Answer, Mounter, MountInput, MountResult
from provider.mount.planning import MULTI
from provider.mount.request import POD_NAMESPACE

log = logging.getLogger("secrets_bridge.server")

API_VERSION = "v1alpha1"
RUNTIME_NAME = "secrets-bridge"


class ProviderServicer(provider_pb2_grpc.CSIDriverProviderServicer):  # type: ignore[misc]
    def __init__(
        self,
        *,
        mounter: Mounter,
        metrics: Metrics,
        audit: AuditTrail | None = None,
        log_repeats_every: float = 0.0,
    ) -> None:
        self._mounter = mounter
        self._metrics = metrics
        #: `--log-repeats-every`: a volume's unchanged re-mounts, and its failures with the
        #: same code and message, are counted, not each logged.
        self._repeats = Repeats(log_repeats_every)
        #: The backstop deadline of each mount in flight.
        self._watchdog = Watchdog()
        metrics.mounts_in_flight.set_function(self._watchdog.__len__)
        #: `--audit-log`: every answer and refusal is recorded before it is sent.
        self._audit = audit
        self._series: dict[tuple[str, str], tuple[Any, Any]] = {}

    async def Version(
        self, request: provider_pb2.VersionRequest, context: grpc.aio.ServicerContext
    ) -> provider_pb2.VersionResponse:
        return provider_pb2.VersionResponse(
            version=API_VERSION, runtime_name=RUNTIME_NAME, runtime_version=__version__
        )

    async def Mount(
        self, request: provider_pb2.MountRequest, context: grpc.aio.ServicerContext
    ) -> provider_pb2.MountResponse:
        start = time.perf_counter()
        fields: dict[str, object] = {}
        backend = "unknown"
        mount_input: MountInput | None = None
        audit = self._audit
        raw = (request.attributes, request.secrets, request.permission, request.target_path)
        # The driver re-sends each volume's request unchanged: the answer it got, while every
        # value in it is still cached, is the whole of this mount. (The audit trail records
        # where each value came from, which only a read says.)
        held = self._mounter.recall(raw)
        if held is not None and audit is None:
            answer = self._mounter.answered(held)
            if answer is not None:
                TENANT.set(held.input.pod.namespace)
                volume = _volume(held.input.target_path, held.fields)
                return self._answer(answer, volume, held.fields, start)
        # Lines logged on this mount's way count against its namespace's log budget; it is
        # read from the request only if one is logged before the request is parsed.
        TENANT.set(functools.partial(_namespace_in, request.attributes))
        try:
            remaining = context.time_remaining()
            if remaining is None:
                remaining = DEFAULT_DEADLINE
            ends = time.monotonic() + remaining
            prepared = held or await self._mounter.prepare(
                raw, deadline=ends - answer_margin(remaining)
            )
            mount_input, fields, backend = prepared.input, prepared.fields, prepared.backend
            TENANT.set(mount_input.pod.namespace)
            remaining = ends - time.monotonic()  # a new class may have waited for its turn
            # Our answer must reach the driver before its own deadline ends the call: the
            # mount gets the time left minus a margin, and ends itself at that deadline with a
            # message naming what it waited for; the watchdog's deadline is only the backstop.
            margin = answer_margin(remaining)
            budget = remaining - margin
            task = asyncio.current_task()
            assert task is not None  # grpc runs each call's handler in a task of its own
            self._watchdog.watch(task, budget + margin / 2)
            try:
                answer = await self._mounter.answer(
                    prepared, budget=budget, audit=audit is not None
                )
            except asyncio.CancelledError:
                if not self._watchdog.fired(task):
                    raise  # the driver's cancellation, handled below
                raise DeadlineExceeded(
                    f"the mount did not finish within the driver's deadline of {remaining:.0f}s; "
                    f"the {backend if backend in _KNOWN else 'class'}'s store is slow or "
                    "unreachable"
                ) from None
            finally:
                self._watchdog.forget(task)
        except asyncio.CancelledError:
            # The driver gave up (its deadline passed, or the kubelet went away): nobody is
            # left to answer, and that is no error of ours.
            self._gone(backend, fields, start)
            raise
        except BridgeError as exc:
            # Bounded (MAX_MESSAGE_BYTES): the first problems of a class of hundreds, then
            # how many more; a longer trailer fails gRPC clients, and each retry logs it.
            code, message = exc.code, exc.brief()
            repeats = self._failed(_volume(request.target_path, fields), fields, code.name, message)
            if repeats is not None:
                line = {**fields, "code": code.name, "error": message}
                if repeats:
                    line["repeats"] = repeats
                log.warning("mount failed", extra={"fields": line})
        except Exception as exc:
            code, message = Status.INTERNAL, INTERNAL_TEXT
            volume = _volume(request.target_path, fields)
            repeats = self._failed(volume, fields, code.name, type(exc).__name__)
            if repeats is not None:
                line = {**fields, "repeats": repeats} if repeats else fields
                log.exception("mount failed unexpectedly", extra={"fields": line})
        else:
            result = answer.result
            assert result is not None  # just built: nothing dropped it yet
            if audit is not None and not audit.answered(mount_input, result):
                code, message, audit = Status.UNAVAILABLE, UNWRITABLE_TEXT, None
            else:
                volume = _volume(mount_input.target_path, fields)
                return self._answer(answer, volume, fields, start)
        if audit is not None:
            audit.refused(mount_input, code.name, message)
        try:
            await context.abort(grpc_code(code), message)
        except grpc.aio.AbortError:  # how abort ends when the status was sent
            self._record(
                backend if backend in _KNOWN else "unknown", code.name, time.perf_counter() - start
            )
            raise
        except Exception:
            # The call ended while we answered (the driver's deadline raced ours): grpc
            # cannot send the status. Ending as cancelled keeps grpc from logging a traceback.
            self._gone(backend, fields, start)
            raise asyncio.CancelledError() from None
        raise AssertionError("unreachable: context.abort raises")

    def _answer(
        self, answer: Answer, volume: str, fields: dict[str, object], start: float
    ) -> provider_pb2.MountResponse:
        result = answer.result
        assert result is not None  # the mounter hands over only answers it has not dropped
        end = time.perf_counter()
        elapsed = end - start
        self._record(result.backend, "OK", elapsed)
        if log.isEnabledFor(logging.INFO):
            said = (fields["class"], result.versions)
            repeats = self._repeats.quiet(volume, said, elapsed, end)
            if repeats is not None:
                line = {
                    **fields,
                    "backend": result.backend,
                    "files": len(result.files),
                    "ms": round(elapsed * 1000, 1),
                }
                if repeats:
                    line["repeats"] = repeats
                log.info("mount", extra={"fields": line})
        # Versions are readable in the pod's namespace; logged so the suite's leak guard
        # checks them too (they are HMACs or store version ids, never content). Built only
        # when debug is on: this is the path of every mount.
        if log.isEnabledFor(logging.DEBUG):
            versions = {v.id: v.version for v in result.versions}
            log.debug("mount answer", extra={"fields": {**fields, "versions": versions}})
        # The protobuf is kept with the answer (and dropped with it): every mount answered
        # again sends the same one.
        reply = answer.reply
        if not isinstance(reply, provider_pb2.MountResponse):
            reply = answer.reply = _response(result)
        return reply

    def _failed(
        self, volume: str, fields: dict[str, object], code: str, message: str
    ) -> int | None:
        """None when this failure is counted instead of logged: the volume's previous line was
        the same failure (class, code, message) less than --log-repeats-every ago; else the
        failures counted since that line (as for answers: provider/edge/repeats.py)."""
        failure = ("failed", fields.get("class"), code, hash(message))
        return self._repeats.quiet(volume, failure, 0.0, time.perf_counter())

    def _gone(self, backend: str, fields: dict[str, object], start: float) -> None:
        elapsed = time.perf_counter() - start
        log.debug(
            "the driver cancelled the mount before it was answered",
            extra={"fields": {**fields, "ms": round(elapsed * 1000, 1)}},
        )
        self._record(backend if backend in _KNOWN else "unknown", "CANCELLED", elapsed)

    def _record(self, backend: str, code: str, seconds: float) -> None:
        # The label children are looked up once per (backend, code) (measured: BENCHMARKS.md,
        # "The Mount counters' label children").
        series = self._series.get((backend, code))
        if series is None:
            series = (
                self._metrics.mount_requests.labels(backend, code),
                self._metrics.mount_duration.labels(backend),
            )
            self._series[(backend, code)] = series
        series[0].inc()
        series[1].observe(seconds)


def _namespace_in(attributes: str) -> str:
    """The pod's namespace in a request's attributes, for a log line written before the request
    was parsed (the log budget's; "" when it does not parse)."""
    parsed = json.loads(attributes)
    namespace = parsed.get(POD_NAMESPACE, "") if isinstance(parsed, dict) else ""
    return namespace if isinstance(namespace, str) else ""


def answer_margin(remaining: float) -> float:
    """Seconds kept between the mount's own deadline and the driver's: 1 s, or a quarter of
    what is left when that is short."""
    return min(1.0, max(remaining, 0.0) / 4)


# Metric labels come from a fixed set, so a pod author cannot mint label values: the stores the
# registry lists (the one list of stores), and a class of several.
_KNOWN = frozenset({*registry.PACKAGES, MULTI})


def _response(result: MountResult) -> provider_pb2.MountResponse:
    return provider_pb2.MountResponse(
        object_version=[
            provider_pb2.ObjectVersion(id=v.id, version=v.version) for v in result.versions
        ],
        files=[
            provider_pb2.File(path=f.path, mode=f.mode, contents=f.contents) for f in result.files
        ],
    )


def build_server(servicer: ProviderServicer, *, max_send_bytes: int) -> grpc.aio.Server:
    server = grpc.aio.server(
        options=[
            ("grpc.max_send_message_length", max_send_bytes),
            ("grpc.max_receive_message_length", 4 * 1024 * 1024),
        ]
    )
    provider_pb2_grpc.add_CSIDriverProviderServicer_to_server(servicer, server)
    return server


async def call_version(socket_path: str, seconds: float = 2.0) -> str:
    """Dial a provider socket as the driver does and call Version (readiness, `mount`)."""
    async with dial(socket_path) as channel:
        stub = provider_pb2_grpc.CSIDriverProviderStub(channel)
        reply = await stub.Version(
            provider_pb2.VersionRequest(version=API_VERSION), timeout=seconds, wait_for_ready=True
        )
        return str(reply.runtime_version)


def dial(socket_path: str) -> grpc.aio.Channel:
    """A channel with the driver's dial options: insecure, authority `localhost`."""
    return grpc.aio.insecure_channel(
        f"unix://{socket_path}",
        options=[
            ("grpc.default_authority", "localhost"),
            ("grpc.max_receive_message_length", 64 * 1024 * 1024),
        ],
    )


def _volume(target_path: str, fields: dict[str, object]) -> str:
    """What log lines are grouped by: the volume's target path, and the pod's namespace and
    service account — the secrets-store-sync-controller sends one placeholder path for every
    SecretSync (docs/sync-controller.md), which must not count as one volume."""
    return f"{target_path}|{fields.get('namespace', '')}/{fields.get('serviceaccount', '')}"
