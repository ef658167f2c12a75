"""The backstop deadline of every Mount in flight, kept with one loop timer for all of them.

A mount ends itself at its own deadline (its store calls, waits and retries are bounded); the
server's backstop only catches what is not. `asyncio.timeout()` around each mount scheduled a
loop timer per call and cancelled it after (measured: BENCHMARKS.md, "The backstop deadline:
one timer"). Here a mount registers its task and
deadline in a dict, and one timer, set for the earliest deadline, cancels the tasks whose
deadline has passed.
"""

from __future__ import annotations

import asyncio
import math


class Watchdog:
    def __init__(self) -> None:
        self._deadlines: dict[asyncio.Task[object], float] = {}
        #: Tasks the watchdog cancelled whose cancellation was not yet claimed by `fired`.
        self._expired: set[asyncio.Task[object]] = set()
        #: Set for the earliest deadline watched when it was scheduled.
        self._timer: asyncio.TimerHandle | None = None

    def watch(self, task: asyncio.Task[object], seconds: float) -> None:
        """Cancel `task` if it is still watched `seconds` from now."""
        loop = asyncio.get_running_loop()
        when = loop.time() + seconds
        self._deadlines[task] = when
        if self._timer is None or when < self._timer.when():
            self._schedule(loop, when)

    def fired(self, task: asyncio.Task[object]) -> bool:
        """Whether the cancellation `task` is handling is the watchdog's (claimed: the task is
        no longer cancelling); False for anyone else's (the driver's)."""
        if task not in self._expired:
            return False
        self._expired.discard(task)
        task.uncancel()
        return True

    def forget(self, task: asyncio.Task[object]) -> None:
        """`task` is done with its mount (always called, in a `finally`)."""
        self._deadlines.pop(task, None)
        if task in self._expired:  # cancelled, but the cancellation was swallowed on the way
            self._expired.discard(task)
            task.uncancel()

    def __len__(self) -> int:
        return len(self._deadlines)

    def _schedule(self, loop: asyncio.AbstractEventLoop, when: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = loop.call_at(when, self._check, loop)

    def _check(self, loop: asyncio.AbstractEventLoop) -> None:
        self._timer = None
        now = loop.time()
        earliest = math.inf
        for task, when in list(self._deadlines.items()):
            if when > now:
                earliest = min(earliest, when)
            else:
                del self._deadlines[task]
                if not task.done():
                    self._expired.add(task)
                    task.cancel()
        if earliest < math.inf:
            self._schedule(loop, earliest)
