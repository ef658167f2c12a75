"""Suite-wide guard: no secret value or token in any log line the provider writes (object
versions are logged at DEBUG, so they are checked too; `devkit.serving` checks /metrics).

Every test runs with the provider's loggers captured at DEBUG (SDK loggers at the levels the
provider configures in production). After the test, each captured record — formatted exactly as
`serve` writes it, structured fields and tracebacks included — must contain no JWT, no private
key, no Vault/OpenBao token and none of the suite's known secret values.

And no proxy from the developer's shell: every store call honours HTTPS_PROXY/NO_PROXY
(backends/proxies.py), so a proxy set in the environment would carry the suite's loopback
calls; the proxy tests set their own.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from devkit.connect_proxy import VARIABLES as PROXY_VARIABLES
from devkit.leaks import leaks_in


@pytest.fixture(autouse=True)
def no_proxy_from_the_shell(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)


@pytest.fixture(autouse=True)
def no_secrets_in_logs(caplog: pytest.LogCaptureFixture) -> Iterator[None]:
    caplog.set_level(logging.DEBUG, logger="secrets_bridge")
    yield
    records = [r for when in ("setup", "call", "teardown") for r in caplog.get_records(when)]  # type: ignore[arg-type]
    leaks = leaks_in(records)
    assert not leaks, f"secret material in log lines: {leaks}"
