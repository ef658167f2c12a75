"""What a cached Vault value keeps alive is what the value cache counts (issue 40, item 2): a
secret of many short keys parsed into a map kept about nine times its bytes beside it, while
the caches' byte bounds (`values_size`) counted its contents only."""

from __future__ import annotations

import gc
import json
import tracemalloc

from backends.vault.client import Reply
from backends.vault.store import _value
from provider.core.model import ObjectSpec, Transforms, values_size
from provider.mount.transforms import apply


def answer(keys: int) -> bytes:
    data = {f"key{i:05d}": f"v{i}" for i in range(keys)}
    return json.dumps({"request_id": "r", "lease_duration": 0, "data": data}).encode()


def test_a_cached_value_keeps_alive_no_more_than_it_counts() -> None:
    body = answer(20_000)
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        held = []
        for _ in range(10):
            read = _value(Reply(200, body), "reading")
            assert not isinstance(read, Exception)
            held.append([read.value])
            del read
        gc.collect()
        kept = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    counted = sum(values_size(v) for v in held)
    assert kept <= counted, f"kept {kept} bytes, counted {counted}"


def test_the_data_map_is_still_what_extraction_reads() -> None:
    read = _value(Reply(200, answer(3)), "reading")
    assert not isinstance(read, Exception)
    spec = ObjectSpec("f", "ref", transforms=Transforms(extract_key="key00002", parse_as="json"))
    assert apply(spec, read.value, 1 << 20) == [("", b"v2")]
