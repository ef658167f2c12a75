"""SecretProviderClass parameters -> a `MountPlan`: the dispatch on `backend` (or, for a class
of several stores, `stores`: provider/mount/stores.py) and the checks every dialect shares
(object limit, file paths, templates, unknown keys).

`Mount`, `mount` and `check` all parse through here, so a class that `check` accepts is one that
`Mount` accepts.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from backends import registry
from provider.core.boundedyaml import yaml_node_budget
from provider.core.errors import InvalidParameters
from provider.core.files import overlap_problems, path_problem
from provider.core.model import AnyPlan, ObjectSpec, ParseContext, Pod
from provider.core.parsing import Problems, fraction
from provider.mount import stores as named_stores
from provider.mount import templates
from provider.mount.lifetimes import Owner
from provider.mount.stores import NamedStore
from provider.mount.templates import TemplateSpec

#: Keys the driver and kubelet add to the attributes; never parameters of a dialect.
KUBELET_PREFIX = "csi.storage.k8s.io/"
COMMON_KEYS = frozenset({"backend", "templates", "secretProviderClass", "renewAt"})
#: The top-level keys of a class of several stores; every other setting is in a store's block.
STORES_KEYS = frozenset({"stores", "objects", "templates", "secretProviderClass", "renewAt"})
#: `MountResult.backend` (and the metrics' label) of a class of several stores.
MULTI = "multi"
#: What a mount's files are built from, in order: each object's spec (the file name, mode and
#: transforms) and its key into the mount's values (a fallback's value stands in for its object).
Inputs = Sequence[tuple[ObjectSpec[Any], Hashable]]


@dataclass(frozen=True)
class MountPlan:
    #: One unnamed store for a `backend:` class; the named ones of a `stores:` class.
    stores: tuple[NamedStore, ...]
    templates: tuple[TemplateSpec, ...]
    warnings: tuple[str, ...]
    #: `renewAt`: the fraction of a credential's life after which it is renewed, when the
    #: class asks for less than the provider's --renew-at (provider/mount/lifetimes.py).
    renew_at: float | None = None

    def owner(self, pod: Pod) -> Owner:
        """Who the credentials with a lifetime this class yields are held for."""
        return Owner(pod.uid, pod.namespace, self.renew_at)

    @property
    def named(self) -> bool:
        """Whether the class gives `stores:` (several named stores) rather than `backend:`."""
        return bool(self.stores) and self.stores[0].name != ""

    @property
    def store(self) -> AnyPlan:
        """The plan of a `backend:` class (one store)."""
        if self.named:
            raise ValueError("a class of several stores has no single store plan; use .stores")
        return self.stores[0].plan

    @property
    def backend(self) -> str:
        """The backend name, or "multi" for a class of several stores."""
        return MULTI if self.named else self.stores[0].plan.backend

    @cached_property
    def keys(self) -> tuple[tuple[int, Hashable], ...]:
        """Every store's refs as (store index, ref), each once, in object order (several
        objects may share a read): a mount's values are keyed by these."""
        return tuple(
            dict.fromkeys((i, o.ref) for i, s in enumerate(self.stores) for o in s.plan.objects)
        )

    @cached_property
    def inputs(self) -> Inputs:
        """Every store's objects, each with its key into a mount's values: (store index, ref).
        A mount whose objects all came from their own stores builds its files from these."""
        return tuple((o, (i, o.ref)) for i, s in enumerate(self.stores) for o in s.plan.objects)

    @property
    def objects(self) -> tuple[ObjectSpec[Any], ...]:
        """Every object of every store (file names are unique across stores)."""
        return tuple(spec for s in self.stores for spec in s.plan.objects)


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
    if "stores" in params:
        return _parse_stores(params, options_for, enable_fake, max_objects, strict)
    name = _backend_name(params, enable_fake)
    module = registry.dialect_module(name)
    options = options_for(name) if options_for else None
    ctx = ParseContext(options=options, max_objects=max_objects, strict=strict)
    # One YAML node budget for the whole class, so its parse time is bounded.
    with yaml_node_budget():
        store: AnyPlan = module.parse(params, ctx)
        plan = MountPlan((NamedStore("", store),), (), store.warnings)
        return _finish(params, plan, COMMON_KEYS | module.KEYS, f"the {name} backend", max_objects)


def _parse_stores(
    params: Mapping[str, str],
    options_for: Callable[[str], Any] | None,
    enable_fake: bool,
    max_objects: int,
    strict: bool,
) -> MountPlan:
    """A class of several named stores (provider/mount/stores.py)."""
    if "backend" in params:
        raise InvalidParameters(
            "the class gives both backend and stores: set backend for a class of one store, or "
            "stores (with `store:` on every object) for several, not both"
        )

    def backend_of(block: Mapping[str, str], where: str) -> str:
        return _backend_name(block, enable_fake, where)

    def ctx_for(name: str) -> ParseContext[Any]:
        options = options_for(name) if options_for else None
        return ParseContext(options=options, max_objects=max_objects, strict=strict)

    problems = Problems(strict=strict)
    with yaml_node_budget():
        found = named_stores.parse(params, backend_of, ctx_for, problems)
        problems.raise_if_any()
        plan = MountPlan(found, (), tuple(problems.warnings))
        return _finish(params, plan, STORES_KEYS, "a class of several stores", max_objects)


def _finish(
    params: Mapping[str, str], plan: MountPlan, known: frozenset[str], user: str, max_objects: int
) -> MountPlan:
    """The checks every dialect shares: object limit, templates, paths, unknown keys."""
    problems = Problems()
    problems.warnings.extend(plan.warnings)
    objects = plan.objects
    if len(objects) > max_objects:
        problems.fail(
            f"the class asks for {len(objects)} objects; this provider allows at most "
            f"{max_objects} (--max-objects); split it into several SecretProviderClasses"
        )
    names = [spec.name for spec in objects]
    specs = templates.parse(params.get("templates", ""), names, problems)
    _check_paths(objects, specs, problems)
    renew_at = _renew_at(params.get("renewAt", ""), problems)
    problems.raise_if_any()
    for key in sorted(params):
        if key not in known and not key.startswith(KUBELET_PREFIX):
            problems.warn(f"parameter {key!r} is not used by {user} (a typo?)")
    return MountPlan(plan.stores, specs, tuple(problems.warnings), renew_at)


def _renew_at(text: str, problems: Problems) -> float | None:
    """`renewAt: "0.5"` (or "1/2"): renew this class's leases and certificates sooner."""
    if not text.strip():
        return None
    value = fraction(text)
    if value is None:
        problems.add(
            f"renewAt: expected a fraction of a credential's life above 0 and below 1, such as "
            f"0.5 or 1/2, got {text!r}"
        )
    return value


def _backend_name(params: Mapping[str, str], enable_fake: bool, field: str = "backend") -> str:
    available = [n for n in registry.names() if n != "fake" or enable_fake]
    name = params.get("backend", "").strip()
    if name in available:
        return name
    valid = ", ".join(available)
    if not name:
        hint = _suggest(params, available)
        raise InvalidParameters(f"parameter {field!r} is missing; set it to one of: {valid}{hint}")
    if name == "fake":
        raise InvalidParameters(
            f"{field} 'fake' is a test store and is off; start the provider with "
            "--enable-fake-backend to use it"
        )
    raise InvalidParameters(f"parameter {field!r} is {name!r}; expected one of: {valid}")


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


def _check_paths(
    objects: tuple[ObjectSpec[Any], ...], specs: tuple[TemplateSpec, ...], problems: Problems
) -> None:
    paths: list[str] = []
    for spec in objects:
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
