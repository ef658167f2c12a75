"""Top-level `templates`: files rendered from several objects (docs/architecture.md).

    templates: |
      - path: pgpass
        mode: 0400
        template: "${db-host}:5432:*:${db/user}:${db/password}"
      - path: app.env
        format: env            # env | properties | json
        objects: [db/user, db/password]   # default: every object

`${name}` refers to an object's name (or `object/key` for an exploded object); names may contain
`-`, `.` and `/`, which is why `string.Template` is not used. `$$` is a literal `$`. Rendering is
substitution only: no code, no file or environment access, and the output size is bounded.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from provider.core.boundedyaml import load_yaml
from provider.core.errors import InvalidParameters, LimitExceeded
from provider.core.parsing import (
    Problems,
    expect_list,
    expect_map,
    expect_str,
    parse_mode,
    shown,
    unknown_keys,
)

MAX_TEMPLATE_BYTES = 1024 * 1024
_TOKEN = re.compile(r"\$(?:\$|\{([A-Za-z0-9_.\-/]+)\}|\{[^}]*\}?)")
_KEYS = frozenset({"path", "mode", "template", "format", "objects"})
#: Problems reported per class: a template of 60,000 bad placeholders needs only the first few.
_MAX_PROBLEMS = 20

Format = Literal["env", "properties", "json"]


@dataclass(frozen=True)
class TemplateSpec:
    path: str
    mode: int | None
    template: str | None
    format: Format | None
    #: Names the file reads (placeholders, or the format's `objects`); empty = all objects.
    objects: tuple[str, ...]
    field: str


def parse(raw: str, object_names: Sequence[str], problems: Problems) -> tuple[TemplateSpec, ...]:
    if not raw.strip():
        return ()
    try:
        entries = expect_list(load_yaml(raw, "templates"), "templates", problems)
    except InvalidParameters as exc:
        problems.items.extend(exc.problems)
        return ()
    specs = []
    for i, entry in enumerate(entries):
        spec = _parse_entry(entry, f"templates[{i}]", object_names, problems)
        if spec is not None:
            specs.append(spec)
    return tuple(specs)


def _parse_entry(
    entry: object, where: str, names: Sequence[str], problems: Problems
) -> TemplateSpec | None:
    obj = expect_map(entry, where, problems)
    if obj is None:
        return None
    unknown_keys(obj, _KEYS, where, "a template", problems)
    path = expect_str(obj.get("path"), f"{where}.path", problems, required=True)
    mode = parse_mode(obj.get("mode"), f"{where}.mode", problems)
    text = obj.get("template")
    fmt = obj.get("format")
    if (text is None) == (fmt is None):
        problems.add(f"{where} ({path!r}): give exactly one of 'template' or 'format'")
        return None
    if text is not None:
        if not isinstance(text, str):
            problems.add(f"{where}.template: expected text, got {type(text).__name__}")
            return None
        used = _placeholders(text, f"{where}.template", problems)
        _check_names(used, names, f"{where}.template ({path!r})", problems)
        return TemplateSpec(path, mode, text, None, tuple(used), where)
    if fmt not in ("env", "properties", "json"):
        problems.add(f"{where}.format: expected env, properties or json, got {fmt!r}")
        return None
    listed = [
        expect_str(n, f"{where}.objects[{j}]", problems)
        for j, n in enumerate(expect_list(obj.get("objects"), f"{where}.objects", problems))
    ]
    _check_names(listed, names, f"{where}.objects ({path!r})", problems)
    return TemplateSpec(path, mode, None, fmt, tuple(listed), where)


def _placeholders(text: str, field: str, problems: Problems) -> list[str]:
    # A dict keeps first-seen order and finds repeats in O(1)
    # (measured: BENCHMARKS.md, "Template placeholders found with a dict").
    found: dict[str, None] = {}
    for m in _TOKEN.finditer(text):
        if m.group(0) == "$$":
            continue
        if m.group(1) is None:
            problems.add(
                f"{field}: malformed placeholder {shown(m.group(0))}; write ${{name}} with "
                "letters, digits, '_', '-', '.', '/' (or $$ for a literal $)"
            )
            if len(problems.items) >= _MAX_PROBLEMS:
                break
        else:
            found.setdefault(m.group(1))
    return list(found)


def _check_names(used: Sequence[str], names: Sequence[str], where: str, problems: Problems) -> None:
    known = set(names)
    if "" in known:  # a selector writes at the volume's root: any name may be one of its files
        return
    for name in used:
        # `object/key` may name a file of an exploded object; it is resolved when rendering.
        if name not in known and not _under_object(name, known):
            problems.add(f"{where}: unknown object {name!r}; known objects: {_listed(names)}")
            if len(problems.items) >= _MAX_PROBLEMS:
                return


def _under_object(name: str, known: set[str]) -> bool:
    """Whether some prefix of `name` ending before a '/' is a known object."""
    return any(name[:i] in known for i, c in enumerate(name) if c == "/")


def _listed(names: Sequence[str]) -> str:
    text = ", ".join(names) or "none"
    return text if len(text) <= 200 else text[:199] + "…"


def render(spec: TemplateSpec, inputs: Mapping[str, bytes], limit: int | None = None) -> bytes:
    """Render one template from the objects' file contents (name -> bytes), refusing before
    building anything over `limit` bytes (at most MAX_TEMPLATE_BYTES)."""
    budget = MAX_TEMPLATE_BYTES if limit is None else min(limit, MAX_TEMPLATE_BYTES)
    if spec.template is not None:
        return _substitute(spec, inputs, budget)
    names = list(spec.objects) or sorted(inputs)
    values = {n: _text(spec, n, inputs) for n in names}
    return _format(spec, values, budget)


def _substitute(spec: TemplateSpec, inputs: Mapping[str, bytes], budget: int) -> bytes:
    """`${name}` substitution; the output size is the sum of the literal text and each
    placeholder's input, known before anything is joined (60,000 x `${b}` over 64 KiB would
    otherwise be built whole, 4 GiB, before a size check)."""
    assert spec.template is not None
    template = spec.template.encode()
    size = len(template)
    for m in _TOKEN.finditer(spec.template):
        name = m.group(1)
        if m.group(0) == "$$":
            size -= 1
        elif name is not None:
            size += len(inputs[name]) - len(m.group(0).encode()) if name in inputs else 0
    if size > budget:
        raise _too_big(spec, size, budget)
    out = _TOKEN.sub(
        lambda m: "$" if m.group(0) == "$$" else _text(spec, m.group(1), inputs), spec.template
    )
    return out.encode()


def _too_big(spec: TemplateSpec, size: int | str, budget: int) -> LimitExceeded:
    return LimitExceeded(
        f"{spec.field} ({spec.path!r}) would render {size} bytes, over its budget of {budget} "
        f"(at most {MAX_TEMPLATE_BYTES} for one template, and what is left of the mount's "
        "--max-response-bytes)"
    )


def _text(spec: TemplateSpec, name: str, inputs: Mapping[str, bytes]) -> str:
    if name not in inputs:
        raise InvalidParameters(
            f"{spec.field} ({spec.path!r}): unknown object {name!r}; known: "
            f"{', '.join(sorted(inputs)) or 'none'}"
        )
    try:
        return inputs[name].decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidParameters(
            f"{spec.field} ({spec.path!r}): object {name!r} is binary and cannot be placed in "
            "a text template; decode it or leave it out"
        ) from None


def env_name(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9]", "_", name).upper()


def _format(spec: TemplateSpec, values: Mapping[str, str], budget: int) -> bytes:
    """One line (or JSON member) per object, counted as it is made: each object appears once,
    so a line is at most a few times its input, and the total stops at the budget."""
    size = 0
    lines = []
    for name, value in sorted(values.items()) if spec.format == "json" else values.items():
        line = _line(spec.format, name, value)
        size += len(line.encode()) + 1
        if size > budget:
            raise _too_big(spec, f"more than {budget}", budget)
        lines.append(line)
    if spec.format == "json":
        return ("{\n" + ",\n".join(lines) + "\n}\n" if lines else "{}\n").encode()
    return ("\n".join(lines) + "\n").encode()


def _line(fmt: Format | None, name: str, value: str) -> str:
    if fmt == "json":
        # Exactly what json.dumps(indent=2, sort_keys=True) writes for one member.
        return f"  {json.dumps(name)}: {json.dumps(value)}"
    if fmt == "env":
        quoted = "'" + value.replace("'", "'\\''") + "'"
        return f"{env_name(name)}={quoted}"
    return f"{_prop_escape(name, key=True)}={_prop_escape(value, key=False)}"


def _prop_escape(text: str, *, key: bool) -> str:
    out = text.replace("\\", "\\\\").replace("\n", "\\n").replace("\r", "\\r")
    out = out.replace("\t", "\\t")
    if key:
        out = out.replace("=", "\\=").replace(":", "\\:").replace(" ", "\\ ")
    elif out.startswith(" "):
        out = "\\" + out
    return out
