"""One Mount, store-neutral: raw request -> plan -> identity -> fetch -> files
(provider/mount/building.py).

All or nothing: every object's failure is gathered into one error, and no file is returned
unless every object and template succeeded and every path passed the driver's rules.

The driver re-sends each volume's request unchanged at every rotation poll, so the mounter keeps
each parsed request by its four raw fields, byte for byte (`prepare`), with the answer it last
got (`Request.answer`); while every value that answer was built from is still the one the value
cache keeps, within the class's window, that answer is the next mount's (`answered`): no parse,
no identify, no key looked up. An `Answer` is shared by the requests of one class, namespace and
permission built from the same cache entries, and lives exactly as long as those entries: when
the cache drops one (expired, replaced, evicted), the answer and its files are dropped with it,
so with caching off no secret outlives its Mount here.

Bounds: requests kept by entries and raw bytes (a hostile class is megabytes of parameters;
such a request is parsed at every mount); answers by their file bytes. A namespace sending many
distinct requests can evict others' entries: they are parsed again, which is what every mount
cost without them. What a request entry holds — the pod's token and the node-publish secret
among it — is what the request carried and the identity caches hold anyway.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import math
import time
import weakref
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

from provider.core.backend import INLINE_PARSE_BYTES
from provider.core.boundedyaml import yaml_node_budget
from provider.core.caching import Entry
from provider.core.errors import InvalidParameters, MountFailed
from provider.core.files import File, ObjectVersion
from provider.core.identity import pod_named
from provider.core.limits import PARSE_SHARE, PARSE_WINDOW, WorkShares
from provider.core.memo import Memo
from provider.core.model import FetchContext, ObjectSpec, Pod, SecretValue, Source
from provider.core.versions import Versioner
from provider.mount import gathering
from provider.mount.auditing import Served, served
from provider.mount.backends import Backends
from provider.mount.building import Builder
from provider.mount.fetching import Fetcher
from provider.mount.planning import KUBELET_PREFIX, MULTI, MountPlan, RefreshBounds, parse_plan
from provider.mount.reads import StoreRead
from provider.mount.request import MountInput, Raw, parse_request

__all__ = ["DEFAULT_DEADLINE", "Answer", "MountInput", "MountResult", "Mounter", "Request"]

log = logging.getLogger("secrets_bridge.mounting")

#: The kubelet gives NodePublish about two minutes; used when the caller set no deadline.
DEFAULT_DEADLINE = 120.0
#: Distinct SecretProviderClass parameter sets whose parsed plans (or refusals) are kept.
PLAN_CACHE_SIZE = 512
#: Parameter text those plans may hold in all: a class may be megabytes of unused parameters.
PLAN_CACHE_BYTES = 16 * 1024 * 1024
#: A class's parameters as plans are kept by: the kubelet's own keys left out.
PlanKey = frozenset[tuple[str, str]]
#: File bytes the kept answers may hold in all (each is at most --max-response-bytes), with
#: what the edge made of them (their protobuf: as many bytes again).
ANSWER_CACHE_BYTES = 16 * 1024 * 1024
#: Distinct requests kept: a node runs a few hundred volumes at most.
MAX_REQUESTS = 1024
#: Raw request bytes kept in all (a typical request is 2-4 KiB with its token).
MAX_REQUEST_BYTES = 4 * 1024 * 1024
#: A larger request is parsed at each mount rather than kept.
MAX_KEPT_REQUEST = 64 * 1024
#: (namespace, plan, permission, the cache entries' ids)
AnswerKey = tuple[str, int, int, tuple[int, ...]]


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


class Answer:
    """A mount's answer, and what the edge made of it (`reply`, its protobuf): kept with the
    value-cache entries it was built from (`held`, weakly), dropped with the first of them."""

    __slots__ = ("held", "plan", "reply", "result")

    def __init__(
        self,
        result: MountResult,
        plan: MountPlan | None = None,
        held: tuple[weakref.ref[Entry[Sequence[SecretValue]]], ...] = (),
    ) -> None:
        self.result: MountResult | None = result
        self.reply: object = None
        #: The plan it was built with (held, so its id keys no other plan's answer).
        self.plan = plan
        self.held = held

    def drop(self) -> None:
        self.result = self.reply = None


@dataclass(eq=False, slots=True)
class Request:
    """A parsed request, kept by its raw fields (`Mounter.prepare`): what every later mount of
    the same fields starts from, and the answer it last got."""

    input: MountInput
    #: The class's plan; None when the class is refused (`Mounter.answer` raises its problems).
    plan: MountPlan | None
    #: The pod's fields of the mount's log lines; shared by every mount of this entry, so
    #: never changed (a line adds its own fields to a copy).
    fields: dict[str, object]
    #: The backend as the class names it (the metrics label is checked against a fixed set).
    backend: str
    #: The answer last built for it, while the values it was built from are cached.
    answer: Answer | None = None
    #: Until when the pod's identities that answer was read as hold (`Identity.expires`).
    identified_until: float = math.inf


class Mounter:
    def __init__(
        self,
        *,
        backends: Backends,
        fetcher: Fetcher,
        versioner: Versioner,
        enable_test_stores: bool,
        max_objects: int,
        max_response_bytes: int,
        strict_parameters: bool = False,
        refresh_bounds: RefreshBounds | None = None,
        shares: WorkShares | None = None,
    ) -> None:
        self._backends = backends
        self._strict = strict_parameters
        self._refresh_bounds = refresh_bounds
        self._fetcher = fetcher
        #: The change feed's view, when the fetcher has one (the edge feeds it).
        self.coverage = fetcher.coverage
        self._builder = Builder(versioner, max_response_bytes, max_objects)
        self._enable_test_stores = enable_test_stores
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
        #: Parsed requests by their raw fields, with their answers.
        self._requests: Memo[Raw, Request] = Memo(MAX_REQUESTS, MAX_REQUEST_BYTES)
        #: The answers requests share, by what they were built from; one dropped here is dead.
        self._answers: Memo[AnswerKey, Answer] = Memo(
            PLAN_CACHE_SIZE, ANSWER_CACHE_BYTES, on_drop=Answer.drop
        )

    def recall(self, raw: Raw) -> Request | None:
        """The request of these very fields, as `prepare` kept it, if it is kept."""
        return self._requests.get(raw)

    def answered(self, request: Request) -> Answer | None:
        """The request's last answer, if every value it was built from is still cached within
        the class's window: the whole of a mount answered again (no parse, identify or key
        lookup). Its `result` is set."""
        answer = request.answer
        if answer is None or answer.result is None or request.plan is None:
            return None
        until = request.identified_until
        if until != math.inf and time.monotonic() >= until:
            return None  # identify would read what it read again: it runs, on the full path
        return answer if self._fetcher.fresh(answer.held, request.plan.refresh) else None

    async def prepare(self, raw: Raw, deadline: float = math.inf) -> Request:
        """The parsed request; raises `InvalidParameters` for one that does not parse. A class
        nobody parsed yet is parsed within the pod's namespace's share (`plan_in_turn`), by
        `deadline` (time.monotonic()). Kept by its raw fields unless its class is refused
        (the plan memo keeps that verdict) or it is large."""
        held = self._requests.get(raw)
        if held is not None:
            return held
        mount_input = parse_request(*raw)
        params, pod = mount_input.params, mount_input.pod
        fields: dict[str, object] = {
            "namespace": pod.namespace,
            "pod": pod.name,
            "serviceaccount": pod.service_account,
            "class": params.get("secretProviderClass", ""),
        }
        backend = MULTI if "stores" in params else params.get("backend", "unknown")
        try:
            plan: MountPlan | None = await self.plan_in_turn(params, pod.namespace, deadline)
        except InvalidParameters:
            plan = None  # the mount raises the class's problems, with the pod's log fields
        request = Request(mount_input, plan, fields, backend)
        size = sum(len(field) for field in raw)
        if plan is not None and size <= MAX_KEPT_REQUEST:
            self._requests.put(raw, request, size)
        return request

    def requests_kept(self) -> int:
        return len(self._requests)

    async def answer(
        self, request: Request, *, budget: float | None = None, audit: bool = False
    ) -> Answer:
        """`mount` of a prepared request; the answer is kept with it when it can be
        (`answered`)."""
        plan = request.plan if request.plan is not None else self.plan(request.input.params)
        answer, until = await self._answer(request.input, plan, budget, audit)
        request.answer = answer if answer.held else None
        request.identified_until = until
        return answer

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
                options_for=self._backends.options_for,
                enable_test_stores=self._enable_test_stores,
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
        already holds it."""
        if plan is None:
            plan = self.plan(request.params)
        result = (await self._answer(request, plan, budget, audit))[0].result
        assert result is not None  # a fresh answer: nothing dropped it yet
        return result

    async def _answer(
        self, request: MountInput, plan: MountPlan, budget: float | None, audit: bool
    ) -> tuple[Answer, float]:
        """The answer, and until when the identities it was read as hold."""
        # The budget counts from the call, not from after identify (a TokenRequest takes time).
        now = time.monotonic()
        # Identity first: no token, no answer — before any cache is consulted.
        reads = await gathering.identify(plan, request.pod, self._backends.get)
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
        scope = request.pod.namespace
        entries = self._entries(plan, got, reads)
        key = None if entries is None else _answer_key(plan, entries, request.permission, scope)
        # A kept answer holds its plan, so the plan's id in its key names no other plan; and the
        # memo holds no dropped answer (Memo hands each to Answer.drop as it lets it go).
        answer = None if key is None else self._answers.get(key)
        if answer is None:
            deadline = now + (DEFAULT_DEADLINE if budget is None else budget)
            result = await self._build(plan, got, request.permission, request.pod, deadline)
            answer = self._keep(key, plan, entries, result)
        until = min(read.identity.expires for read in reads)
        if sources is None:
            return answer, until
        assert answer.result is not None
        return Answer(_with_served(answer.result, plan, sources, got.values)), until

    def _entries(
        self, plan: MountPlan, got: gathering.Gathered, reads: Sequence[StoreRead]
    ) -> list[Entry[Sequence[SecretValue]]] | None:
        """The value-cache entries of the class's values, or None when the answer may not be
        kept by them — when the cached path (`gathering.cached`) would not have served them:
        a value not cached (caching off, a stale copy, a held credential), an object from its
        fallback store (its primary is read again at each mount), an optional object absent,
        an empty selection."""
        if got.absent:
            return None
        values = [got.values.get(key) for key in plan.keys]
        if not values or not all(values):
            return None
        keys = [reads[index].key(ref) for index, ref in plan.keys]
        return self._fetcher.entries(keys, cast(list[Sequence[SecretValue]], values))

    def _keep(
        self,
        key: AnswerKey | None,
        plan: MountPlan,
        entries: Sequence[Entry[Sequence[SecretValue]]] | None,
        result: MountResult,
    ) -> Answer:
        """The answer, kept by its cache entries when it has them: each entry's end ends it."""
        # The edge's protobuf of it holds the same bytes again.
        size = 2 * sum(len(f.contents) for f in result.files)
        if key is None or entries is None or size > ANSWER_CACHE_BYTES:
            return Answer(result)
        forget = functools.partial(self._forget, key)
        answer = Answer(result, plan, tuple(weakref.ref(entry, forget) for entry in entries))
        self._answers.put(key, answer, size)
        return answer

    def _forget(self, key: AnswerKey, _entry: object) -> None:
        """A cache entry an answer was built from is gone: so is the answer."""
        self._answers.drop(key)

    def requested(self, params: Mapping[str, str]) -> tuple[Served, ...]:
        """What a refused mount asked for, for the audit trail (nothing if the class does not
        parse)."""
        try:
            return served(self.plan(params), (), None)
        except InvalidParameters:
            return ()

    async def _build(
        self, plan: MountPlan, got: gathering.Gathered, permission: int, pod: Pod, deadline: float
    ) -> MountResult:
        """Build the files. Values that must be parsed (extract, explode) and are large are
        built off the event loop, in the namespace's share: a 3.9 MB secret of 220,000 keys
        takes 0.1-0.2 s to parse."""
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
        return result


def _parses_much(got: gathering.Gathered) -> bool:
    """Whether building parses more values (extract, explode) than are parsed on the loop."""
    size = 0
    for spec, key in got.inputs:
        if not spec.transforms.identity:
            size += sum(len(value.content) for value in got.values.get(key, ()))
    return size > INLINE_PARSE_BYTES


def _answer_key(
    plan: MountPlan, entries: Sequence[Entry[Sequence[SecretValue]]], permission: int, scope: str
) -> AnswerKey:
    return (scope, id(plan), permission, tuple(id(entry) for entry in entries))


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
