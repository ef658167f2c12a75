"""`secrets-bridge bench`: the load-testing tool for a provider, with an honest floor.

    flags     the command's flags (`add_bench_flags`)
    targets   the requests: the team's classes and tokens, or the dev kit's store rigs
    load      client processes sending pre-serialized requests (closed and open loop)
    floor     the bare gRPC server the provider is compared with (its own process)
    stats     CPU and RSS from /proc, store calls and process figures from /metrics
    command   one run: target, probe mount, floor phase, provider phase
    summary   percentiles (HDR histogram), errors by code, CPU per call, soak figures
    report    text, JSON and plot

Nothing here is imported by `serve`; the dev kit is imported only for `--store`.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import sys
from pathlib import Path

from provider.cli.bench.compat import Run, drive
from provider.cli.bench.flags import add_bench_flags
from provider.cli.bench.stats import rss_mib
from provider.core.errors import InvalidParameters


def run(args: argparse.Namespace) -> int:
    """The run, its report and exit status: 2 for a wrong command line, 1 when what it names
    cannot be used (a file, the socket, the first mount) or any measured mount failed."""
    if args.plot and importlib.util.find_spec("matplotlib") is None:
        # Checked before the run: finding out after minutes of load would lose the results.
        print(
            "secrets-bridge bench: --plot needs matplotlib "
            "(pip install 'secrets-bridge[plot]'); run without --plot or install it",
            file=sys.stderr,
        )
        return 1
    from provider.cli.bench import command, report
    from provider.cli.mount import Unusable

    try:
        result = asyncio.run(command.bench(args))
    except Unusable as exc:
        print(f"secrets-bridge bench: {exc}", file=sys.stderr)
        return exc.exit_code
    except InvalidParameters as exc:
        print(
            f"secrets-bridge bench: error: {exc}; see secrets-bridge bench --help", file=sys.stderr
        )
        return 2
    print(report.report(result))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    if args.plot:
        report.plot(args.plot, result)
    return 0 if not result["mount"]["errors"] else 1


async def wait_ready(socket: str, proc: object, limit: float = 30) -> float:
    from provider.cli.bench.servers import wait_ready as waiting

    return await waiting(socket, proc, limit)  # type: ignore[arg-type]


__all__ = ["Run", "add_bench_flags", "drive", "rss_mib", "run", "wait_ready"]
