"""The outage and fair-share flags of `serve` (issues 20 and 21): defaults, environment, limits."""

from __future__ import annotations

import pytest

from provider.cli.main import build_parser, settings_from_args
from provider.core.settings import CoreSettings


def core(*argv: str) -> CoreSettings:
    args = build_parser("serve").parse_args(["serve", *argv])
    return settings_from_args(args).core


def test_defaults() -> None:
    settings = core()
    assert settings.store_call_timeout == 10.0
    assert settings.serve_stale_wait == 3.0
    assert settings.max_concurrent_fetches_per_namespace == 16
    assert settings == CoreSettings(rate_limits={})


def test_flags_and_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SECRETS_BRIDGE_STORE_CALL_TIMEOUT", "4")
    settings = core("--serve-stale-wait", "1.5", "--max-concurrent-fetches-per-namespace", "8")
    assert (settings.store_call_timeout, settings.serve_stale_wait) == (4.0, 1.5)
    assert settings.max_concurrent_fetches_per_namespace == 8


@pytest.mark.parametrize(
    "argv",
    [("--store-call-timeout", "0"), ("--max-concurrent-fetches-per-namespace", "0")],
)
def test_nonsense_is_refused_by_name(
    argv: tuple[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        core(*argv)
    assert exited.value.code == 2
    assert f"argument {argv[0]}:" in capsys.readouterr().err
