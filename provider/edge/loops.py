"""Which event loop `serve` runs on: uvloop when installed (the default), else asyncio's own.

It costs the provider less CPU per cached mount (measured: BENCHMARKS.md, "uvloop as the
serving loop"). grpc's asyncio stack runs on any asyncio loop (it polls
its completion queue on its own thread and wakes the loop through a socket), as do aiohttp and
the store SDKs. `--event-loop asyncio` is the escape hatch should a library misbehave on uvloop.
"""

from __future__ import annotations

import asyncio
import importlib.util
from collections.abc import Coroutine
from typing import Any, Literal, TypeVar

from provider.core.settings import EventLoop

T = TypeVar("T")


class LoopUnavailable(Exception):
    """`--event-loop uvloop` where uvloop is not installed."""


def chosen(choice: EventLoop) -> Literal["uvloop", "asyncio"]:
    """The loop `choice` gives on this installation."""
    has_uvloop = importlib.util.find_spec("uvloop") is not None
    if choice == "uvloop" and not has_uvloop:
        raise LoopUnavailable(
            "--event-loop uvloop: uvloop is not installed (pip install uvloop); "
            "or use --event-loop asyncio"
        )
    if choice == "asyncio" or not has_uvloop:
        return "asyncio"
    return "uvloop"


def run(main: Coroutine[Any, Any, T], loop: Literal["uvloop", "asyncio"]) -> T:
    """`asyncio.run(main)` on `loop` (what `chosen` gave)."""
    if loop == "uvloop":
        import uvloop

        return uvloop.run(main)
    return asyncio.run(main)


def running() -> str:
    """The running loop's name, for the start-up log line."""
    module = type(asyncio.get_running_loop()).__module__
    return "uvloop" if module.startswith("uvloop") else "asyncio"
