"""Helpers every dialect parser uses: problem lists, modes, booleans, transforms, JMESPath
checks, the object list (YAML is read through provider/core/boundedyaml.py).

Parsers collect every problem before raising, so a user fixes a class in one round; each
message names the SPC field (`objects[1].objectName`) and says what to do.
"""

from __future__ import annotations

import dataclasses
import datetime
import difflib
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn, TypeVar

import yaml

from provider.core.boundedyaml import load_yaml
from provider.core.errors import InvalidParameters
from provider.core.model import ObjectSpec, ParseContext, Transforms

R = TypeVar("R")

#: JMESPath expressions: length and syntax-tree size (parse time), evaluation is bounded in
#: provider/mount/transforms.py. Deep nesting would otherwise hit Python's recursion limit.
MAX_JMESPATH_CHARS = 1024
MAX_JMESPATH_NODES = 256
MAX_JMESPATH_DEPTH = 48


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


def fraction(text: str) -> float | None:
    """A fraction above 0 and below 1, written `2/3` or `0.67`; None when `text` is not one
    (`--renew-at`, a class's `renewAt`)."""
    top, _, bottom = text.strip().partition("/")
    try:
        value = float(top) / float(bottom) if bottom else float(top)
    except (ValueError, ZeroDivisionError):
        return None
    return value if 0 < value < 1 else None  # NaN fails both comparisons


_DURATION = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ms|h|m|s)")
_UNIT_SECONDS = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}


def duration(text: str) -> float | None:
    """Seconds of a duration written as Kubernetes and Go write them (`90s`, `10m`, `1h30m`,
    `0.5h`), or a plain number of seconds; None when `text` is not one (a class's
    `refreshInterval`)."""
    text = text.strip()
    try:
        seconds = float(text)
    except ValueError:
        pos, seconds = 0, 0.0
        for match in _DURATION.finditer(text):
            if match.start() != pos:
                return None
            seconds += float(match.group(1)) * _UNIT_SECONDS[match.group(2)]
            pos = match.end()
        if pos == 0 or pos != len(text):
            return None
    return seconds if math.isfinite(seconds) and seconds >= 0 else None


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
TRANSFORM_KEYS = frozenset({"extract", "explode", "decode", "file", "optional"})


def parse_transforms(
    obj: Mapping[str, Any], where: str, problems: Problems, base: Transforms = Transforms()
) -> Transforms:
    """Our `extract`/`explode`/`decode`/`file`/`optional` keys of one object, over the
    dialect's own."""
    extract = expect_str(obj.get("extract"), f"{where}.extract", problems) or base.extract
    if extract:
        check_jmespath(extract, f"{where}.extract", problems)
    explode = parse_bool(obj.get("explode"), f"{where}.explode", problems, base.explode)
    decode: Any = expect_str(obj.get("decode"), f"{where}.decode", problems) or base.decode
    if decode not in (None, "base64", "hex"):
        problems.add(f"{where}.decode: expected base64 or hex, got {decode!r}")
        decode = None
    file = parse_bool(obj.get("file"), f"{where}.file", problems, base.file)
    optional = parse_bool(obj.get("optional"), f"{where}.optional", problems, base.optional)
    return Transforms(
        extract=extract or None,
        extract_key=base.extract_key,
        parse_as=base.parse_as,
        explode=explode,
        decode=decode,
        file=file,
        optional=optional,
    )


@dataclass(frozen=True)
class ObjectList:
    """How a dialect writes its object list (the parameter naming its objects, one map each)."""

    #: What an entry is, in the messages about its keys: "a vault object".
    what: str
    #: The entry's own keys; our extension keys (TRANSFORM_KEYS) are accepted beside them.
    keys: frozenset[str]
    #: The problem when the parameter is missing (and the class selects nothing); by default
    #: "objects is required: a YAML list of {<keys>}".
    required: str = ""
    #: The parameter; each entry's field is `<field>[i]` (`objects[2]`, GCP's `secrets[2]`).
    field: str = "objects"
    #: What the message about two entries writing one file calls the file's name.
    unique: str = "objectName"
    #: Upstream keys we do not implement, refused by name with what to use instead.
    refused: Mapping[str, str] = dataclasses.field(default_factory=dict)
    #: Keys match their known spelling ignoring case (AWS decodes entries as Go's JSON does).
    fold: bool = False
    #: The problem when the list is empty (and the class selects nothing); "" lets it pass.
    empty: str = ""

    def listed(self, items: list[dict[str, Any]]) -> dict[str, str]:
        """Object entries of a class of several stores (provider/mount/stores.py) as the
        parameter `parse` reads them: this list (the dialect's `listed`)."""
        return {self.field: yaml.safe_dump(items, sort_keys=False)}


#: What a dialect makes of one entry (the map, its field): its objects (AWS: one per
#: jmesPath entry besides the object's own), or None when the entry has problems.
Entry = Callable[[Mapping[str, Any], str], "ObjectSpec[R] | Sequence[ObjectSpec[R]] | None"]


def parse_objects(
    raw: str, form: ObjectList, entry: Entry[R], ctx: ParseContext[Any], problems: Problems
) -> list[ObjectSpec[R]]:
    """A class's object list `raw` (YAML or JSON) as its ObjectSpecs: problems collected."""
    if not raw.strip():
        if not ctx.selects:
            keys = ", ".join(sorted(form.keys))
            problems.add(form.required or f"{form.field} is required: a YAML list of {{{keys}}}")
        return []
    try:
        doc = load_yaml(raw, form.field)
    except InvalidParameters as exc:  # keep collecting the other parameters' problems
        problems.items.extend(exc.problems)
        return []
    return object_entries(doc, form.field, form, entry, ctx, problems)


def object_entries(
    doc: Any,
    where: str,
    form: ObjectList,
    entry: Entry[R],
    ctx: ParseContext[Any],
    problems: Problems,
    as_map: Callable[[Any, str, Problems], Mapping[str, Any] | None] = expect_map,
) -> list[ObjectSpec[R]]:
    """The loop over a loaded list `doc` (field `where`): held to `--max-objects` before any
    entry is parsed, each entry a map (`as_map` reads one otherwise written, Azure's YAML
    strings) of known keys handed to `entry`, and no two objects writing one file."""
    items = expect_list(doc, where, problems)
    if isinstance(doc, list) and not doc and form.empty and not ctx.selects:
        problems.add(form.empty)
    if len(items) > ctx.max_objects:
        problems.add(
            f"{where}: {len(items)} entries is over the limit of {ctx.max_objects}; this "
            f"provider allows at most {ctx.max_objects} (--max-objects) in a class: split it into "
            "several SecretProviderClasses"
        )
        return []
    keys = form.keys | TRANSFORM_KEYS
    specs: list[ObjectSpec[R]] = []
    for i, item in enumerate(items):
        at = f"{where}[{i}]"
        obj = as_map(item, at, problems)
        if obj is None:
            continue
        if form.fold:
            obj = fold_keys(obj, keys | frozenset(form.refused), at, problems)
        unknown_keys(obj, keys, at, form.what, problems, form.refused, upstream=True)
        got = entry(obj, at)
        specs.extend([got] if isinstance(got, ObjectSpec) else got or ())
    unique_names([(s.name, s.field) for s in specs], form.unique, problems)
    return specs


def plain_secrets(ref: object) -> None:
    """A dialect's `lifetime` when its answers are plain secrets: no lease, no certificate
    issued per read (`check`)."""
    return None


def file_object(
    obj: Mapping[str, Any], where: str, name: str, ref: R, problems: Problems
) -> ObjectSpec[R]:
    """The entry `where` as the file `name` of what `ref` reads: its `filePermission` and our
    extension keys, named in messages by its objectName."""
    mode = parse_mode(obj.get("filePermission"), f"{where}.filePermission", problems)
    transforms = parse_transforms(obj, where, problems)
    return ObjectSpec(name, ref, mode, transforms, f"{where}.objectName")


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


#: A base URL a class names (Vault's `vaultAddress`): the client appends `/v1/<path>` to it.
BASE_URL_FORM = (
    "http(s)://host[:port] with an optional path prefix, e.g. https://vault.example:8200"
)
_SCHEMES = ("http://", "https://")
#: Plain path segments, none of them '.' or '..'.
_PREFIX = re.compile(r"(?:/(?!\.\.?(?:/|$))[A-Za-z0-9._~-]+)+")
_BRACKETED = re.compile(r"\[[0-9A-Fa-f:.]+\]")
_PORT = re.compile(r"[0-9]{1,5}")
_SPACE_OR_CONTROL = re.compile(r"[\x00-\x20\x7f\\]")


def base_url_problem(url: str) -> str | None:
    """What makes `url` unfit as a base URL that API paths are appended to, or None.

    Accepted: `http(s)://host[:port]`, optionally with a path prefix of plain segments (a
    reverse proxy's, as the upstream Go clients join it: `path.Join(addr.Path, requestPath)`);
    trailing slashes are ignored. Refused, so that a class chooses the origin and a visible
    prefix but never the rest of a request: a query (`?`) or fragment (`#`), which would swallow
    the appended path (`https://v/v1/secret/x#` reads `secret/x` whatever object is named); user
    info (`user:pass@`: credentials in a class end up in messages and the audit trail, and a host
    that reads as another); `.`, `..` and percent-escaped prefix segments (yarl resolves them);
    backslashes, spaces, control and non-ASCII characters. The answer never quotes `url` (it
    may hold a password).
    """
    scheme = next((s for s in _SCHEMES if url.startswith(s)), None)
    if scheme is None:
        return "expected an http:// or https:// URL"
    for char, what in (("?", "a query ('?')"), ("#", "a fragment ('#')")):
        if char in url:
            return f"has {what}, which would replace the API path the provider appends"
    if not url.isascii():  # look-alikes too: IDNA maps '？' (U+FF1F) to '?'
        return "has a non-ASCII character; write an international host name in its xn-- form"
    if _SPACE_OR_CONTROL.search(url):
        return "has a space, a control character or a backslash"
    authority, _, path = url[len(scheme) :].partition("/")
    if "@" in authority:
        return "has user info ('user:password@'); credentials do not belong in a class"
    if "%" in url:
        return "has a percent-escape ('%'); write the host and prefix unescaped"
    host, colon, port = authority.partition(":")
    if authority.startswith("["):  # an IPv6 literal: [::1]:8200
        end = authority.find("]") + 1
        host, port = authority[:end], authority[end:]
        if not _BRACKETED.fullmatch(host) or (port and not port.startswith(":")):
            return "has a malformed bracketed IPv6 address"
        colon, port = port[:1], port[1:]
    elif ":" in port:
        return "has several ':' in the host; write an IPv6 address in brackets"
    if not host:
        return "has no host"
    if colon and not (_PORT.fullmatch(port) and 0 < int(port) < 65536):
        return "has a port that is not a number from 1 to 65535"
    prefix = path.rstrip("/")
    if prefix and not _PREFIX.fullmatch("/" + prefix):
        return (
            "has a path prefix that is not plain segments (letters, digits, '-', '.', '_', '~'; "
            "no '.', '..' or empty segment)"
        )
    return None
