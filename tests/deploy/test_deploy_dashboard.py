"""deploy/grafana-dashboard.json and docs/metrics.md against the metrics the provider really
exports: every queried series and label exists, every exported series is charted and
documented."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from prometheus_client.metrics import MetricWrapperBase

from provider.core.metrics import Metrics
from provider.watch.run import WatchMetrics
from tests.deploy.conftest import DEPLOY, ROOT

DASHBOARD = DEPLOY / "grafana-dashboard.json"
METRICS_DOC = ROOT / "docs" / "metrics.md"

#: The charted series: counters as `_total`, histograms by `_bucket`, as Prometheus sees them.
CHARTED = {
    "secrets_bridge_build_info",
    "process_resident_memory_bytes",
    "process_open_fds",
    "secrets_bridge_mount_requests_total",
    "secrets_bridge_mount_duration_seconds_bucket",
    "secrets_bridge_backend_calls_total",
    "secrets_bridge_backend_call_duration_seconds_bucket",
    "secrets_bridge_cache_events_total",
    "secrets_bridge_retries_total",
}


#: Labels Prometheus adds to every scraped series (the target's), usable in any query.
TARGET_LABELS = {"instance", "job"}
#: Series names a query may use: ours, and the process collector's.
SERIES = re.compile(r"\b(?:secrets_bridge|process)_\w+")


def exported() -> dict[str, set[str]]:
    """Series name -> label names, from the provider's own Metrics, named as exposed."""
    metrics, watcher = Metrics(), WatchMetrics()
    # Unlabelled collectors (process, build info) show their samples at once.
    series: dict[str, set[str]] = {
        sample.name: set(sample.labels)
        for registry in (metrics.registry, watcher.registry)
        for family in registry.collect()
        for sample in family.samples
    }
    for metric in [*vars(metrics).values(), *vars(watcher).values()]:
        if not isinstance(metric, MetricWrapperBase):
            continue
        labels = set(metric._labelnames)
        if metric._type == "counter":
            series[f"{metric._name}_total"] = labels
        elif metric._type == "histogram":
            series[f"{metric._name}_bucket"] = labels | {"le"}
            series[f"{metric._name}_sum"] = labels
            series[f"{metric._name}_count"] = labels
        elif metric._type == "gauge":  # a labelled one shows no sample until it is set
            series[metric._name] = labels
    return series


def targets() -> list[tuple[str, str]]:
    """(panel title, PromQL expression) for every query in the dashboard."""
    dashboard = json.loads(DASHBOARD.read_text())
    return [
        (panel["title"], target["expr"])
        for panel in dashboard["panels"]
        for target in panel.get("targets", [])
    ]


def labels_used(expr: str) -> set[str]:
    grouped = {
        label.strip()
        for group in re.findall(r"\b(?:by|without)\s*\(([^)]*)\)", expr)
        for label in group.split(",")
    }
    matched = {
        label
        for selector in re.findall(r"\{([^}]*)\}", expr)
        for label in re.findall(r"(\w+)\s*(?:=~|!~|!=|=)", selector)
    }
    return (grouped | matched) - {""}


def test_the_exporter_serves_the_charted_series() -> None:
    assert set(exported()) >= CHARTED


def test_dashboard_is_importable_grafana_json() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["uid"] and dashboard["title"] and dashboard["schemaVersion"] >= 36
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    variables = {v["name"] for v in dashboard["templating"]["list"]}
    assert "datasource" in variables
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            assert target["datasource"]["uid"] == "${datasource}", panel["title"]


@pytest.mark.parametrize(("title", "expr"), targets())
def test_each_query_uses_exported_series_and_their_labels(title: str, expr: str) -> None:
    series = exported()
    names = set(SERIES.findall(expr))
    assert names, f"{title}: queries no secrets-bridge series"
    for name in names:
        assert name in series, f"{title}: {name} is not exported"
        unknown = labels_used(expr) - series[name] - TARGET_LABELS
        assert not unknown, f"{title}: {name} has no label {sorted(unknown)}"


def test_every_charted_series_has_a_panel() -> None:
    queried = {name for _, expr in targets() for name in SERIES.findall(expr)}
    assert queried == CHARTED


def test_metrics_doc_names_every_series_and_label() -> None:
    doc = METRICS_DOC.read_text()
    missing = [name for name in CHARTED if f"`{name}`" not in doc]
    labels: set[str] = set().union(*(exported()[name] for name in CHARTED)) - {"le"}
    missing += [f"label {label}" for label in sorted(labels) if f"`{label}`" not in doc]
    assert not missing, f"docs/metrics.md lacks: {missing}"


def test_metrics_doc_names_no_series_the_provider_lacks() -> None:
    series = exported()
    bases = {re.sub(r"_(total|bucket|sum|count|created)$", "", name) for name in series}
    named = set(SERIES.findall(METRICS_DOC.read_text()))
    stale = sorted(n for n in named if n not in series and n not in bases)
    assert not stale, f"docs/metrics.md names series that are not exported: {stale}"


def _operations_in_code() -> set[tuple[str, str]]:
    """(backend, operation) of every literal `backend_call("<backend>", "<operation>")`."""
    found: set[tuple[str, str]] = set()
    for path in (ROOT / "backends").rglob("*.py"):
        found.update(re.findall(r'backend_call\(\s*"(\w+)",\s*"([\w.]+)"', path.read_text()))
    return found


def test_metrics_doc_names_every_operation_the_code_emits() -> None:
    doc = METRICS_DOC.read_text()
    operations = _operations_in_code()
    assert ("gcp", "StsExchange") in operations  # the scan finds what it should
    missing = sorted(f"{b} {op}" for b, op in operations if f"`{op}`" not in doc)
    assert not missing, f"docs/metrics.md lacks the operations: {missing}"


def _panel_titles(dashboard: dict[str, Any]) -> list[str]:
    return [p["title"] for p in dashboard["panels"] if p["type"] != "row"]


def test_panel_titles_are_unique() -> None:
    titles = _panel_titles(json.loads(DASHBOARD.read_text()))
    assert len(titles) == len(set(titles))
