"""The node's side of the change feed: one list+watch of the feed ConfigMaps in the provider's
namespace (docs/change-feed.md), each document handed to the fetcher's `Coverage`
(provider/mount/changes.py), and a periodic check, since a heartbeat that stops comes with no
event. The node only reads the feed: its Role has get, list and watch on ConfigMaps.

A document that does not parse is ignored whole (provider/core/changes.py parses it with
bounds) and said once a minute at most; a records document must carry its own ConfigMap's
source name, so no document speaks for another source.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from typing import Any

from provider.core import changes
from provider.core.kube import KubeClient, Object, configmaps, pod_namespace
from provider.core.kubewatch import ListWatch
from provider.mount.changes import Coverage

log = logging.getLogger("secrets_bridge.feed")

#: Seconds between two refusals said in the log.
SAY_EVERY = 60.0


def namespace(configured: str) -> str:
    """The feed's namespace: --feed-namespace, else this pod's, else "default"."""
    return configured or pod_namespace() or "default"


class NodeFeed:
    """`await NodeFeed(client, namespace, coverage).run()` until cancelled."""

    def __init__(self, client: KubeClient, namespace: str, coverage: Coverage) -> None:
        self._coverage = coverage
        self._said = -SAY_EVERY
        self._watch = ListWatch(
            client,
            configmaps(namespace),
            changes.SELECTOR,
            on_sync=self._sync,
            on_event=self._event,
        )
        #: Seconds between checks of the heartbeat's age: a few per --feed-stale-after.
        self._check_every = max(0.5, min(5.0, coverage.stale_after / 6))

    async def run(self) -> None:
        checks = asyncio.create_task(self._checks())
        try:
            await self._watch.run()
        finally:
            checks.cancel()

    async def _checks(self) -> None:
        while True:
            await asyncio.sleep(self._check_every)
            self._coverage.check()

    def _sync(self, items: Sequence[Object]) -> None:
        for obj in items:
            self._apply(obj)

    def _event(self, kind: str, obj: Object) -> None:
        if kind != "DELETED":  # a deleted document says nothing; its next one starts anew
            self._apply(obj)

    def _apply(self, obj: Object) -> None:
        metadata: Any = obj.get("metadata") or {}
        name = metadata.get("name", "") if isinstance(metadata, dict) else ""
        data: Any = obj.get("data")
        try:
            if name == changes.HEALTH_NAME:
                self._coverage.health(changes.parse_health(data))
            elif isinstance(name, str) and name.startswith(changes.RECORDS_PREFIX):
                records = changes.parse_records(data)
                if changes.records_name(records.source) != name:
                    raise changes.BadDocument(f"its source is {records.source!r}")
                self._coverage.records(records)
        except changes.BadDocument as exc:
            now = time.monotonic()
            if now - self._said >= SAY_EVERY:
                self._said = now
                log.warning("change feed: ConfigMap %.80s ignored: %s", name, exc)
