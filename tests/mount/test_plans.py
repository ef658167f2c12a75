"""Parsed plans are reused per class, and a class's warnings reach the log once."""

from __future__ import annotations

import logging

import pytest

from devkit.testing import Harness


async def test_unknown_parameter_is_logged_once_per_class(
    harness: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    harness.write({"secrets": {"s": "v"}})
    for _ in range(3):
        await harness.mounter.mount(
            harness.request([{"objectName": "o", "secretPath": "s"}], objcets="typo")
        )
    warnings = [
        r
        for r in caplog.records
        if r.name == "secrets_bridge.mounting" and r.levelno == logging.WARNING
    ]
    assert len(warnings) == 1
    assert "'objcets' is not used by the fake backend" in str(warnings[0].fields)  # type: ignore[attr-defined]


async def test_plans_follow_the_parameters(harness: Harness) -> None:
    harness.write({"secrets": {"a": "1", "b": "2"}})
    first = await harness.files([{"objectName": "o", "secretPath": "a"}])
    second = await harness.files([{"objectName": "o", "secretPath": "b"}])
    assert (first, second) == ({"o": b"1"}, {"o": b"2"})
