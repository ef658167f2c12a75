"""`refreshInterval` durations, as Kubernetes and Go write them."""

from __future__ import annotations

import pytest

from provider.core.parsing import duration


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("90s", 90.0),
        ("10m", 600.0),
        ("1h30m", 5400.0),
        ("0.5h", 1800.0),
        ("120", 120.0),
        ("300ms", 0.3),
        (" 1m30s ", 90.0),
        ("0", 0.0),
    ],
)
def test_durations(text: str, seconds: float) -> None:
    assert duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize(
    "text", ["", "soon", "m", "1h 2m", "-5", "-5m", "nan", "inf", "1e400s", "5d"]
)
def test_not_durations(text: str) -> None:
    assert duration(text) is None
