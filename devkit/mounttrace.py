"""How far one cached Mount travels through our modules (issue 42's measure, kept in CI).

    python -m devkit.mounttrace [--store fake] [--verbose]

Builds the servicer as `serve` does (devkit/inprocess.py, as the CPU probe does: the fake store, 5
objects, `--cache-ttl 30`), answers one pod's request twice, then traces the third identical
Mount through `ProviderServicer.Mount` with `sys.setprofile`, counting only frames of the
provider's own packages (`provider`, `backends`):

- calls: Python calls into our code (a coroutine resumed after an await is not a new call);
- functions, modules: the distinct ones those calls reach;
- moves: each time the innermost frame of our code changes module, by a call or a return;
- returns: the moves into a module the mount had already been in and left (every move that is
  not a first visit: moves = returns + modules - 1).

A structure that hands data back and forth between layers, or calls out to many small helpers,
shows as returns; a straight stack (each layer calls down once and is returned to once) keeps
them to about one per module.
`tests/perf/test_mount_trace.py` holds the figures to their ceilings.
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import json
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from types import CodeType, FrameType
from typing import Any

from devkit.inprocess import Context, serving

#: Code flags of functions whose frame can suspend and be resumed.
_SUSPENDS = inspect.CO_COROUTINE | inspect.CO_GENERATOR | inspect.CO_ASYNC_GENERATOR
#: The packages whose frames count.
OURS = ("provider.", "backends.")


@dataclass
class Trace:
    calls: int = 0
    functions: set[CodeType] = field(default_factory=set)
    modules: list[str] = field(default_factory=list)
    moves: int = 0
    returns: int = 0
    #: The coroutine and generator frames entered (a 'call' on one again is a resume).
    started: set[FrameType] = field(default_factory=set)
    #: Every move, in order: (event, from module, to module, function).
    path: list[tuple[str, str, str, str]] = field(default_factory=list)

    def figures(self) -> dict[str, int]:
        return {
            "calls": self.calls,
            "functions": len(self.functions),
            "modules": len(self.modules),
            "moves": self.moves,
            "returns": self.returns,
        }


def _module(frame: FrameType | None) -> str | None:
    """The module of the innermost frame of our code at or outside `frame`."""
    while frame is not None:
        name = frame.f_globals.get("__name__", "")
        if name.startswith(OURS):
            return str(name)
        frame = frame.f_back
    return None


def tracer(trace: Trace) -> Any:
    current: list[str | None] = [None]

    def profile(frame: FrameType, event: str, _arg: Any) -> None:
        if event == "call":
            module = _module(frame) if _ours(frame) else None
            if module is None:
                return
            if frame not in trace.started:  # entered, not a coroutine resumed
                trace.calls += 1
                trace.functions.add(frame.f_code)
                if frame.f_code.co_flags & _SUSPENDS:
                    trace.started.add(frame)
            now: str | None = module
        elif event == "return":
            if not _ours(frame):
                return
            now = _module(frame.f_back)
        else:
            return
        if now is None:
            return
        before = current[0]
        if before is not None and before != now:
            trace.moves += 1
            if now in trace.modules:
                trace.returns += 1
            trace.path.append((event, before, now, frame.f_code.co_qualname))
        if now not in trace.modules:
            trace.modules.append(now)
        current[0] = now

    return profile


def _ours(frame: FrameType) -> bool:
    return str(frame.f_globals.get("__name__", "")).startswith(OURS)


async def measure(store: str = "fake") -> Trace:
    with tempfile.TemporaryDirectory() as work:
        async with serving(store, Path(work), 1) as (_rig, provider, requests):
            context = Context()
            request = requests[0]
            for _ in range(2):
                await provider.Mount(request, context)
            trace = Trace()
            sys.setprofile(tracer(trace))
            try:
                await provider.Mount(request, context)
            finally:
                sys.setprofile(None)
            return trace


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", choices=["fake"], default="fake")
    parser.add_argument("--verbose", action="store_true", help="print every move")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON only")
    args = parser.parse_args()
    trace = asyncio.run(measure(args.store))
    if args.json:
        print(json.dumps({**trace.figures(), "modules_reached": trace.modules}))
        return
    print(" ".join(f"{k}={v}" for k, v in trace.figures().items()))
    print("modules: " + ", ".join(trace.modules))
    if args.verbose:
        for event, before, now, function in trace.path:
            print(f"  {event:6} {before} -> {now}  ({function})")


if __name__ == "__main__":
    main()
