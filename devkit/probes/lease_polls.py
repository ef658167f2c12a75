"""One pod polled the way the driver republishes it, with dynamic objects from a real OpenBao
(its database engine on a real PostgreSQL, its PKI engine): what the store did and how often
the pod's files changed (BENCHMARKS.md, issue 31).

    python -m devkit.probes.lease_polls --polls 60 --interval 1 --scale 60 --json

Time is scaled: with `--scale 60`, one second stands for one minute, so 60 polls a second apart
are an hour of the driver's 1-minute republish, and every TTL given in (unscaled) minutes is
divided by 60. The class has three dynamic objects: two database roles' credentials
(`database/creds/a`, `database/creds/b`) and one certificate (`pki/issue/web`).

It imports `provider` from wherever Python finds it first, so the same script measures another
checkout (copied into it, run there with `PYTHONPATH=<worktree>`): today's code against the
code before credentials with a lifetime, in one run of `devkit/probes/bench_leases.sh`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from backends.vault.options import Options
from devkit.openbao import OpenBao
from devkit.postgres import PostgreSQL
from devkit.testing import make_pod
from devkit.tokens import SigningKey
from provider.core.metrics import Metrics
from provider.core.settings import CoreSettings, ServeSettings
from provider.edge.app import build_mounter
from provider.mount.mounting import MountInput

OBJECTS = """
- {objectName: db-a, secretPath: database/creds/a}
- {objectName: db-b, secretPath: database/creds/b}
- objectName: tls
  secretPath: pki/issue/web
  method: POST
  secretArgs: {common_name: app.example.test}
"""
POLICY = """
path "database/creds/*" { capabilities = ["read"] }
path "pki/issue/*" { capabilities = ["update"] }
path "sys/leases/revoke" { capabilities = ["update"] }
"""


def _cpu_seconds(pid: int) -> float:
    """User + system CPU of one process, from /proc (what the OS charged it)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _tree_cpu(pid: int) -> float:
    """CPU of a process and its live children (PostgreSQL's backends)."""
    total = _cpu_seconds(pid)
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    return total + sum(_tree_cpu(int(child)) for child in children)


def _seconds(minutes: float, scale: float) -> str:
    return f"{max(1, round(minutes * 60 / scale))}s"


def _configure(bao: OpenBao, db: PostgreSQL, key: SigningKey, args: argparse.Namespace) -> None:
    scale = args.scale
    bao.configure_database("database", db)
    for role in ("a", "b"):
        bao.add_database_role(
            "database",
            role,
            default_ttl=_seconds(args.lease_ttl, scale),
            max_ttl=_seconds(args.lease_max_ttl, scale),
        )
    bao.configure_pki("pki")
    cert_ttl = _seconds(args.cert_ttl, scale)
    bao.add_pki_role("pki", "web", ttl=cert_ttl, max_ttl=cert_ttl)
    bao.put_policy("dyn", POLICY)
    bao.configure_jwt_auth("jwt", key.public_pem)
    bao.root().write(
        "auth/jwt/role/dyn",
        role_type="jwt",
        bound_audiences=["vault"],
        user_claim="sub",
        bound_subject="system:serviceaccount:default:app",
        token_policies=["dyn"],
        token_ttl=_seconds(args.token_ttl, scale),
        token_max_ttl=_seconds(args.token_max_ttl, scale),
    )


async def _poll(bao: OpenBao, key: SigningKey, args: argparse.Namespace, work: Path) -> Any:
    hmac_key = work / "hmac"
    hmac_key.write_bytes(b"k" * 32)
    settings = ServeSettings(
        hmac_key_file=str(hmac_key),
        core=CoreSettings(),
        backend_options={"vault": Options(addr=bao.addr)},
    )
    mounter, backends = build_mounter(settings, Metrics(), warn_random_key=False)
    pod = make_pod(tokens={"vault": key.pod_token("default", "app", lifetime=24 * 3600)})
    params = {"backend": "vault", "roleName": "dyn", "vaultAuthMountPath": "jwt"}
    request = MountInput({**params, "objects": OBJECTS}, pod, permission=0o644)
    changes: Counter[str] = Counter()
    last: dict[str, bytes] = {}
    start = time.monotonic()
    try:
        for i in range(args.polls):
            await asyncio.sleep(max(0.0, start + i * args.interval - time.monotonic()))
            result = await mounter.mount(request)
            for f in result.files:
                if last.get(f.path) != f.contents:
                    changes[f.path] += 1
                last[f.path] = f.contents
    finally:
        await backends.close()
    return changes, time.monotonic() - start


def run(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="lease-polls-") as tmp:
        work = Path(tmp)
        db = PostgreSQL.start(work / "pg")
        bao = OpenBao.start(work / "bao")
        try:
            key = SigningKey.generate()
            _configure(bao, db, key, args)
            roles_before = db.roles()
            bao.audit_mark()
            cpu_before = (_cpu_seconds(bao.process.pid), _tree_cpu(db.process.pid))
            changes, seconds = asyncio.run(_poll(bao, key, args, work))
            cpu_after = (_cpu_seconds(bao.process.pid), _tree_cpu(db.process.pid))
            calls = bao.audit_counts()
            live = len(db.roles() - roles_before)
        finally:
            bao.stop()
            db.stop()
    return {
        "polls": args.polls,
        "interval_s": args.interval,
        "scale": args.scale,
        "minutes": {
            "lease_ttl": args.lease_ttl,
            "lease_max_ttl": args.lease_max_ttl,
            "cert_ttl": args.cert_ttl,
            "token_ttl": args.token_ttl,
            "token_max_ttl": args.token_max_ttl,
        },
        "seconds": round(seconds, 1),
        "store_calls": {f"{op} {path}": n for (op, path), n in sorted(calls.items())},
        "store_calls_total": sum(calls.values()),
        # Every read of a creds path creates a lease and a database user; those revoked with
        # their login token before the end are gone from PostgreSQL by then.
        "leases_created": sum(n for (_op, path), n in calls.items() if "/creds/" in path),
        "database_users_live_at_end": live,
        "certificates_issued": calls.get(("update", "pki/issue/web"), 0),
        "file_changes_after_the_first": {p: n - 1 for p, n in sorted(changes.items())},
        "openbao_cpu_s": round(cpu_after[0] - cpu_before[0], 2),
        "postgres_cpu_s": round(cpu_after[1] - cpu_before[1], 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--polls", type=int, default=60)
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between polls")
    parser.add_argument("--scale", type=float, default=60.0, help="real seconds per second")
    parser.add_argument("--lease-ttl", type=float, default=60.0, help="minutes")
    parser.add_argument("--lease-max-ttl", type=float, default=24 * 60.0, help="minutes")
    parser.add_argument("--cert-ttl", type=float, default=24 * 60.0, help="minutes")
    parser.add_argument("--token-ttl", type=float, default=60.0, help="minutes")
    parser.add_argument("--token-max-ttl", type=float, default=24 * 60.0, help="minutes")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    report = run(args)
    print(json.dumps(report, indent=None if args.json else 2))


if __name__ == "__main__":
    main()
