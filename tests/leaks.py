"""What counts as secret material in the suite's outputs (logs, metrics, versions)."""

from __future__ import annotations

import re

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


def leaks_in_text(text: str) -> list[str]:
    """Secret material found in `text`, each named by a short prefix only."""
    found = [m.group(0)[:12] for m in PATTERNS.finditer(text)]
    return found + [s for s in KNOWN_SECRETS if s in text]
