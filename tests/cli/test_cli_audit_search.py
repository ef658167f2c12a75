"""`secrets-bridge audit search` (issue 40, item 8): which pods received a secret, and when, over
rotated files given oldest first, by secret (listed or selected, whole segments only), pod,
namespace and time; the chain checked as it reads (exit 1 naming the line where it breaks);
a trail from before selectors were named is searched too; usage errors are one line, exit 2."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from devkit.testing import make_pod
from provider.cli.main import main
from provider.core.files import File, ObjectVersion
from provider.core.metrics import Metrics
from provider.edge import audit, auditchain
from provider.edge.audit import AuditTrail, FileSink
from provider.mount.auditing import Served
from provider.mount.mounting import MountInput, MountResult
from tests.cli.test_cli_audit import INSTALLATION_KEY, SCRIPT

START = 1_790_000_000.0  # 2026-09-21T14:13:20Z


def clock_at(times: list[float]) -> Callable[[], float]:
    return lambda: times[0]


def answer(trail: AuditTrail, pod: str, served: tuple[Served, ...], ns: str = "team-b") -> None:
    request = MountInput(
        params={"backend": "vault", "secretProviderClass": "sel"},
        pod=make_pod(namespace=ns, name=pod, uid=f"uid-{pod}"),
        permission=0o644,
    )
    result = MountResult(
        files=(File("x", 0o400, b"never-in-the-trail"),),
        versions=(ObjectVersion("x", "1"),),
        backend="vault",
        served=served,
    )
    assert trail.answered(request, result)


def selection(*names: str, version: str = "1") -> Served:
    refs = tuple(f"KV secret/team-b/sel/{n}" for n in names)
    return Served("sel", "bao", "KV secret/team-b/sel/*", "store", (version,) * len(names), refs)


LISTED = Served("db", "bao", "GET secret/data/team-b/db", "cache", ("v1",))


@pytest.fixture
def key(tmp_path: Path) -> Path:
    path = tmp_path / "hmac.key"
    path.write_bytes(INSTALLATION_KEY)
    return path


@pytest.fixture
def rotated(tmp_path: Path) -> list[Path]:
    """Two files (logrotate renamed the first): web-0 at START, web-1 an hour later, both
    selecting; job-0 listing db; a refusal of other/x-0; a 1,000-secret selection."""
    now = [START]
    path = tmp_path / "audit.log"
    trail = AuditTrail(
        FileSink(str(path)),
        auditchain.derive_key(INSTALLATION_KEY),
        metrics=Metrics(),
        requested=lambda params: (LISTED,),
        clock=clock_at(now),
    )
    trail.start()
    answer(trail, "web-0", (selection("api", "api-old", "db"),))
    answer(trail, "job-0", (LISTED,))
    path.rename(tmp_path / "audit.log.1")
    trail.reopen()
    now[0] = START + 3600
    answer(trail, "web-1", (selection("api", version="2"),))
    pod = make_pod(namespace="other", name="x-0", uid="uid-x-0")
    assert trail.refused(MountInput({"backend": "vault"}, pod, 0o644), "NOT_FOUND", "gone")
    answer(trail, "big-0", (selection(*(f"k{i}" for i in range(1000))),))
    trail.close()
    return [tmp_path / "audit.log.1", path]


def search(
    capsys: pytest.CaptureFixture[str], key: Path, files: list[Path], *args: str
) -> tuple[int, list[str], str]:
    capsys.readouterr()
    code = main(["audit", "search", *map(str, files), *args, "--hmac-key-file", str(key)])
    out, err = capsys.readouterr()
    return code, out.splitlines(), err


def pods(lines: list[str]) -> list[str]:
    return [line.split()[2] for line in lines]


def test_a_selected_secret_is_found_across_rotated_files_by_whole_segments(
    capsys: pytest.CaptureFixture[str], key: Path, rotated: list[Path]
) -> None:
    code, out, err = search(capsys, key, rotated, "--secret", "team-b/sel/api")
    assert code == 0, err
    assert pods(out) == ["team-b/web-0", "team-b/web-1"]  # not api-old's delivery alone
    assert "KV secret/team-b/sel/api version 1 (store) into 'sel'" in out[0]
    assert out[1].startswith("2026-09-21T15:13:20.000+00:00 answered") and "version 2" in out[1]
    assert f"[{rotated[1]}:2]" in out[1]
    total = sum(len(path.read_text().splitlines()) for path in rotated)
    assert err == f"2 matches in {total} lines; intact: {total} lines in 2 file(s); chains " + (
        f"start at {rotated[0]}:1\n"
    )
    code, out, _ = search(capsys, key, rotated, "--secret", "secret/data/team-b/db")
    assert code == 0 and pods(out) == ["team-b/job-0"] and "version v1 (cache)" in out[0]
    code, out, _ = search(capsys, key, rotated, "--secret", "k999")
    assert code == 0 and pods(out) == ["team-b/big-0"]


def test_search_by_pod_namespace_and_time(
    capsys: pytest.CaptureFixture[str], key: Path, rotated: list[Path]
) -> None:
    code, out, _ = search(capsys, key, rotated, "--namespace", "team-b")
    assert code == 0 and pods(out) == [
        "team-b/web-0",
        "team-b/job-0",
        "team-b/web-1",
        "team-b/big-0",
    ]
    assert "1 objects, 1000 selected secrets, in " in out[-1]
    code, out, _ = search(capsys, key, rotated, "--pod", "other/x-0")
    assert code == 0 and len(out) == 1 and " refused other/x-0 " in out[0] and "NOT_FOUND" in out[0]
    code, out, _ = search(
        capsys, key, rotated, "--secret", "sel/api", "--since", "2026-09-21T15:00:00Z"
    )
    assert pods(out) == ["team-b/web-1"]
    code, out, _ = search(capsys, key, rotated, "--until", "2026-09-21T14:30:00+00:00")
    assert pods(out) == ["team-b/web-0", "team-b/job-0"]
    code, out, _ = search(capsys, key, rotated, "--secret", "sel/db", "--json")
    [found] = [json.loads(line) for line in out]
    assert found["pod"] == "web-0" and found["secret"] == "KV secret/team-b/sel/db"
    assert found["version"] == "1" and found["where"] == f"{rotated[0]}:2"


def test_every_line_of_a_long_record_is_within_the_bound(rotated: list[Path]) -> None:
    lines = [line for path in rotated for line in path.read_text().splitlines()]
    assert max(len(line) + 1 for line in lines) <= audit.LINE_BYTES
    assert "never-in-the-trail" not in "".join(lines)


def test_a_tampered_line_is_named_and_the_matches_still_shown(
    capsys: pytest.CaptureFixture[str], key: Path, rotated: list[Path]
) -> None:
    lines = rotated[0].read_text().splitlines(keepends=True)
    # Hide who received db: web-0's record is said to be another pod's.
    lines[1] = lines[1].replace('"pod":"web-0"', '"pod":"web-7"')
    rotated[0].write_text("".join(lines))
    total = sum(len(path.read_text().splitlines()) for path in rotated)
    code, out, err = search(capsys, key, rotated, "--secret", "sel/db")
    assert code == 1 and pods(out) == ["team-b/web-7"]
    assert err == (
        f"1 match in {total} lines; broken: {rotated[0]}:2: its MAC does not follow from the line "
        "before it: this line was edited, or a line before it was deleted or replaced\n"
    )
    # Deleting a line is named too, by the line after it.
    del lines[1]
    rotated[0].write_text("".join(lines))
    code, _, err = search(capsys, key, rotated, "--namespace", "team-b")
    assert code == 1 and f"broken: {rotated[0]}:2: " in err


def test_verify_still_checks_files_with_long_records(
    capsys: pytest.CaptureFixture[str], key: Path, rotated: list[Path]
) -> None:
    assert main(["audit", "verify", *map(str, rotated), "--hmac-key-file", str(key)]) == 0
    lines = rotated[1].read_text().splitlines(keepends=True)
    part = next(i for i, line in enumerate(lines) if '"event":"continued"' in line)
    del lines[part]  # a part of the 1,000-secret record goes missing
    rotated[1].write_text("".join(lines))
    capsys.readouterr()
    assert main(["audit", "verify", *map(str, rotated), "--hmac-key-file", str(key)]) == 1
    assert f"broken: {rotated[1]}:{part + 1}: its MAC does not follow" in capsys.readouterr().out


def test_a_trail_of_the_previous_format_is_searched(
    capsys: pytest.CaptureFixture[str], key: Path, tmp_path: Path
) -> None:
    """Lines as the release before wrote them (no `secrets`, no parts): listed objects are
    found as before."""
    trail = tmp_path / "old.log"
    derived = auditchain.derive_key(INSTALLATION_KEY)
    start, mac = auditchain.seal(
        derived,
        "",
        {"type": "audit-start", "time": "2026-01-01T00:00:00.000+00:00", "seq": 0,
         "previous": "", "pid": 1, "version": "0.1.0", "reason": "start"},
    )  # fmt: skip
    record, _ = auditchain.seal(
        derived,
        mac,
        {"type": "audit", "time": "2026-01-01T00:00:01.000+00:00", "seq": 1, "event": "answered",
         "namespace": "a", "pod": "p", "pod_uid": "u", "serviceaccount": "s", "class": "c",
         "backend": "vault", "store": "bao", "objects": [{"object": "db", "ref": "GET kv/db",
         "source": "store", "version": "3"}], "code": "OK"},
    )  # fmt: skip
    trail.write_text(f"{start}\n{record}\n")
    code, out, _ = search(capsys, key, [trail], "--secret", "kv/db")
    assert code == 0 and pods(out) == ["a/p"] and "version 3" in out[0]


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["missing.log"], "secrets-bridge audit search: missing.log: No such file or directory"),
        (["KEEP", "--pod", "web-0"], "secrets-bridge audit search: --pod 'web-0': expected "
         "NAMESPACE/NAME (e.g. team-b/web-0)"),
        (["KEEP", "--since", "yesterday"], "secrets-bridge audit search: --since 'yesterday': "
         "expected a time (2026-12-03T10:00:00Z) or an age (90s, 30m, 2h, 7d)"),
        (["KEEP", "-", "-"], "secrets-bridge audit search: standard input (-) can be read once"),
    ],
)  # fmt: skip
def test_bad_input_is_one_line_and_exit_2(
    capsys: pytest.CaptureFixture[str],
    key: Path,
    rotated: list[Path],
    args: list[str],
    said: str,
) -> None:
    argv = [str(rotated[1]) if a == "KEEP" else a for a in args]
    capsys.readouterr()
    assert main(["audit", "search", *argv, "--hmac-key-file", str(key)]) == 2
    out, err = capsys.readouterr()
    assert err == said + "\n" and not out


def test_a_missing_key_and_a_bad_flag_exit_2(
    capsys: pytest.CaptureFixture[str], rotated: list[Path]
) -> None:
    assert main(["audit", "search", str(rotated[1])]) == 2
    assert capsys.readouterr().err == "secrets-bridge audit search: --hmac-key-file is required\n"
    with pytest.raises(SystemExit) as exited:
        main(["audit", "search", str(rotated[1]), "--secrett", "x"])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "--secrett" in err and "Traceback" not in err


def test_through_the_console_script(key: Path, rotated: list[Path]) -> None:
    argv = [SCRIPT, "audit", "search", *map(str, rotated), "--hmac-key-file", str(key)]
    done = subprocess.run([*argv, "--secret", "sel/api"], capture_output=True, text=True)
    assert done.returncode == 0 and pods(done.stdout.splitlines()) == [
        "team-b/web-0",
        "team-b/web-1",
    ]
    bad = subprocess.run([*argv, "--bogus"], capture_output=True, text=True)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
