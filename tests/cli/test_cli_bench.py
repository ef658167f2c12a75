"""`secrets-bridge bench --socket` against a provider started on its own (`serve`, a subprocess)
in front of a real OpenBao, with the team's class file and tokens from a file or a command —
the way a platform team runs it — and the open loop's honesty about a stalled server."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml

from devkit.openbao import OpenBao, read_policy
from devkit.ports import free_port
from devkit.tokens import SigningKey
from protos import provider_pb2
from provider.cli.bench import load
from provider.cli.bench.report import soak_lines
from provider.cli.bench.servers import floor
from provider.cli.bench.stats import Usage, parse_metrics
from provider.cli.bench.summary import soak_summary
from provider.cli.main import main

OBJECTS = [
    {"objectName": f"o{i}", "secretPath": f"secret/data/team/s{i}", "secretKey": "pw"}
    for i in range(5)
]


@dataclass
class Provider:
    socket: str
    metrics: str
    keys: SigningKey
    spc: Path
    token: Path


@pytest.fixture
def provider(tmp_path: Path) -> Iterator[Provider]:
    bao = OpenBao.start(tmp_path / "openbao")
    keys = SigningKey.generate()
    bao.configure_jwt_auth("jwt", keys.public_pem)
    bao.put_policy("team", read_policy(["secret/data/team/*"]))
    bao.add_jwt_role(
        "jwt", "team", namespace="team", service_account=["app", "sa-0", "sa-1"], policies=["team"]
    )
    for i in range(5):
        bao.kv2_put("secret", f"team/s{i}", {"pw": f"team-secret-{i}"})
    spc = tmp_path / "spc.yaml"
    spc.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "secrets-store.csi.x-k8s.io/v1",
                "kind": "SecretProviderClass",
                "metadata": {"name": "team-db", "namespace": "team"},
                "spec": {
                    "provider": "secrets-bridge",
                    "parameters": {
                        "backend": "vault",
                        "roleName": "team",
                        "vaultAuthMountPath": "jwt",
                        "objects": yaml.safe_dump(OBJECTS),
                    },
                },
            }
        )
    )
    token = tmp_path / "vault.token"
    token.write_text(keys.pod_token("team", "app", "vault"))
    key = tmp_path / "hmac.key"
    key.write_bytes(b"k" * 32)
    socket, port = str(tmp_path / "provider.sock"), free_port()
    proc = subprocess.Popen(
        [
            sys.executable, "-m", "provider.cli.main", "serve", "--socket", socket,
            "--health-addr", f"127.0.0.1:{port}", "--hmac-key-file", str(key),
            "--vault-addr", bao.addr, "--cache-ttl", "30", "--log-level", "warning",
        ],
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 20
        while not Path(socket).exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        yield Provider(socket, f"http://127.0.0.1:{port}/metrics", keys, spc, token)
    finally:
        proc.terminate()
        proc.wait(15)
        bao.stop()


def bench(provider: Provider, tmp_path: Path, *extra: str) -> tuple[int, dict[str, Any]]:
    out = tmp_path / "result.json"
    code = main(
        [
            "bench", "--socket", provider.socket, "--class", str(provider.spc),
            "--metrics-url", provider.metrics, "--warmup", "0.5", "--json", str(out),
            "--no-progress", *extra,
        ]
    )  # fmt: skip
    return code, json.loads(out.read_text()) if out.exists() else {}


def test_bench_drives_a_running_provider_with_a_class_and_a_token_file(
    provider: Provider, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, result = bench(
        provider, tmp_path, "--token", f"vault={provider.token}", "--namespace", "team",
        "--service-accounts", "app", "--mounts", "300", "--concurrency", "8",
    )  # fmt: skip
    assert code == 0, capsys.readouterr()
    mount, echo = result["mount"], result["echo"]
    assert mount["ok"] == 300 and mount["errors"] == 0
    # CPU from the OS for the floor the bench started, from /metrics for the remote provider
    # (300 mounts are a few clock ticks: present, not precise).
    assert echo["ok"] == 300 and echo["cpu_us_per_call"] >= 0
    assert mount["cpu_us_per_call"] >= 0 and mount["rss_mib"] > 10
    assert mount["p50_ms"] <= mount["p99_ms"] <= mount["max_ms"]
    # Cached (--cache-ttl 30, warmed up): no store calls in the measured phase.
    assert result["store_calls_per_s"] == {}
    text = capsys.readouterr().out
    assert "mount vs echo: p50" in text and "CPU µs/call" in text


def test_tokens_from_a_command_one_per_service_account(
    provider: Provider, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tokens = tmp_path / "tokens"
    tokens.mkdir()
    for account in ("sa-0", "sa-1"):
        (tokens / f"team-{account}-vault").write_text(
            provider.keys.pod_token("team", account, "vault")
        )
    log = tmp_path / "calls.log"
    command = (
        f'echo "$POD_NAMESPACE $SERVICE_ACCOUNT $AUDIENCE" >> {log}; '
        f'cat {tokens}/"$POD_NAMESPACE-$SERVICE_ACCOUNT-$AUDIENCE"'
    )
    code, result = bench(
        provider, tmp_path, "--token-command", command, "--audience", "vault",
        "--service-accounts", "2", "--pods", "10", "--rate", "100", "--duration", "1",
        "--no-echo",
    )  # fmt: skip
    assert code == 0, capsys.readouterr()
    assert result["mount"]["errors"] == 0 and result["mount"]["ok"] >= 95
    assert sorted(log.read_text().splitlines()) == ["team sa-0 vault", "team sa-1 vault"]


def test_a_wrong_token_stops_the_run_with_the_providers_message(
    provider: Provider, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    wrong = tmp_path / "wrong.token"
    wrong.write_text(SigningKey.generate().pod_token("team", "app", "vault"))
    code, _ = bench(provider, tmp_path, "--token", f"vault={wrong}", "--service-accounts", "app")
    err = capsys.readouterr().err
    assert code == 1  # the command line is right: the store refused the token
    assert "the first mount failed: PERMISSION_DENIED" in err or "UNAUTHENTICATED" in err, err


async def test_open_loop_counts_queueing_from_the_scheduled_send_time() -> None:
    """A server that stalls 300 ms once, then answers one call at a time: every call scheduled
    during the stall waits for it, and the open loop must record that (a closed loop with one
    call in flight would record one slow call and a short pause)."""
    lock = asyncio.Lock()
    stalled = False

    async def call(req: bytes) -> None:
        nonlocal stalled
        async with lock:
            if not stalled:
                stalled = True
                await asyncio.sleep(0.3)

    counter = [0, 0]
    shape = load.Shape("open", rate=200, duration=1.0)
    start = time.monotonic() + 0.05
    rec = load._Recorder(start, measured=True)
    await load._open(call, [b"r"], rec, 0, start, start + 1.0, 200, 0, 1, counter, 1)
    slow = [lat for lat in rec.out.latencies if lat > 0.1]
    assert counter[1] == 200 and len(rec.out.latencies) == 200
    # ~60 calls were scheduled during the stall; their latencies count the wait.
    assert len(slow) >= 30, sorted(rec.out.latencies)[-5:]
    assert shape.mode == "open"


def test_client_errors_are_counted_by_code_with_one_sample() -> None:
    rec = load._Recorder(0.0, measured=True)

    class Failed(grpc.aio.AioRpcError):
        def __init__(self, message: str) -> None:
            super().__init__(
                grpc.StatusCode.UNAVAILABLE, grpc.aio.Metadata(), grpc.aio.Metadata(), message
            )

    rec.error(0.1, Failed("vault: connection refused"))
    rec.error(0.2, Failed("vault: again"))
    assert rec.out.errors == {"UNAVAILABLE": 2}
    assert rec.out.samples == {"UNAVAILABLE": "vault: connection refused"}


async def test_a_call_sent_before_an_outage_that_fails_in_it_counts_as_the_outages() -> None:
    """Errors are timed when they come back: a mount sent just before the store went down, and
    failed by it, is an outage's failure, not one "outside"."""

    class Failed(grpc.aio.AioRpcError):
        def __init__(self) -> None:
            meta = grpc.aio.Metadata()
            super().__init__(grpc.StatusCode.UNAVAILABLE, meta, meta, "store down")

    async def call(req: bytes) -> None:
        await asyncio.sleep(0.2)  # in flight when "the store" dies at 0.1 s
        raise Failed()

    start = time.monotonic()
    rec = load._Recorder(start, measured=True)
    await load._open(call, [b"r"], rec, 1, start, start + 0.05, 20, 0, 1, [0, 0], 1)
    mount = {"error_times": rec.out.error_times}
    summary = soak_summary([], [(0.1, 0.15)], mount, timeout=1.0)
    assert (summary["errors_during_outages"], summary["errors_outside_outages"]) == (1, 0)


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
async def test_the_floor_serves_on_either_loop(tmp_path: Path, loop: str) -> None:
    """`--floor-loop`: the floor answers the captured response on the loop asked for."""
    answer = provider_pb2.MountResponse(
        files=[provider_pb2.File(path="a", mode=0o644, contents=b"captured")]
    ).SerializeToString()
    async with floor(tmp_path, answer, loop) as (socket, pid):
        # uvloop's extension is mapped into the floor's process only when it runs on it.
        assert ("uvloop" in Path(f"/proc/{pid}/maps").read_text()) == (loop == "uvloop")
        async with grpc.aio.insecure_channel(f"unix://{socket}") as channel:
            mount = channel.unary_unary(load.MOUNT)
            reply = await mount(provider_pb2.MountRequest().SerializeToString(), timeout=5)
    assert provider_pb2.MountResponse.FromString(reply).files[0].contents == b"captured"


def test_the_soak_baseline_is_not_taken_in_an_outage() -> None:
    """Growth after the first minute is measured from the first sample after it, unless an
    outage has begun by then: a sample in it reads a dip in open files and the mounts in flight."""

    def usage(rss: float, fds: int) -> Usage:
        return Usage(cpu_seconds=0.0, rss_mib=rss, open_fds=fds, threads=8)

    samples = [(50.0, usage(60, 27)), (60.5, usage(63, 22)), (70.0, usage(61, 27))]
    mount: dict[str, Any] = {"error_times": []}
    in_outage = soak_summary(samples, [(60.0, 65.0)], mount, timeout=1.0)
    assert in_outage["fds_growth_after_1min"] == 0.0  # from 27 at 50 s, not 22 in the outage
    assert in_outage["rss_growth_after_1min"] == pytest.approx(63 / 60 - 1)
    later = soak_summary(samples, [(100.0, 105.0)], mount, timeout=1.0)
    assert later["fds_growth_after_1min"] == pytest.approx(27 / 22 - 1)  # the 60.5 s sample


def test_the_soak_tells_drift_between_outages_from_the_mounts_an_outage_holds() -> None:
    """The highest sample after the first minute may be taken while an outage holds mounts;
    the growth between outages (outside each and one mount deadline after it) is what stays."""
    samples = [
        (60.0, Usage(0.0, 70.0, 27, 8)),  # the baseline
        (121.0, Usage(0.0, 74.0, 27, 8)),  # in the outage: mounts held
        (140.0, Usage(0.0, 73.0, 27, 8)),  # still within a mount deadline after it
        (160.0, Usage(0.0, 72.1, 27, 8)),
        (200.0, Usage(0.0, 71.4, 27, 8)),
    ]
    summary = soak_summary(samples, [(120.0, 126.0)], {"error_times": []}, timeout=30.0)
    assert summary["rss_growth_after_1min"] == pytest.approx(74 / 70 - 1)
    assert summary["rss_growth_between_outages"] == pytest.approx(72.1 / 70 - 1)
    lines = report_lines(summary)
    assert "RSS +5.7% at the highest, +3.0% between outages, open files +0.0%" in lines
    # Without outages there is no "between": the one figure is the growth.
    calm = soak_summary(samples, [], {"error_times": []}, timeout=30.0)
    assert "rss_growth_between_outages" not in calm
    assert "growth after the first minute: RSS +5.7%, open files +0.0%" in report_lines(calm)


def report_lines(soak: dict[str, Any]) -> str:
    return "\n".join(soak_lines(soak, {}))


def test_the_soak_reports_the_most_mounts_in_flight_during_and_outside_outages() -> None:
    """The provider's gauge at each sample, split by outage: what an outage's RSS step is."""
    samples = [
        (10.0, Usage(0.0, 60.0, 27, 8, in_flight=2)),
        (61.0, Usage(0.0, 63.0, 22, 8, in_flight=75)),
        (70.0, Usage(0.0, 62.0, 27, 8, in_flight=40)),  # within a mount deadline after it
        (90.0, Usage(0.0, 62.0, 27, 8, in_flight=1)),
    ]
    summary = soak_summary(samples, [(60.0, 66.0)], {"error_times": []}, timeout=10.0)
    assert (summary["in_flight_max_during_outages"], summary["in_flight_max_outside"]) == (75, 2)
    assert [s["in_flight"] for s in summary["samples"]] == [2, 75, 40, 1]
    # Without the gauge (a provider of an older version) nothing is claimed.
    blind = soak_summary([(t, Usage(0.0, u.rss_mib)) for t, u in samples], [], {}, 10.0)
    assert "in_flight_max_outside" not in blind
    assert all("in_flight" not in s for s in blind["samples"])


def test_the_gauge_is_read_from_metrics() -> None:
    text = (
        "# TYPE secrets_bridge_mounts_in_flight gauge\n"
        "secrets_bridge_mounts_in_flight 7.0\n"
        "# TYPE process_cpu_seconds_total counter\n"
        "process_cpu_seconds_total 1.5\n"
    )
    scraped = parse_metrics(text)
    assert scraped.in_flight == 7 and scraped.usage is not None
    assert scraped.usage.in_flight == 7
    assert parse_metrics("process_cpu_seconds_total 1.5\n").in_flight == -1
