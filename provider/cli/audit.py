"""`secrets-bridge audit verify FILE...`: check the MAC chain of an audit trail (`serve
--audit-log`), oldest file first, and name the first line that is missing, edited or out of
place: within a file, and across files (each file's first line names the last MAC of the file
before it, so files given out of order, or with a file missing between them, are refused).

Exit 0: every line follows from the one before it (the first file may continue an older file
that is not given; a file that starts a new chain is accepted with its continuity unchecked,
and both are said). Exit 1: the first broken line is printed (evidence of deletion, edits or
disorder: the chain shows tampering, it cannot prevent it). Exit 2: usage (no key, a file that
cannot be read).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator

from provider.cli.flags import flag
from provider.edge import auditchain

EXIT_INTACT, EXIT_BROKEN, EXIT_USAGE = 0, 1, 2


def add_audit_flags(cmd: argparse.ArgumentParser) -> None:
    actions = cmd.add_subparsers(dest="audit_action", required=True, metavar="ACTION")
    text = "check the MAC chain of audit files; name the first missing, edited or moved line"
    verify = actions.add_parser("verify", help=text, description=text)
    verify.add_argument(
        "files",
        nargs="+",
        metavar="FILE",
        help="audit files, oldest first (a rotated file before the one that replaced it: "
        "audit.log.2 audit.log.1 audit.log); "
        '- is stdin (e.g. the lines of `kubectl logs` that start with {"type":"audit)',
    )
    flag(
        verify,
        "--hmac-key-file",
        None,
        "the installation key the provider sealed the lines with (its --hmac-key-file)",
        metavar="PATH",
    )


def run(args: argparse.Namespace) -> int:
    if not args.hmac_key_file:
        print("secrets-bridge audit verify: --hmac-key-file is required", file=sys.stderr)
        return EXIT_USAGE
    if args.files.count("-") > 1:
        print("secrets-bridge audit verify: standard input (-) can be read once", file=sys.stderr)
        return EXIT_USAGE
    try:
        key = auditchain.read_key(args.hmac_key_file)
        for name in args.files:
            if name != "-":
                open(name, "rb").close()  # every file is readable before any is judged
    except OSError as exc:
        print(f"secrets-bridge audit verify: {exc.filename}: {exc.strerror}", file=sys.stderr)
        return EXIT_USAGE
    except ValueError as exc:
        print(f"secrets-bridge audit verify: {exc}", file=sys.stderr)
        return EXIT_USAGE
    verdict = auditchain.verify(key, ((name, _lines(name)) for name in args.files))
    if verdict.problem:
        print(f"broken: {verdict.problem}")
        return EXIT_BROKEN
    print("; ".join(_intact(verdict, len(args.files))))
    return EXIT_INTACT


def _intact(verdict: auditchain.Verdict, files: int) -> list[str]:
    said = [f"intact: {verdict.lines} lines in {files} file(s)"]
    if verdict.continues:
        said.append(f"{verdict.continues} continues an older file, not given")
    if verdict.starts:
        said.append(f"chains start at {', '.join(verdict.starts)}")
    if verdict.unlinked:
        said.append(
            f"continuity with the file before unchecked at {', '.join(verdict.unlinked)} "
            "(a new chain: a provider start on a new file, or on stderr)"
        )
    return said


def _lines(name: str) -> Iterator[str]:
    """Lines split on \\n only, with it (a missing last newline is a cut line)."""
    if name == "-":
        yield from (raw.decode("utf-8", "replace") for raw in sys.stdin.buffer)
        return
    with open(name, "rb") as fh:
        for raw in fh:
            yield raw.decode("utf-8", "replace")
