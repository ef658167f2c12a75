"""What one store call knows of the mount-layer code that started it, through contextvars.

The core's retry loop (`BackendEnv.retry`, provider/core/backend.py) runs a store's call with
two things set in its context: the call's cut-off (`attempt_cutoff`: a store client with its own
timer, Vault's, ends there), and the `FailureWatch` of the shared load that started it
(provider/mount/loads.py), told of every failed attempt. This is the one place store calls
talk upward: a load learns at once that its store refuses (down, not slow), and answers its
waiting mounts with their stale copies, without every store passing a callback through its
fetch. docs/architecture.md ("Talking upward") draws it.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from provider.core.errors import BridgeError

_cutoff: contextvars.ContextVar[float] = contextvars.ContextVar("store_call_cutoff")
_failures: contextvars.ContextVar[FailureWatch | None] = contextvars.ContextVar(
    "store_call_failures", default=None
)


@dataclass(frozen=True)
class Failure:
    """A failed store call: its error, and whether the store was silent (the call was cut off)
    rather than refusing."""

    error: BridgeError
    silent: bool

    @property
    def refused(self) -> bool:
        """The store answered, with a failure worth retrying (down, restarting, throttling):
        not silence, not a denial."""
        return not self.silent and self.error.transient


class FailureWatch:
    """The latest failed store call made from one context on (a fetcher's load watches its
    own, so a mount that stops waiting can say what the store did), and whom to tell at once
    when the store refuses."""

    def __init__(self, on_refused: Callable[[BridgeError], None] | None = None) -> None:
        self.latest: Failure | None = None
        self._on_refused = on_refused

    def note(self, failure: Failure) -> None:
        self.latest = failure
        if self._on_refused is not None and failure.refused:
            self._on_refused(failure.error)

    def close(self) -> None:
        """Stop telling of refusals. The watch lives on in the context of every handle and
        task started while it was set, and its callback holds what the watcher answers with
        (a load's values): let those go with the watcher."""
        self._on_refused = None


def watch_failures(on_refused: Callable[[BridgeError], None] | None = None) -> FailureWatch:
    """Watch the store calls made from this context on (see FailureWatch)."""
    watch = FailureWatch(on_refused)
    _failures.set(watch)
    return watch


def note(failure: Failure) -> None:
    """Tell the watch of this context (if any) of a failed store call."""
    watch = _failures.get()
    if watch is not None:
        watch.note(failure)


@contextlib.contextmanager
def cut_off_at(when: float) -> Iterator[None]:
    """Within the block, the store call now running is cut off at `when` (time.monotonic())."""
    token = _cutoff.set(when)
    try:
        yield
    finally:
        _cutoff.reset(token)


def attempt_cutoff() -> float:
    """`time.monotonic()` at which the store call now running is cut off (inf outside
    `BackendEnv.retry`): a store client with its own timer sets it to end there."""
    return _cutoff.get(math.inf)
