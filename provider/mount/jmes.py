"""JMESPath under budgets: the `extract` of a class runs on a tenant's secret, in the process
that serves every namespace, so it must not be able to allocate or compute without bound.

jmespath has no budget of its own, and an expression such as `k | join('', [@, @]) | ...` doubles
its result at every step (30 steps of it on a one-byte value: over 1 GiB). Here every node visit
costs a step, every value a node builds is sized (as compact JSON) before the next node can build
on it, and `join`/`to_string` are checked before they allocate.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import jmespath
from jmespath import functions
from jmespath.visitor import Options, TreeInterpreter

if TYPE_CHECKING:
    from jmespath.visitor import _TreeNode

#: AST node visits plus container elements sized, per `extract` evaluation
#: (measured: BENCHMARKS.md, "The JMESPath step budget").
MAX_STEPS = 100_000


class OverBudget(Exception):
    """An evaluation went past its byte budget, or (`steps`) its step budget."""

    def __init__(self, steps: bool = False) -> None:
        super().__init__()
        self.steps = steps


def search(expression: str, data: Any, limit: int, steps: int = MAX_STEPS) -> Any:
    """`expression` on `data`, with results of at most `limit` bytes (as JSON) and at most
    `steps` steps; OverBudget otherwise. jmespath's own errors propagate."""
    return BoundedInterpreter(limit, steps).visit(jmespath.compile(expression).parsed, data)


class BoundedInterpreter(TreeInterpreter):  # type: ignore[misc]
    """jmespath's interpreter with budgets. Every node visit costs a step; every node that
    builds a value (function call, multi-select, projection, flatten, slice) has the JSON size
    of its result checked before the next node can build on it. Sizes of containers are
    remembered by identity, so `[@, @] | [@, @] | ...` is sized in O(1) per step while its
    written size doubles. `join` and `to_string` are checked before they allocate."""

    _BUILDERS = frozenset(
        {
            "function_expression",
            "multi_select_list",
            "multi_select_dict",
            "projection",
            "value_projection",
            "filter_projection",
            "flatten",
            "slice",
        }
    )

    def __init__(self, limit: int, steps: int) -> None:
        super().__init__(Options(custom_functions=_BoundedFunctions(self)))
        self.limit = limit
        self._steps = steps
        # id -> (the container itself, so the id stays its own; its JSON size)
        self._sizes: dict[int, tuple[Any, int]] = {}

    def visit(self, node: _TreeNode, *args: Any, **kwargs: Any) -> Any:
        self._step()
        result = super().visit(node, *args, **kwargs)
        if node["type"] in self._BUILDERS:
            self.size(result)
        return result

    def _step(self) -> None:
        self._steps -= 1
        if self._steps < 0:
            raise OverBudget(steps=True)

    def size(self, value: Any) -> int:
        """`value`'s compact JSON size (strings unquoted and unescaped, as a file holds a
        string result), or OverBudget past the limit."""
        if isinstance(value, str):
            total = len(value)
        elif isinstance(value, list | dict):
            total = self._container_size(value)
        elif isinstance(value, int) and not isinstance(value, bool):
            total = value.bit_length() * 3 // 10 + 2
        else:
            total = 24
        if total > self.limit:
            raise OverBudget()
        return total

    def _container_size(self, value: list[Any] | dict[str, Any]) -> int:
        held = self._sizes.get(id(value))
        if held is not None and held[0] is value:
            return held[1]
        total = 2 + max(len(value) - 1, 0)  # brackets and commas
        if isinstance(value, dict):
            for key, item in value.items():
                self._step()
                total += len(str(key)) + 3 + self._item_size(item)  # "key":
                if total > self.limit:
                    raise OverBudget()
        else:
            for item in value:
                self._step()
                total += self._item_size(item)
                if total > self.limit:
                    raise OverBudget()
        self._sizes[id(value)] = (value, total)
        return total

    def _item_size(self, item: Any) -> int:
        return self.size(item) + 2 if isinstance(item, str) else self.size(item)


class _BoundedFunctions(functions.Functions):  # type: ignore[misc]
    """The two built-ins whose output can be much larger than what the budget saw of their
    input (a join of many references to one string; JSON of a shared structure), checked
    before they allocate. Subclass methods replace the built-ins of the same name."""

    def __init__(self, interpreter: BoundedInterpreter) -> None:
        self._interpreter = interpreter

    @functions.signature({"types": ["string"]}, {"types": ["array-string"]})  # type: ignore[misc]
    def _func_join(self, separator: str, array: list[str]) -> str:
        size = sum(map(len, array)) + len(separator) * max(len(array) - 1, 0)
        if size > self._interpreter.limit:
            raise OverBudget()
        return separator.join(array)

    @functions.signature({"types": []})  # type: ignore[misc]
    def _func_to_string(self, arg: Any) -> str:
        if isinstance(arg, str):
            return arg
        self._interpreter.size(arg)
        return json.dumps(arg, separators=(",", ":"), default=str)
