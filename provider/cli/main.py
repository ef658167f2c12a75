"""The `secrets-bridge` command: serve, check, mount, version, bench.

Every `serve` flag can also come from the environment as SECRETS_BRIDGE_<FLAG>.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Sequence
from typing import Any

from backends import registry
from provider import __version__
from provider.core.errors import InvalidParameters
from provider.core.limits import parse_rate_limits
from provider.core.settings import (
    DEFAULT_SOCKET,
    CoreSettings,
    ServeSettings,
    add_options_flags,
    env_default,
    options_from_args,
    parse_bool,
)


def _flag(group: Any, name: str, default: Any, help_text: str, **kw: Any) -> None:
    value = env_default(name, default, tuple(kw.pop("env", ())))
    group.add_argument(name, default=value, help=f"{help_text} (default {default!r})", **kw)


def add_serve_flags(parser: argparse.ArgumentParser, *, with_socket: bool = True) -> None:
    g = parser.add_argument_group("provider")
    if with_socket:
        _flag(g, "--socket", DEFAULT_SOCKET, "Unix socket the driver dials")
        _flag(g, "--health-addr", "0.0.0.0:8098", "address of /healthz, /readyz, /metrics")
        _flag(g, "--grace-period", 10.0, "seconds to drain in-flight mounts on SIGTERM", type=float)
    _flag(g, "--log-level", "info", "debug, info, warning or error")
    _flag(g, "--log-format", "json", "json or text", choices=["json", "text"])
    _flag(g, "--hmac-key-file", None, "installation key for object versions")
    _flag(g, "--cache-ttl", 0.0, "seconds a fetched value is reused (0 = off)", type=float)
    _flag(
        g,
        "--serve-stale-max-age",
        0.0,
        "seconds the last good value may be served while its store is unavailable (0 = off)",
        type=float,
    )
    _flag(
        g,
        "--serve-stale-wait",
        3.0,
        "seconds a mount with a stale copy waits for its store before the copy is served",
        type=float,
    )
    _flag(
        g,
        "--store-call-timeout",
        10.0,
        "seconds one store call (login, read) may take before it counts as unavailable",
        type=float,
    )
    _flag(g, "--max-concurrent-fetches", 64, "store fetch calls in flight per backend", type=int)
    _flag(
        g,
        "--max-concurrent-fetches-per-namespace",
        16,
        "of those, fetch calls one namespace may have in flight (its share)",
        type=int,
    )
    _flag(g, "--rate-limit", "", "fetch calls per second per backend, e.g. 'aws=40,azure=400'")
    _flag(
        g,
        "--cache-scope",
        "serviceaccount",
        "identity key granularity",
        choices=["serviceaccount", "pod"],
    )
    _flag(
        g,
        "--allow-node-identity-namespaces",
        "",
        "comma-separated namespaces whose pods may use the node's identity",
    )
    _flag(
        g,
        "--token-request-fallback",
        False,
        "mint pod tokens via the TokenRequest API",
        type=parse_bool,
        nargs="?",
        const=True,
    )
    _flag(g, "--max-objects", 100, "most objects in one class", type=int)
    _flag(g, "--max-response-bytes", 4 * 1024 * 1024, "largest answer", type=int)
    _strict_flag(g)
    _flag(
        g,
        "--enable-fake-backend",
        False,
        "accept backend: fake (tests, demos)",
        type=parse_bool,
        nargs="?",
        const=True,
    )
    _flag(g, "--kube-api-url", None, "Kubernetes API URL (default: in-cluster config)")
    for name in registry.names():
        add_options_flags(parser, name, registry.options_class(name))


def _strict_flag(group: Any) -> None:
    _flag(
        group,
        "--strict-parameters",
        False,
        "refuse unknown keys inside objects instead of warning (upstream ignores them)",
        type=parse_bool,
        nargs="?",
        const=True,
    )


def settings_from_args(args: argparse.Namespace) -> ServeSettings:
    if float(args.store_call_timeout) <= 0 or int(args.max_concurrent_fetches_per_namespace) < 1:
        raise InvalidParameters(
            "--store-call-timeout must be positive and --max-concurrent-fetches-per-namespace "
            "at least 1"
        )
    namespaces = frozenset(
        n.strip() for n in args.allow_node_identity_namespaces.split(",") if n.strip()
    )
    core = CoreSettings(
        cache_ttl=float(args.cache_ttl),
        serve_stale_max_age=float(args.serve_stale_max_age),
        serve_stale_wait=float(args.serve_stale_wait),
        store_call_timeout=float(args.store_call_timeout),
        max_concurrent_fetches=int(args.max_concurrent_fetches),
        max_concurrent_fetches_per_namespace=int(args.max_concurrent_fetches_per_namespace),
        rate_limits=parse_rate_limits(args.rate_limit, registry.names()),
        cache_scope=args.cache_scope,
        allow_node_identity_namespaces=namespaces,
        token_request_fallback=parse_bool(args.token_request_fallback),
        max_objects=int(args.max_objects),
        max_response_bytes=int(args.max_response_bytes),
        strict_parameters=parse_bool(args.strict_parameters),
        enable_fake_backend=parse_bool(args.enable_fake_backend),
        kube_api_url=args.kube_api_url,
    )
    options = {
        name: options_from_args(args, name, registry.options_class(name))
        for name in registry.names()
    }
    return ServeSettings(
        socket=getattr(args, "socket", DEFAULT_SOCKET),
        health_addr=getattr(args, "health_addr", "0.0.0.0:8098"),
        log_level=args.log_level,
        log_format=args.log_format,
        grace_period=float(getattr(args, "grace_period", 10.0)),
        hmac_key_file=args.hmac_key_file,
        core=core,
        backend_options=options,
    )


#: Subcommands and their one-line help. Only the chosen command's flags are built (and its
#: module imported), so `serve` never loads the bench, the driver emulation or the dev kit.
COMMANDS = {
    "serve": "serve the driver's gRPC API on a Unix socket",
    "version": "print the version",
    "check": "validate a SecretProviderClass file offline",
    "mount": "act as the driver: mount a class into a directory",
    "bench": "load-test Mount against a store, with an echo floor",
}


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The CLI's parser, with the flags of `command` only (None: every command's)."""
    parser = argparse.ArgumentParser(
        prog="secrets-bridge",
        description="Secrets Store CSI driver provider for Vault/OpenBao, AWS, Google and Azure",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for name, help_text in COMMANDS.items():
        cmd = sub.add_parser(name, help=help_text)
        if command in (None, name):
            _add_flags(name, cmd)
    return parser


def _add_flags(name: str, cmd: argparse.ArgumentParser) -> None:
    if name == "serve":
        add_serve_flags(cmd)
    elif name == "check":
        cmd.add_argument(
            "files",
            nargs="+",
            metavar="FILE",
            help="YAML file(s) holding SecretProviderClasses (or a List of them); - is stdin",
        )
        cmd.add_argument(
            "--json", action="store_true", help="print one JSON document: per class, its files"
        )
        g = cmd.add_argument_group("the limits serve applies")
        _flag(g, "--max-objects", 100, "most objects in one class", type=int)
        _flag(g, "--max-response-bytes", 4 * 1024 * 1024, "largest answer", type=int)
        # A plain switch here: an optional value would swallow the first FILE.
        g.add_argument(
            "--strict-parameters",
            action="store_true",
            default=parse_bool(env_default("--strict-parameters", False)),
            help="refuse unknown keys inside objects, as serve --strict-parameters does",
        )
    elif name == "mount":
        from provider.cli import mount as driver

        driver.add_mount_flags(cmd)
        add_serve_flags(cmd, with_socket=False)
    elif name == "bench":
        from provider.cli import bench as bench_module

        bench_module.add_bench_flags(cmd)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command = argv[0] if argv and argv[0] in COMMANDS else None
    args = build_parser(command).parse_args(argv)
    if args.command == "version":
        print(f"secrets-bridge {__version__}")
        return 0
    if args.command == "bench":
        from provider.cli import bench as bench_module

        return bench_module.run(args)
    if args.command == "check":
        from provider.cli import check as checking

        if int(args.max_objects) < 1 or int(args.max_response_bytes) < 1:
            print("secrets-bridge check: the limits must be positive", file=sys.stderr)
            return checking.EXIT_USAGE
        if args.files.count("-") > 1:
            print("secrets-bridge check: standard input (-) can be read once", file=sys.stderr)
            return checking.EXIT_USAGE
        limits = checking.Limits(
            max_objects=int(args.max_objects),
            max_response_bytes=int(args.max_response_bytes),
            strict_parameters=parse_bool(args.strict_parameters),
        )
        return checking.run(args.files, as_json=args.json, limits=limits)
    try:
        settings = settings_from_args(args)
    except InvalidParameters as exc:
        print(f"secrets-bridge: {exc}", file=sys.stderr)
        return 2
    from provider.edge import logs

    logs.configure(settings.log_level, settings.log_format)
    if args.command == "serve":
        from provider.edge import app
        from provider.edge.startup import StartupError

        try:
            return asyncio.run(app.serve(settings))
        except StartupError as exc:
            print(f"secrets-bridge serve: {exc}", file=sys.stderr)
            return 1
    if args.command == "mount":
        from provider.cli import mount as driver

        return asyncio.run(driver.run(args, settings))
    return 2


if __name__ == "__main__":
    sys.exit(main())
