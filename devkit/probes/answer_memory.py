"""Issue 40, items 1-3: the served provider's peak RSS and a victim's cached-mount latency while
one namespace mounts large answers from its own OpenBao (devkit/bigvalues.py), and the RSS at
rest after 20 cached large values. `--pythonpath` runs another checkout's provider (before/after
figures in one run).

    .venv/bin/python -m devkit.probes.answer_memory [--pythonpath /tmp/before] [--seconds 8]
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
from pathlib import Path

from devkit import bigvalues
from devkit.openbao import OpenBao
from devkit.served_process import provider_process
from devkit.tokens import SigningKey


async def run(args: argparse.Namespace) -> None:
    work = Path(tempfile.mkdtemp(prefix="answer-memory-"))
    key = SigningKey.generate()
    bao = OpenBao.start(work / "openbao")
    try:
        bao.configure_jwt_auth("jwt", key.public_pem)
        bao.enable_kv("kv1", 1)
        bigvalues.prepare(bao, key)
        shapes = {
            "100 objects of 3.9 MB": bigvalues.many_objects(bao.addr),
            "a selection of 20 x 3.9 MB": bigvalues.selecting(bao.addr),
            "one secret of 220,000 values": bigvalues.many_values(bao.addr),
        }
        for i, (name, params) in enumerate(shapes.items()):
            flags = ["--cache-ttl=60"]
            with provider_process(work / f"p{i}", *flags, pythonpath=args.pythonpath) as served:
                got = await bigvalues.attack(
                    served.socket, key, params, bigvalues.victim(bao.addr), work / f"p{i}",
                    seconds=args.seconds,
                )  # fmt: skip
                lat = sorted(got.latencies)
                print(
                    f"{name}: peak RSS {served.status_mib('VmHWM'):.0f} MiB; attacker "
                    f"{got.attacker}; victim {got.victim_ok} ok, {len(got.victim_failed)} failed, "
                    f"p50 {lat[len(lat) // 2] * 1000:.1f} ms p99 {got.p99() * 1000:.1f} ms "
                    f"max {lat[-1] * 1000:.0f} ms"
                )
        with provider_process(work / "rest", "--cache-ttl=60", pythonpath=args.pythonpath) as s:
            await bigvalues.one_at_a_time(s.socket, key, bigvalues.big_once(bao.addr))
            await asyncio.sleep(1)
            print(
                f"20 cached values of 3.9 MB: RSS at rest {s.status_mib('VmRSS'):.0f} MiB, "
                f"peak {s.status_mib('VmHWM'):.0f} MiB"
            )
    finally:
        bao.stop()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pythonpath", default="")
    parser.add_argument("--seconds", type=float, default=8.0)
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
