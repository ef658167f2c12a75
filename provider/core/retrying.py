"""Retries of transient store failures, bounded by the Mount's retry deadline.

The driver re-sends a Mount that failed with UNAVAILABLE up to three times, so our own retries
may spend only about a third of the request's deadline; otherwise an outage multiplies the
traffic on the store. Only errors marked `transient` (StoreUnavailable: connection errors, 5xx,
429/throttling) are retried; a Retry-After from the store is honoured when it fits.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from tenacity import AsyncRetrying, RetryCallState, retry_if_exception, wait_random_exponential

from provider.core.errors import BridgeError, StoreUnavailable, shed_tracebacks
from provider.core.limits import wait_off_slot
from provider.core.model import FetchContext

T = TypeVar("T")

#: Jittered exponential backoff between attempts (seconds).
_BACKOFF = wait_random_exponential(multiplier=0.1, max=4.0)
MAX_ATTEMPTS = 6


def retry_reason(exc: BaseException) -> str:
    """The metrics label of a retry: "throttled" (429, Retry-After, throttling) or
    "unavailable" (connection errors, 5xx), so dashboards can tell quota from outage."""
    text = str(exc).lower()
    if getattr(exc, "retry_after", None) is not None or "429" in text or "thrott" in text:
        return "throttled"
    return "unavailable"


def _is_transient(exc: BaseException) -> bool:
    return isinstance(exc, BridgeError) and exc.transient


def _wait(state: RetryCallState) -> float:
    backoff = _BACKOFF(state)
    exc = state.outcome.exception() if state.outcome else None
    if isinstance(exc, StoreUnavailable) and exc.retry_after is not None:
        return max(backoff, exc.retry_after)
    return backoff


async def retry_transient(
    call: Callable[[], Awaitable[T]],
    ctx: FetchContext,
    *,
    on_retry: Callable[[BaseException], None] | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> T:
    """Run `call`, retrying transient failures while the next attempt can start in time."""

    def stop(state: RetryCallState) -> bool:
        if state.attempt_number >= MAX_ATTEMPTS:
            return True
        return clock() + (state.upcoming_sleep or 0.0) > ctx.retry_deadline

    def before_sleep(state: RetryCallState) -> None:
        exc = state.outcome.exception() if state.outcome is not None else None
        if exc is not None:
            # The failed attempt is done with: its frames need not wait for the cyclic
            # collector (shed_tracebacks).
            shed_tracebacks(exc)
            if on_retry is not None:
                on_retry(exc)

    retrying = AsyncRetrying(
        # The load's fetch slot is not held while a retry waits (provider/core/limits.py).
        sleep=wait_off_slot,
        retry=retry_if_exception(_is_transient),
        wait=_wait,
        stop=stop,
        reraise=True,
        before_sleep=before_sleep,
    )

    async def attempt() -> T:
        # Awaited here, so `call` may be any callable returning an awaitable (even a lambda,
        # which tenacity would otherwise treat as synchronous and never retry).
        return await call()

    try:
        return await retrying(attempt)
    except BridgeError as exc:  # expected: reported by its message (a bug keeps its traceback)
        shed_tracebacks(exc)
        raise
