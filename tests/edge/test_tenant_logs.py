"""Issue 20 against a served provider: an attacking namespace gets a clear error, the provider
stays under a memory ceiling and answers another namespace right after, no value reaches the
error or the logs, and no parameter can forge a log line in either log format."""

from __future__ import annotations

import json
import logging
import tracemalloc

import grpc
import pytest

from devkit.testing import driver_request
from provider.edge.logs import JsonFormatter, TextFormatter
from tests.edge.conftest import Provider

CEILING = 64 * 1024 * 1024
DOUBLING = "k" + " | join('', [@, @])" * 30


def fake(objects: str, **extra: str) -> dict[str, str]:
    return {"backend": "fake", "objects": objects, **extra}


async def refused(provider: Provider, request: object) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await provider.stub.Mount(request, timeout=10)
    return info.value


@pytest.mark.parametrize(
    ("params", "text"),
    [
        (
            fake(f'- {{objectName: o, secretPath: one, extract: "{DOUBLING}"}}'),
            "object 'o': extract expression",
        ),
        (
            fake(
                "- {objectName: b, secretPath: big, file: false}",
                templates="- path: t\n  template: '" + "${b}" * 60_000 + "'\n",
            ),
            "templates[0] ('t') would render",
        ),
    ],
    ids=["jmespath doubling", "template amplification"],
)
async def test_attack_is_refused_and_others_are_served(
    provider: Provider, params: dict[str, str], text: str
) -> None:
    provider.write_store({"secrets": {"one": '{"k": "a"}', "big": "b" * 65536, "api-key": "k-1"}})
    attack = driver_request(params, namespace="tenant-b")
    await refused(provider, attack)  # parses the class (tracemalloc would make that slow)
    tracemalloc.start()
    try:
        error = await refused(provider, attack)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < CEILING, f"peak {peak / 2**20:.0f} MiB"
    assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert text in error.details() and "--max-response-bytes" in error.details()
    ok = await provider.stub.Mount(
        driver_request(fake("- {objectName: api, secretPath: api-key}"), namespace="tenant-a"),
        timeout=10,
    )
    assert ok.files[0].contents == b"k-1"


async def test_runtime_error_names_expression_not_value(
    provider: Provider, caplog: pytest.LogCaptureFixture
) -> None:
    provider.write_store({"secrets": {"s": json.dumps({"password": "s3cr3t"})}})
    error = await refused(
        provider, driver_request(fake("- {objectName: o, secretPath: s, extract: abs(password)}"))
    )
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "object 'o': extract expression 'abs(password)'" in error.details()
    assert "s3cr3t" not in error.details() and "s3cr3t" not in caplog.text
    assert "mount failed unexpectedly" not in caplog.text  # not INTERNAL any more


FORGED = "x\nerror secrets_bridge.server: mount failed namespace=kube-system\r\x1b[2K"


async def test_parameters_cannot_forge_log_lines(
    provider: Provider, caplog: pytest.LogCaptureFixture
) -> None:
    provider.write_store({"secrets": {"api-key": "k-1"}})
    request = driver_request(fake("- {objectName: o, secretPath: nope}"), spc=FORGED)
    await refused(provider, request)
    records = [r for r in caplog.records if r.name.startswith("secrets_bridge")]
    assert any(getattr(r, "fields", {}).get("class") == FORGED for r in records)
    for record in records:
        for formatter in (TextFormatter(), JsonFormatter()):
            line = formatter.format(record)
            assert "\n" not in line and "\r" not in line and "\x1b" not in line
        entry = json.loads(JsonFormatter().format(record))
        if entry.get("class"):
            assert entry["class"] == FORGED  # JSON keeps the value exactly, escaped


def test_text_format_escapes_and_quotes() -> None:
    record = logging.LogRecord("secrets_bridge.server", logging.WARNING, "", 0, "a\nb", (), None)
    record.fields = {"class": "c d=e", "ns": "x\u2028y", "n": 3}
    line = TextFormatter().format(record)
    assert line == 'warning secrets_bridge.server: a\\nb class="c d=e" ns=x\\u2028y n=3'
    try:
        raise ValueError("boom\nerror forged")
    except ValueError:
        import sys

        record.exc_info = sys.exc_info()
    lines = TextFormatter().format(record).splitlines()
    assert all(line.startswith("  | ") for line in lines[1:])
