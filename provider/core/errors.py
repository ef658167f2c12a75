"""The one error hierarchy of secrets-bridge, and its single mapping to gRPC status codes.

    BridgeError                      (base; never raised itself)
     ├── InvalidParameters           INVALID_ARGUMENT   the SecretProviderClass or request is wrong
     ├── LimitExceeded               RESOURCE_EXHAUSTED the answer would exceed a configured limit
     ├── MissingCredential           FAILED_PRECONDITION no pod token / credentials for the store
     ├── PermissionDenied            PERMISSION_DENIED  the store or our policy refused the pod
     ├── NotFound                    NOT_FOUND          the object does not exist in the store
     ├── StoreUnavailable            UNAVAILABLE        transient: unreachable, 5xx, throttled
     ├── DeadlineExceeded            DEADLINE_EXCEEDED  the request's deadline passed
     └── MountFailed                 (code of its most actionable part) several objects failed

Anything that is not a BridgeError becomes INTERNAL with a fixed text; the traceback goes to the
log only (see provider/server.py). Backends translate their SDK's exceptions into this tree in
exactly one place each, so messages can name the object, store and identity without ever
carrying secret material. A store's error body is never relayed: messages carry the HTTP or RPC
status and the store's known error codes (`known_phrases`: our own fixed text for each), and the
body goes to a DEBUG log line only after `redacted`. `scrub` masks token-like strings in any
other text that came from outside (exception texts of transports).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import grpc

INTERNAL_TEXT = "internal error in secrets-bridge; see the provider's log for details"


class BridgeError(Exception):
    """Base class; `code` is the gRPC status this error is reported with."""

    code: grpc.StatusCode = grpc.StatusCode.INTERNAL
    #: Whether retrying the same call later may succeed.
    transient: bool = False

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return self.message


class InvalidParameters(BridgeError):
    """Bad SecretProviderClass parameters or request fields; lists every problem at once."""

    code = grpc.StatusCode.INVALID_ARGUMENT

    def __init__(self, problems: Sequence[str] | str) -> None:
        self.problems = [problems] if isinstance(problems, str) else list(problems)
        if len(self.problems) == 1:
            text = self.problems[0]
        else:
            text = f"{len(self.problems)} problems: " + "; ".join(self.problems)
        super().__init__(text)


class LimitExceeded(BridgeError):
    code = grpc.StatusCode.RESOURCE_EXHAUSTED


class MissingCredential(BridgeError):
    code = grpc.StatusCode.FAILED_PRECONDITION


class PermissionDenied(BridgeError):
    code = grpc.StatusCode.PERMISSION_DENIED


class NotFound(BridgeError):
    code = grpc.StatusCode.NOT_FOUND


class StoreUnavailable(BridgeError):
    code = grpc.StatusCode.UNAVAILABLE
    transient = True

    def __init__(self, message: str, *, retry_after: float | None = None) -> None:
        super().__init__(message)
        #: Seconds the store asked us to wait (Retry-After), if it said.
        self.retry_after = retry_after


class StoreSilent(StoreUnavailable):
    """A store call a client's own timer cut off (Vault's `--vault-request-timeout`): the store
    stayed silent rather than refused, however early the timer fired."""


class DeadlineExceeded(BridgeError):
    code = grpc.StatusCode.DEADLINE_EXCEEDED


# When several objects fail differently, report the code a user can act on first: a typo or a
# denial will not heal by itself, so it wins over "unavailable", which the driver retries.
_PRIORITY = [
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.PERMISSION_DENIED,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.INTERNAL,
    grpc.StatusCode.DEADLINE_EXCEEDED,
    grpc.StatusCode.UNAVAILABLE,
]


class MountFailed(BridgeError):
    """Several per-object failures gathered into one message (all or nothing)."""

    def __init__(self, failures: Sequence[tuple[str, BridgeError]], context: str = "") -> None:
        self.failures = list(failures)
        codes = {err.code for _, err in failures}
        self.code = min(codes, key=_PRIORITY.index) if codes else grpc.StatusCode.INTERNAL
        self.transient = all(err.transient for _, err in failures)
        parts = [_named(name, err) for name, err in failures]
        where = f" ({context})" if context else ""
        text = (
            "; ".join(parts)
            if len(parts) == 1
            else f"{len(parts)} objects failed: " + "; ".join(parts)
        )
        super().__init__(text + where)


def _named(name: str, err: BridgeError) -> str:
    """`object 'x': cause`, without repeating the prefix when the cause already names it."""
    text = str(err)
    prefix = f"object {name!r}: "
    return text if text.startswith(prefix) else prefix + text


# Things that look like credentials in a store's error text: JWTs, Vault/OpenBao tokens, bearer
# headers, AWS access key ids and secrets. Stores rarely echo them, but a proxy page might.
_SECRETISH = re.compile(
    r"(eyJ[\w-]{8,}\.[\w-]{8,}\.[\w-]*"
    r"|\b(?:hv|hb)[sbr]\.[\w-]{10,}"
    r"|\bs\.[A-Za-z0-9]{20,}"
    r"|(?i:bearer)\s+[\w.~+/=-]+"
    r"|\b(?:AKIA|ASIA)[A-Z0-9]{12,}"
    r"|[A-Za-z0-9+/]{40,}={0,2})"
)
MAX_STORE_TEXT = 240


def scrub(text: object, limit: int = MAX_STORE_TEXT) -> str:
    """Store error text made safe for a pod event: credentials masked, length bounded."""
    cleaned = _SECRETISH.sub("[redacted]", " ".join(str(text).split()))
    return cleaned if len(cleaned) <= limit else cleaned[: limit - 1] + "…"


# Punctuation of JSON and of quoted values: split on it, so the words inside are judged alone.
_SEPARATORS = re.compile(r"[{}\[\]\"',:;=()<>|`]+")
#: Longest word `redacted` keeps (longer runs of letters are more likely keys than words).
_MAX_WORD = 24


def redacted(text: object, limit: int = MAX_STORE_TEXT) -> str:
    """A store's free text made safe for a DEBUG log line: scrubbed, then every word that is not
    plain ASCII letters masked. Stores echo request input and sometimes values in their error
    bodies; no pattern recognises a password, but one is rarely letters only. What is left
    (`permission denied`, `role could not be found`) still tells an operator what happened."""
    words = _SEPARATORS.sub(" ", scrub(text, limit=16 * limit)).split()
    kept = [w if w.isascii() and w.isalpha() and len(w) <= _MAX_WORD else "…" for w in words]
    return scrub(" ".join(kept), limit)


def known_phrases(text: str, table: Sequence[tuple[str, str]]) -> list[str]:
    """Our own fixed phrases for the known messages found in a store's text, never its text:
    `table` maps a lower-case needle to the phrase reported when the needle occurs."""
    lowered = text.lower()
    found: list[str] = []
    for needle, phrase in table:
        if needle in lowered and phrase not in found:
            found.append(phrase)
    return found


#: Most exceptions of one chain (cause and context) `shed_tracebacks` walks.
_CHAIN_LIMIT = 32


def shed_tracebacks(exc: BaseException) -> None:
    """Drop the tracebacks of `exc` and of the exceptions it was raised from or while handling.

    A failed store call's exceptions sit in reference cycles with the frames of their
    tracebacks: aiohttp's response queue keeps the error its reader frame raised, tenacity's
    frames keep the retry state that keeps the last error. Only the cyclic collector frees
    such a cycle — with everything its frames point at (connections, buffers, requests) — and
    a retry series lasts long enough for the cycle to reach the oldest generation, which is
    collected rarely: in an outage every failed call's garbage piled up for tens of seconds.
    Without the tracebacks the frames go as soon as the call is over. Store errors are
    reported by their messages, never with a traceback, so nothing is lost: call this only on
    errors that are expected (a BridgeError and what it was raised from), never on a bug's.
    """
    todo: list[BaseException] = [exc]
    seen: set[int] = set()
    while todo and len(seen) < _CHAIN_LIMIT:
        error = todo.pop()
        if id(error) in seen:
            continue
        seen.add(id(error))
        error.__traceback__ = None
        todo.extend(e for e in (error.__cause__, error.__context__) if e is not None)
