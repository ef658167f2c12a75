"""Several named stores in one class: `stores:` instead of `backend:` (docs/multi-store.md).

    stores: |
      vault: {backend: vault, roleName: app, vaultAddress: "https://vault.internal:8200"}
      aws:   {backend: aws, region: eu-west-1}
    objects: |
      - {store: vault, objectName: db-password, secretPath: secret/data/db, secretKey: password}
      - store: aws
        objectName: prod/api-key
        objectAlias: api-key
        fallback: {store: vault, objectName: api-key, secretPath: secret/data/api, secretKey: key}

Every entry of the one `objects` list is a map: `store:` plus that store's object keys exactly as
its upstream provider spells one object (an Azure entry is the map an `array:` string holds, a
GCP entry one `secrets:` item). Each store is parsed by its own dialect's `parse` — its block's
parameters, plus its entries re-serialized under the key and in the shape that dialect reads —
so every dialect rule and message applies unchanged; messages are prefixed with the store's name
and name each entry by its place in the shared list.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from backends import registry
from provider.core.boundedyaml import load_yaml
from provider.core.errors import InvalidParameters
from provider.core.model import AnyPlan, ObjectSpec, ParseContext
from provider.core.parsing import Problems, expect_str, unique_names

STORE_KEY = "store"
#: The class's selectors (provider/mount/planning.py): a store they name needs no objects.
SELECT_KEY = "select"
FALLBACK_KEY = "fallback"
#: Store names: short words, so messages and `check` can show them as they are.
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
#: Class-level keys that do not belong in a store's block.
_CLASS_LEVEL = ("objects", "secrets", "templates", "stores")
#: A dialect's own field of an entry (`objects[2]`, Azure `objects.array[2]`, GCP `secrets[2]`).
_FIELD = re.compile(r"\b(?:objects\.array|objects|secrets)\[(\d+)\]")


@dataclass(frozen=True)
class Fallback:
    """Where to read an object when its store answers not found."""

    #: Index of the fallback store in `MountPlan.stores`.
    store: int
    #: The object in the fallback store's dialect; it writes the primary's file (same name).
    spec: ObjectSpec[Any]


@dataclass(frozen=True)
class NamedStore:
    """One store of a class: its name ("" for a `backend:` class) and its own plan."""

    name: str
    plan: AnyPlan
    #: Per object of `plan.objects`: its fallback, if it names one.
    fallbacks: tuple[Fallback | None, ...] = ()
    #: The fallback objects other stores' objects name in this store (settings as `plan`).
    fallback_plan: AnyPlan | None = None

    @property
    def label(self) -> str:
        return f"store {self.name!r}" if self.name else self.plan.backend


@dataclass
class _Entry:
    index: int
    keys: dict[str, Any]
    fallback: tuple[str, dict[str, Any]] | None = None


def parse(
    params: Mapping[str, str],
    backend_of: Callable[[Mapping[str, str], str], str],
    ctx_for: Callable[[str], ParseContext[Any]],
    problems: Problems,
) -> tuple[NamedStore, ...]:
    """The class's stores, each parsed by its dialect; problems collected into `problems`.
    `backend_of(block, where)` validates a block's `backend` (raising InvalidParameters)."""
    blocks = _blocks(params.get("stores", ""), problems)
    selecting = _selecting(params.get(SELECT_KEY, ""))
    entries = _entries(params.get("objects", ""), blocks, problems, bool(selecting))
    used = {e.keys[STORE_KEY] for e in entries} | {e.fallback[0] for e in entries if e.fallback}
    used |= selecting & set(blocks)
    for name in blocks:
        if name not in used:
            problems.warn(f"store {name!r} is not used by any object (remove it, or add objects)")
    named: list[NamedStore] = []
    for name, block in blocks.items():
        if name not in used:
            continue
        try:
            backend = backend_of(block, f"stores.{name}.backend")
        except InvalidParameters as exc:
            problems.items.extend(exc.problems)
            continue
        store = _parse_store(
            name, backend, block, entries, ctx_for(backend), problems, name in selecting
        )
        if store is not None:
            named.append(store)
    if problems.items:
        return ()
    return _link_fallbacks(named, entries, problems)


def _blocks(raw: str, problems: Problems) -> dict[str, dict[str, str]]:
    doc = load_yaml(raw, "stores")
    if not isinstance(doc, dict) or not doc:
        problems.fail(
            "stores: expected a YAML map of store names to their parameters, e.g. "
            "'vault: {backend: vault, roleName: app}'"
        )
    blocks: dict[str, dict[str, str]] = {}
    for name, block in doc.items():
        if not isinstance(name, str) or not _NAME.match(name):
            problems.add(f"stores: {name!r} is not a store name (letters, digits, '-', '_', '.')")
            continue
        if not isinstance(block, dict):
            problems.add(f"stores.{name}: expected a map of that store's parameters")
            continue
        values: dict[str, str] = {}
        for key, value in block.items():
            where = f"stores.{name}.{key}"
            if key in _CLASS_LEVEL:
                problems.add(
                    f"{where}: {key} belongs to the class, not to a store: list the objects in "
                    f"the class's `objects`, each with `store: {name}`"
                )
            else:
                values[str(key)] = expect_str(value, where, problems)
        blocks[name] = values
    return blocks


def _selecting(raw: str) -> set[str]:
    """The stores the class's selectors name (provider/mount/planning.py checks the rest)."""
    if not raw.strip():
        return set()
    doc = load_yaml(raw, SELECT_KEY)
    entries = doc if isinstance(doc, list) else []
    return {
        e[STORE_KEY] for e in entries if isinstance(e, dict) and isinstance(e.get(STORE_KEY), str)
    }


def _entries(
    raw: str, blocks: Mapping[str, object], problems: Problems, selecting: bool = False
) -> list[_Entry]:
    if not raw.strip():
        if selecting:  # a class of selectors only
            return []
        problems.fail("objects is required: a YAML list of objects, each with `store: <name>`")
    doc = load_yaml(raw, "objects")
    if not isinstance(doc, list) or not doc:
        problems.fail("objects: expected a YAML list of objects, each with `store: <name>`")
    names = ", ".join(blocks) or "none"
    entries: list[_Entry] = []
    for i, raw_entry in enumerate(doc):
        where = f"objects[{i}]"
        keys = _entry_keys(raw_entry, where, blocks, names, problems)
        if keys is None:
            continue
        entry = _Entry(i, keys)
        fallback = keys.pop(FALLBACK_KEY, None)
        if fallback is not None:
            fb = _entry_keys(fallback, f"{where}.{FALLBACK_KEY}", blocks, names, problems)
            if fb is not None and FALLBACK_KEY in fb:
                problems.add(f"{where}.{FALLBACK_KEY}: a fallback cannot have a fallback")
            elif fb is not None:
                entry.fallback = (fb.pop(STORE_KEY), fb)
        entries.append(entry)
    return entries


def _entry_keys(
    value: Any, where: str, blocks: Mapping[str, object], names: str, problems: Problems
) -> dict[str, Any] | None:
    if not isinstance(value, dict):
        problems.add(
            f"{where}: expected a map: `store: <name>` and that store's object keys (an Azure "
            "object is written as the map its `array:` string would hold)"
        )
        return None
    store = value.get(STORE_KEY)
    if store is None or store == "":
        problems.add(f"{where}.store is required: the name of one of the class's stores ({names})")
        return None
    if not isinstance(store, str) or store not in blocks:
        problems.add(f"{where}.store: {store!r} is not one of the class's stores ({names})")
        return None
    return dict(value)


def _parse_store(
    name: str,
    backend: str,
    block: Mapping[str, str],
    entries: Sequence[_Entry],
    ctx: ParseContext[Any],
    problems: Problems,
    selected: bool = False,
) -> NamedStore | None:
    """One store's plan; a store only selectors read has a plan of no objects (its dialect is
    told the class selects, so it needs none)."""
    settings = {k: v for k, v in block.items() if k != "backend"}
    prefix = f"store {name!r}: "
    module = registry.dialect_module(backend)
    for key in sorted(settings):
        if key not in module.KEYS:
            problems.warn(f"{prefix}parameter {key!r} is not used by the {backend} backend")
    mine = [(e.index, e.keys) for e in entries if e.keys[STORE_KEY] == name]
    theirs = [(e.index, e.fallback[1]) for e in entries if e.fallback and e.fallback[0] == name]
    plan = _dialect_parse(module, backend, settings, mine, "", ctx, prefix, problems)
    fallback_plan = _dialect_parse(
        module, backend, settings, theirs, f".{FALLBACK_KEY}", ctx, prefix, problems
    )
    if plan is None and not mine and fallback_plan is not None:
        plan = dataclasses.replace(fallback_plan, objects=())
    elif plan is None and not mine and selected:
        try:
            plan = module.parse(settings, dataclasses.replace(ctx, selects=True))
        except InvalidParameters as exc:
            problems.items.extend(prefix + p for p in exc.problems)
            return None
    if plan is None:
        return None
    return NamedStore(name, plan, fallback_plan=fallback_plan)


def _dialect_parse(
    module: Any,
    backend: str,
    settings: Mapping[str, str],
    entries: Sequence[tuple[int, Mapping[str, Any]]],
    suffix: str,
    ctx: ParseContext[Any],
    prefix: str,
    problems: Problems,
) -> AnyPlan | None:
    """The dialect's own `parse` over the store's settings and `entries`, with each entry's
    field renamed to its place in the class's list and every message prefixed with the store."""
    if not entries:
        return None
    indexes = [i for i, _ in entries]

    def rename(text: str) -> str:
        return _FIELD.sub(lambda m: f"objects[{indexes[int(m.group(1))]}]{suffix}", text)

    items = [{k: v for k, v in keys.items() if k != STORE_KEY} for _, keys in entries]
    params = {**settings, **_listed(backend, items)}
    try:
        plan: AnyPlan = module.parse(params, ctx)
    except InvalidParameters as exc:
        problems.items.extend(prefix + rename(p) for p in exc.problems)
        problems.warnings.extend(prefix + rename(w) for w in getattr(exc, "warnings", ()))
        return None
    problems.warnings.extend(prefix + rename(w) for w in plan.warnings)
    objects = tuple(dataclasses.replace(s, field=rename(s.field)) for s in plan.objects)
    return dataclasses.replace(plan, objects=objects, warnings=())


def _listed(backend: str, items: list[dict[str, Any]]) -> dict[str, str]:
    """The entries under the key, and in the shape, the dialect reads (its `listed`)."""
    return registry.dialect_module(backend).listed(items)


def _entry_of(field: str) -> int:
    match = _FIELD.match(field)
    return int(match.group(1)) if match else -1


def _link_fallbacks(
    named: list[NamedStore], entries: Sequence[_Entry], problems: Problems
) -> tuple[NamedStore, ...]:
    """Each fallback object writes exactly the files of the object it stands in for; it is read
    under the object's file name, mode and ObjectVersion id."""
    position = {s.name: i for i, s in enumerate(named)}
    unique_names(
        [(spec.name, f"{spec.field} (store {s.name!r})") for s in named for spec in s.plan.objects],
        "file name",
        problems,
    )
    by_entry: dict[int, tuple[int, dict[str, ObjectSpec[Any]]]] = {}
    for s in named:
        for spec in s.fallback_plan.objects if s.fallback_plan else ():
            by_entry.setdefault(_entry_of(spec.field), (position[s.name], {}))[1][spec.name] = spec
    for s in named:
        for index in sorted({_entry_of(spec.field) for spec in s.plan.objects} & set(by_entry)):
            wanted = sorted(spec.name for spec in s.plan.objects if _entry_of(spec.field) == index)
            written = sorted(by_entry[index][1])
            if written != wanted:
                problems.add(
                    f"objects[{index}].{FALLBACK_KEY} writes {', '.join(map(repr, written))}, "
                    f"the object {', '.join(map(repr, wanted))}: a fallback must write the same "
                    "files as its object (give it the same file name)"
                )
    if problems.items:
        return ()
    linked: list[NamedStore] = []
    for s in named:
        fallbacks: list[Fallback | None] = []
        for spec in s.plan.objects:
            held = by_entry.get(_entry_of(spec.field))
            if held is None:
                fallbacks.append(None)
                continue
            store, twins = held
            # Read under the object's file name, mode and ObjectVersion id: where the value
            # came from does not change the file.
            stand_in = dataclasses.replace(
                twins[spec.name], mode=spec.mode, version_id=spec.version_id
            )
            fallbacks.append(Fallback(store, stand_in))
        linked.append(dataclasses.replace(s, fallbacks=tuple(fallbacks)))
    return tuple(linked)
