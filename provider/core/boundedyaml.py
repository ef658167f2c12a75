"""YAML from tenants, bounded: no aliases, limited nesting, and one budget of nodes and bytes
shared by every document of a class (its parameters) or of a mount (its secret values).

Every YAML a tenant controls is read through `load_yaml` (parameters: errors name the field and
the line) or `load_yaml_safe` (secret values: callers replace the error with a fixed message).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar
from typing import Any

import yaml

from provider.core.errors import InvalidParameters

MAX_YAML_BYTES = 256 * 1024
MAX_YAML_DEPTH = 32
#: YAML nodes (scalars, lists, maps) one class may hold across all its YAML parameters. The pure
#: Python parser is slow per node, so a document within the byte limit held the event loop for
#: seconds (measured: BENCHMARKS.md, "The YAML parser's cost per node"); a class of 100 objects
#: with ten keys each has about 2,100. Also the cap for a YAML secret value.
MAX_YAML_NODES = 10_000
#: YAML text one class (all its parameters) or one mount (all its secret values) may parse.
MAX_YAML_TOTAL_BYTES = 1024 * 1024
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


class UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that refuses a key given twice in one map, as kubectl and the upstream
    providers' YAML parsers do (PyYAML keeps the last one silently, so `backend: vault` then
    `backend: aws` would have been an aws class)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[tuple[str, str], int] = {}
        for key_node, _ in node.value:
            if not isinstance(key_node, yaml.ScalarNode):
                continue
            key = (key_node.tag, key_node.value)
            line = key_node.start_mark.line + 1
            if key in seen:
                raise yaml.MarkedYAMLError(
                    None,
                    None,
                    f"the key {key_node.value!r} is given twice, on lines {seen[key]} and "
                    f"{line}; keep one",
                    key_node.start_mark,
                )
            seen[key] = line
        return super().construct_mapping(node, deep=deep)


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


class _ParameterLoader(UniqueKeyLoader, _BoundedLoader):
    """A tenant's parameters: bounded, and a key given twice is refused."""


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
        return yaml.load(text, Loader=_ParameterLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as exc:
        raise InvalidParameters(f"{field}: invalid YAML {yaml_problem(exc, 'at ')}") from None


def yaml_problem(exc: yaml.YAMLError, at: str = "") -> str:
    """The parser's complaint with the line and column it names (1-based, as editors count);
    never the text around it (it may be a secret)."""
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    if mark is None:
        return str(problem)
    return f"{at}line {mark.line + 1}, column {mark.column + 1}: {problem}"


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
