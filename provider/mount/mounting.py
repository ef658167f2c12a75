"""One Mount, store-neutral: plan -> identity -> fetch -> transforms/templates -> files.

All or nothing: every object's failure is gathered into one error, and no file is returned
unless every object and template succeeded and every path passed the driver's rules.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from provider.core.errors import BridgeError, InvalidParameters, LimitExceeded, MountFailed
from provider.core.files import File, ObjectVersion, overlap_problems, path_problem
from provider.core.model import Backend, FetchContext, ObjectSpec, Pod, SecretValue
from provider.core.versions import Versioner
from provider.mount import templates, transforms
from provider.mount.fetching import Fetcher
from provider.mount.planning import KUBELET_PREFIX, MountPlan, parse_plan

log = logging.getLogger("secrets_bridge.mounting")

#: The kubelet gives NodePublish about two minutes; used when the caller set no deadline.
DEFAULT_DEADLINE = 120.0
#: Distinct SecretProviderClass parameter sets whose parsed plans are kept.
PLAN_CACHE_SIZE = 512


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


class Mounter:
    def __init__(
        self,
        *,
        backend_for: Callable[[str], Backend],
        options_for: Callable[[str], Any],
        fetcher: Fetcher,
        versioner: Versioner,
        enable_fake: bool,
        max_objects: int,
        max_response_bytes: int,
    ) -> None:
        self._backend_for = backend_for
        self._options_for = options_for
        self._fetcher = fetcher
        self._versioner = versioner
        self._enable_fake = enable_fake
        self._max_objects = max_objects
        self._max_bytes = max_response_bytes
        # Parsed plans by parameters: every pod of a class sends the same parameters, and
        # parsing YAML costs more than the rest of a cached mount. Plans are pure functions of
        # the parameters (and the fixed provider options), so reusing them is safe.
        self._plans: OrderedDict[frozenset[tuple[str, str]], MountPlan] = OrderedDict()
        self._answers: OrderedDict[
            tuple[int, int, tuple[int, ...]],
            tuple[MountPlan, tuple[Sequence[SecretValue], ...], MountResult],
        ] = OrderedDict()

    def plan(self, params: Mapping[str, str]) -> MountPlan:
        key = frozenset((k, v) for k, v in params.items() if not k.startswith(KUBELET_PREFIX))
        plan = self._plans.get(key)
        if plan is not None:
            self._plans.move_to_end(key)
            return plan
        plan = parse_plan(
            params,
            options_for=self._options_for,
            enable_fake=self._enable_fake,
            max_objects=self._max_objects,
        )
        self._plans[key] = plan
        if plan.warnings:
            # Once per distinct class (plans are cached): likely typos, unused parameters.
            log.warning(
                "class parameters need attention",
                extra={
                    "fields": {
                        "class": params.get("secretProviderClass", ""),
                        "warnings": list(plan.warnings),
                    }
                },
            )
        if len(self._plans) > PLAN_CACHE_SIZE:
            self._plans.popitem(last=False)
        return plan

    async def mount(self, request: MountInput, *, budget: float | None = None) -> MountResult:
        plan = self.plan(request.params)
        backend = self._backend_for(plan.store.backend)
        # Identity first: no token, no answer — before any cache is consulted.
        identity = await backend.identify(plan.store, request.pod)
        now = time.monotonic()
        seconds = DEFAULT_DEADLINE if budget is None else budget
        ctx = FetchContext(deadline=now + seconds, retry_deadline=now + seconds / 3)
        refs = [spec.ref for spec in plan.store.objects]
        fetched = await self._fetcher.fetch(backend, plan.store, identity, refs, ctx)
        failures: list[tuple[str, BridgeError]] = []
        values: dict[Hashable, Sequence[SecretValue]] = {}
        for spec in plan.store.objects:
            result = fetched[spec.ref]
            if isinstance(result, BridgeError):
                failures.append((spec.name, result))
            else:
                values[spec.ref] = result
        if failures:
            # Report every problem at once: the objects that were fetched are built too, so a
            # wrong secretKey shows up beside an unreachable path, not after it is fixed.
            failures += self._build_failures(plan, values)
            raise MountFailed(failures, context=f"{plan.store.backend}, {identity.subject}")
        return self._build_memoized(plan, values, request.permission)

    def _build_failures(
        self, plan: MountPlan, values: Mapping[Hashable, Sequence[SecretValue]]
    ) -> list[tuple[str, BridgeError]]:
        failures: list[tuple[str, BridgeError]] = []
        for spec in plan.store.objects:
            if spec.ref in values:
                try:
                    self._object_files(spec, values[spec.ref])
                except BridgeError as exc:
                    failures.append((spec.name, exc))
        return failures

    def _build_memoized(
        self, plan: MountPlan, values: dict[Hashable, Sequence[SecretValue]], permission: int
    ) -> MountResult:
        """Reuse the answer built from the very same value objects (a value-cache hit).

        Building (transforms, templates, HMACs, path checks) is a pure function of the plan,
        the permission and the values; the entry holds the value objects themselves, so an
        identity check (`is`) proves they are the same ones the answer was built from.
        """
        key = (id(plan), permission, tuple(id(v) for v in values.values()))
        entry = self._answers.get(key)
        if entry is not None:
            held_plan, held_values, result = entry
            if held_plan is plan and all(
                a is b for a, b in zip(held_values, values.values(), strict=True)
            ):
                self._answers.move_to_end(key)
                return result
        result = self._build(plan, values, permission)
        self._answers[key] = (plan, tuple(values.values()), result)
        if len(self._answers) > PLAN_CACHE_SIZE:
            self._answers.popitem(last=False)
        return result

    def _build(
        self, plan: MountPlan, values: Mapping[Hashable, Sequence[SecretValue]], permission: int
    ) -> MountResult:
        files: list[File] = []
        versions: list[ObjectVersion] = []
        inputs: dict[str, bytes] = {}
        input_versions: dict[str, str] = {}
        failures: list[tuple[str, BridgeError]] = []
        for spec in plan.store.objects:
            try:
                built = self._object_files(spec, values[spec.ref])
            except BridgeError as exc:
                failures.append((spec.name, exc))
                continue
            for path, content, version_id, version in built:
                inputs[path] = content
                input_versions[path] = version
                if spec.transforms.file:
                    mode = permission if spec.mode is None else spec.mode
                    files.append(File(path, mode, content))
                    versions.append(ObjectVersion(version_id, version))
        if failures:
            raise MountFailed(failures, context=plan.store.backend)
        for tmpl in plan.templates:
            content = templates.render(tmpl, inputs)
            used = sorted(tmpl.objects or inputs)
            version = self._versioner.of_inputs(
                tmpl.path, [input_versions.get(n, "") for n in used], content
            )
            mode = permission if tmpl.mode is None else tmpl.mode
            files.append(File(tmpl.path, mode, content))
            versions.append(ObjectVersion(tmpl.path, version))
        self._check(files)
        return MountResult(tuple(files), tuple(versions), plan.store.backend)

    def _object_files(
        self, spec: ObjectSpec, values: Sequence[SecretValue]
    ) -> list[tuple[str, bytes, str, str]]:
        """(path, content, version id, version) for each file of one object."""
        out = []
        for value in values:
            base = f"{spec.name}/{value.suffix}" if value.suffix else spec.name
            for sub, content in transforms.apply(spec, value):
                path = f"{base}/{sub}" if sub else base
                problem = path_problem(path)
                if problem:
                    raise InvalidParameters(f"{spec.field or 'object'}: {problem}")
                version_id = value.version_id if value.version_id and not sub else path
                if value.version and spec.transforms.identity:
                    version = value.version
                else:
                    version = self._versioner.of_content(version_id, content)
                out.append((path, content, version_id, version))
        return out

    def _check(self, files: list[File]) -> None:
        problems = overlap_problems([f.path for f in files])
        if problems:
            raise InvalidParameters(problems)
        if not files:
            raise InvalidParameters("the mount produced no files; the driver would keep old files")
        total = sum(len(f.contents) + len(f.path) for f in files)
        if total > self._max_bytes:
            raise LimitExceeded(
                f"the answer would be {total} bytes, over the provider's limit of "
                f"{self._max_bytes} (--max-response-bytes); split the class or raise the limit "
                "(the driver's own default limit is 4 MiB; over 1 MiB breaks sync to a Secret)"
            )
