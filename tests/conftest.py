"""Suite-wide guard: no secret value or token in any log line the provider writes.

Every test runs with the provider's loggers captured at DEBUG (SDK loggers at the levels the
provider configures in production). After the test, each captured record — formatted exactly as
`serve` writes it, structured fields and tracebacks included — must contain no JWT, no private
key, no Vault/OpenBao token and none of the suite's known secret values.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator

import pytest

from provider.logs import JsonFormatter

#: Secret values the suite's stores serve (tokens are caught by pattern).
KNOWN_SECRETS = (
    "pw-1",
    "pw-2",
    "key-123",
    "s3cr3t",
    "e2e-secret-",
    "correct-horse-",
    "p'w $HOME",
    "it's $ecret",
)
PATTERNS = re.compile(
    r"eyJ[\w-]{8,}\.[\w-]{8,}\.[\w-]{8,}"  # a JWT (pod tokens, access tokens)
    r"|-----BEGIN (?:RSA |EC )?PRIVATE KEY-----"
    r"|\b(?:hv|hb)[sbr]\.[\w-]{20,}"  # Vault/OpenBao tokens
)
_FORMAT = JsonFormatter()


def leaks_in(records: list[logging.LogRecord]) -> list[str]:
    """Which records carry secret material (named by logger and a short prefix only)."""
    leaks = []
    for record in records:
        line = _FORMAT.format(record)
        found = PATTERNS.search(line)
        known = [s for s in KNOWN_SECRETS if s in line]
        if found or known:
            leaks.append(f"{record.name}: {(found.group(0)[:12] if found else known[0])!r}")
    return leaks


@pytest.fixture(autouse=True)
def no_secrets_in_logs(caplog: pytest.LogCaptureFixture) -> Iterator[None]:
    caplog.set_level(logging.DEBUG, logger="secrets_bridge")
    yield
    records = [r for when in ("setup", "call", "teardown") for r in caplog.get_records(when)]  # type: ignore[arg-type]
    leaks = leaks_in(records)
    assert not leaks, f"secret material in log lines: {leaks}"
