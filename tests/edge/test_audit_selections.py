"""The audit trail names every secret a selector delivered (issue 40, item 8), in lines that stay
within `LINE_BYTES`, and `secrets-bridge audit search` answers "which pods received secret X,
and when" for selected secrets as for listed ones: a served provider over its socket, the fake
store, real gRPC mounts."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from backends.fake.options import Options as FakeOptions
from devkit.leaks import leaks_in_text
from devkit.serving import serving
from devkit.testing import driver_request
from provider.cli.main import main
from provider.core.settings import CoreSettings
from provider.edge import audit

SECRETS = {
    "team-b/sel/a": "value-a-1",
    "team-b/sel/b": "value-b-1",
    "team-b/sel/ab": "value-ab-1",
    "team-b/other": "value-other-1",
}
BIG = 1000


class Rig:
    def __init__(self, stub: Any, trail: Path, store: Path) -> None:
        self.stub, self.trail, self.store = stub, trail, store

    async def mount(self, pod: str, namespace: str = "team-b", **params: str) -> Any:
        request = driver_request(
            {"backend": "fake", **params}, pod=pod, namespace=namespace, spc="sel"
        )
        return await self.stub.Mount(request, timeout=30)

    async def select(self, pod: str, prefix: str, namespace: str = "team-b") -> Any:
        chosen = yaml.safe_dump([{"prefix": prefix, "directory": "sel"}])
        return await self.mount(pod, namespace, select=chosen)

    def lines(self) -> list[str]:
        return self.trail.read_text().splitlines()

    def records(self) -> list[dict[str, Any]]:
        return [r for r in map(json.loads, self.lines()) if r["type"] == "audit"]


@pytest.fixture
async def rig(tmp_path: Path) -> AsyncIterator[Rig]:
    store = tmp_path / "store.yaml"
    secrets = {**SECRETS, **{f"k1000/k{i}": f"v{i}" for i in range(1, BIG + 1)}}
    store.write_text(yaml.safe_dump({"secrets": secrets}))
    options = {"fake": FakeOptions(store_file=str(store))}
    core = CoreSettings(enable_fake_backend=True, max_objects=BIG)
    trail = tmp_path / "audit.log"
    async with serving(
        tmp_path, backend_options=options, core=core, audit_log=str(trail)
    ) as running:
        yield Rig(running.stub, trail, store)
    text = trail.read_text()
    assert "value-" not in text and not leaks_in_text(text)


def search(capsys: pytest.CaptureFixture[str], trail: Path, *args: str) -> tuple[int, str, str]:
    capsys.readouterr()
    key = trail.parent / "hmac.key"  # devkit.serving's installation key
    code = main(["audit", "search", str(trail), *args, "--hmac-key-file", str(key)])
    out, err = capsys.readouterr()
    return code, out, err


async def test_a_selected_secret_names_the_pods_that_received_it(
    rig: Rig, capsys: pytest.CaptureFixture[str]
) -> None:
    await rig.select("web-0", "team-b/sel/")
    await rig.select("web-1", "team-b/sel/")
    listed = yaml.safe_dump([{"objectName": "b", "secretPath": "team-b/sel/b"}])
    await rig.mount("job-0", objects=listed)
    await rig.mount(
        "job-1", objects=yaml.safe_dump([{"objectName": "o", "secretPath": "team-b/other"}])
    )
    first = rig.records()[0]
    [entry] = first["objects"]
    # Every secret the selector delivered, by its reference, each beside its version.
    assert entry["ref"] == "team-b/sel/*" and entry["selected"] == 3
    assert entry["secrets"] == ["team-b/sel/a", "team-b/sel/ab", "team-b/sel/b"]
    assert len(entry["version"]) == 3 and entry["source"] == "store"

    code, out, err = search(capsys, rig.trail, "--secret", "team-b/sel/b")
    assert code == 0, err
    pods = [line.split()[2] for line in out.splitlines()]
    # The two pods that selected it and the one that listed it; not team-b/sel/ab's alone.
    assert pods == ["team-b/web-0", "team-b/web-1", "team-b/job-0"]
    assert "team-b/sel/b version " in out.splitlines()[0]
    assert "3 matches in 5 lines" in err and "intact" in err
    code, out, _ = search(capsys, rig.trail, "--secret", "sel/ab", "--pod", "team-b/web-1")
    assert code == 0 and len(out.splitlines()) == 1 and "team-b/sel/ab" in out


async def test_a_thousand_file_selection_is_in_bounded_lines_costing_what_listing_costs(
    rig: Rig, capsys: pytest.CaptureFixture[str]
) -> None:
    before = len(rig.lines())
    await rig.select("poll-0", "k1000/")
    selected = rig.lines()[before:]
    await rig.select("poll-0", "k1000/")  # the next poll writes the same again
    again = rig.lines()[before + len(selected) :]
    objects = [{"objectName": f"k{i}", "secretPath": f"k1000/k{i}"} for i in range(1, BIG + 1)]
    start = len(rig.lines())
    await rig.mount("list-0", objects=yaml.safe_dump(objects))
    listed = rig.lines()[start:]

    assert all(len(line) + 1 <= audit.LINE_BYTES for line in rig.lines())
    parts = [json.loads(line) for line in selected]
    assert parts[0]["event"] == "answered" and parts[0]["parts"] == len(parts) > 1
    assert [p["event"] for p in parts[1:]] == ["continued"] * (len(parts) - 1)
    assert all(p["pod"] == "poll-0" and p["namespace"] == "team-b" for p in parts)
    pieces = [e for p in parts for e in p["objects"]]
    names = [s for e in pieces for s in e["secrets"]]
    assert sorted(names) == sorted(f"k1000/k{i}" for i in range(1, BIG + 1))
    assert all(len(e["secrets"]) == len(e["version"]) for e in pieces)
    assert [e["at"] for e in pieces] == [
        sum(len(e["secrets"]) for e in pieces[:i]) for i in range(len(pieces))
    ]
    # Bytes per poll: the selection's record costs no more than the same secrets listed.
    per_poll = sum(len(line) + 1 for line in selected)
    assert per_poll == sum(len(line) + 1 for line in again)
    assert per_poll <= sum(len(line) + 1 for line in listed)
    print(
        f"bytes per poll: selected {per_poll} in {len(selected)} lines, "
        f"listed {sum(len(line) + 1 for line in listed)} in {len(listed)} lines"
    )

    code, out, err = search(capsys, rig.trail, "--secret", "k1000/k777")
    assert code == 0, err
    assert [line.split()[2] for line in out.splitlines()] == ["team-b/poll-0"] * 2 + [
        "team-b/list-0"
    ]
    code, out, _ = search(capsys, rig.trail, "--pod", "team-b/poll-0")
    assert code == 0 and len(out.splitlines()) == 2
    assert f"1 objects, {BIG} selected secrets, in {len(parts)} lines" in out.splitlines()[0]


async def test_a_tampered_line_is_reported_where_it_breaks(
    rig: Rig, capsys: pytest.CaptureFixture[str]
) -> None:
    await rig.select("poll-0", "k1000/")
    await rig.select("web-0", "team-b/sel/")
    lines = rig.lines()
    # Someone hides a delivery: the third line (a part of poll-0's record) is said to be web-9's.
    edited = lines[2].replace('"pod":"poll-0"', '"pod":"web-9"')
    assert edited != lines[2]
    rig.trail.write_text("\n".join([*lines[:2], edited, *lines[3:]]) + "\n")
    code, out, err = search(capsys, rig.trail, "--namespace", "team-b")
    assert code == 1
    assert f"broken: {rig.trail}:3: its MAC does not follow from the line before it" in err
    assert len(err.splitlines()) == 1 and out  # the matches are still shown
    rig.trail.write_text("\n".join(lines) + "\n")  # the fixture's checks read it back
