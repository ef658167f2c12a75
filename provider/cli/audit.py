"""`secrets-bridge audit verify FILE...`: check the MAC chain of an audit trail (`serve
--audit-log`), oldest file first, and name the first line that is missing, edited or out of
place: within a file, and across files (each file's first line names the last MAC of the file
before it, so files given out of order, or with a file missing between them, are refused).

Exit 0: every line follows from the one before it (the first file may continue an older file
that is not given; a file that starts a new chain is accepted with its continuity unchecked,
and both are said). Exit 1: the first broken line is printed (evidence of deletion, edits or
disorder: the chain shows tampering, it cannot prevent it). Exit 2: usage (no key, a file that
cannot be read).

`secrets-bridge audit search FILE... [--secret S] [--pod NS/NAME] [--namespace NS] [--since T]
[--until T]`: the records that match (provider/cli/auditsearch.py), one a line on stdout, read
with the chain checked as verify checks it; then, on stderr, how many matched and the chain's
verdict. Exit 0: the chain is intact (whether anything matched or not); 1: it is broken, and
where is said (the matches are still printed: those from that line on are not vouched for);
2: usage.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from datetime import UTC, datetime

from provider.cli import auditsearch
from provider.cli.flags import flag
from provider.edge import auditchain

EXIT_INTACT, EXIT_BROKEN, EXIT_USAGE = 0, 1, 2


def add_audit_flags(cmd: argparse.ArgumentParser) -> None:
    actions = cmd.add_subparsers(dest="audit_action", required=True, metavar="ACTION")
    text = "check the MAC chain of audit files; name the first missing, edited or moved line"
    verify = actions.add_parser("verify", help=text, description=text)
    _files_and_key(verify)
    text = "which pods received a secret, and when: the records that match, chain checked"
    search = actions.add_parser("search", help=text, description=text)
    _files_and_key(search)
    search.add_argument(
        "--secret",
        default="",
        metavar="REF",
        help="a secret's reference in its store, or its last segments (secret/app/db, app/db, "
        "an ARN, a resource name): the answers that delivered it, listed or selected",
    )
    search.add_argument("--pod", default="", metavar="NS/NAME", help="one pod's records")
    search.add_argument("--namespace", default="", metavar="NS", help="one namespace's records")
    for name, when in (("--since", "from"), ("--until", "up to")):
        search.add_argument(
            name,
            default="",
            metavar="TIME",
            help=f"records {when} this time (ISO 8601, UTC unless it says otherwise) or age "
            "(90s, 30m, 2h, 7d ago)",
        )
    search.add_argument("--json", action="store_true", help="one JSON object per match")


def _files_and_key(cmd: argparse.ArgumentParser) -> None:
    cmd.add_argument(
        "files",
        nargs="+",
        metavar="FILE",
        help="audit files, oldest first (a rotated file before the one that replaced it: "
        "audit.log.2 audit.log.1 audit.log); "
        '- is stdin (e.g. the lines of `kubectl logs` that start with {"type":"audit)',
    )
    flag(
        cmd,
        "--hmac-key-file",
        None,
        "the installation key the provider sealed the lines with (its --hmac-key-file)",
        metavar="PATH",
    )


def run(args: argparse.Namespace) -> int:
    action = args.audit_action
    try:
        key = _key_and_files(args)
        query = _query(args) if action == "search" else None
    except ValueError as exc:
        print(f"secrets-bridge audit {action}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if query is not None:
        return _search(key, query, args)
    verdict = auditchain.verify(key, ((name, _lines(name)) for name in args.files))
    if verdict.problem:
        print(f"broken: {verdict.problem}")
        return EXIT_BROKEN
    print("; ".join(_intact(verdict, len(args.files))))
    return EXIT_INTACT


def _key_and_files(args: argparse.Namespace) -> bytes:
    """The audit key, once every file is known readable (ValueError: one line to print)."""
    if not args.hmac_key_file:
        raise ValueError("--hmac-key-file is required")
    if args.files.count("-") > 1:
        raise ValueError("standard input (-) can be read once")
    try:
        key = auditchain.read_key(args.hmac_key_file)
        for name in args.files:
            if name != "-":
                open(name, "rb").close()  # every file is readable before any is judged
    except OSError as exc:
        raise ValueError(f"{exc.filename}: {exc.strerror}") from None
    return key


def _query(args: argparse.Namespace) -> auditsearch.Query:
    now = datetime.now(UTC)
    return auditsearch.Query(
        secret=args.secret,
        pod=auditsearch.parse_pod(args.pod) if args.pod else None,
        namespace=args.namespace,
        since=auditsearch.parse_time(args.since, "--since", now) if args.since else None,
        until=auditsearch.parse_time(args.until, "--until", now) if args.until else None,
    )


def _search(key: bytes, query: auditsearch.Query, args: argparse.Namespace) -> int:
    chain = auditchain.Chain(key)
    show = auditsearch.as_json if args.json else auditsearch.text
    found = 0
    files = [(name, _lines(name)) for name in args.files]
    for match in auditsearch.search(query, chain, files):
        print(show(match))
        found += 1
    verdict = chain.verdict()
    said = f"{found} match{'es' if found != 1 else ''} in {verdict.lines} lines"
    if verdict.problem:
        print(f"{said}; broken: {verdict.problem}", file=sys.stderr)
        return EXIT_BROKEN
    print(f"{said}; {'; '.join(_intact(verdict, len(args.files)))}", file=sys.stderr)
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
