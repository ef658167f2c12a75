"""Property-based tests: whatever the attributes, parsing ends in a plan or InvalidParameters.

Never another exception type (which the server would report as INTERNAL): every dialect's
parser is driven with its own keys holding random text, random YAML documents, and YAML made of
plausible object entries with random values.
"""

from __future__ import annotations

import json

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from backends import registry
from provider.core.errors import InvalidParameters
from provider.mount.planning import parse_plan
from provider.mount.request import parse_request

FUZZ = settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**40), 2**40),
    st.floats(allow_nan=False),
    st.text(max_size=30),
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=12), inner, max_size=4)
    ),
    max_leaves=12,
)


def object_entries(backend: str) -> st.SearchStrategy[str]:
    """YAML lists of maps using the dialect's object keys (and a few strangers)."""
    module = registry.dialect_module(backend)
    keys = sorted(
        getattr(getattr(module, "OBJECTS", None), "keys", frozenset())
        | {"extract", "explode", "decode", "file", "zzz"}
    )
    entry = st.dictionaries(st.sampled_from(keys), values, max_size=6)
    docs = st.lists(entry, max_size=4)
    if backend == "azure":  # azure wraps each object in `array:` as a YAML string
        return docs.map(lambda items: yaml.safe_dump({"array": [yaml.safe_dump(i) for i in items]}))
    return docs.map(yaml.safe_dump)


def params_for(backend: str) -> st.SearchStrategy[dict[str, str]]:
    module = registry.dialect_module(backend)
    keys = sorted(module.KEYS)
    text_value = st.one_of(st.text(max_size=40), values.map(lambda v: yaml.safe_dump(v)))
    base = st.dictionaries(st.sampled_from(keys), text_value, max_size=6)
    listish = sorted(module.listed([]))  # the parameter(s) the dialect lists objects under

    def with_objects(d: dict[str, str], objs: str, tmpl: str) -> dict[str, str]:
        out = {**d, "backend": backend}
        for k in listish:
            out[k] = objs
        out["templates"] = tmpl
        return out

    templates = st.one_of(
        st.just(""),
        values.map(yaml.safe_dump),
        st.lists(
            st.dictionaries(
                st.sampled_from(["path", "mode", "template", "format", "objects"]),
                values,
                max_size=4,
            ),
            max_size=3,
        ).map(yaml.safe_dump),
    )
    return st.builds(with_objects, base, object_entries(backend), templates)


@pytest.mark.parametrize("backend", registry.names())
def test_dialect_parsers_fail_cleanly(backend: str) -> None:
    @FUZZ
    @given(params_for(backend))
    def check(params: dict[str, str]) -> None:
        try:
            parse_plan(params, options_for=lambda _n: None, enable_test_stores=True)
        except InvalidParameters as exc:
            assert exc.problems and all(isinstance(p, str) and p for p in exc.problems)

    check()


@FUZZ
@given(
    st.one_of(
        st.text(max_size=200),
        st.dictionaries(st.text(max_size=40), values, max_size=8).map(json.dumps),
    ),
    st.one_of(
        st.just("null"),
        st.text(max_size=50),
        st.dictionaries(st.text(max_size=10), values, max_size=3).map(json.dumps),
    ),
    st.text(max_size=8),
)
def test_attributes_fail_cleanly(attributes: str, secrets: str, permission: str) -> None:
    try:
        parse_request(attributes, secrets, permission, "/t")
    except InvalidParameters as exc:
        assert str(exc)


def test_ten_thousand_objects_are_refused_quickly() -> None:
    import time

    objects = yaml.safe_dump([{"objectName": f"o{i}"} for i in range(10_000)])
    start = time.monotonic()
    with pytest.raises(InvalidParameters):
        parse_plan(
            {"backend": "fake", "objects": objects},
            options_for=lambda _n: None,
            enable_test_stores=True,
        )
    assert time.monotonic() - start < 5
