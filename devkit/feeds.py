"""A recording `Feed` (provider/core/changes.py): the watcher's side of a change source, as the
sources' tests hand it to `run`, keeping what it was handed."""

from __future__ import annotations

from collections.abc import Sequence

from provider.core.changes import Change


class RecordingFeed:
    """Keeps each published batch, how often the source said up, and each down reason; the
    first `refuse` publishes raise (the records did not reach the feed), as a real one does."""

    def __init__(self, refuse: int = 0) -> None:
        self.batches: list[list[Change]] = []
        #: Publishes tried, refused ones too.
        self.attempts = 0
        self.refuse = refuse
        self.ups = 0
        self.downs: list[str] = []

    async def publish(self, changes: Sequence[Change]) -> None:
        self.attempts += 1
        if self.refuse:
            self.refuse -= 1
            raise RuntimeError("the records document was not written")
        self.batches.append(list(changes))

    def up(self) -> None:
        self.ups += 1

    def down(self, reason: str) -> None:
        self.downs.append(reason)

    @property
    def changes(self) -> list[Change]:
        """Every change published, in order."""
        return [change for batch in self.batches for change in batch]

    @property
    def names(self) -> list[str]:
        return [change.name for change in self.changes]
