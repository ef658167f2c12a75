"""SecretProviderClass parameters -> a `MountPlan`: the dispatch on `backend` and the checks
every dialect shares (object limit, file paths, templates, unknown keys).

`Mount`, `mount` and `check` all parse through here, so a class that `check` accepts is one that
`Mount` accepts.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from backends import registry
from provider.core.errors import InvalidParameters
from provider.core.files import overlap_problems, path_problem
from provider.core.model import AnyPlan, ParseContext
from provider.core.parsing import Problems, yaml_node_budget
from provider.mount import templates
from provider.mount.templates import TemplateSpec

#: Keys the driver and kubelet add to the attributes; never parameters of a dialect.
KUBELET_PREFIX = "csi.storage.k8s.io/"
COMMON_KEYS = frozenset({"backend", "templates", "secretProviderClass"})


@dataclass(frozen=True)
class MountPlan:
    store: AnyPlan
    templates: tuple[TemplateSpec, ...]
    warnings: tuple[str, ...]


def parse_plan(
    params: Mapping[str, str],
    *,
    options_for: Callable[[str], Any] | None,
    enable_fake: bool,
    max_objects: int = 100,
    strict: bool = False,
) -> MountPlan:
    """Parse and validate. `options_for` is None under `check` (no provider flags); `strict`
    (`--strict-parameters`) refuses unknown object keys instead of warning about them."""
    name = _backend_name(params, enable_fake)
    module = registry.dialect_module(name)
    options = options_for(name) if options_for else None
    ctx = ParseContext(options=options, max_objects=max_objects, strict=strict)
    # One YAML node budget for the whole class, so its parse time is bounded.
    with yaml_node_budget():
        store: AnyPlan = module.parse(params, ctx)
        return _finish(params, name, module, store, max_objects)


def _finish(
    params: Mapping[str, str], name: str, module: Any, store: AnyPlan, max_objects: int
) -> MountPlan:
    """The checks every dialect shares: object limit, templates, paths, unknown keys."""
    problems = Problems()
    problems.warnings.extend(store.warnings)
    if len(store.objects) > max_objects:
        problems.fail(
            f"the class asks for {len(store.objects)} objects; this provider allows at most "
            f"{max_objects} (--max-objects); split it into several SecretProviderClasses"
        )
    names = [spec.name for spec in store.objects]
    specs = templates.parse(params.get("templates", ""), names, problems)
    _check_paths(store, specs, problems)
    problems.raise_if_any()
    known = COMMON_KEYS | module.KEYS
    for key in sorted(params):
        if key not in known and not key.startswith(KUBELET_PREFIX):
            problems.warn(f"parameter {key!r} is not used by the {name} backend (a typo?)")
    return MountPlan(store, specs, tuple(problems.warnings))


def _backend_name(params: Mapping[str, str], enable_fake: bool) -> str:
    available = [n for n in registry.names() if n != "fake" or enable_fake]
    name = params.get("backend", "").strip()
    if name in available:
        return name
    valid = ", ".join(available)
    if not name:
        hint = _suggest(params, available)
        raise InvalidParameters(f"parameter 'backend' is missing; set it to one of: {valid}{hint}")
    if name == "fake":
        raise InvalidParameters(
            "backend 'fake' is a test store and is off; start the provider with "
            "--enable-fake-backend to use it"
        )
    raise InvalidParameters(f"parameter 'backend' is {name!r}; expected one of: {valid}")


def _suggest(params: Mapping[str, str], available: list[str]) -> str:
    """ "Looks like vault": the dialect whose specific keys the class uses most."""
    given = set(params) - COMMON_KEYS
    scores = {}
    for name in available:
        overlap = given & (registry.dialect_module(name).KEYS - {"objects"})
        if overlap:
            scores[name] = len(overlap)
    if not scores:
        return ""
    best = max(scores, key=lambda n: scores[n])
    return f" (the parameters look like the {best} dialect: add backend: {best})"


def _check_paths(store: AnyPlan, specs: tuple[TemplateSpec, ...], problems: Problems) -> None:
    paths: list[str] = []
    for spec in store.objects:
        problem = path_problem(spec.name)
        if problem:
            problems.add(f"{spec.field or 'object'} ({spec.name!r}): {problem}")
        elif spec.transforms.file:
            paths.append(spec.name)
    for tmpl in specs:
        problem = path_problem(tmpl.path)
        if problem:
            problems.add(f"{tmpl.field}.path: {problem}")
        else:
            paths.append(tmpl.path)
    problems.items.extend(overlap_problems(paths))
    if not paths and not problems.items:
        problems.add(
            "the class writes no files (every object has file: false and there are no "
            "templates); the driver would keep the old files"
        )
