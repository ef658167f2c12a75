"""SecretProviderClass parameters -> a `MountPlan`: the dispatch on `backend` (or, for a class
of several stores, `stores`: provider/mount/stores.py) and the checks every dialect shares
(object limit, file paths, templates, unknown keys).

`Mount`, `mount` and `check` all parse through here, so a class that `check` accepts is one that
`Mount` accepts.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from backends import registry
from provider.core import selection
from provider.core.boundedyaml import load_yaml, yaml_node_budget
from provider.core.errors import InvalidParameters
from provider.core.files import overlap_problems, path_problem
from provider.core.model import AnyPlan, ObjectSpec, ParseContext, Pod, Transforms
from provider.core.parsing import (
    TRANSFORM_KEYS,
    Problems,
    duration,
    expect_list,
    expect_map,
    expect_str,
    fraction,
    parse_transforms,
    unknown_keys,
)
from provider.mount import stores as named_stores
from provider.mount import templates
from provider.mount.lifetimes import Owner
from provider.mount.stores import NamedStore
from provider.mount.templates import TemplateSpec

#: Keys the driver and kubelet add to the attributes; never parameters of a dialect.
KUBELET_PREFIX = "csi.storage.k8s.io/"
#: Our class-level keys, beside each dialect's own.
CLASS_KEYS = frozenset({"templates", "secretProviderClass", "renewAt", "refreshInterval", "select"})
COMMON_KEYS = CLASS_KEYS | {"backend"}
#: The top-level keys of a class of several stores; every other setting is in a store's block.
STORES_KEYS = CLASS_KEYS | {"stores", "objects"}
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
    #: `refreshInterval`: seconds this class's values may be reused per identity before a poll
    #: reads the store again, within the provider's bounds; None: the provider's --cache-ttl.
    refresh: float | None = None
    #: The class's `secretProviderClass` name, for log lines.
    class_name: str = ""
    #: The optional objects already logged as missing (once per plan, not once a poll).
    absent_announced: set[str] = field(default_factory=set, compare=False, hash=False, repr=False)

    def owner(self, pod: Pod) -> Owner:
        """Who the credentials with a lifetime this class yields are held for."""
        return Owner(pod.uid, pod.namespace, self.renew_at, label=self.class_name)

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
    enable_test_stores: bool,
    max_objects: int = 100,
    strict: bool = False,
    refresh_bounds: RefreshBounds | None = None,
) -> MountPlan:
    """Parse and validate. `options_for` is None under `check` (no provider flags);
    `enable_test_stores` accepts the stores whose dialect declares them for tests; `strict`
    (`--strict-parameters`) refuses unknown object keys instead of warning about them;
    `refresh_bounds` (the provider's flags) bound a class's `refreshInterval`."""
    if "stores" in params:
        return _parse_stores(
            params, options_for, enable_test_stores, max_objects, strict, refresh_bounds
        )
    name = _backend_name(params, enable_test_stores)
    module = registry.dialect_module(name)
    options = options_for(name) if options_for else None
    selects = bool(params.get(SELECT, "").strip())
    ctx = ParseContext(options=options, max_objects=max_objects, strict=strict, selects=selects)
    # One YAML node budget for the whole class, so its parse time is bounded.
    with yaml_node_budget():
        store: AnyPlan = module.parse(params, ctx)
        plan = MountPlan((NamedStore("", store),), (), store.warnings)
        plan = _with_selectors(params, plan, max_objects, strict)
        known = COMMON_KEYS | module.KEYS
        return _finish(params, plan, known, f"the {name} backend", max_objects, refresh_bounds)


def _parse_stores(
    params: Mapping[str, str],
    options_for: Callable[[str], Any] | None,
    enable_test_stores: bool,
    max_objects: int,
    strict: bool,
    refresh_bounds: RefreshBounds | None,
) -> MountPlan:
    """A class of several named stores (provider/mount/stores.py)."""
    if "backend" in params:
        raise InvalidParameters(
            "the class gives both backend and stores: set backend for a class of one store, or "
            "stores (with `store:` on every object) for several, not both"
        )

    def backend_of(block: Mapping[str, str], where: str) -> str:
        return _backend_name(block, enable_test_stores, where)

    def ctx_for(name: str) -> ParseContext[Any]:
        options = options_for(name) if options_for else None
        return ParseContext(options=options, max_objects=max_objects, strict=strict)

    problems = Problems(strict=strict)
    with yaml_node_budget():
        found = named_stores.parse(params, backend_of, ctx_for, problems)
        problems.raise_if_any()
        plan = MountPlan(found, (), tuple(problems.warnings))
        plan = _with_selectors(params, plan, max_objects, strict)
        user = "a class of several stores"
        return _finish(params, plan, STORES_KEYS, user, max_objects, refresh_bounds)


def _finish(
    params: Mapping[str, str],
    plan: MountPlan,
    known: frozenset[str],
    user: str,
    max_objects: int,
    refresh_bounds: RefreshBounds | None,
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
    refresh = _refresh(params.get("refreshInterval", ""), refresh_bounds, problems)
    problems.raise_if_any()
    for key in sorted(params):
        if key not in known and not key.startswith(KUBELET_PREFIX):
            problems.warn(f"parameter {key!r} is not used by {user} (a typo?)")
    return MountPlan(
        plan.stores,
        specs,
        tuple(problems.warnings),
        renew_at,
        refresh,
        params.get("secretProviderClass", ""),
    )


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


SELECT = "select"


def selects(spec: ObjectSpec[Any]) -> bool:
    """Whether the object is a `select` entry (its files are the secrets it matches)."""
    return spec.field.startswith(SELECT + "[")


def failed_as(spec: ObjectSpec[Any]) -> str:
    """What a failure is listed under: the object's name, or a selector's field (`select[0]`:
    its name is its directory, empty at the volume's root)."""
    return spec.field if selects(spec) else spec.name


def _with_selectors(
    params: Mapping[str, str], plan: MountPlan, max_objects: int, strict: bool
) -> MountPlan:
    """`select`: each entry becomes an object of its store whose values are the secrets it
    matches (provider/core/selection.py), one file each under its `directory`."""
    raw = params.get(SELECT, "")
    if not raw.strip():
        return plan
    problems = Problems(strict=strict)
    entries = expect_list(load_yaml(raw, SELECT), SELECT, problems)
    by_name = {s.name: i for i, s in enumerate(plan.stores)}
    added: dict[int, list[ObjectSpec[Any]]] = {}
    for i, entry in enumerate(entries):
        where = f"{SELECT}[{i}]"
        obj = expect_map(entry, where, problems)
        if obj is None:
            continue
        index = _selector_store(obj, plan, by_name, where, problems)
        if index is None:
            continue
        store = plan.stores[index]
        module = registry.selecting(store.plan.backend)
        if module is None:
            problems.add(
                f"{where}: the {store.plan.backend} store has no selectors yet; list its "
                "objects by name"
            )
            continue
        keys = module.SELECT_KEYS | selection.COMMON_KEYS | TRANSFORM_KEYS
        unknown_keys(obj, keys, where, f"a {store.plan.backend} selector", problems)
        own = {k: v for k, v in obj.items() if k in module.SELECT_KEYS}
        ref = module.selection(own, store.plan.store, max_objects, where, problems)
        directory = expect_str(obj.get("directory"), f"{where}.directory", problems).rstrip("/")
        problem = path_problem(directory) if directory else None
        if problem:
            problems.add(f"{where}.directory ({directory!r}): {problem}")
        # A selector that matches nothing is no error unless it says `optional: false`.
        transforms = parse_transforms(obj, where, problems, base=Transforms(optional=True))
        if ref is not None:
            added.setdefault(index, []).append(ObjectSpec(directory, ref, None, transforms, where))
    problems.raise_if_any()
    stores = list(plan.stores)
    for index, specs in added.items():
        named = stores[index]
        objects = named.plan.objects + tuple(specs)
        fallbacks = named.fallbacks + (None,) * len(specs) if named.fallbacks else ()
        stores[index] = dataclasses.replace(
            named, plan=dataclasses.replace(named.plan, objects=objects), fallbacks=fallbacks
        )
    warnings = plan.warnings + tuple(problems.warnings)
    return dataclasses.replace(plan, stores=tuple(stores), warnings=warnings)


def _selector_store(
    obj: Mapping[str, Any],
    plan: MountPlan,
    by_name: Mapping[str, int],
    where: str,
    problems: Problems,
) -> int | None:
    """The index of the store a selector reads: the one store, or the one its `store` names."""
    name = expect_str(obj.get("store"), f"{where}.store", problems)
    if not plan.named:
        if name:
            problems.add(f"{where}.store: only a class of several stores names stores; remove it")
        return 0
    if name in by_name:
        return by_name[name]
    problems.add(
        f"{where}.store: {'missing' if not name else repr(name) + ' is not a store of the class'}"
        f"; a selector of a class of several stores names one of: {', '.join(by_name) or 'none'}"
    )
    return None


@dataclass(frozen=True)
class RefreshBounds:
    """What a class's `refreshInterval` may ask for (`--min-refresh-interval`,
    `--max-refresh-interval`): a floor, so no class can make every poll read its store, and a
    ceiling, so no class pins values for ever."""

    floor: float
    ceiling: float


def _refresh(text: str, bounds: RefreshBounds | None, problems: Problems) -> float | None:
    """`refreshInterval: 10m`: seconds the class's values may be reused, held to the bounds
    (with a warning: the same class may be installed where the bounds differ)."""
    if not text.strip():
        return None
    seconds = duration(text)
    if seconds is None:
        problems.add(
            f"refreshInterval: expected a duration such as 90s, 10m or 1h30m, got {text!r}"
        )
        return None
    if bounds is None:
        return seconds
    if seconds < bounds.floor:
        problems.warn(
            f"refreshInterval {text.strip()} is under this provider's floor of "
            f"{bounds.floor:g}s (--min-refresh-interval): {bounds.floor:g}s is used"
        )
        return bounds.floor
    if seconds > bounds.ceiling:
        problems.warn(
            f"refreshInterval {text.strip()} is over this provider's ceiling of "
            f"{bounds.ceiling:g}s (--max-refresh-interval): {bounds.ceiling:g}s is used"
        )
        return bounds.ceiling
    return seconds


def _backend_name(
    params: Mapping[str, str], enable_test_stores: bool, field: str = "backend"
) -> str:
    """The store a class names: any but a test store (registry.enabled_by) unless enabled."""
    available = [n for n in registry.names() if enable_test_stores or not registry.enabled_by(n)]
    name = params.get("backend", "").strip()
    if name in available:
        return name
    valid = ", ".join(available)
    if not name:
        hint = _suggest(params, available)
        raise InvalidParameters(f"parameter {field!r} is missing; set it to one of: {valid}{hint}")
    flag = registry.enabled_by(name) if name in registry.PACKAGES else None
    if flag:
        raise InvalidParameters(
            f"{field} {name!r} is a test store and is off; start the provider with {flag} to use it"
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
    selected = False
    for spec in objects:
        if selects(spec):
            # A selector's files (its directory was checked with it): their collisions with
            # each other and with the other files are checked as they are built.
            selected = selected or spec.transforms.file
            continue
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
    if not paths and not selected and not problems.items:
        problems.add(
            "the class writes no files (every object has file: false and there are no "
            "templates); the driver would keep the old files"
        )
