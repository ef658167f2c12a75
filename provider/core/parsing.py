"""Helpers every dialect parser uses: problem lists, safe YAML, modes, booleans, transforms.

Parsers collect every problem before raising, so a user fixes a class in one round; each
message names the SPC field (`objects[1].objectName`) and says what to do.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from typing import Any, NoReturn

import yaml

from provider.core.errors import InvalidParameters
from provider.core.model import Transforms

MAX_YAML_BYTES = 256 * 1024
MAX_YAML_DEPTH = 32


class Problems:
    """Collects parse problems; `raise_if_any` raises them all as one InvalidParameters."""

    def __init__(self) -> None:
        self.items: list[str] = []
        self.warnings: list[str] = []

    def add(self, message: str) -> None:
        self.items.append(message)

    def warn(self, message: str) -> None:
        self.warnings.append(message)

    def raise_if_any(self) -> None:
        if self.items:
            raise InvalidParameters(self.items)

    def fail(self, message: str) -> NoReturn:
        self.add(message)
        raise InvalidParameters(self.items)


class _BoundedLoader(yaml.SafeLoader):
    """SafeLoader without aliases (no "billion laughs") and with a nesting limit."""

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()  # type: ignore[no-untyped-call]
            raise yaml.MarkedYAMLError(
                "while composing", None, "YAML aliases (*name) are not allowed", event.start_mark
            )
        self._depth = getattr(self, "_depth", 0) + 1
        try:
            if self._depth > MAX_YAML_DEPTH:
                mark = self.peek_event().start_mark  # type: ignore[no-untyped-call]
                raise yaml.MarkedYAMLError(
                    None, None, f"nested deeper than {MAX_YAML_DEPTH} levels", mark
                )
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


def load_yaml(text: str, field: str) -> Any:
    """Parse a YAML (or JSON) parameter; errors name the field and the line."""
    if len(text.encode()) > MAX_YAML_BYTES:
        raise InvalidParameters(
            f"{field}: {len(text.encode())} bytes is over the {MAX_YAML_BYTES}-byte limit"
        )
    try:
        return yaml.load(text, Loader=_BoundedLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as exc:
        where = ""
        mark = getattr(exc, "problem_mark", None)
        if mark is not None:
            where = f" at line {mark.line + 1}, column {mark.column + 1}"
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise InvalidParameters(f"{field}: invalid YAML{where}: {problem}") from None


def load_yaml_safe(text: str) -> Any:
    """Parse a secret's content as YAML with the same limits (transforms use it)."""
    return yaml.load(text, Loader=_BoundedLoader)  # noqa: S506


def parse_mode(value: Any, field: str, problems: Problems) -> int | None:
    """A file mode: a YAML integer (0400 -> 256) or an octal string ("0400" / "400")."""
    if value is None or value == "":
        return None
    if isinstance(value, bool):
        problems.add(f'{field}: expected a file mode such as 0400 or "0644", got {value!r}')
        return None
    if isinstance(value, int):
        mode = value
    elif isinstance(value, str) and value.strip() and set(value.strip()) <= set("01234567"):
        mode = int(value.strip(), 8)
    else:
        problems.add(f'{field}: expected an octal file mode such as "0400", got {value!r}')
        return None
    if not 0 <= mode <= 0o777:
        problems.add(f"{field}: file mode {oct(mode)} is outside 0000..0777")
        return None
    return mode


def parse_bool(value: Any, field: str, problems: Problems, default: bool = False) -> bool:
    if value is None or value == "":
        return default
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    problems.add(f'{field}: expected "true" or "false", got {value!r}')
    return default


def expect_str(value: Any, field: str, problems: Problems, *, required: bool = False) -> str:
    """A scalar parameter as a string ('' when absent); YAML numbers are accepted as text."""
    if value is None or value == "":
        if required:
            problems.add(f"{field} is required")
        return ""
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        problems.add(f"{field}: expected a string, got {type(value).__name__}")
        return ""
    return str(value)


def expect_list(value: Any, field: str, problems: Problems) -> list[Any]:
    if value is None or value == "":
        return []
    if not isinstance(value, list):
        problems.add(f"{field}: expected a YAML list, got {type(value).__name__}")
        return []
    return value


def expect_map(value: Any, field: str, problems: Problems) -> Mapping[str, Any] | None:
    if not isinstance(value, dict):
        problems.add(f"{field}: expected a map of keys to values, got {type(value).__name__}")
        return None
    return value


def unknown_keys(
    obj: Mapping[Any, Any],
    known: frozenset[str],
    where: str,
    what: str,
    problems: Problems,
    refused: Mapping[str, str] | None = None,
) -> None:
    """Report every key of an entry that its dialect does not know, with the likely fix:
    an upstream key we refuse says why; a near miss of a known key is suggested."""
    for key in sorted(set(obj) - known, key=str):
        if refused and key in refused:
            problems.add(f"{where}.{key} is not supported by secrets-bridge: {refused[key]}")
            continue
        close = difflib.get_close_matches(str(key), sorted(known), n=1, cutoff=0.6)
        if not close:
            close = [k for k in sorted(known) if k.lower() == str(key).lower()]
        hint = f"; did you mean {close[0]!r}?" if close else f" (known: {', '.join(sorted(known))})"
        problems.add(f"{where}.{key} is not a parameter of {what}{hint}")


#: Our extension keys, accepted on the objects of every dialect (SPEC §2 Extensions).
TRANSFORM_KEYS = frozenset({"extract", "explode", "decode", "file"})


def parse_transforms(
    obj: Mapping[str, Any], where: str, problems: Problems, base: Transforms = Transforms()
) -> Transforms:
    """Our `extract`/`explode`/`decode`/`file` keys of one object, over the dialect's own."""
    extract = expect_str(obj.get("extract"), f"{where}.extract", problems) or base.extract
    if extract:
        check_jmespath(extract, f"{where}.extract", problems)
    explode = parse_bool(obj.get("explode"), f"{where}.explode", problems, base.explode)
    decode: Any = expect_str(obj.get("decode"), f"{where}.decode", problems) or base.decode
    if decode not in (None, "base64", "hex"):
        problems.add(f"{where}.decode: expected base64 or hex, got {decode!r}")
        decode = None
    file = parse_bool(obj.get("file"), f"{where}.file", problems, base.file)
    return Transforms(
        extract=extract or None,
        extract_key=base.extract_key,
        parse_as=base.parse_as,
        explode=explode,
        decode=decode,
        file=file,
    )


def check_jmespath(expression: str, field: str, problems: Problems) -> None:
    import jmespath
    from jmespath.exceptions import JMESPathError

    try:
        jmespath.compile(expression)
    except JMESPathError as exc:
        first = str(exc).splitlines()[0]
        problems.add(
            f"{field}: invalid JMESPath expression {expression!r}: {first} "
            "(quote keys containing '-' or '.', e.g. '\"db-password\"')"
        )


def unique_names(names: list[tuple[str, str]], what: str, problems: Problems) -> None:
    """Report every duplicated name at once: names is [(name, field)]."""
    seen: dict[str, list[str]] = {}
    for name, field in names:
        seen.setdefault(name, []).append(field)
    for name, fields in seen.items():
        if len(fields) > 1:
            problems.add(f"{what} {name!r} is used by {', '.join(fields)}; names must be unique")
