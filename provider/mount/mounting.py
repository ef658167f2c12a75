"""One Mount, store-neutral: plan -> identity -> fetch -> files (provider/mount/building.py).

All or nothing: every object's failure is gathered into one error, and no file is returned
unless every object and template succeeded and every path passed the driver's rules.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import time
import weakref
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from provider.core.backend import INLINE_PARSE_BYTES, AnyBackend
from provider.core.boundedyaml import yaml_node_budget
from provider.core.errors import InvalidParameters, MountFailed
from provider.core.files import File, ObjectVersion
from provider.core.identity import pod_named
from provider.core.limits import PARSE_SHARE, PARSE_WINDOW, WorkShares
from provider.core.memo import Memo
from provider.core.model import FetchContext, ObjectSpec, Pod, SecretValue, Source
from provider.core.versions import Versioner
from provider.mount import gathering
from provider.mount.auditing import Served, served
from provider.mount.building import Builder
from provider.mount.fetching import Fetcher
from provider.mount.planning import KUBELET_PREFIX, MountPlan, RefreshBounds, parse_plan
from provider.mount.reads import StoreRead

log = logging.getLogger("secrets_bridge.mounting")

#: The kubelet gives NodePublish about two minutes; used when the caller set no deadline.
DEFAULT_DEADLINE = 120.0
#: Distinct SecretProviderClass parameter sets whose parsed plans (or refusals) are kept.
PLAN_CACHE_SIZE = 512
#: Parameter text those plans may hold in all: a class may be megabytes of unused parameters.
PLAN_CACHE_BYTES = 16 * 1024 * 1024
#: A class's parameters as plans are kept by: the kubelet's own keys left out.
PlanKey = frozenset[tuple[str, str]]
#: File bytes the memoized answers may hold in all (each is at most --max-response-bytes).
ANSWER_CACHE_BYTES = 16 * 1024 * 1024


@dataclass(frozen=True)
class MountInput:
    params: Mapping[str, str]
    pod: Pod
    #: Default file mode from the request's `permission`.
    permission: int
    target_path: str = ""


@dataclass(frozen=True)
class MountResult:
    files: tuple[File, ...]
    versions: tuple[ObjectVersion, ...]
    backend: str
    #: Each object's name and the versions of the files it yielded (`file: false` ones too).
    object_versions: tuple[tuple[str, tuple[str, ...]], ...] = ()
    #: With `mount(..., audit=True)`: what the audit trail records of each object.
    served: tuple[Served, ...] = ()
    #: The class's `refreshInterval` (seconds, within the provider's bounds), if it set one.
    refresh: float | None = None


class Mounter:
    def __init__(
        self,
        *,
        backend_for: Callable[[str], AnyBackend],
        options_for: Callable[[str], Any],
        fetcher: Fetcher,
        versioner: Versioner,
        enable_fake: bool,
        max_objects: int,
        max_response_bytes: int,
        strict_parameters: bool = False,
        refresh_bounds: RefreshBounds | None = None,
        shares: WorkShares | None = None,
    ) -> None:
        self._backend_for = backend_for
        self._strict = strict_parameters
        self._refresh_bounds = refresh_bounds
        self._options_for = options_for
        self._fetcher = fetcher
        self._builder = Builder(versioner, max_response_bytes, max_objects)
        self._enable_fake = enable_fake
        self._max_objects = max_objects
        # Parsed plans by parameters: every pod of a class sends the same parameters, and
        # parsing YAML costs more than the rest of a cached mount. Plans are pure functions of
        # the parameters (and the fixed provider options), so reusing them is safe.
        # A refused class is kept too (its problems), so the kubelet's retries of a class that
        # fails late in parsing do not parse it again.
        self._plans: Memo[PlanKey, MountPlan | _Refused] = Memo(PLAN_CACHE_SIZE, PLAN_CACHE_BYTES)
        #: Parsing classes nobody parsed yet, and building answers from large values: off the
        #: loop, within each namespace's one share (the stores' large answers use it too).
        self._shares = shares or WorkShares(PARSE_SHARE, PARSE_WINDOW)
        self._parsing: dict[PlanKey, asyncio.Future[MountPlan | _Refused]] = {}
        self._answers: Memo[
            tuple[str, int, int, tuple[int, ...]],
            tuple[MountPlan, tuple[weakref.ref[SecretValue], ...], MountResult],
        ] = Memo(PLAN_CACHE_SIZE, ANSWER_CACHE_BYTES)

    def plan(self, params: Mapping[str, str]) -> MountPlan:
        """The class's plan, parsed here if nobody parsed it yet (`check`, `mount`, tests)."""
        key = _plan_key(params)
        held = self._plans.get(key)
        if held is None:
            held = self._settle(params, key, self._parse(params))
        return _verdict(held)

    async def plan_in_turn(
        self, params: Mapping[str, str], namespace: str, deadline: float
    ) -> MountPlan:
        """The class's plan; one nobody parsed yet is parsed off the event loop, within the
        pod's namespace's share of parsing (WorkShares, issue 32), once for all the mounts
        that bring it together."""
        key = _plan_key(params)
        held = self._plans.get(key)
        if held is not None:
            return _verdict(held)
        parsing = self._parsing.get(key)
        if parsing is None:
            parsing = self._parsing[key] = asyncio.ensure_future(
                self._shares.run(
                    namespace,
                    functools.partial(self._parse, params),
                    deadline,
                    f"class {params.get('secretProviderClass', '')!r}",
                )
            )
            parsing.add_done_callback(lambda _f: self._parsing.pop(key, None))
            parsed = await asyncio.shield(parsing)
            return _verdict(self._settle(params, key, parsed))
        await asyncio.shield(parsing)
        return self.plan(params)  # settled by the mount that parsed it

    def _parse(self, params: Mapping[str, str]) -> MountPlan | _Refused:
        """Pure: the plan, or the class's problems (run in a worker thread by plan_in_turn)."""
        try:
            return parse_plan(
                params,
                options_for=self._options_for,
                enable_fake=self._enable_fake,
                max_objects=self._max_objects,
                strict=self._strict,
                refresh_bounds=self._refresh_bounds,
            )
        except InvalidParameters as exc:
            return _Refused(tuple(exc.problems))

    def _settle(
        self,
        params: Mapping[str, str],
        key: frozenset[tuple[str, str]],
        parsed: MountPlan | _Refused,
    ) -> MountPlan | _Refused:
        """Keep a parse's verdict (a refused class too: the kubelet's retries of a class that
        fails late in parsing do not parse it again), and log a plan's warnings once."""
        if self._plans.get(key) is not None:
            return parsed
        self._plans.put(key, parsed, sum(len(k) + len(v) for k, v in key))
        if isinstance(parsed, MountPlan) and parsed.warnings:
            # Once per distinct class (plans are cached): likely typos, unused parameters.
            log.warning(
                "class parameters need attention",
                extra={
                    "fields": {
                        "class": params.get("secretProviderClass", ""),
                        "warnings": list(parsed.warnings),
                    }
                },
            )
        return parsed

    async def mount(
        self,
        request: MountInput,
        *,
        budget: float | None = None,
        audit: bool = False,
        plan: MountPlan | None = None,
    ) -> MountResult:
        """The answer; with `audit` (the audit trail is on), also what it records of each
        object in `MountResult.served`. `plan` is `self.plan(request.params)` when the caller
        already holds it (the edge keeps it with the parsed request)."""
        # The budget counts from the call, not from after identify (a TokenRequest takes time).
        now = time.monotonic()
        if plan is None:
            plan = self.plan(request.params)
        # Identity first: no token, no answer — before any cache is consulted.
        reads = await gathering.identify(plan, request.pod, self._backend_for)
        # Every value cached: the answer without setting up a read. (With the audit trail on,
        # the read below also says where each value came from.)
        got = None if audit else gathering.cached(self._fetcher, plan, reads)
        sources: dict[Hashable, Source] | None = {} if audit else None
        if got is None:
            ctx = FetchContext.within(DEFAULT_DEADLINE if budget is None else budget, now)
            got = await gathering.gather(
                plan,
                reads,
                ctx,
                fetcher=self._fetcher,
                owner=plan.owner(request.pod),
                sources=sources,
            )
        if got.failures:
            # Report every problem at once: the objects that were fetched are built too, so a
            # wrong secretKey shows up beside an unreachable path, not after it is fixed.
            failures = got.failures + self._builder.failures(got.inputs, got.values)
            raise MountFailed(failures, context=_where(plan, reads, request.pod))
        if got.absent:
            _announce_absent(plan, got.absent, request.pod)
        answer = self._memoized(plan, got, request.permission, request.pod.namespace)
        if answer is None:
            deadline = now + (DEFAULT_DEADLINE if budget is None else budget)
            answer = await self._build(plan, got, request.permission, request.pod, deadline)
        return answer if sources is None else _with_served(answer, plan, sources, got.values)

    def requested(self, params: Mapping[str, str]) -> tuple[Served, ...]:
        """What a refused mount asked for, for the audit trail (nothing if the class does not
        parse)."""
        try:
            return served(self.plan(params), (), None)
        except InvalidParameters:
            return ()

    def _memoized(
        self, plan: MountPlan, got: gathering.Gathered, permission: int, scope: str
    ) -> MountResult | None:
        """The answer built from the very same value objects (a value-cache hit), if held.

        Building (transforms, templates, HMACs, path checks) is a pure function of the plan,
        the permission, the version scope (the namespace) and the values. The entry holds the
        values only weakly, and is dropped when they die: an answer lives exactly as long as a
        cache (value cache, AWS revalidation, serve-stale) keeps its values, so with caching
        off no secret outlives its Mount here.
        """
        flat = [value for seq in got.values.values() for value in seq]
        entry = self._answers.get(_answer_key(plan, flat, permission, scope))
        if entry is not None:
            held_plan, held_values, result = entry
            if held_plan is plan and all(
                ref() is value for ref, value in zip(held_values, flat, strict=True)
            ):
                return result
        return None

    async def _build(
        self, plan: MountPlan, got: gathering.Gathered, permission: int, pod: Pod, deadline: float
    ) -> MountResult:
        """Build the files, and keep the answer for as long as its values live. Values that
        must be parsed (extract, explode) and are large are built off the event loop, in the
        namespace's share: a 3.9 MB secret of 220,000 keys takes 0.1-0.2 s to parse."""
        scope = pod.namespace

        def build() -> MountResult:
            # One YAML budget for all the secret values of the mount (provider/core/boundedyaml.py).
            with yaml_node_budget():
                absent = [spec.name for spec in got.absent]
                built = self._builder.build(plan, got.inputs, got.values, permission, scope, absent)
            return MountResult(
                built.files, built.versions, plan.backend, built.object_versions, (), plan.refresh
            )

        if _parses_much(got):
            what = f"building class {plan.class_name!r}"
            result = await self._shares.run(scope, build, deadline, what)
        else:
            result = build()
        flat = [value for seq in got.values.values() for value in seq]
        key = _answer_key(plan, flat, permission, scope)
        size = sum(len(f.contents) for f in result.files)
        self._answers.put(key, (plan, tuple(weakref.ref(v) for v in flat), result), size)
        for value in flat:
            weakref.finalize(value, self._answers.drop, key)
        return result


def _parses_much(got: gathering.Gathered) -> bool:
    """Whether building parses more values (extract, explode) than are parsed on the loop."""
    size = 0
    for spec, key in got.inputs:
        if not spec.transforms.identity:
            size += sum(len(value.content) for value in got.values.get(key, ()))
    return size > INLINE_PARSE_BYTES


def _answer_key(
    plan: MountPlan, flat: Sequence[SecretValue], permission: int, scope: str
) -> tuple[str, int, int, tuple[int, ...]]:
    return (scope, id(plan), permission, tuple(id(v) for v in flat))


@dataclass(frozen=True)
class _Refused:
    """A class that failed to parse: its problems, raised afresh on each hit."""

    problems: tuple[str, ...]


def _plan_key(params: Mapping[str, str]) -> PlanKey:
    return frozenset((k, v) for k, v in params.items() if not k.startswith(KUBELET_PREFIX))


def _verdict(held: MountPlan | _Refused) -> MountPlan:
    if isinstance(held, _Refused):
        raise InvalidParameters(list(held.problems))
    return held


def _announce_absent(plan: MountPlan, absent: Sequence[ObjectSpec[Any]], pod: Pod) -> None:
    """A warning the first time each optional object of a class is found missing (once per
    plan: every pod of the class polls it every minute)."""
    new = [spec for spec in absent if spec.name not in plan.absent_announced]
    if not new:
        return
    plan.absent_announced.update(spec.name for spec in new)
    log.warning(
        "optional objects not found; their files are left out",
        extra={
            "fields": {
                "class": plan.class_name,
                "pod": pod.subject,
                "objects": [f"{spec.name} ({spec.field})" for spec in new],
            }
        },
    )


def _where(plan: MountPlan, reads: Sequence[StoreRead], pod: Pod) -> str:
    """Whose mount failed: the pod and its service account (the identity every store reads
    as), after the store of a one-store class (a class of several names the store in each
    failure)."""
    if plan.named:
        return f"pod {pod_named(pod)}"
    return f"{reads[0].store}, pod {pod_named(pod)}"


def _with_served(
    answer: MountResult,
    plan: MountPlan,
    sources: Mapping[Any, Source],
    values: Mapping[Hashable, Sequence[SecretValue]],
) -> MountResult:
    # The memoized answer is shared by every mount built from the same values; the record of
    # where they came from is this mount's own.
    return dataclasses.replace(answer, served=served(plan, answer.object_versions, sources, values))
