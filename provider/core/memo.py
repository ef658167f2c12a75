"""A least-recently-used memo of pure results, bounded by count and by a size the caller states.

What is memoized here is recomputable at any time (parsed requests, parsed classes, built
answers): an evicted entry costs CPU, never correctness. The size bound (parameter text, file
bytes) keeps a few huge entries from holding the provider's memory.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class Memo(Generic[K, V]):
    def __init__(
        self, max_entries: int, max_size: int, on_drop: Callable[[V], None] | None = None
    ) -> None:
        self._entries: OrderedDict[K, tuple[V, int]] = OrderedDict()
        self._max_entries = max_entries
        self._max_size = max_size
        self._size = 0
        #: Called with each value evicted, replaced or dropped (not with one refused by `put`).
        self._on_drop = on_drop

    def get(self, key: K) -> V | None:
        held = self._entries.get(key)
        if held is None:
            return None
        self._entries.move_to_end(key)
        return held[0]

    def put(self, key: K, value: V, size: int) -> None:
        if size > self._max_size:
            return
        old = self._entries.pop(key, None)
        if old is not None:
            self._size -= old[1]
            if old[0] is not value and self._on_drop is not None:
                self._on_drop(old[0])
        self._entries[key] = (value, size)
        self._size += size
        while len(self._entries) > self._max_entries or self._size > self._max_size:
            self._dropped(*self._entries.popitem(last=False)[1])

    def drop(self, key: K) -> None:
        held = self._entries.pop(key, None)
        if held is not None:
            self._dropped(*held)

    def _dropped(self, value: V, size: int) -> None:
        self._size -= size
        if self._on_drop is not None:
            self._on_drop(value)

    def __len__(self) -> int:
        return len(self._entries)
