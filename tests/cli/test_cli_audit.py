"""`secrets-bridge audit verify`: an intact trail passes; a deleted, edited, cut or moved line
is named (the line after a deleted one, the edited line itself); restarts and rotation keep the
chain; exit codes 0 intact, 1 broken, 2 usage."""

from __future__ import annotations

import io
import json
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


def trail_on(sink: FileSink | StreamSink) -> AuditTrail:
    trail = AuditTrail(
        sink,
        auditchain.derive_key(INSTALLATION_KEY),
        metrics=Metrics(),
        requested=lambda params: (Served("db", "fake", "secret/db"),),
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
