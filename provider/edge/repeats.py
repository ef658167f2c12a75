"""Which mounts get their own log line: a volume's unchanged re-mounts are counted.

The driver republishes every volume on each rotation poll (every 2 minutes by default), and
nearly every poll gets the answer the previous one got. A line for each is most of a provider's
log and, on a cached mount, the largest share of its own CPU. So a volume's answer is logged
when it is new (the pod's first mount, a provider restart), when its versions changed (a
rotation), when it took long, and otherwise at most once every `--log-repeats-every` seconds,
with `repeats`: how many times the volume's previous line repeated since it was written.
Failures are grouped the same way (issue 32: the kubelet retries a failing volume, and a
class's message may be kilobytes): a volume's failure is logged when it differs from the
volume's previous line (another code or message, or the volume was answered since), and an
identical one at most once every interval, whatever it took. Grepping a pod still finds its
first mount, every change, every new failure and a line at least every interval while it is
polled or retried. `--log-repeats-every 0` logs every mount. The audit trail (`--audit-log`)
is unaffected: it records every answer (and counts repeated refusals its own way).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable

#: Volumes remembered (LRU): a node's pods' volumes, with room to spare.
MAX_VOLUMES = 8192
#: A target path longer than this is not remembered (its mounts are always logged): the key
#: is kept, and the driver's paths are ~150 characters.
MAX_KEY_CHARS = 1024
#: A mount slower than this is always logged, changed or not.
SLOW_SECONDS = 1.0


class Repeats:
    """Per volume (its target path): the answer last logged, when, and repeats since."""

    def __init__(self, every: float, max_volumes: int = MAX_VOLUMES) -> None:
        self._every = every
        self._max = max_volumes
        self._seen: OrderedDict[str, tuple[Hashable, float, int]] = OrderedDict()

    def quiet(self, volume: str, answer: Hashable, seconds: float, now: float) -> int | None:
        """None when this mount is counted as a repeat instead of logged; else the repeats to
        report on its line (0 when there were none)."""
        if self._every <= 0 or not volume or len(volume) > MAX_KEY_CHARS:
            return 0
        held = self._seen.get(volume)
        if held is None:
            if len(self._seen) >= self._max:
                self._seen.popitem(last=False)
            self._seen[volume] = (answer, now, 0)
            return 0
        self._seen.move_to_end(volume)
        last_answer, logged_at, repeats = held
        if last_answer == answer and now - logged_at < self._every and seconds < SLOW_SECONDS:
            self._seen[volume] = (last_answer, logged_at, repeats + 1)
            return None
        self._seen[volume] = (answer, now, 0)
        return repeats

    def __len__(self) -> int:
        return len(self._seen)
