"""Token buckets, alone and one per namespace.

`TokenBucket` holds `burst` tokens at most and gains `rate` a second: the store-call rate limit
waits on one (provider/core/limits.py). `Budgets` gives each namespace a bucket of its own and
counts what it refused, so that a later line can say how many were dropped: the log lines of a
namespace (provider/edge/logs.py) and its refusal lines in the audit trail
(provider/edge/audit.py).

Namespaces are tracked in a bounded number: a bucket that is full again and has no count to
report is forgotten by the next sweep (a new one would be the same), and past MAX_NAMESPACES
the namespaces not tracked yet share one bucket, OTHERS, so memory stays bounded and no count
is lost.
"""

from __future__ import annotations

from collections.abc import Callable

#: Namespaces with a bucket of their own (more than a node runs pods of).
MAX_NAMESPACES = 8192
#: The bucket of the namespaces past MAX_NAMESPACES (no namespace can be named so).
OTHERS = "(others)"


class TokenBucket:
    """`burst` tokens at once, then `rate` a second; it starts full."""

    __slots__ = ("burst", "rate", "stamp", "tokens")

    def __init__(self, burst: float, rate: float, now: float) -> None:
        self.burst, self.rate = burst, rate
        self.tokens = burst
        self.stamp = now

    def refill(self, now: float) -> float:
        """The tokens held at `now`, refilled for the time since the bucket was last looked at."""
        self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.rate)
        self.stamp = now
        return self.tokens

    def take(self, amount: float, now: float) -> bool:
        """Spend `amount`; False, and nothing spent, when the bucket holds less."""
        if self.refill(now) < amount:
            return False
        self.tokens -= amount
        return True

    def wait(self, amount: float) -> float:
        """Seconds until the bucket holds `amount`, as refilled last."""
        return (amount - self.tokens) / self.rate


class _Budget(TokenBucket):
    """A namespace's bucket, and what it refused since a line last carried the count (the
    first of them at `since`)."""

    __slots__ = ("dropped", "since")

    def __init__(self, burst: float, rate: float, now: float) -> None:
        super().__init__(burst, rate, now)
        self.dropped = 0
        self.since = 0.0


#: Writes a namespace's count, first refused at `since`: False when it could not be written.
Report = Callable[[str, int, float], bool]


class Budgets:
    """A token bucket of `burst` refilled at `rate` a second for each namespace, and what each
    refused since a line last carried its count."""

    def __init__(self, burst: float, rate: float, *, most: int = MAX_NAMESPACES) -> None:
        self.burst, self.rate, self._most = burst, rate, most
        self._budgets: dict[str, _Budget] = {}

    def allows(self, namespace: str, amount: float, now: float) -> bool:
        """Whether the namespace's bucket holds `amount` now; a refusal is counted."""
        budget = self._budgets.get(namespace)
        if budget is None:
            if len(self._budgets) >= self._most:
                namespace = OTHERS
                budget = self._budgets.get(namespace)
            if budget is None:
                budget = self._budgets[namespace] = _Budget(self.burst, self.rate, now)
        if budget.refill(now) >= amount:
            return True
        if not budget.dropped:
            budget.since = now
        budget.dropped += 1
        return False

    def spend(self, namespace: str, amount: float) -> None:
        """Spend `amount` that `allows` just found in the namespace's bucket."""
        budget = self._budgets.get(namespace) or self._budgets[OTHERS]
        budget.tokens -= amount

    def dropped(self, namespace: str) -> tuple[int, float]:
        """What the namespace's bucket refused since a line last carried the count, and since
        when; (0, 0.0) when nothing."""
        budget = self._budgets.get(namespace)
        return (budget.dropped, budget.since) if budget is not None else (0, 0.0)

    def carried(self, namespace: str) -> None:
        """A line carried the namespace's count: it counts from 0 again."""
        budget = self._budgets.get(namespace)
        if budget is not None:
            budget.dropped = 0

    def sweep(
        self, now: float, report: Report, *, older_than: float, everything: bool = False
    ) -> None:
        """`report` the counts first refused `older_than` seconds ago or more (all of them with
        `everything`), and forget the buckets full again with nothing to report. Stops at the
        first count `report` could not write (kept for a later sweep)."""
        for namespace, budget in list(self._budgets.items()):
            if budget.dropped and (everything or now - budget.since >= older_than):
                if not report(namespace, budget.dropped, budget.since):
                    return
                budget.dropped = 0
            if not budget.dropped and budget.refill(now) >= self.burst:
                del self._budgets[namespace]
