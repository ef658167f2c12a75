"""A Mount request's parsed form, kept by its raw fields: the cached mount's first step.

The driver re-sends each volume's request unchanged at every rotation poll, and the kubelet's
retries send it again. Parsing it — the attributes and tokens JSON, then the class's plan
lookup, which keys the parameters as a set — was over a third of what a cached mount cost the
provider beyond the bench's echo floor (measured: BENCHMARKS.md, "Parsed requests kept by their
raw fields"). It is a pure
function of the four fields, so its result is kept by them, exactly: a token or a parameter
that differs by one byte is another entry, and nothing is shared between two requests that
are not byte for byte the same. A request that does not parse is not kept (its error is
raised afresh each time), nor is one whose class is refused (the mounter keeps that verdict).

Bounds: entries and raw bytes (a hostile class is megabytes of parameters; such a request is
simply parsed every time). What an entry holds — the pod's token and the node-publish secret
among it — is what the request carried and the identity caches hold anyway; it is dropped when
the entry is evicted. A namespace sending many distinct requests can evict others' entries:
they are parsed again, which is what every mount cost without this memo.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from provider.core.errors import InvalidParameters
from provider.core.memo import Memo
from provider.edge.attributes import parse_request
from provider.mount.mounting import Mounter, MountInput
from provider.mount.planning import MountPlan

#: Distinct requests kept: a node runs a few hundred volumes at most.
MAX_ENTRIES = 1024
#: Raw request bytes kept in all (a typical request is 2-4 KiB with its token).
MAX_BYTES = 4 * 1024 * 1024
#: A larger request is parsed at each mount rather than kept.
MAX_ENTRY_BYTES = 64 * 1024


@dataclass(frozen=True, slots=True)
class Prepared:
    input: MountInput
    #: The class's plan; None when the class is refused (`Mounter.mount` raises its problems).
    plan: MountPlan | None
    #: The pod's fields of the mount's log lines; shared by every mount of this entry, so
    #: never changed (a line adds its own fields to a copy).
    fields: dict[str, object]
    #: The backend as the class names it (the metrics label is checked against a fixed set).
    backend: str


class Requests:
    def __init__(
        self,
        mounter: Mounter,
        *,
        max_entries: int = MAX_ENTRIES,
        max_bytes: int = MAX_BYTES,
        max_entry_bytes: int = MAX_ENTRY_BYTES,
    ) -> None:
        self._mounter = mounter
        self._memo: Memo[tuple[str, str, str, str], Prepared] = Memo(max_entries, max_bytes)
        self._max_entry_bytes = max_entry_bytes

    async def prepare(
        self,
        attributes: str,
        secrets: str,
        permission: str,
        target_path: str,
        deadline: float = math.inf,
    ) -> Prepared:
        """The parsed request; raises `InvalidParameters` for one that does not parse. A class
        nobody parsed yet is parsed within the pod's namespace's share (`plan_in_turn`), by
        `deadline` (time.monotonic())."""
        key = (attributes, secrets, permission, target_path)
        held = self._memo.get(key)
        if held is not None:
            return held
        mount_input = parse_request(attributes, secrets, permission, target_path)
        params = mount_input.params
        pod = mount_input.pod
        fields: dict[str, object] = {
            "namespace": pod.namespace,
            "pod": pod.name,
            "serviceaccount": pod.service_account,
            "class": params.get("secretProviderClass", ""),
        }
        backend = "multi" if "stores" in params else params.get("backend", "unknown")
        try:
            plan: MountPlan | None = await self._mounter.plan_in_turn(
                params, pod.namespace, deadline
            )
        except InvalidParameters:
            plan = None  # the mount raises the class's problems, with the pod's log fields
        prepared = Prepared(mount_input, plan, fields, backend)
        size = len(attributes) + len(secrets) + len(permission) + len(target_path)
        if plan is not None and size <= self._max_entry_bytes:
            self._memo.put(key, prepared, size)
        return prepared

    def __len__(self) -> int:
        return len(self._memo)
