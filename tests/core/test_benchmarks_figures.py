"""The figures the docs cite agree with BENCHMARKS.md's "Current figures" (issue 41): one current
figure per claim, with the command and the date of its run; the history below it is named by
topic, not by the work's sessions."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BENCHMARKS = (ROOT / "BENCHMARKS.md").read_text()


def current() -> list[dict[str, str]]:
    section = BENCHMARKS.split("## Current figures", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| ") and "---" not in line]
    header, *body = ([c.strip() for c in row.strip("|").split("|")] for row in rows)
    return [dict(zip(header, cells, strict=True)) for cells in body]


def row(claim: str) -> dict[str, str]:
    (found,) = [r for r in current() if r["claim"].startswith(claim)]
    return found


def test_every_current_figure_has_a_command_and_a_date() -> None:
    rows = current()
    assert len(rows) >= 10
    for r in rows:
        assert re.fullmatch(r"20\d\d-\d\d-\d\d", r["run"]), r
        assert r["command"].startswith("`") and r["figure"], r


def test_the_memory_figures_of_deploy_md_are_the_current_ones() -> None:
    deploy = (ROOT / "docs" / "deploy.md").read_text()
    all_four = re.search(r"\*\*(\d+) MiB\*\*", row("memory, all four backends")["figure"])
    vault = re.search(r"\*\*~(\d+) MiB\*\*", row("memory serving Vault")["figure"])
    assert all_four and vault
    said = " ".join(deploy.split("The memory figures are measured", 1)[1].split()[:40])
    assert f"~{vault.group(1)} MiB serving Vault" in said, said
    assert f"{all_four.group(1)} MiB with all four" in said, said
    assert "python -m tests.perf.rss_all_backends --mounts 20000 --every 5000" in (
        said + row("memory, all four backends")["command"]
    )


def test_the_uvloop_figure_is_the_same_everywhere() -> None:
    figure = re.search(r"~(\d+) % less CPU", row("uvloop")["figure"])
    assert figure
    for doc in ("README.md", "docs/deploy.md"):
        claims = re.findall(r"~(\d+) % less CPU per cached mount", (ROOT / doc).read_text())
        assert claims and set(claims) == {figure.group(1)}, (doc, claims)


def test_no_doc_says_the_load_test_job_is_missing() -> None:
    assert (ROOT / "deploy" / "loadtest" / "job.yaml").is_file()
    for doc in (ROOT / "README.md", *(ROOT / "docs").glob("*.md")):
        assert "not in the chart yet" not in doc.read_text(), doc


def test_history_headings_are_named_by_topic() -> None:
    headings = re.findall(r"^## (.+)$", BENCHMARKS, flags=re.M)
    assert headings[:2] == ["Current figures", "Round three of tenant isolation (issue 40)"]
    by_session = [
        h
        for h in headings
        if re.search(r"\bsession\b|^Issue \d+|\(issue \d+\)", h) and "40" not in h
    ]
    assert not by_session, by_session
