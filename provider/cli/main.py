"""The `secrets-bridge` command: serve, check, mount, version, bench, audit, watch.

Every `serve` flag can also come from the environment as SECRETS_BRIDGE_<FLAG>
(provider/cli/flags.py).

Exit status, the same rule for every command (EXIT_STATUS, shown by --help): 2 when the command
line itself is wrong, 1 when it is right but the node refuses it or the command's verdict is a
failure. Flags are never abbreviated, and an unknown one is named with the nearest real one.
"""

from __future__ import annotations

import argparse
import asyncio
import difflib
import sys
from collections.abc import Sequence
from typing import Any

from provider import __version__
from provider.cli.flags import (
    Parser,
    UnusableFile,
    add_refresh_interval_flags,
    add_serve_flags,
    count,
    flag,
    settings_from_args,
)
from provider.core.errors import InvalidParameters
from provider.core.files import DRIVER_RECV_BYTES
from provider.core.settings import ServeSettings

#: The exit codes of every command.
EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2

EXIT_STATUS = """\
exit status (every command):
  0  done (check: every class is valid; audit verify: the chain is intact)
  1  the command line is right, but the node refused it or the command failed:
     a file, directory, socket or port it needs is missing, unreadable, not
     writable or taken (by another provider); a provider or store refused or
     did not answer; check: a class is invalid; mount: the answer was refused;
     bench: mounts failed. The one line on stderr names the path and the fix.
  2  the command line (or a SECRETS_BRIDGE_* variable) is wrong: an unknown
     flag, a bad value, a missing or conflicting flag, a socket path too long
     for a Unix socket; nothing was created or bound. audit verify also exits 2
     when it cannot read a file or the key, so that its 1 always means a broken
     chain.
flags are never abbreviated: write each in full (see COMMAND --help).
"""


class CommandParser(Parser):
    """The CLI's parsers (subcommands inherit the class): flags are never abbreviated, and
    arguments no parser knows are refused by the subcommand they were given to, naming the
    nearest flag it has."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def parse_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> argparse.Namespace:
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:
            owner = _innermost(self, parsed)
            owner.error(unrecognized(extras, owner))
        return parsed


def _subparsers(parser: argparse.ArgumentParser) -> Any:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action
    return None


def _innermost(parser: argparse.ArgumentParser, parsed: argparse.Namespace) -> Any:
    """The (sub)command parser the arguments were given to: `secrets-bridge audit verify`'s,
    say, rather than the top level's."""
    while (sub := _subparsers(parser)) is not None:
        chosen = getattr(parsed, sub.dest, None)
        if chosen not in sub.choices:
            break
        parser = sub.choices[chosen]
    return parser


def unrecognized(extras: list[str], parser: argparse.ArgumentParser) -> str:
    """`unrecognized arguments: ...`, with the parser's nearest flag to the first unknown one."""
    message = f"unrecognized arguments: {' '.join(extras)}"
    flags = [o for action in parser._actions for o in action.option_strings]
    for extra in extras:
        if extra.startswith("-"):
            near = difflib.get_close_matches(extra.split("=", 1)[0], flags, n=1, cutoff=0.6)
            if near:
                return f"{message} (did you mean {near[0]}?)"
            break
    return message


def usage_error(command: str, message: str) -> int:
    """A usage error found after parsing: one line, exit 2, as argparse's own."""
    print(
        f"secrets-bridge {command}: error: {message}; see secrets-bridge {command} --help",
        file=sys.stderr,
    )
    return EXIT_USAGE


#: Subcommands and their one-line help. Only the chosen command's flags are built (and its
#: module imported), so `serve` never loads the bench, the driver emulation or the dev kit.
COMMANDS = {
    "serve": "serve the driver's gRPC API on a Unix socket",
    "version": "print the version",
    "check": "validate a SecretProviderClass file offline",
    "mount": "act as the driver: mount a class into a directory",
    "bench": "load-test Mount against a store, with an echo floor",
    "audit": "check or search an audit trail written by serve --audit-log "
    "(audit verify|search FILE...)",
    "watch": "publish which secrets changed, from the stores' event services, to every "
    "node (the change feed: docs/change-feed.md)",
}


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The CLI's parser, with the flags of `command` only (None: every command's)."""
    parser = CommandParser(
        prog="secrets-bridge",
        description="Secrets Store CSI driver provider for Vault/OpenBao, AWS, Google and Azure",
        epilog=EXIT_STATUS,
        formatter_class=argparse.RawDescriptionHelpFormatter,
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
        add_refresh_interval_flags(g)
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
    elif name == "watch":
        from provider.cli import watch as watching

        watching.add_watch_flags(cmd)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command = argv[0] if argv and argv[0] in COMMANDS else None
    try:
        args = build_parser(command).parse_args(argv)
    except InvalidParameters as exc:  # a bad switch value in the environment
        print(f"secrets-bridge: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if args.command == "version":
        print(f"secrets-bridge {__version__}")
        return EXIT_OK
    if args.command == "bench":
        from provider.cli import bench as bench_module

        return bench_module.run(args)
    if args.command == "audit":
        from provider.cli import audit as auditing

        return auditing.run(args)
    if args.command == "watch":
        return _watch(args)
    if args.command == "check":
        from provider.cli import check as checking

        if args.files.count("-") > 1:
            print("secrets-bridge check: standard input (-) can be read once", file=sys.stderr)
            return checking.EXIT_USAGE
        try:
            limits = checking.limits_from_args(args)
        except InvalidParameters as exc:
            return usage_error("check", str(exc))
        return checking.run(args.files, as_json=args.json, limits=limits)
    try:
        settings = settings_from_args(args)
    except InvalidParameters as exc:
        # The key file is read as it is parsed: one the node cannot give is the node's problem.
        code = EXIT_FAILED if isinstance(exc, UnusableFile) else EXIT_USAGE
        print(f"secrets-bridge {args.command}: error: {exc}", file=sys.stderr)
        return code
    in_process = args.command == "serve" or not getattr(args, "provider_socket", None)
    if in_process and (problem := _fake_without_store(settings)):
        return usage_error(args.command, problem)
    from provider.edge import logs

    logs.configure(settings.log_level, settings.log_format)
    if args.command == "serve":
        from provider.edge import app, loops
        from provider.edge.startup import StartupError

        try:
            loop = loops.chosen(settings.event_loop)
            return loops.run(app.serve(settings), loop)
        except StartupError as exc:
            print(f"secrets-bridge serve: {exc}", file=sys.stderr)
            return exc.exit_code
        except loops.LoopUnavailable as exc:
            print(f"secrets-bridge serve: {exc}", file=sys.stderr)
            return EXIT_FAILED
    if args.command == "mount":
        from provider.cli import mount as driver

        return asyncio.run(driver.run(args, settings))
    return EXIT_USAGE


def _watch(args: argparse.Namespace) -> int:
    from provider.cli import watch as watching
    from provider.edge import logs
    from provider.watch import run

    try:
        settings = watching.settings_from_args(args)
        sources = run.create_sources(settings.sources)
    except (InvalidParameters, ValueError) as exc:
        return usage_error("watch", str(exc))
    logs.configure(args.log_level, args.log_format)
    try:
        return asyncio.run(run.watch(settings, sources=sources))
    except OSError as exc:  # the metrics address or a source's listen address is taken
        print(f"secrets-bridge watch: cannot listen: {exc.strerror or exc}", file=sys.stderr)
        return EXIT_FAILED


def _fake_without_store(settings: ServeSettings) -> str | None:
    """The fake store holds only what its file lists: without one every mount would fail."""
    fake = settings.backend_options.get("fake")
    if settings.core.enable_fake_backend and fake is not None and not fake.store_file:
        return (
            "--enable-fake-backend needs --fake-store-file FILE (the fake store serves only "
            "the secrets that file lists, docs/fake-store.md); without it every mount would fail"
        )
    return None


if __name__ == "__main__":
    sys.exit(main())
