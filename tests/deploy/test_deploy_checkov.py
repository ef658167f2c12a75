"""checkov over the rendered base and overlay: no failed check, and every skipped check is one
we decided on, with its reason written beside it in the manifest (`checkov.io/skip<N>`)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.deploy.conftest import ROOT, Rendered, tool

CHECKOV = ROOT / ".tools" / "checkov" / "bin" / "checkov"

#: Each one is explained in deploy/base/daemonset.yaml and docs/deploy.md.
DECIDED_SKIPS = {
    "CKV_K8S_11",  # no CPU limit: throttling stalls Python during bursts of pod starts
    "CKV_K8S_15",  # IfNotPresent: a node-critical pod must restart without the registry
    "CKV_K8S_23",  # uid 0: the driver's socket directory on the node is root-owned
    "CKV_K8S_38",  # the ServiceAccount token reads role annotations from the API
    "CKV_K8S_40",  # uid 0, as CKV_K8S_23
    "CKV_K8S_43",  # tag pinned; the digest is set at release time
}


#: JSON lists passed, failed and skipped checks (--quiet would drop the skipped ones);
#: --skip-download keeps checkov off the network (it otherwise fetches its guideline links).
QUIET_JSON = ("--skip-download", "--output", "json")


@pytest.fixture(scope="module")
def report(base: Rendered, overlay: Rendered, tmp_path_factory: pytest.TempPathFactory) -> Any:
    checkov = tool(str(CHECKOV), "checkov", "run `make tools` (deploy/tools.sh)")
    scan = tmp_path_factory.mktemp("checkov")
    (scan / "base.yaml").write_text(base.text)
    (scan / "token-request-fallback.yaml").write_text(overlay.text)
    result = subprocess.run(
        [checkov, "-d", str(scan), "--framework", "kubernetes", "--compact", *QUIET_JSON],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=scan,
    )
    assert result.stdout.strip(), f"checkov printed nothing:\n{result.stderr[-3000:]}"
    out = json.loads(result.stdout)
    reports = out if isinstance(out, list) else [out]
    (k8s,) = [r for r in reports if r.get("check_type") == "kubernetes"]
    return k8s


def _where(check: dict[str, Any]) -> str:
    return f"{check['check_id']} {check['check_name']} ({Path(check['file_path']).name}: " + (
        f"{check['resource']})"
    )


def test_checkov_finds_no_failed_check(report: Any) -> None:
    failed = report["results"]["failed_checks"]
    assert not failed, "checkov failed:\n" + "\n".join(_where(c) for c in failed)
    assert report["summary"]["parsing_errors"] == 0
    assert report["summary"]["passed"] > 50, "checkov checked next to nothing"


def test_every_skipped_check_is_decided_and_carries_its_reason(report: Any) -> None:
    skipped = report["results"]["skipped_checks"]
    assert {c["check_id"] for c in skipped} == DECIDED_SKIPS
    for check in skipped:
        reason = check["check_result"].get("suppress_comment", "")
        assert len(reason) > 20, f"no reason given for {_where(check)}"
