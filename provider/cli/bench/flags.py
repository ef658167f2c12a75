"""`secrets-bridge bench` flags, grouped as the help shows them."""

from __future__ import annotations

import argparse
import sys

STORES = ("fake", "openbao", "moto")


def stores(text: str) -> str:
    """`--store`: rig names, comma-separated."""
    unknown = [name for name in text.split(",") if name not in STORES]
    if unknown:
        raise argparse.ArgumentTypeError(
            f"expected {', '.join(STORES)} or several comma-separated, got {text!r}"
        )
    return text


def add_bench_flags(p: argparse.ArgumentParser) -> None:
    p.description = (
        "Load-test Mount. Either against a running provider (--socket, with --class and the "
        "pods' tokens) or against a provider it starts on a dev-kit store rig (--store). The "
        "same pre-serialized requests go to a bare gRPC server (the floor) for comparison."
    )
    t = p.add_argument_group("target")
    t.add_argument("--socket", help="drive the provider already serving on this socket")
    t.add_argument(
        "--metrics-url",
        help="the provider's /metrics (store calls, CPU and RSS of a provider the bench did "
        "not start), e.g. http://127.0.0.1:8098/metrics",
    )
    t.add_argument(
        "--class",
        dest="classes",
        action="append",
        default=[],
        metavar="SPC.yaml[:WEIGHT]",
        help="a SecretProviderClass file (repeatable; pods are spread over classes by weight)",
    )
    t.add_argument(
        "--token",
        action="append",
        default=[],
        metavar="AUDIENCE=FILE",
        help="a service-account token for an audience, sent for every pod (repeatable)",
    )
    t.add_argument(
        "--token-command",
        metavar="CMD",
        help="shell command printing a token on stdout; run once per namespace, service account "
        "and --audience, with POD_NAMESPACE, POD_NAME, SERVICE_ACCOUNT, AUDIENCE set",
    )
    t.add_argument(
        "--audience", action="append", default=[], help="audiences --token-command mints"
    )
    t.add_argument("--namespace", help="the pods' namespace (default: each class's own)")
    t.add_argument(
        "--service-accounts",
        default=None,
        help="the pods' service accounts: a count (sa-0, sa-1, …) or comma-separated names "
        "(default: default with --socket, 1 with --store)",
    )
    t.add_argument("--identities", type=int, help=argparse.SUPPRESS)  # older name, a count
    t.add_argument("--pods", type=int, default=100, help="distinct pods (volumes)")

    r = p.add_argument_group("self-contained runs (a source checkout's dev kit)")
    r.add_argument(
        "--store",
        type=stores,
        help=f"start a provider on these rigs: {', '.join(STORES)}, or several comma-separated "
        "(classes alternate); the default when no --socket is given is fake",
    )
    r.add_argument("--objects", type=int, default=5, help="objects per rig class")
    r.add_argument("--cache-ttl", type=float, default=0.0, help="the provider's --cache-ttl")
    r.add_argument("--provider-arg", action="append", default=[], help="extra serve flag")
    r.add_argument(
        "--store-error-rate",
        type=float,
        default=0.0,
        help="openbao: share of requests a proxy in front answers with 429",
    )
    r.add_argument(
        "--store-restart-every",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="openbao: kill the store and start it again this often during the run",
    )
    r.add_argument(
        "--store-down", type=float, default=5.0, help="seconds the killed store stays down"
    )

    s = p.add_argument_group("load shape")
    s.add_argument(
        "--scenario",
        choices=["mount", "rotation"],
        default="mount",
        help="rotation: --volumes republished every --interval seconds, as the driver's "
        "rotation poll does (an open loop at volumes/interval per second)",
    )
    s.add_argument("--concurrency", type=int, default=16, help="closed loop: calls in flight")
    s.add_argument(
        "--rate", type=float, default=0.0, help="open loop: mounts per second on a fixed schedule"
    )
    s.add_argument("--mounts", type=int, default=0, help="measured mounts per target")
    s.add_argument("--duration", type=float, default=0.0, help="measured seconds per target")
    s.add_argument("--warmup", type=float, default=2.0, help="seconds of unrecorded load first")
    s.add_argument("--volumes", type=int, default=0, help="rotation: volumes (default --pods)")
    s.add_argument("--interval", type=float, default=120.0, help="rotation: poll interval (s)")
    s.add_argument("--clients", type=int, default=1, help="client processes")
    s.add_argument("--timeout", type=float, default=120.0, help="per-mount deadline (s)")
    s.add_argument(
        "--cold",
        action="store_true",
        help="no warm-up and no probe mount: store calls count from the first mount",
    )
    s.add_argument("--no-echo", action="store_true", help="skip the floor")
    s.add_argument(
        "--floor-loop",
        choices=["asyncio", "uvloop"],
        default="asyncio",
        help="the floor's event loop: asyncio (a stock gRPC server; the default) or uvloop "
        "(the provider's own default loop), to tell the loop's share of a ratio from ours",
    )
    s.add_argument(
        "--sample-every",
        type=float,
        default=5.0,
        help="seconds between samples of the provider's RSS, open files and threads",
    )

    o = p.add_argument_group("output")
    o.add_argument("--json", metavar="FILE", help="write the results as JSON")
    o.add_argument(
        "--plot", metavar="FILE.png", help="latency over time and distribution (matplotlib)"
    )
    o.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=sys.stderr.isatty(),
        help="a live progress line on stderr (default: when stderr is a terminal)",
    )
