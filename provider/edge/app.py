"""The composition root: settings -> backends, caches, mounter, servicer, HTTP app; and the
`serve` loop with its graceful SIGTERM (stop accepting, drain in-flight mounts within the grace
period, remove the socket, exit 0)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import errno
import functools
import gc
import logging
import os
import signal
from collections.abc import Callable
from typing import Any

from provider.core.metrics import Metrics
from provider.core.settings import ServeSettings
from provider.core.versions import Versioner
from provider.edge import auditchain, feed, http, loops, startup
from provider.edge.audit import AuditTrail, open_sink
from provider.edge.feed import NodeFeed
from provider.edge.server import ProviderServicer, build_server
from provider.edge.startup import (
    StartupError,
    claim_socket,
    release_socket,
    socket_identity,
)
from provider.mount.backends import Backends, released
from provider.mount.fetching import Fetcher
from provider.mount.mounting import Mounter
from provider.mount.planning import RefreshBounds

log = logging.getLogger("secrets_bridge")


def load_versioner(path: str | None, *, warn: bool = True) -> Versioner:
    if path:
        return Versioner.from_file(path)
    if not warn:
        return Versioner.random()
    log.warning(RANDOM_KEY_WARNING)
    return Versioner.random()


#: Said once `serve` has started (a refused start says one line, its reason), or by `mount`.
RANDOM_KEY_WARNING = (
    "no --hmac-key-file: object versions use a random per-process key and change on "
    "restart, so every pod's files look rotated after a provider restart"
)


def build_mounter(
    settings: ServeSettings, metrics: Metrics, *, warn_random_key: bool = True
) -> tuple[Mounter, Backends]:
    core = settings.core
    backends = Backends(core=core, options=dict(settings.backend_options), metrics=metrics)
    fetcher = Fetcher(
        cache_ttl=core.cache_ttl,
        metrics=metrics,
        serve_stale_max_age=core.serve_stale_max_age,
        serve_stale_wait=core.serve_stale_wait,
        max_concurrent_fetches=core.max_concurrent_fetches,
        max_concurrent_fetches_per_namespace=core.max_concurrent_fetches_per_namespace,
        rate_limits=core.rate_limits,
        renew_at=core.renew_at,
        lease_idle_after=core.lease_idle_after,
        max_held_credentials=core.max_held_credentials,
        min_renew_interval=core.min_renew_interval,
        replaced_credential_grace=core.replaced_credential_grace,
        feed_window=core.feed_window if core.change_feed else 0.0,
        feed_stale_after=core.feed_stale_after,
    )
    backends.on_close(fetcher.close, "the fetcher")
    mounter = Mounter(
        backends=backends,
        fetcher=fetcher,
        versioner=load_versioner(settings.hmac_key_file, warn=warn_random_key),
        enable_test_stores=core.enable_fake_backend,
        max_objects=core.max_objects,
        max_response_bytes=core.max_response_bytes,
        strict_parameters=core.strict_parameters,
        refresh_bounds=RefreshBounds(core.min_refresh_interval, core.max_refresh_interval),
        shares=backends.work,
    )
    return mounter, backends


async def serve(
    settings: ServeSettings,
    *,
    ready: asyncio.Event | None = None,
    stop: asyncio.Event | None = None,
) -> int:
    """Serve until SIGTERM/SIGINT (or `stop` is set, for tests and the demo).

    Every resource is registered on one exit stack as soon as it is acquired, and released in
    the reverse order, at shutdown or when the start is refused: a refused start (a
    StartupError: one line for the operator) leaves nothing behind: no socket, no audit line,
    no directory it created, nothing listening. A resource that fails to be released is
    logged (`released`), and the others are still released.
    """
    settings = dataclasses.replace(settings, socket=startup.absolute(settings.socket))
    metrics = Metrics()
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    async with contextlib.AsyncExitStack() as stack:
        # The socket's path first: a bad one is refused before anything is built, logged or
        # written to the audit trail. What the claim made is given back unless serve starts.
        claim = await claim_socket(settings.socket)
        _on_exit(stack, "the socket's claim", claim.release)
        # SIGTERM and SIGINT stop serving from here on, and still do while it drains.
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
            _on_exit(
                stack, f"the {sig.name} handler", functools.partial(loop.remove_signal_handler, sig)
            )
        # The random key's warning waits until serve has started: a refused start is one line.
        mounter, backends = build_mounter(settings, metrics, warn_random_key=False)
        stack.push_async_callback(backends.close)  # logs each part that fails to close
        if mounter.coverage is not None:
            node_feed = NodeFeed(
                backends.kube, feed.namespace(settings.core.feed_namespace), mounter.coverage
            )
            watching = asyncio.create_task(node_feed.run(), name="change feed")
            _on_exit(stack, "the change feed's watch", watching.cancel)
        audit = open_audit(settings, metrics, mounter)
        if audit is not None:
            _on_exit(stack, "the audit log", audit.close)
            # logrotate renamed the file: write to the path anew
            loop.add_signal_handler(signal.SIGHUP, audit.reopen)
            unhandle = functools.partial(loop.remove_signal_handler, signal.SIGHUP)
            _on_exit(stack, "the SIGHUP handler", unhandle)
        servicer = ProviderServicer(
            mounter=mounter,
            metrics=metrics,
            audit=audit,
            log_repeats_every=settings.log_repeats_every,
        )
        server = build_server(servicer, max_send_bytes=settings.core.max_response_bytes + 65536)
        runner = await _listen_http(settings, metrics)
        _on_exit(stack, "the health server", runner.cleanup)
        # Nothing is bound before every check passed: a refused start leaves no socket behind.
        ours = await _bind(server, settings.socket)
        _on_exit(stack, "the socket", functools.partial(release_socket, settings.socket, ours))
        # Released before the socket: stop accepting at once; in-flight mounts get the grace
        # period to finish; then the socket is removed (if still ours).
        _on_exit(stack, "the gRPC server", functools.partial(server.stop, settings.grace_period))
        claim.keep()
        # Everything imported and built so far lives as long as the process: move it out of
        # the collector's reach, so a full collection walks only what mounts allocate (a full
        # collection of the start-up heap stalls the loop: BENCHMARKS.md, "The start-up heap
        # frozen").
        gc.collect()
        gc.freeze()
        if not settings.hmac_key_file:
            log.warning(RANDOM_KEY_WARNING)
        log.info(
            "serving",
            extra={
                "fields": {
                    "socket": settings.socket,
                    "health": settings.health_addr,
                    "loop": loops.running(),
                }
            },
        )
        if ready is not None:
            ready.set()
        try:
            await stop.wait()
        finally:
            log.info("stopping", extra={"fields": {"grace_period": settings.grace_period}})
            # Released in reverse order, to the end even when serve is cancelled again.
            await asyncio.shield(stack.aclose())
            log.info("stopped")
    return 0


def _on_exit(stack: contextlib.AsyncExitStack, name: str, release: Callable[[], object]) -> None:
    """Register `release` on `stack`, to be called through `released`."""
    stack.push_async_callback(released, name, release)


async def _listen_http(settings: ServeSettings, metrics: Metrics) -> Any:
    """/healthz, /readyz and /metrics on `--health-addr`; a StartupError when it is taken."""
    try:
        return await http.start(
            http.build_app(socket_path=settings.socket, metrics=metrics), settings.health_addr
        )
    except OSError as exc:
        reason = os.strerror(exc.errno).lower() if exc.errno else str(exc)
        raise StartupError(
            f"--health-addr {settings.health_addr}: cannot listen ({reason}); "
            "stop what listens there, or choose another --health-addr"
        ) from None


def open_audit(settings: ServeSettings, metrics: Metrics, mounter: Mounter) -> AuditTrail | None:
    """The audit trail of `--audit-log`, its first line written; a StartupError when it cannot
    be opened or written, or has no installation key to seal its lines with."""
    target = settings.audit_log
    if not target:
        return None
    if not settings.hmac_key_file:
        raise StartupError(
            "--audit-log needs --hmac-key-file: its lines are sealed with the installation key, "
            "and a random per-process key could never be verified"
        )
    try:
        key = auditchain.read_key(settings.hmac_key_file)
        trail = AuditTrail(open_sink(target), key, metrics=metrics, requested=mounter.requested)
        trail.start()
    except (OSError, ValueError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise StartupError(
            f"--audit-log {target}: cannot write it ({reason}); {_audit_fix(target, exc)}"
        ) from None
    return trail


def _audit_fix(target: str, exc: Exception) -> str:
    """What the operator can do about an audit log that cannot be written."""
    code = exc.errno if isinstance(exc, OSError) else None
    directory = os.path.dirname(os.path.abspath(target))
    if code in (errno.ENOENT, errno.ENOTDIR):
        return f"create the directory {directory}, or choose another --audit-log (- is stderr)"
    if code in (errno.EACCES, errno.EPERM, errno.EROFS):
        return "make it writable for serve, or choose another --audit-log (- is stderr)"
    return "choose another --audit-log (- is stderr)"


async def _bind(server: Any, path: str) -> tuple[int, int] | None:
    """Bind the gRPC server to `path`, and return the socket's identity.

    gRPC unlinks its listening path when it stops, whatever is there by then; so it binds a
    private name beside `path`, which is then renamed into place (atomically). At shutdown gRPC
    removes only that private name (long gone), and `release_socket` removes `path` only if it
    is still ours. `claim_socket` has already bound the private name once, so a failure here is
    not expected; it is still one line.
    """
    private = startup.private_name(path)
    # Only the driver (root on the node) may connect: no world access to the socket.
    old_umask = os.umask(0o117)
    try:
        server.add_insecure_port(f"unix://{private}")
        await server.start()
    except RuntimeError as exc:
        raise StartupError(f"--socket {path}: gRPC cannot listen on {private} ({exc})") from None
    finally:
        os.umask(old_umask)
    try:
        os.rename(private, path)
    except OSError as exc:
        await server.stop(None)
        raise StartupError(
            f"--socket {path}: cannot rename {private} into place ({exc.strerror or exc}); "
            "choose another --socket"
        ) from None
    return socket_identity(path)
