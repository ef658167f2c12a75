"""Helpers every dialect parser uses: problem lists, safe YAML, modes, booleans, transforms.

Parsers collect every problem before raising, so a user fixes a class in one round; each
message names the SPC field (`objects[1].objectName`) and says what to do.
"""

from __future__ import annotations

import contextlib
import datetime
import difflib
from collections.abc import Iterator, Mapping
from contextvars import ContextVar
from typing import Any, NoReturn

import yaml

from provider.core.errors import InvalidParameters
from provider.core.model import Transforms

MAX_YAML_BYTES = 256 * 1024
MAX_YAML_DEPTH = 32
#: YAML nodes (scalars, lists, maps) one class may hold across all its YAML parameters. The pure
#: Python parser costs about 20 us a node, so 256 KiB of `[1,1,...]` took 3 s of event loop; a
#: class of 100 objects with ten keys each has about 2,100. Also the cap for a YAML secret value.
MAX_YAML_NODES = 10_000
#: YAML text one class (all its parameters) or one mount (all its secret values) may parse.
MAX_YAML_TOTAL_BYTES = 1024 * 1024
#: JMESPath expressions: length and syntax-tree size (parse time), evaluation is bounded in
#: provider/mount/transforms.py. Deep nesting would otherwise hit Python's recursion limit.
MAX_JMESPATH_CHARS = 1024
MAX_JMESPATH_NODES = 256
MAX_JMESPATH_DEPTH = 48

# [nodes, bytes] still allowed for the class or mount being parsed (see `yaml_node_budget`);
# unset = a fresh budget per document.
_class_nodes: ContextVar[list[int] | None] = ContextVar("class_yaml_nodes", default=None)


@contextlib.contextmanager
def yaml_node_budget(
    nodes: int = MAX_YAML_NODES, size: int = MAX_YAML_TOTAL_BYTES
) -> Iterator[None]:
    """Share one budget of nodes and bytes among every YAML document of one class (objects,
    templates, Azure's nested object strings) or of one mount's secret values, so splitting
    the input into many small documents gains nothing."""
    token = _class_nodes.set([nodes, size])
    try:
        yield
    finally:
        _class_nodes.reset(token)


class InvalidClass(InvalidParameters):
    """A refused class's problems, with the warnings found on the way (`check` prints both,
    so a typo'd key is named beside the error it may explain)."""

    def __init__(self, problems: list[str], warnings: list[str]) -> None:
        super().__init__(problems)
        self.warnings = list(warnings)


class Problems:
    """Collects parse problems; `raise_if_any` raises them all as one InvalidParameters."""

    def __init__(self, *, strict: bool = False) -> None:
        self.items: list[str] = []
        self.warnings: list[str] = []
        #: `serve --strict-parameters`: unknown object keys are problems, not warnings.
        self.strict = strict

    def add(self, message: str) -> None:
        self.items.append(message)

    def warn(self, message: str) -> None:
        self.warnings.append(message)

    def raise_if_any(self) -> None:
        if self.items:
            raise InvalidClass(self.items, self.warnings)

    def fail(self, message: str) -> NoReturn:
        self.add(message)
        raise InvalidClass(self.items, self.warnings)


class _BoundedLoader(yaml.SafeLoader):
    """SafeLoader without aliases (no "billion laughs"), with a nesting and a node limit."""

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()  # type: ignore[no-untyped-call]
            raise yaml.MarkedYAMLError(
                "while composing", None, "YAML aliases (*name) are not allowed", event.start_mark
            )
        self._count_node()
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

    def _count_node(self) -> None:
        # Counted as nodes are composed, so an oversized document stops at the limit.
        if not hasattr(self, "_nodes"):
            self._nodes = _class_nodes.get() or [MAX_YAML_NODES, MAX_YAML_TOTAL_BYTES]
        self._nodes[0] -= 1
        if self._nodes[0] < 0:
            mark = self.peek_event().start_mark  # type: ignore[no-untyped-call]
            raise yaml.MarkedYAMLError(
                None,
                None,
                f"more than {MAX_YAML_NODES} YAML values (lists, maps, scalars) in the class; "
                "split it into several SecretProviderClasses",
                mark,
            )


def load_yaml(text: str, field: str) -> Any:
    """Parse a YAML (or JSON) parameter; errors name the field and the line."""
    if len(text.encode()) > MAX_YAML_BYTES:
        raise InvalidParameters(
            f"{field}: {len(text.encode())} bytes is over the {MAX_YAML_BYTES}-byte limit"
        )
    if not _charge_bytes(len(text)):
        raise InvalidParameters(
            f"{field}: the class's YAML parameters are over {MAX_YAML_TOTAL_BYTES} bytes in all"
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
    """Parse a secret's content as YAML with the same limits (transforms use it), charged to
    the current budget (the mount's, see provider/mount/mounting.py). Raises ValueError or
    yaml.YAMLError, whose text may quote the value: callers replace it with a fixed message."""
    if not _charge_bytes(len(text)):
        raise ValueError("over the YAML byte budget")
    return yaml.load(text, Loader=_BoundedLoader)  # noqa: S506


def _charge_bytes(size: int) -> bool:
    budget = _class_nodes.get()
    if budget is None:
        return True
    budget[1] -= size
    return budget[1] >= 0


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


#: Go's strconv.ParseBool, which the upstream providers use for their switches: exactly these.
GO_TRUE = frozenset({"1", "t", "T", "TRUE", "true", "True"})
GO_FALSE = frozenset({"0", "f", "F", "FALSE", "false", "False"})


def go_bool(value: str, field: str, problems: Problems, default: bool = False) -> bool:
    """A switch spelled as Go's strconv.ParseBool reads it; '' is the default. Callers trim
    first where their upstream trims (Azure, AWS usePodIdentity does not)."""
    if value == "":
        return default
    if value in GO_TRUE:
        return True
    if value in GO_FALSE:
        return False
    problems.add(
        f'{field}: expected "true" or "false" (or 1, t, T, TRUE, True, 0, f, F, FALSE, False), '
        f"got {value!r}"
    )
    return default


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
    """A scalar parameter as a string ('' when absent). Other scalars are read as text, as the
    upstream decoders put them into string fields: `secretKey: 1` is "1", `true` is "true", a
    date is its ISO form. (yaml.v3 keeps the source text, so `0400` is "0400" there but "256"
    here: quote such values.)"""
    if value is None or value == "":
        if required:
            problems.add(f"{field} is required")
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, datetime.date):
        return value.isoformat()
    if not isinstance(value, str | int | float):
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
    *,
    upstream: bool = False,
) -> None:
    """Report every key of an entry that its dialect does not know.

    Upstream providers decode entries into structs and drop unknown keys, so a class carrying
    one (a comment field, a key of another release) must still move over: each is a warning
    naming the key, the object and the nearest known key — a problem only under
    `serve --strict-parameters` (`problems.strict`). A `refused` key (an upstream feature we do
    not implement, whose silent omission would change what is read) is always a problem, and so
    is any unknown key of an entry that is not an `upstream` object (a template is ours alone:
    no upstream class carries one, so a typo there is an error).
    """
    label = _object_label(obj)
    for key in sorted(set(obj) - known, key=str):
        if refused and key in refused:
            problems.add(f"{where}.{key} is not supported by secrets-bridge: {refused[key]}")
            continue
        if not upstream:
            close = difflib.get_close_matches(str(key), sorted(known), n=1, cutoff=0.6)
            hint = (
                f"; did you mean {close[0]!r}?"
                if close
                else f" (known: {', '.join(sorted(known))})"
            )
            problems.add(f"{where}.{key} is not a parameter of {what}{hint}")
            continue
        nearest = _nearest(str(key), known)
        hint = f"; the nearest known key is {nearest!r}" if nearest else ""
        if problems.strict:
            problems.add(
                f"{where}.{key} is not a parameter of {what}{label}{hint} (refused: the "
                "provider runs with --strict-parameters)"
            )
        else:
            problems.warn(
                f"{where}.{key} is not a parameter of {what}{label} and is ignored, as "
                f"upstream ignores it{hint}"
            )


def _object_label(obj: Mapping[Any, Any]) -> str:
    """` (objectName 'db')`: how a warning names the object besides its index."""
    for key in ("objectName", "resourceName", "path", "objectAlias"):
        value = obj.get(key)
        if isinstance(value, str) and value:
            return f" ({key} {shown(value, 60)})"
    return ""


def _nearest(key: str, known: frozenset[str]) -> str | None:
    folded = [k for k in sorted(known) if k.lower() == key.lower()]
    if folded:
        return folded[0]
    close = difflib.get_close_matches(key, sorted(known), n=1, cutoff=0.0)
    return close[0] if close else None


def fold_keys(
    obj: Mapping[Any, Any], known: frozenset[str], where: str, problems: Problems
) -> dict[Any, Any]:
    """Keys matched case-insensitively to their known spelling, as Go's encoding/json matches
    struct fields (the AWS provider decodes `objects` that way: `Path:` is `path`). Two keys
    that fold to one are refused rather than one silently winning."""
    canonical = {k.lower(): k for k in known}
    out: dict[Any, Any] = {}
    spelled: dict[Any, Any] = {}
    for key, value in obj.items():
        name = canonical.get(key.lower(), key) if isinstance(key, str) else key
        if name in out:
            problems.add(
                f"{where}: {spelled[name]!r} and {key!r} are one key (keys are matched "
                "ignoring case); keep one"
            )
            continue
        out[name] = value
        spelled[name] = key
    return out


#: Our extension keys, accepted on the objects of every dialect (docs/architecture.md).
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
    """Syntax, size and function names of an expression, so a class fails at parse time rather
    than on every mount (an unknown function or a wrong argument count is otherwise found only
    when evaluating)."""
    import jmespath
    from jmespath.exceptions import JMESPathError

    if len(expression) > MAX_JMESPATH_CHARS:
        problems.add(
            f"{field}: the JMESPath expression {shown(expression)} is {len(expression)} "
            f"characters, over the limit of {MAX_JMESPATH_CHARS}"
        )
        return
    try:
        tree = jmespath.compile(expression).parsed
    except JMESPathError as exc:
        first = str(exc).splitlines()[0]
        problems.add(
            f"{field}: invalid JMESPath expression {expression!r}: {first} "
            "(quote keys containing '-' or '.', e.g. '\"db-password\"')"
        )
        return
    except RecursionError:
        tree = None
    problem = _jmespath_tree_problem(tree)
    if problem:
        problems.add(f"{field}: JMESPath expression {shown(expression)}: {problem}")


def shown(expression: str, limit: int = 80) -> str:
    """An expression as messages quote it: repr, cut to `limit` characters."""
    text = expression if len(expression) <= limit else expression[: limit - 1] + "…"
    return repr(text)


def _jmespath_tree_problem(tree: Any) -> str | None:
    from jmespath.functions import Functions

    if tree is None:
        return f"nested deeper than {MAX_JMESPATH_DEPTH} levels"
    count = 0
    stack: list[tuple[Any, int]] = [(tree, 1)]
    while stack:
        node, depth = stack.pop()
        count += 1
        if count > MAX_JMESPATH_NODES:
            return f"more than {MAX_JMESPATH_NODES} syntax nodes; simplify it"
        if depth > MAX_JMESPATH_DEPTH:
            return f"nested deeper than {MAX_JMESPATH_DEPTH} levels"
        if node.get("type") == "function_expression":
            problem = _function_problem(node["value"], len(node["children"]), Functions)
            if problem:
                return problem
        stack.extend((child, depth + 1) for child in node.get("children", []) if _is_node(child))
    return None


def _is_node(child: Any) -> bool:
    # Slices keep their bounds (ints or None) among the children.
    return isinstance(child, dict) and "type" in child


def _function_problem(name: str, given: int, functions: Any) -> str | None:
    spec = functions.FUNCTION_TABLE.get(name)
    if spec is None:
        return f"unknown function {name}()"
    signature = spec["signature"]
    variadic = bool(signature) and signature[-1].get("variadic", False)
    if given < len(signature) or (given > len(signature) and not variadic):
        want = f"at least {len(signature)}" if variadic else str(len(signature))
        return f"{name}() takes {want} argument(s), got {given}"
    return None


def unique_names(names: list[tuple[str, str]], what: str, problems: Problems) -> None:
    """Report every duplicated name at once: names is [(name, field)]."""
    seen: dict[str, list[str]] = {}
    for name, field in names:
        seen.setdefault(name, []).append(field)
    for name, fields in seen.items():
        if len(fields) > 1:
            problems.add(f"{what} {name!r} is used by {', '.join(fields)}; names must be unique")
