"""`--event-loop`: uvloop when installed (auto), asyncio on request, a clear error otherwise."""

from __future__ import annotations

import asyncio
import importlib.util

import pytest

from provider.cli.flags import settings_from_args
from provider.cli.main import build_parser
from provider.edge import loops


def test_auto_takes_uvloop_where_it_is_installed() -> None:
    assert importlib.util.find_spec("uvloop") is not None  # a dependency on Linux
    assert loops.chosen("auto") == "uvloop"
    assert loops.chosen("uvloop") == "uvloop"
    assert loops.chosen("asyncio") == "asyncio"


def test_without_uvloop_auto_falls_back_and_uvloop_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "uvloop" else real(name, *a)
    )
    assert loops.chosen("auto") == "asyncio"
    with pytest.raises(
        loops.LoopUnavailable, match=r"uvloop is not installed.*--event-loop asyncio"
    ):
        loops.chosen("uvloop")


@pytest.mark.parametrize("loop", ["uvloop", "asyncio"])
def test_run_runs_on_the_named_loop(loop: str) -> None:
    async def which() -> str:
        return loops.running()

    assert loops.run(which(), loop) == loop  # type: ignore[arg-type]


def test_the_flag_and_its_environment_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    parser = build_parser()
    assert settings_from_args(parser.parse_args(["serve"])).event_loop == "auto"
    args = parser.parse_args(["serve", "--event-loop", "asyncio"])
    assert settings_from_args(args).event_loop == "asyncio"
    with pytest.raises(SystemExit):
        parser.parse_args(["serve", "--event-loop", "trio"])
    monkeypatch.setenv("SECRETS_BRIDGE_EVENT_LOOP", "asyncio")
    assert settings_from_args(build_parser().parse_args(["serve"])).event_loop == "asyncio"


def test_asyncio_policy_is_left_alone() -> None:
    """Choosing a loop for `serve` does not install uvloop's policy for anything else."""
    loops.run(asyncio.sleep(0), "uvloop")
    assert "uvloop" not in type(asyncio.get_event_loop_policy()).__module__
