"""The provider's flags (`serve`, and `mount`, which runs a provider in-process), validated as
they are parsed: a bad value is one line naming the flag (or the environment variable it came
from), the value and what is expected, and exit code 2 — before anything is bound or created.

Every flag can also come from the environment as SECRETS_BRIDGE_<FLAG> (`--cache-ttl` ->
SECRETS_BRIDGE_CACHE_TTL); the command line wins. Each store's own flags are declared in
`backends/<store>/options.py` and registered by provider/core/settings.py the same way.
"""

from __future__ import annotations

import argparse
import os
import re
from collections.abc import Callable
from typing import Any, NoReturn, get_args

from backends import registry
from backends.fake.options import load_store_file
from provider.core import parsing
from provider.core.errors import InvalidParameters
from provider.core.files import DRIVER_RECV_BYTES
from provider.core.limits import parse_rate_limits
from provider.core.settings import (
    DEFAULT_SOCKET,
    CoreSettings,
    EventLoop,
    ServeSettings,
    add_options_flags,
    env_default,
    env_name,
    options_from_args,
    parse_bool,
)
from provider.core.versions import Versioner

LOG_LEVELS = ("debug", "info", "warning", "error")


class UnusableFile(InvalidParameters):
    """A file a flag names that the node cannot give (missing, unreadable, not what it should
    hold): the command line is right, the node is not (exit 1, not 2)."""


class Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (and names the environment variable when the bad
    value came from there). Subcommand parsers inherit it."""

    def error(self, message: str) -> NoReturn:
        found = re.search(r"argument (--[\w-]+)", message)
        origin = ""
        if found and os.environ.get(env_name(found.group(1))):
            origin = f" (the value comes from the environment variable {env_name(found.group(1))})"
        self.exit(2, f"{self.prog}: error: {message}{origin}; see {self.prog} --help\n")


def seconds(minimum: float = 0.0, *, above: bool = False) -> Callable[[str], float]:
    """A number of seconds, at least `minimum` (or above it)."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = float("nan")
        ok = value > minimum if above else value >= minimum
        if not ok:  # NaN fails both comparisons
            bound = f"above {minimum:g}" if above else f"at least {minimum:g}"
            raise argparse.ArgumentTypeError(f"expected a number of seconds {bound}, got {text!r}")
        return value

    return parse


def count(minimum: int = 1) -> Callable[[str], int]:
    """A whole number, at least `minimum`."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = minimum - 1
        if value < minimum:
            raise argparse.ArgumentTypeError(
                f"expected a whole number of at least {minimum}, got {text!r}"
            )
        return value

    return parse


def host_port(text: str) -> str:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise argparse.ArgumentTypeError(
            f"expected HOST:PORT with a port from 1 to 65535 (e.g. 0.0.0.0:8098), got {text!r}"
        )
    return text


def log_level(text: str) -> str:
    if text.lower() not in LOG_LEVELS:
        raise argparse.ArgumentTypeError(f"expected one of {', '.join(LOG_LEVELS)}, got {text!r}")
    return text.lower()


def flag(
    group: Any, name: str, default: Any, help_text: str, *, metavar: str | None = None, **kw: Any
) -> None:
    """A flag whose default may come from the environment, with its default and variable in the
    help. Booleans become --flag/--no-flag switches."""
    value = env_default(name, default, tuple(kw.pop("env", ())))
    shown = "off" if default is False else "on" if default is True else default
    where = f"default: {shown}; " if default not in (None, "") else ""
    help_full = f"{help_text} ({where}env {env_name(name)})"
    if isinstance(default, bool):
        try:
            value = parse_bool(value)
        except argparse.ArgumentTypeError as exc:
            raise InvalidParameters(f"{env_name(name)}: {exc}") from None
        group.add_argument(
            name, action=argparse.BooleanOptionalAction, default=value, help=help_full, **kw
        )
        return
    group.add_argument(name, default=value, help=help_full, metavar=metavar, **kw)


def add_serve_flags(parser: argparse.ArgumentParser, *, with_socket: bool = True) -> None:
    g = parser.add_argument_group("provider")
    if with_socket:
        flag(g, "--socket", DEFAULT_SOCKET, "Unix socket the driver dials", metavar="PATH")
        flag(
            g,
            "--health-addr",
            "0.0.0.0:8098",
            "address of /healthz, /readyz, /metrics",
            metavar="HOST:PORT",
            type=host_port,
        )
        flag(
            g,
            "--grace-period",
            10.0,
            "seconds to drain in-flight mounts on SIGTERM",
            metavar="SECONDS",
            type=seconds(),
        )
    flag(g, "--log-level", "info", "|".join(LOG_LEVELS), metavar="LEVEL", type=log_level)
    flag(g, "--log-format", "json", "json or text", choices=["json", "text"])
    if with_socket:
        flag(
            g,
            "--log-repeats-every",
            600.0,
            "seconds between a volume's mount lines while its answer is unchanged (rotation "
            "polls); the lines in between are counted in the next one's `repeats`; 0 logs "
            "every mount",
            metavar="SECONDS",
            type=seconds(),
        )
        flag(
            g,
            "--event-loop",
            "auto",
            "the event loop: uvloop (measured faster), asyncio, or auto: uvloop when installed",
            choices=list(get_args(EventLoop)),
        )
    flag(
        g,
        "--hmac-key-file",
        None,
        "installation key for object versions (at least 16 bytes; without it a random key per "
        "process, and versions change on restart)",
        metavar="PATH",
    )
    if with_socket:
        flag(
            g,
            "--audit-log",
            None,
            "append one sealed JSON line per mount answered or refused to PATH (- = stderr; "
            "reopened on SIGHUP; needs --hmac-key-file; off by default)",
            metavar="PATH|-",
        )
    _durations(g)
    _lifetimes(g)
    _limits(g)
    flag(
        g,
        "--rate-limit",
        "",
        "fetch calls per second per backend, e.g. aws=40,azure=400",
        metavar="BACKEND=RATE,...",
    )
    flag(
        g,
        "--cache-scope",
        "serviceaccount",
        "identity key granularity",
        choices=["serviceaccount", "pod"],
    )
    flag(
        g,
        "--allow-node-identity-namespaces",
        "",
        "comma-separated namespaces whose pods may use the node's identity",
        metavar="NS,...",
    )
    flag(g, "--token-request-fallback", False, "mint pod tokens via the TokenRequest API")
    flag(
        g,
        "--strict-parameters",
        False,
        "refuse unknown keys inside objects instead of warning (upstream ignores them)",
    )
    flag(g, "--enable-fake-backend", False, "accept backend: fake (tests, demos)")
    flag(
        g,
        "--kube-api-url",
        None,
        "Kubernetes API URL (default: in-cluster config, then kubeconfig)",
        metavar="URL",
    )
    flag(
        g,
        "--kube-api-token-file",
        "",
        "a bearer token file for --kube-api-url (re-read every minute)",
        metavar="FILE",
    )
    for name in registry.names():
        add_options_flags(parser, name, registry.options_class(name))


def add_refresh_interval_flags(g: Any) -> None:
    """The bounds of a class's refreshInterval: `serve`'s, and `check`'s to show which applies."""
    flag(
        g,
        "--min-refresh-interval",
        CoreSettings.min_refresh_interval,
        "least seconds a class's refreshInterval may ask its values be reused for (a "
        "shorter one is raised to this, with a warning)",
        metavar="SECONDS",
        type=seconds(),
    )
    flag(
        g,
        "--max-refresh-interval",
        CoreSettings.max_refresh_interval,
        "most seconds a class's refreshInterval may ask its values be reused for (a longer "
        "one is lowered to this, with a warning)",
        metavar="SECONDS",
        type=seconds(),
    )


def check_refresh_bounds(floor: float, ceiling: float) -> None:
    if floor > ceiling:
        raise InvalidParameters(
            f"--min-refresh-interval ({floor:g}) is over --max-refresh-interval ({ceiling:g}); "
            "lower the first or raise the second"
        )


def _durations(g: Any) -> None:
    flag(
        g,
        "--cache-ttl",
        0.0,
        "seconds a fetched value is reused (0 = off)",
        metavar="SECONDS",
        type=seconds(),
    )
    add_refresh_interval_flags(g)
    flag(
        g,
        "--serve-stale-max-age",
        0.0,
        "seconds the last good value may be served while its store is unavailable (0 = off)",
        metavar="SECONDS",
        type=seconds(),
    )
    flag(
        g,
        "--change-feed",
        False,
        "watch the change feed of `secrets-bridge watch` (docs/change-feed.md): a changed "
        "secret is read at the next poll, and values it covers are reused for --feed-window",
    )
    flag(
        g,
        "--feed-window",
        3600.0,
        "seconds a value the change feed covers is reused by a class with no refreshInterval",
        metavar="SECONDS",
        type=seconds(above=True),
    )
    flag(
        g,
        "--feed-stale-after",
        90.0,
        "seconds without a feed heartbeat after which values fall back to their configured refresh",
        metavar="SECONDS",
        type=seconds(above=True),
    )
    flag(
        g,
        "--feed-namespace",
        "",
        "namespace of the feed's ConfigMaps (default: this pod's, from POD_NAMESPACE)",
        metavar="NAMESPACE",
    )
    flag(
        g,
        "--serve-stale-wait",
        3.0,
        "seconds a mount with a stale copy waits for a silent store before the copy is served "
        "(a store that refused is not waited for)",
        metavar="SECONDS",
        type=seconds(),
    )
    flag(
        g,
        "--store-call-timeout",
        10.0,
        "seconds one store call (login, read) may take before it counts as unavailable",
        metavar="SECONDS",
        type=seconds(above=True),
    )


def fraction(text: str) -> float:
    """A fraction above 0 and below 1 (`2/3` or `0.67`)."""
    value = parsing.fraction(text)
    if value is None:
        raise argparse.ArgumentTypeError(
            f"expected a fraction above 0 and below 1 (such as 2/3 or 0.5), got {text!r}"
        )
    return value


def _lifetimes(g: Any) -> None:
    flag(
        g,
        "--renew-at",
        "2/3",
        "fraction of a lease's or certificate's life after which a pod's poll renews or "
        "re-issues it; a class may ask for less with renewAt",
        metavar="FRACTION",
        type=fraction,
    )
    flag(
        g,
        "--lease-idle-after",
        600.0,
        "seconds without a poll after which a pod's leases are no longer renewed and are "
        "revoked (a pod seen polling is idle after three of its poll intervals, if sooner)",
        metavar="SECONDS",
        type=seconds(above=True),
    )
    flag(
        g,
        "--max-held-credentials",
        10_000,
        "credentials with a lifetime held for pods (leases, certificates), shared fairly by "
        "namespace",
        metavar="N",
        type=count(),
    )
    flag(
        g,
        "--min-renew-interval",
        300.0,
        "fewest seconds between two renewals or re-issues of one held credential, whatever a "
        "class's renewAt asks",
        metavar="SECONDS",
        type=seconds(),
    )
    flag(
        g,
        "--replaced-credential-grace",
        300.0,
        "seconds a credential replaced by a re-issue stays live (for the pod's application "
        "to move to the new one) before it is revoked",
        metavar="SECONDS",
        type=seconds(),
    )


def _limits(g: Any) -> None:
    flag(
        g,
        "--max-concurrent-fetches",
        64,
        "store fetch calls in flight per backend",
        metavar="N",
        type=count(),
    )
    flag(
        g,
        "--max-concurrent-fetches-per-namespace",
        16,
        "of those, fetch calls one namespace may have in flight (its share)",
        metavar="N",
        type=count(),
    )
    flag(g, "--max-objects", 100, "most objects in one class", metavar="N", type=count())
    flag(
        g,
        "--max-read-bytes",
        64 * 1024 * 1024,
        "bytes of store answers all reads in flight may hold together",
        metavar="BYTES",
        type=count(),
    )
    flag(
        g,
        "--max-read-bytes-per-namespace",
        16 * 1024 * 1024,
        "of those, the bytes one namespace's reads may hold (its share)",
        metavar="BYTES",
        type=count(),
    )
    flag(
        g,
        "--max-response-bytes",
        DRIVER_RECV_BYTES,
        "largest answer as the driver receives it (the serialized MountResponse, framing "
        "included); match the driver's --max-call-recv-msg-size, whose default this is: the "
        "driver refuses larger answers, so raise both together",
        metavar="BYTES",
        type=count(),
    )


def settings_from_args(args: argparse.Namespace) -> ServeSettings:
    """Settings from parsed flags; the checks argparse cannot make (the key file, rate limits)
    raise InvalidParameters naming the flag."""
    if args.hmac_key_file:
        _check_key_file(args.hmac_key_file)
    elif getattr(args, "audit_log", None):
        raise InvalidParameters(
            "--audit-log needs --hmac-key-file: the trail's lines are sealed with the "
            "installation key, so that `secrets-bridge audit verify` can check them"
        )
    check_refresh_bounds(args.min_refresh_interval, args.max_refresh_interval)
    namespaces = frozenset(
        n.strip() for n in args.allow_node_identity_namespaces.split(",") if n.strip()
    )
    core = CoreSettings(
        cache_ttl=args.cache_ttl,
        min_refresh_interval=args.min_refresh_interval,
        max_refresh_interval=args.max_refresh_interval,
        serve_stale_max_age=args.serve_stale_max_age,
        serve_stale_wait=args.serve_stale_wait,
        store_call_timeout=args.store_call_timeout,
        renew_at=args.renew_at,
        lease_idle_after=args.lease_idle_after,
        max_held_credentials=args.max_held_credentials,
        min_renew_interval=args.min_renew_interval,
        replaced_credential_grace=args.replaced_credential_grace,
        max_concurrent_fetches=args.max_concurrent_fetches,
        max_concurrent_fetches_per_namespace=args.max_concurrent_fetches_per_namespace,
        rate_limits=parse_rate_limits(args.rate_limit, registry.names()),
        cache_scope=args.cache_scope,
        allow_node_identity_namespaces=namespaces,
        token_request_fallback=args.token_request_fallback,
        max_objects=args.max_objects,
        max_read_bytes=args.max_read_bytes,
        max_read_bytes_per_namespace=args.max_read_bytes_per_namespace,
        max_response_bytes=args.max_response_bytes,
        strict_parameters=args.strict_parameters,
        change_feed=args.change_feed,
        feed_window=args.feed_window,
        feed_stale_after=args.feed_stale_after,
        feed_namespace=args.feed_namespace,
        enable_fake_backend=args.enable_fake_backend,
        kube_api_url=args.kube_api_url,
        kube_api_token_file=args.kube_api_token_file,
        aws_sts_endpoint=getattr(args, "aws__sts_endpoint", None) or None,
    )
    options = {
        name: options_from_args(args, name, registry.options_class(name))
        for name in registry.names()
    }
    _check_fake_store_file(args, core, options.get("fake"))
    return ServeSettings(
        socket=getattr(args, "socket", DEFAULT_SOCKET),
        health_addr=getattr(args, "health_addr", "0.0.0.0:8098"),
        log_level=args.log_level,
        log_format=args.log_format,
        log_repeats_every=getattr(args, "log_repeats_every", 600.0),
        grace_period=getattr(args, "grace_period", 10.0),
        event_loop=getattr(args, "event_loop", "auto"),
        hmac_key_file=args.hmac_key_file,
        audit_log=getattr(args, "audit_log", None),
        core=core,
        backend_options=options,
    )


def _check_fake_store_file(args: argparse.Namespace, core: CoreSettings, fake: Any) -> None:
    """The fake store's file, read once at start as the store reads it: a missing or broken
    file fails `serve` (and an in-process `mount`) at once, not every mount after `serving`."""
    if getattr(args, "provider_socket", None) or not core.enable_fake_backend:
        return
    if fake is not None and fake.store_file:
        try:
            load_store_file(fake.store_file)
        except InvalidParameters as exc:
            raise UnusableFile(str(exc)) from None


def _check_key_file(path: str) -> None:
    try:
        Versioner.from_file(path)
    except OSError as exc:
        raise UnusableFile(
            f"--hmac-key-file {path}: cannot read it ({exc.strerror or exc}); create it with "
            "`openssl rand -base64 48`"
        ) from None
    except ValueError as exc:
        raise UnusableFile(f"{exc}; create one with `openssl rand -base64 48`") from None
