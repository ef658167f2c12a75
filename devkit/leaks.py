"""What counts as secret material in the harness's outputs (logs, metrics, versions, the
audit trail).

The values the harness's stores serve, the installation keys it writes, and the shapes of tokens
and keys: the suite-wide log guard (tests/conftest.py) and `devkit.serving` (/metrics and the
`--audit-log` file) all check against this one list.
"""

from __future__ import annotations

import logging
import re

from provider.edge.logs import JsonFormatter

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
    # The installation keys of devkit.serving and devkit.testing.Harness (`--hmac-key-file`).
    "0123456789abcdef0123456789abcdef",
    "k" * 32,
)
PATTERNS = re.compile(
    r"eyJ[\w-]{8,}\.[\w-]{8,}\.[\w-]{8,}"  # a JWT (pod tokens, access tokens)
    r"|-----BEGIN (?:RSA |EC )?PRIVATE KEY-----"
    r"|\b(?:hv|hb)[sbr]\.[\w-]{20,}"  # Vault/OpenBao tokens
)


def leaks_in_text(text: str) -> list[str]:
    """Secret material found in `text`, each named by a short prefix only."""
    found = [m.group(0)[:12] for m in PATTERNS.finditer(text)]
    return found + [s for s in KNOWN_SECRETS if s in text]


_FORMAT = JsonFormatter()


def leaks_in(records: list[logging.LogRecord]) -> list[str]:
    """Which records carry secret material, formatted exactly as `serve` writes them (named by
    logger and a short prefix only)."""
    return [f"{r.name}: {leak}" for r in records for leak in leaks_in_text(_FORMAT.format(r))]
