"""`secrets-bridge audit verify`: an intact trail passes; a deleted, edited, cut or moved line
is named (the line after a deleted one, the edited line itself); restarts and rotation keep the
chain; across rotated files, files given out of order or with one missing between them are
refused, a first file continuing an older one rotated away is accepted and said, new chains at a
file boundary are accepted with their continuity unchecked, in time order only (issue 33);
exit codes 0 intact, 1 broken, 2 usage; in-process and through the console script."""

from __future__ import annotations

import io
import itertools
import json
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from devkit.leaks import leaks_in_text
from devkit.testing import make_pod
from provider.cli.main import main
from provider.core.files import File, ObjectVersion
from provider.core.metrics import Metrics
from provider.edge import auditchain
from provider.edge.audit import AuditTrail, FileSink, StreamSink
from provider.mount.auditing import Served
from provider.mount.mounting import MountInput, MountResult

INSTALLATION_KEY = b"k" * 32
ROOT = Path(__file__).resolve().parents[2]
SCRIPT = shutil.which("secrets-bridge", path=str(ROOT / ".venv" / "bin")) or "secrets-bridge"


def trail_on(sink: FileSink | StreamSink, clock: Callable[[], float] = time.time) -> AuditTrail:
    trail = AuditTrail(
        sink,
        auditchain.derive_key(INSTALLATION_KEY),
        metrics=Metrics(),
        requested=lambda params: (Served("db", "fake", "secret/db"),),
        clock=clock,
    )
    trail.start()
    return trail


def write_mounts(trail: AuditTrail, pods: list[str]) -> None:
    for pod in pods:
        request = MountInput(
            params={"backend": "fake", "secretProviderClass": "c"},
            pod=make_pod(name=pod, tokens={"vault": "eyJhbGciOi.eyJzdWIiOiJ4In0.c2lnbmF0dXJl"}),
            permission=0o644,
        )
        result = MountResult(
            files=(File("db", 0o400, b"s3cr3t"),),
            versions=(ObjectVersion("db", "v" * 32),),
            backend="fake",
            served=(Served("db", "fake", "secret/db", "cache", ("v" * 32,)),),
        )
        assert trail.answered(request, result)
    assert trail.refused(None, "INVALID_ARGUMENT", "objects: expected a list")


@pytest.fixture
def key(tmp_path: Path) -> Path:
    path = tmp_path / "hmac.key"
    path.write_bytes(INSTALLATION_KEY)
    return path


@pytest.fixture
def audit_log(tmp_path: Path) -> Path:
    path = tmp_path / "audit.log"
    trail = trail_on(FileSink(str(path)))
    write_mounts(trail, ["p0", "p1", "p2", "p3"])
    trail.close()
    return path


def verify(capsys: pytest.CaptureFixture[str], key: Path, *files: Path | str) -> tuple[int, str]:
    code = main(["audit", "verify", *map(str, files), "--hmac-key-file", str(key)])
    return code, capsys.readouterr().out


def rewrite(path: Path, lines: list[str]) -> None:
    path.write_text("".join(lines))


def test_an_intact_trail_passes(
    audit_log: Path, key: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert verify(capsys, key, audit_log) == (
        0,
        f"intact: 6 lines in 1 file(s); chains start at {audit_log}:1\n",
    )
    text = audit_log.read_text()
    # Neither the value, nor the pod's token, nor the key (installation or derived).
    assert not leaks_in_text(text) and "s3cr3t" not in text
    assert auditchain.derive_key(INSTALLATION_KEY).hex() not in text
    first = json.loads(text.splitlines()[1])
    assert first["objects"] == [
        {"object": "db", "ref": "secret/db", "source": "cache", "version": "v" * 32}
    ]


def test_a_deleted_line_is_named_by_the_line_after_it(
    audit_log: Path, key: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = audit_log.read_text().splitlines(keepends=True)
    rewrite(audit_log, lines[:2] + lines[3:])
    code, out = verify(capsys, key, audit_log)
    assert code == 1
    assert out == (
        f"broken: {audit_log}:3: its MAC does not follow from the line before it: "
        "1 line was deleted before it\n"
    )


def test_an_edited_line_is_named(
    audit_log: Path, key: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = audit_log.read_text().splitlines(keepends=True)
    lines[3] = lines[3].replace('"pod":"p2"', '"pod":"p9"')
    rewrite(audit_log, lines)
    code, out = verify(capsys, key, audit_log)
    assert (code, out.split(": its MAC")[0]) == (1, f"broken: {audit_log}:4")
    assert "this line was edited" in out


@pytest.mark.parametrize(
    ("change", "line", "says"),
    [
        (lambda ls: ls[1:], 1, "no audit-start line before it"),
        (lambda ls: [*ls[:-1], ls[-1][:-1]], 6, "incomplete last line"),
        (lambda ls: [ls[0], ls[2], ls[1], *ls[3:]], 2, "1 line was deleted before it"),
        (lambda ls: [*ls[:2], "not json\n", *ls[2:]], 3, "not a sealed audit line"),
    ],
    ids=["head-cut", "tail-cut-mid-line", "reordered", "inserted"],
)
def test_other_tampering_is_named(
    audit_log: Path,
    key: Path,
    capsys: pytest.CaptureFixture[str],
    change: object,
    line: int,
    says: str,
) -> None:
    lines = audit_log.read_text().splitlines(keepends=True)
    rewrite(audit_log, change(lines))  # type: ignore[operator]
    code, out = verify(capsys, key, audit_log)
    assert code == 1 and out.startswith(f"broken: {audit_log}:{line}: ") and says in out


def test_a_restart_appending_to_the_file_continues_its_chain(
    audit_log: Path, key: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    again = trail_on(FileSink(str(audit_log)))
    write_mounts(again, ["q0"])
    again.close()
    lines = audit_log.read_text().splitlines(keepends=True)
    restart = json.loads(lines[6])
    assert (restart["type"], restart["reason"], restart["seq"]) == ("audit-start", "start", 0)
    assert restart["previous"] == json.loads(lines[5])["mac"]
    assert verify(capsys, key, audit_log)[0] == 0
    # The lines before the restart deleted: the restart's line names what it continued.
    rewrite(audit_log, lines[:5] + lines[6:])
    code, out = verify(capsys, key, audit_log)
    assert code == 1 and out.startswith(f"broken: {audit_log}:6: this segment does not continue")


def test_a_wrong_key_breaks_the_first_line(
    audit_log: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    other = tmp_path / "other.key"
    other.write_bytes(b"x" * 32)
    code, out = verify(capsys, other, audit_log)
    assert code == 1 and "a wrong --hmac-key-file" in out


def test_usage_errors_exit_2(
    audit_log: Path, key: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["audit", "verify", str(audit_log)]) == 2
    assert "--hmac-key-file is required" in capsys.readouterr().err
    assert verify(capsys, key, tmp_path / "missing.log")[0] == 2
    short = tmp_path / "short.key"
    short.write_bytes(b"short")
    assert verify(capsys, short, audit_log)[0] == 2
    with pytest.raises(SystemExit) as usage:
        main(["audit"])
    assert usage.value.code == 2


def test_stderr_lines_are_marked_and_verify_from_stdin(
    key: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    stream = io.StringIO()
    write_mounts(trail_on(StreamSink(stream)), ["p0"])
    mixed = '{"ts":"...","level":"info","msg":"mount"}\n' + stream.getvalue()
    audit_lines = [
        line for line in mixed.splitlines(keepends=True) if line.startswith('{"type":"audit')
    ]
    assert len(audit_lines) == 3
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO("".join(audit_lines).encode())))
    assert verify(capsys, key, "-")[0] == 0


# Across files: each file's first line names the last MAC of the file before it (`previous`),
# so files given out of order, or with a file missing between them, are refused (issue 33).


def rotate(path: Path, trail: AuditTrail, to: str) -> None:
    """logrotate's rename-and-create, then its postrotate SIGHUP."""
    path.rename(path.with_name(to))
    trail.reopen()


def ticking(start: float = 1_790_000_000) -> Callable[[], float]:
    ticks = itertools.count(start, 60)
    return lambda: next(ticks)


@pytest.fixture
def rotated(tmp_path: Path) -> list[Path]:
    """audit.log.2, audit.log.1, audit.log (oldest first): one provider, rotated twice."""
    path = tmp_path / "audit.log"
    trail = trail_on(FileSink(str(path)), clock=ticking())
    write_mounts(trail, ["p0"])
    rotate(path, trail, "audit.log.2")
    write_mounts(trail, ["p1"])
    rotate(path, trail, "audit.log.1")
    write_mounts(trail, ["p2"])
    trail.close()
    return [tmp_path / "audit.log.2", tmp_path / "audit.log.1", path]


def test_rotated_files_given_oldest_first_are_one_chain(
    rotated: list[Path], key: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    old, mid, new = rotated
    assert verify(capsys, key, old, mid, new) == (
        0,
        f"intact: 9 lines in 3 file(s); chains start at {old}:1\n",
    )
    # Each later file begins with a reopen naming the last MAC of the file before it.
    for before, after in ((old, mid), (mid, new)):
        start = json.loads(after.read_text().splitlines()[0])
        assert (start["type"], start["reason"]) == ("audit-start", "reopen")
        assert start["previous"] == json.loads(before.read_text().splitlines()[-1])["mac"]


@pytest.mark.parametrize(
    ("order", "at", "continues"),
    [((2, 1, 0), 2, 1), ((1, 0), 1, 0), ((0, 2, 1), 2, 1), ((1, 0, 2), 1, 0)],
    ids=["newest-first", "two-newest-first", "last-two-swapped", "first-two-swapped"],
)
def test_files_given_out_of_order_are_refused(
    rotated: list[Path],
    key: Path,
    capsys: pytest.CaptureFixture[str],
    order: tuple[int, ...],
    at: int,
    continues: int,
) -> None:
    code, out = verify(capsys, key, *(rotated[i] for i in order))
    assert (code, out) == (
        1,
        f"broken: {rotated[at]}:1: out of order: it continues {rotated[continues]}:3, which is "
        "given after it (give the files oldest first)\n",
    )


def test_a_file_missing_from_the_middle_is_refused(
    rotated: list[Path], key: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    old, mid, new = rotated
    gap = (
        f"broken: {new}:1: it does not continue {old}: lines are missing between them "
        f"(a whole file, or the end of {old})\n"
    )
    assert verify(capsys, key, old, new) == (1, gap)
    empty = old.with_name("empty.log")
    empty.touch()
    assert verify(capsys, key, old, empty, new) == (1, gap)  # an empty file is no boundary
    # The end of a rotated file cut off reads the same: the next file names the lost MAC.
    lines = mid.read_text().splitlines(keepends=True)
    rewrite(mid, lines[:-1])
    assert verify(capsys, key, old, mid, new) == (1, gap.replace(str(old), str(mid)))
    # ...except at the end of the newest file given: nothing names its last line yet.
    assert verify(capsys, key, old, mid)[0] == 0


def test_a_first_file_continuing_an_older_one_rotated_away_is_accepted_and_said(
    rotated: list[Path], key: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _, mid, new = rotated
    said = "continues an older file, not given"
    assert verify(capsys, key, mid, new) == (0, f"intact: 6 lines in 2 file(s); {mid}:1 {said}\n")
    assert verify(capsys, key, new) == (0, f"intact: 3 lines in 1 file(s); {new}:1 {said}\n")


def test_a_file_cut_at_a_provider_start_is_refused(
    audit_log: Path, key: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A provider start names the last line of the file it appended to: that file's head."""
    again = trail_on(FileSink(str(audit_log)))
    write_mounts(again, ["q0"])
    again.close()
    rewrite(audit_log, audit_log.read_text().splitlines(keepends=True)[6:])
    assert verify(capsys, key, audit_log) == (
        1,
        f"broken: {audit_log}:1: the head of its file is missing: this provider start "
        "continued lines that are not before it\n",
    )


def test_new_chains_at_a_file_boundary_are_accepted_in_time_order_only(
    tmp_path: Path, key: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two provider starts on new files (a rotation the provider missed, or two containers'
    stderr): nothing links them, so continuity is unchecked and said; their order is checked
    by time."""
    first, second = tmp_path / "first.log", tmp_path / "second.log"
    write_mounts(trail_on(FileSink(str(first)), clock=ticking(1_790_000_000)), ["p0"])
    write_mounts(trail_on(FileSink(str(second)), clock=ticking(1_790_003_600)), ["p1"])
    assert verify(capsys, key, first, second) == (
        0,
        f"intact: 6 lines in 2 file(s); chains start at {first}:1, {second}:1; continuity with "
        f"the file before unchecked at {second}:1 (a new chain: a provider start on a new "
        "file, or on stderr)\n",
    )
    assert verify(capsys, key, second, first) == (
        1,
        f"broken: {first}:1: out of order: this new chain starts at "
        f"2026-09-21T14:13:20.000+00:00, before the end of {second} at "
        "2026-09-21T15:15:20.000+00:00 (give the files oldest first, unless the node's clock "
        "was set back)\n",
    )


def test_files_concatenated_newest_first_on_stdin_are_refused(
    rotated: list[Path],
    key: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    text = "".join(path.read_text() for path in reversed(rotated))
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(text.encode())))
    assert verify(capsys, key, "-") == (
        1,
        "broken: -:1: out of order: it continues -:6, which is given after it "
        "(give the files oldest first)\n",
    )


#: Two files written by the release before issue 33 (0.1.0; pid 7, a fixed clock), under
#: INSTALLATION_KEY: the start line's format is unchanged, so such trails are checked across
#: files as well.
RELEASED = {
    "audit.log.1": [
        '{"type":"audit-start","time":"2026-09-21T14:13:20.000+00:00","seq":0,"previous":"",'
        '"pid":7,"version":"0.1.0","reason":"start",'
        '"mac":"dafdf592ae3e06b383b0f2f672151973bdd5c5f8f195d5e0433cb6ad21274f98"}',
        '{"type":"audit","time":"2026-09-21T14:14:20.000+00:00","seq":1,"event":"refused",'
        '"code":"INVALID_ARGUMENT","message":"objects: expected a list",'
        '"mac":"1bd6a7b8d98b793d20ce44b3002c85c0a23958913d87f97a4b5bb55fd790d644"}',
    ],
    "audit.log": [
        '{"type":"audit-start","time":"2026-09-21T14:15:20.000+00:00","seq":2,'
        '"previous":"1bd6a7b8d98b793d20ce44b3002c85c0a23958913d87f97a4b5bb55fd790d644",'
        '"pid":7,"version":"0.1.0","reason":"reopen",'
        '"mac":"dde1738964409eb2b12f57e5c597ec065446e980e5d7ba1657c8c5e049fc8c9a"}',
        '{"type":"audit","time":"2026-09-21T14:16:20.000+00:00","seq":3,"event":"refused",'
        '"code":"INVALID_ARGUMENT","message":"objects: expected a list",'
        '"mac":"4b3f9ebb547add3d4f7deab07b976c9961cc1f39423a92617757580204ad941d"}',
    ],
}


def test_a_trail_from_the_previous_release_is_checked_across_files(
    tmp_path: Path, key: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    old, new = (tmp_path / name for name in RELEASED)
    for path in (old, new):
        path.write_text("".join(line + "\n" for line in RELEASED[path.name]))
    assert verify(capsys, key, old, new)[0] == 0
    code, out = verify(capsys, key, new, old)
    assert code == 1 and out.startswith(f"broken: {new}:1: out of order: it continues {old}:2")
    # Today's writer still writes this start line: the same members, in the same order.
    path = tmp_path / "today.log"
    trail_on(FileSink(str(path))).close()
    start = json.loads(path.read_text())
    assert list(start) == list(json.loads(RELEASED["audit.log"][0]))


def test_through_the_console_script(rotated: list[Path], key: Path) -> None:
    old, mid, new = rotated

    def cli(*files: Path) -> tuple[int, str, str]:
        argv = [SCRIPT, "audit", "verify", *map(str, files), "--hmac-key-file", str(key)]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=30)
        return done.returncode, done.stdout, done.stderr

    assert cli(old, mid, new) == (0, f"intact: 9 lines in 3 file(s); chains start at {old}:1\n", "")
    code, out, err = cli(new, mid, old)
    assert (code, err) == (1, "")
    assert out == (
        f"broken: {new}:1: out of order: it continues {mid}:3, which is given after it "
        "(give the files oldest first)\n"
    )
    code, out, err = cli(old, new)
    assert (code, err) == (1, "")
    assert out.startswith(f"broken: {new}:1: it does not continue {old}: lines are missing")
