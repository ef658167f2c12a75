"""Issue 20: a tenant's class cannot make the provider build more than its budgets allow.

JMESPath that multiplies its input, templates that repeat a large object, explode and the YAML
of a class are refused with a clear error naming the object (or field) and the budget, before
the provider allocates anything near the amplified size; budgets are tested at their edges.
"""

from __future__ import annotations

import json
import time
import tracemalloc
from collections.abc import Awaitable
from pathlib import Path
from typing import Any

import pytest

from devkit.testing import Harness, make_pod
from provider.core.boundedyaml import MAX_YAML_NODES, load_yaml, yaml_node_budget
from provider.core.errors import BridgeError, InvalidParameters, LimitExceeded, MountFailed
from provider.core.files import wire_size
from provider.core.parsing import MAX_JMESPATH_CHARS
from provider.mount import mounting
from provider.mount.jmes import MAX_STEPS as MAX_EXTRACT_STEPS
from provider.mount.templates import MAX_TEMPLATE_BYTES
from provider.mount.transforms import MAX_EXPLODE_FILES

#: What one attack may make the provider allocate at its peak (the DaemonSet has 256 MiB).
CEILING = 64 * 1024 * 1024
DOUBLING = "k" + " | join('', [@, @])" * 30  # the 1-byte -> 1 GiB expression
STORE = {
    "one": json.dumps({"k": "a"}),
    "big": "b" * 65536,
    "pw": json.dumps({"password": "pw-1"}),
}


async def peak_of(call: Awaitable[Any]) -> tuple[int, BaseException | None]:
    """Peak bytes traced while `call` runs, and what it raised."""
    tracemalloc.start()
    try:
        await call
        error = None
    except BridgeError as exc:
        error = exc
    finally:
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    return peak, error


def cause(error: BaseException | None) -> BridgeError:
    """The one object's error inside a MountFailed."""
    assert isinstance(error, MountFailed), error
    ((_, inner),) = error.failures
    return inner


def template(text: str, path: str = "t") -> str:
    # Written by hand: yaml.safe_dump of a 240 KB scalar costs more than the mount.
    return f"- path: {path}\n  template: '{text}'\n"


ATTACKS: list[tuple[str, list[dict[str, Any]], dict[str, str], str]] = [
    (
        "jmespath join doubling",
        [{"objectName": "o", "secretPath": "one", "extract": DOUBLING}],
        {},
        "object 'o': extract expression",
    ),
    (
        "jmespath nested lists",
        [{"objectName": "o", "secretPath": "one", "extract": "[@, @]" + " | [@, @]" * 40}],
        {},
        "object 'o': extract expression",
    ),
    (
        "jmespath to_string of a shared structure",
        [
            {
                "objectName": "o",
                "secretPath": "one",
                "extract": "to_string(" + "[@, @] | " * 30 + "@)",
            }
        ],
        {},
        "object 'o': extract expression",
    ),
    (
        "jmespath flatten doubling",
        [{"objectName": "o", "secretPath": "big", "extract": "[@, @]" + " | [@, @][]" * 12}],
        {},
        "object 'o': extract expression",
    ),
    (
        "template 60,000 x ${b} over 64 KiB",
        [{"objectName": "b", "secretPath": "big", "file": False}],
        {"templates": template("${b}" * 60_000)},
        "templates[0] ('t') would render 3932160000 bytes",
    ),
    (
        "many objects each near the limit",
        [
            # 2 MiB each: the first fits, the second would pass the mount's budget.
            {
                "objectName": f"o{i}",
                "secretPath": "big",
                "extract": "join('', [@" + ", @" * 31 + "])",
            }
            for i in range(100)
        ],
        {},
        "--max-response-bytes",
    ),
]


@pytest.mark.parametrize(
    ("objects", "params", "text"), [a[1:] for a in ATTACKS], ids=[a[0] for a in ATTACKS]
)
async def test_amplification_is_refused_before_allocating(
    harness: Harness, objects: list[dict[str, Any]], params: dict[str, str], text: str
) -> None:
    harness.write({"secrets": STORE})
    request = harness.request(objects, **params)
    started = time.perf_counter()
    with pytest.raises(BridgeError):
        await harness.mounter.mount(request)
    assert time.perf_counter() - started < 2
    # Again under tracemalloc (slow, so not timed; the parsed class is reused).
    peak, error = await peak_of(harness.mounter.mount(request))
    assert peak < CEILING, f"peak {peak / 2**20:.0f} MiB"
    assert isinstance(error, BridgeError) and error.code.name == "RESOURCE_EXHAUSTED"
    assert text in str(error) and "--max-response-bytes" in str(error)
    # The provider is fine: another namespace's mount right after succeeds.
    other = harness.request(
        [{"objectName": "p", "secretPath": "pw", "extract": "password"}],
        pod=make_pod(namespace="tenant-a"),
    )
    assert (await harness.mounter.mount(other)).files[0].contents == b"pw-1"


async def test_extract_has_a_step_budget(harness: Harness) -> None:
    harness.write({"secrets": {"list": json.dumps(list(range(MAX_EXTRACT_STEPS // 2)))}})
    # CPU time, not wall time: what the budget bounds, whatever else the machine runs.
    started = time.process_time()
    with pytest.raises(MountFailed) as info:
        await harness.files(
            [{"objectName": "o", "secretPath": "list", "extract": "[*].to_string(@)"}]
        )
    assert time.process_time() - started < 2
    assert isinstance(cause(info.value), LimitExceeded)
    assert f"needs more than {MAX_EXTRACT_STEPS} evaluation steps" in str(info.value)


def budget_harness(tmp_path: Path, limit: int, secrets: dict[str, str]) -> Harness:
    tmp_path.mkdir()
    harness = Harness(tmp_path, max_response_bytes=limit)
    harness.write({"secrets": secrets})
    return harness


# (case, secrets, objects, templates, bytes the answer builds: paths + contents)
EDGES: list[tuple[str, dict[str, str], list[dict[str, Any]], str, int]] = [
    ("plain object", {"s": "x" * 100}, [{"objectName": "o", "secretPath": "s"}], "", 101),
    (
        "extract join",
        {"s": json.dumps({"l": ["ab", "cd", "ef"]})},
        [{"objectName": "o", "secretPath": "s", "extract": "join('', l)"}],
        "",
        7,
    ),
    (
        "extract to a list",
        {"s": json.dumps({"k": "ab"})},
        [{"objectName": "o", "secretPath": "s", "extract": "[k, k]"}],
        "",
        len('["ab","ab"]') + 1,
    ),
    (
        "template repeats an input",
        {"s": "y" * 50},
        [{"objectName": "b", "secretPath": "s", "file": False}],
        template("${b}${b}$$"),
        1 + 50 + 1 + 101,  # the input (file: false counts), then the template
    ),
    (
        "env format",
        {"s": "it's"},
        [{"objectName": "b", "secretPath": "s", "file": False}],
        "- path: e\n  format: env\n",
        1 + 4 + 1 + len("B='it'\\''s'\n"),
    ),
]


@pytest.mark.parametrize(
    ("secrets", "objects", "templates", "size"), [e[1:] for e in EDGES], ids=[e[0] for e in EDGES]
)
async def test_budget_edges(
    tmp_path: Path,
    secrets: dict[str, str],
    objects: list[dict[str, Any]],
    templates: str,
    size: int,
) -> None:
    params = {"templates": templates} if templates else {}
    # The answer is also measured as sent (issue 33): the limit is whichever budget binds, the
    # bytes built (file: false inputs count) or the serialized answer.
    roomy = budget_harness(tmp_path / "roomy", 1 << 20, secrets)
    answer = await roomy.mounter.mount(roomy.request(objects, **params))
    size = max(size, wire_size(answer.files, answer.versions))
    at_limit = budget_harness(tmp_path / "at", size, secrets)
    await at_limit.mounter.mount(at_limit.request(objects, **params))
    over = budget_harness(tmp_path / "over", size - 1, secrets)
    with pytest.raises(BridgeError) as info:
        await over.mounter.mount(over.request(objects, **params))
    assert info.value.code.name == "RESOURCE_EXHAUSTED"
    assert "--max-response-bytes" in str(info.value)


async def test_one_template_is_at_most_one_mebibyte(harness: Harness) -> None:
    harness.write({"secrets": {"s": "z" * 1024}})
    objects = [{"objectName": "b", "secretPath": "s", "file": False}]
    fits = "${b}" * (MAX_TEMPLATE_BYTES // 1024)
    assert len((await harness.files(objects, templates=template(fits)))["t"]) == MAX_TEMPLATE_BYTES
    with pytest.raises(LimitExceeded, match="at most 1048576 for one template"):
        await harness.files(objects, templates=template(fits + "!"))


@pytest.mark.parametrize(
    ("keys", "ok"), [(MAX_EXPLODE_FILES, True), (MAX_EXPLODE_FILES + 1, False)]
)
async def test_explode_file_count_edge(harness: Harness, keys: int, ok: bool) -> None:
    harness.write({"secrets": {"s": json.dumps({f"k{i}": "v" for i in range(keys)})}})
    objects = [{"objectName": "o", "secretPath": "s", "explode": True}]
    if ok:
        assert len(await harness.files(objects)) == keys
        return
    with pytest.raises(MountFailed, match=f"over the limit of {MAX_EXPLODE_FILES} for one object"):
        await harness.files(objects)


@pytest.mark.parametrize(
    ("length", "ok"), [(MAX_JMESPATH_CHARS, True), (MAX_JMESPATH_CHARS + 1, False)]
)
async def test_expression_length_edge(harness: Harness, length: int, ok: bool) -> None:
    harness.write({"secrets": {"s": json.dumps({"k": "v"})}})
    expression = "k" + " " * (length - 1)
    objects = [{"objectName": "o", "secretPath": "s", "extract": expression}]
    if ok:
        assert await harness.files(objects) == {"o": b"v"}
        return
    with pytest.raises(InvalidParameters, match=f"over the limit of {MAX_JMESPATH_CHARS}"):
        await harness.files(objects)


@pytest.mark.parametrize(("nodes", "ok"), [(MAX_YAML_NODES, True), (MAX_YAML_NODES + 1, False)])
def test_yaml_node_budget_edge(nodes: int, ok: bool) -> None:
    text = "[" + ",".join(["1"] * (nodes - 1)) + "]"  # the list itself is a node too
    with yaml_node_budget():
        if ok:
            assert len(load_yaml(text, "objects")) == nodes - 1
            return
        with pytest.raises(InvalidParameters, match=f"more than {MAX_YAML_NODES} YAML values"):
            load_yaml(text, "objects")


def test_yaml_node_budget_is_shared_by_the_class() -> None:
    # Objects, templates and Azure's nested object strings of one class share one budget.
    half = "[" + ",".join(["1"] * (MAX_YAML_NODES // 2)) + "]"
    with yaml_node_budget():
        load_yaml(half, "objects")
        with pytest.raises(InvalidParameters, match=r"templates: invalid YAML.*YAML values"):
            load_yaml(half, "templates")


async def test_class_budget_through_a_mount(harness: Harness) -> None:
    half = "[" + ",".join(["o"] * (MAX_YAML_NODES // 2)) + "]"
    objects = [{"objectName": "o", "secretPath": "s"}]
    harness.write({"secrets": {"s": "v"}})
    one = f"- path: t\n  format: env\n  objects: {half}\n"
    assert (await harness.files(objects, templates=one))["t"].startswith(b"O='v'")
    with pytest.raises(InvalidParameters, match=r"templates: invalid YAML.*YAML values"):
        await harness.files(objects, templates=one + one.replace("path: t", "path: u"))


async def test_a_refused_class_is_parsed_once(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The kubelet retries a failing mount; a class that fails late in parsing is not parsed
    again (the refusal is kept by the same key as plans)."""
    calls = []
    real = mounting.parse_plan

    def counting(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(mounting, "parse_plan", counting)
    objects = [{"objectName": f"o{i}", "secretPath": "s"} for i in range(100)]
    bad = template("${nope}", path="last")
    for _ in range(3):
        with pytest.raises(InvalidParameters, match="unknown object 'nope'"):
            await harness.files(objects, templates=bad)
    assert len(calls) == 1
    # A fixed class is a different key: parsed afresh.
    harness.write({"secrets": {"s": "v"}})
    await harness.files(objects)
    assert len(calls) == 2


async def test_worst_class_within_the_limits_parses_quickly(harness: Harness) -> None:
    """256 KiB of `[1,1,...]` took 3 s of event loop to parse; the node budget stops it."""
    flood = "[" + ",".join(["1"] * (128 * 1024 - 1)) + "]"
    started = time.process_time()  # CPU time: the parse's own cost under any load
    with pytest.raises(InvalidParameters, match="YAML values"):
        await harness.mounter.mount(harness.request([], templates=flood))
    assert time.process_time() - started < 1.0
