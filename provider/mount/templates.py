"""Top-level `templates`: files rendered from several objects (SPEC §2 Extensions).

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

from provider.core.errors import InvalidParameters, LimitExceeded
from provider.core.parsing import (
    Problems,
    expect_list,
    expect_map,
    expect_str,
    load_yaml,
    parse_mode,
    unknown_keys,
)

MAX_TEMPLATE_BYTES = 1024 * 1024
_TOKEN = re.compile(r"\$(?:\$|\{([A-Za-z0-9_.\-/]+)\}|\{[^}]*\}?)")
_KEYS = frozenset({"path", "mode", "template", "format", "objects"})

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
    found: list[str] = []
    for m in _TOKEN.finditer(text):
        if m.group(0) == "$$":
            continue
        if m.group(1) is None:
            problems.add(
                f"{field}: malformed placeholder {m.group(0)!r}; write ${{name}} with letters, "
                "digits, '_', '-', '.', '/' (or $$ for a literal $)"
            )
        elif m.group(1) not in found:
            found.append(m.group(1))
    return found


def _check_names(used: Sequence[str], names: Sequence[str], where: str, problems: Problems) -> None:
    for name in used:
        # `object/key` may name a file of an exploded object; it is resolved when rendering.
        if name not in names and not any(name.startswith(n + "/") for n in names):
            problems.add(
                f"{where}: unknown object {name!r}; known objects: {', '.join(names) or 'none'}"
            )


def render(spec: TemplateSpec, inputs: Mapping[str, bytes]) -> bytes:
    """Render one template from the objects' file contents (name -> bytes)."""
    if spec.template is not None:
        out = _TOKEN.sub(
            lambda m: "$" if m.group(0) == "$$" else _text(spec, m.group(1), inputs), spec.template
        )
        data = out.encode()
    else:
        names = list(spec.objects) or sorted(inputs)
        values = {n: _text(spec, n, inputs) for n in names}
        data = _format(spec.format, values)
    if len(data) > MAX_TEMPLATE_BYTES:
        raise LimitExceeded(
            f"template {spec.path!r} renders {len(data)} bytes, over the "
            f"{MAX_TEMPLATE_BYTES}-byte limit for one template"
        )
    return data


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


def _format(fmt: Format | None, values: Mapping[str, str]) -> bytes:
    if fmt == "json":
        return (json.dumps(dict(values), indent=2, sort_keys=True) + "\n").encode()
    lines = []
    for name, value in values.items():
        if fmt == "env":
            quoted = "'" + value.replace("'", "'\\''") + "'"
            lines.append(f"{env_name(name)}={quoted}")
        else:
            lines.append(f"{_prop_escape(name, key=True)}={_prop_escape(value, key=False)}")
    return ("\n".join(lines) + "\n").encode()


def _prop_escape(text: str, *, key: bool) -> str:
    out = text.replace("\\", "\\\\").replace("\n", "\\n").replace("\r", "\\r")
    out = out.replace("\t", "\\t")
    if key:
        out = out.replace("=", "\\=").replace(":", "\\:").replace(" ", "\\ ")
    elif out.startswith(" "):
        out = "\\" + out
    return out
