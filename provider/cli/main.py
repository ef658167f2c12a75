"""The `secrets-bridge` command: serve, check, mount, version, bench, audit.

Every `serve` flag can also come from the environment as SECRETS_BRIDGE_<FLAG>
(provider/cli/flags.py).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Sequence

from provider import __version__
from provider.cli.flags import (
    Parser,
    add_serve_flags,
    count,
    flag,
    settings_from_args,
)
from provider.core.errors import InvalidParameters
from provider.core.files import DRIVER_RECV_BYTES

#: Subcommands and their one-line help. Only the chosen command's flags are built (and its
#: module imported), so `serve` never loads the bench, the driver emulation or the dev kit.
COMMANDS = {
    "serve": "serve the driver's gRPC API on a Unix socket",
    "version": "print the version",
    "check": "validate a SecretProviderClass file offline",
    "mount": "act as the driver: mount a class into a directory",
    "bench": "load-test Mount against a store, with an echo floor",
    "audit": "check an audit trail written by serve --audit-log (audit verify FILE...)",
}


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The CLI's parser, with the flags of `command` only (None: every command's)."""
    parser = Parser(
        prog="secrets-bridge",
        description="Secrets Store CSI driver provider for Vault/OpenBao, AWS, Google and Azure",
    )
    parser.add_argument("--version", action="version", version=f"secrets-bridge {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, help_text in COMMANDS.items():
        cmd = sub.add_parser(name, help=help_text, description=help_text)
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
        flag(g, "--max-objects", 100, "most objects in one class", metavar="N", type=count())
        flag(
            g,
            "--max-response-bytes",
            DRIVER_RECV_BYTES,
            "largest answer as the driver receives it (serialized, framing included)",
            metavar="BYTES",
            type=count(),
        )
        flag(
            g,
            "--strict-parameters",
            False,
            "refuse unknown keys inside objects, as serve --strict-parameters does",
        )
    elif name == "mount":
        from provider.cli import mount as driver

        driver.add_mount_flags(cmd)
        add_serve_flags(cmd, with_socket=False)
    elif name == "bench":
        from provider.cli import bench as bench_module

        bench_module.add_bench_flags(cmd)
    elif name == "audit":
        from provider.cli import audit as auditing

        auditing.add_audit_flags(cmd)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command = argv[0] if argv and argv[0] in COMMANDS else None
    try:
        args = build_parser(command).parse_args(argv)
    except InvalidParameters as exc:  # a bad switch value in the environment
        print(f"secrets-bridge: error: {exc}", file=sys.stderr)
        return 2
    if args.command == "version":
        print(f"secrets-bridge {__version__}")
        return 0
    if args.command == "bench":
        from provider.cli import bench as bench_module

        return bench_module.run(args)
    if args.command == "audit":
        from provider.cli import audit as auditing

        return auditing.run(args)
    if args.command == "check":
        from provider.cli import check as checking

        if args.files.count("-") > 1:
            print("secrets-bridge check: standard input (-) can be read once", file=sys.stderr)
            return checking.EXIT_USAGE
        limits = checking.Limits(
            max_objects=int(args.max_objects),
            max_response_bytes=int(args.max_response_bytes),
            strict_parameters=args.strict_parameters,
        )
        return checking.run(args.files, as_json=args.json, limits=limits)
    try:
        settings = settings_from_args(args)
    except InvalidParameters as exc:
        print(f"secrets-bridge {args.command}: error: {exc}", file=sys.stderr)
        return 2
    from provider.edge import logs

    logs.configure(settings.log_level, settings.log_format)
    if args.command == "serve":
        from provider.edge import app, loops
        from provider.edge.startup import StartupError

        try:
            loop = loops.chosen(settings.event_loop)
            return loops.run(app.serve(settings), loop)
        except (StartupError, loops.LoopUnavailable) as exc:
            print(f"secrets-bridge serve: {exc}", file=sys.stderr)
            return 1
    if args.command == "mount":
        from provider.cli import mount as driver

        return asyncio.run(driver.run(args, settings))
    return 2


if __name__ == "__main__":
    sys.exit(main())
