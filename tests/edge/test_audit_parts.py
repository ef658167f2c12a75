"""Records split into parts (issue 40, item 8): every line within LINE_BYTES whatever the names
(long, non-ASCII: six bytes a character as JSON writes them), a selector's secrets and versions
sliced together or, when an object yielded more files than secrets (explode), each list on its
own; an answer whose later part cannot be written is not sent; small records stay one line."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from devkit.testing import make_pod
from provider.core.metrics import Metrics
from provider.edge import audit, auditchain
from provider.edge.audit import AuditTrail, FileSink
from provider.mount.auditing import Served
from provider.mount.mounting import MountInput, MountResult

KEY = auditchain.derive_key(b"k" * 32)
WORST = "\u00e9\u2028\U0001d11e"


class BreaksAfter(FileSink):
    """Writes `lines` lines, then fails as a full disk does."""

    lines = 10**9

    def write(self, line: bytes) -> None:
        if self.lines <= 0:
            raise OSError(28, "No space left on device")
        self.lines -= 1
        super().write(line)


def trail_in(path: Path, sink: FileSink | None = None) -> AuditTrail:
    trail = AuditTrail(
        sink or FileSink(str(path)), KEY, metrics=Metrics(), requested=lambda params: ()
    )
    trail.start()
    return trail


def answer(trail: AuditTrail, *served: Served, pod: str = "p") -> bool:
    request = MountInput({"backend": "vault"}, make_pod(name=pod), 0o644)
    return trail.answered(request, MountResult((), (), "vault", served=served))


def parts(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()[1:]]


def test_worst_case_names_stay_within_the_line_bound(tmp_path: Path) -> None:
    names = tuple(f"KV {WORST * 400}/{i}" for i in range(300))
    versions = tuple(WORST * 400 for _ in names)
    path = tmp_path / "a.log"
    trail = trail_in(path)
    assert answer(trail, Served("sel", WORST * 400, "KV x/*", "store", versions, names))
    trail.close()
    lines = path.read_text().splitlines()
    assert max(len(line) + 1 for line in lines) <= audit.LINE_BYTES
    pieces = [e for p in parts(path) for e in p["objects"]]
    assert sum(len(e["secrets"]) for e in pieces) == 300 and len(pieces) == len(lines) - 1
    # Each name and version is cut as written (ending in an ellipsis), never dropped.
    assert all(s.endswith("\u2026") for e in pieces for s in e["secrets"] + e["version"])


def test_an_exploded_selection_slices_its_lists_each_on_its_own(tmp_path: Path) -> None:
    names = tuple(f"KV secret/app/s{i}" for i in range(400))
    versions = tuple(f"{i:064x}" for i in range(1200))  # three files a secret
    path = tmp_path / "a.log"
    trail = trail_in(path)
    assert answer(trail, Served("sel", "bao", "KV secret/app/*", "store", versions, names))
    trail.close()
    pieces = [e for p in parts(path) for e in p["objects"]]
    secrets = [e for e in pieces if "secrets" in e]
    held = [e for e in pieces if "version" in e]
    assert not [e for e in pieces if "secrets" in e and "version" in e]
    assert [s for e in secrets for s in e["secrets"]] == list(names)
    assert [v for e in held for v in e["version"]] == list(versions)
    assert [e["at"] for e in held] == [
        sum(len(e["version"]) for e in held[:i]) for i in range(len(held))
    ]
    assert all(e["selected"] == 400 and e["ref"] == "KV secret/app/*" for e in pieces)


def test_an_answer_whose_later_part_is_not_written_is_not_sent(tmp_path: Path) -> None:
    path = tmp_path / "a.log"
    sink = BreaksAfter(str(path))
    trail = trail_in(path, sink)
    names = tuple(f"KV secret/app/s{i}" for i in range(1000))
    sink.lines = 1  # the first part goes, the second does not
    assert not answer(trail, Served("sel", "bao", "KV secret/app/*", "store", ("1",) * 1000, names))
    sink.lines = 10**9
    assert answer(trail, Served("db", "bao", "GET secret/data/db", "store", ("1",)))
    trail.close()
    # What was written is still one chain: the lost part is not a hole in it.
    lines = path.read_text().splitlines(keepends=True)
    assert auditchain.verify(KEY, [("a.log", lines)]).problem == ""
    first, last = parts(path)
    assert first["parts"] > 1 and "parts" not in last


def test_a_small_record_is_one_line_without_parts(tmp_path: Path) -> None:
    path = tmp_path / "a.log"
    trail = trail_in(path)
    chosen = Served(
        "sel", "bao", "KV secret/app/*", "cache", ("1", "2"), ("KV secret/app/a", "KV secret/app/b")
    )
    assert answer(trail, chosen, Served("db", "bao", "GET secret/data/db", "store", ("3",)))
    trail.close()
    [record] = parts(path)
    assert "parts" not in record and record["event"] == "answered"
    assert record["objects"] == [
        {"object": "sel", "ref": "KV secret/app/*", "source": "cache", "selected": 2,
         "secrets": ["KV secret/app/a", "KV secret/app/b"], "version": ["1", "2"]},
        {"object": "db", "ref": "GET secret/data/db", "source": "store", "version": "3"},
    ]  # fmt: skip
