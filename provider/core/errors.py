"""The one error hierarchy of secrets-bridge, each error with its neutral `Status`.

    BridgeError                      (base; never raised itself)
     ├── InvalidParameters           INVALID_ARGUMENT   the SecretProviderClass or request is wrong
     ├── LimitExceeded               RESOURCE_EXHAUSTED the answer would exceed a configured limit
     ├── MissingCredential           FAILED_PRECONDITION no pod token / credentials for the store
     ├── PermissionDenied            PERMISSION_DENIED  the store or our policy refused the pod
     ├── NotFound                    NOT_FOUND          the object does not exist in the store
     ├── StoreUnavailable            UNAVAILABLE        transient: unreachable, 5xx, throttled
     ├── DeadlineExceeded            DEADLINE_EXCEEDED  the request's deadline passed
     └── MountFailed                 (code of its most actionable part) several objects failed

The statuses keep gRPC's names; the edge maps each to its gRPC status code in one table
(provider/edge/status.py), so nothing below the edge imports gRPC. Anything that is not a
BridgeError becomes INTERNAL with a fixed text; the traceback goes to the log only (see
provider/edge/server.py). Backends translate their SDK's exceptions into this tree in
exactly one place each, so messages can name the object, store and identity without ever
carrying secret material. A store's error body is never relayed: messages carry the HTTP or RPC
status and the store's known error codes (`known_phrases`: our own fixed text for each), and the
body goes to a DEBUG log line only after `redacted`. `scrub` masks token-like strings in any
other text that came from outside (exception texts of transports).
"""

from __future__ import annotations

import enum
import re
from collections.abc import Sequence

INTERNAL_TEXT = "internal error in secrets-bridge; see the provider's log for details"


#: The most an error message returned to the driver takes on the wire: gRPC sends it in its
#: Status-Message trailer, percent-encoded (every byte outside printable ASCII, and `%`, as three
#: bytes). C-core clients refuse trailers over 8 KiB (at random up to 16 KiB, then always);
#: gRPC-Go, the driver's, takes 16 MiB. A class of hundreds of problems made messages of
#: hundreds of KiB: the driver's event and our own `mount` and `bench` failed on them.
MAX_MESSAGE_BYTES = 4096
#: The most one problem (one object's failure) takes of such a message, so several fit.
MAX_PART_BYTES = 1024


class Status(enum.Enum):
    """What kind of failure an error is: the status the edge reports it with. The names (and
    values) are gRPC's status names, which log lines, metrics labels and audit records carry."""

    INVALID_ARGUMENT = "INVALID_ARGUMENT"
    RESOURCE_EXHAUSTED = "RESOURCE_EXHAUSTED"
    FAILED_PRECONDITION = "FAILED_PRECONDITION"
    PERMISSION_DENIED = "PERMISSION_DENIED"
    NOT_FOUND = "NOT_FOUND"
    UNAVAILABLE = "UNAVAILABLE"
    DEADLINE_EXCEEDED = "DEADLINE_EXCEEDED"
    INTERNAL = "INTERNAL"


class BridgeError(Exception):
    """Base class; `code` is the status this error is reported with."""

    code: Status = Status.INTERNAL
    #: Whether retrying the same call later may succeed.
    transient: bool = False

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return self.message

    def brief(self, limit: int = MAX_MESSAGE_BYTES) -> str:
        """The message within `limit` bytes on the wire (`wire_bytes`): what the driver gets.
        A list of problems keeps its first problems and says how many more there are."""
        return cut(self.message, limit)


class InvalidParameters(BridgeError):
    """Bad SecretProviderClass parameters or request fields; lists every problem at once."""

    code = Status.INVALID_ARGUMENT

    def __init__(self, problems: Sequence[str] | str) -> None:
        self.problems = [problems] if isinstance(problems, str) else list(problems)
        if len(self.problems) == 1:
            text = self.problems[0]
        else:
            text = f"{len(self.problems)} problems: " + "; ".join(self.problems)
        super().__init__(text)
        self._listed = text

    def brief(self, limit: int = MAX_MESSAGE_BYTES) -> str:
        if len(self.problems) < 2 or self.message != getattr(self, "_listed", None):
            return cut(self.message, limit)
        return listed(f"{len(self.problems)} problems: ", self.problems, "", "problems", limit)


class LimitExceeded(BridgeError):
    code = Status.RESOURCE_EXHAUSTED


class MissingCredential(BridgeError):
    code = Status.FAILED_PRECONDITION


class PermissionDenied(BridgeError):
    code = Status.PERMISSION_DENIED


class NotFound(BridgeError):
    code = Status.NOT_FOUND


class StoreUnavailable(BridgeError):
    code = Status.UNAVAILABLE
    transient = True

    def __init__(self, message: str, *, retry_after: float | None = None) -> None:
        super().__init__(message)
        #: Seconds the store asked us to wait (Retry-After), if it said.
        self.retry_after = retry_after


class StoreSilent(StoreUnavailable):
    """A store call a client's own timer cut off (Vault's `--vault-request-timeout`): the store
    stayed silent rather than refused, however early the timer fired."""


class DeadlineExceeded(BridgeError):
    code = Status.DEADLINE_EXCEEDED


# When several objects fail differently, report the code a user can act on first: a typo or a
# denial will not heal by itself, so it wins over "unavailable", which the driver retries.
_PRIORITY = [
    Status.INVALID_ARGUMENT,
    Status.FAILED_PRECONDITION,
    Status.PERMISSION_DENIED,
    Status.NOT_FOUND,
    Status.RESOURCE_EXHAUSTED,
    Status.INTERNAL,
    Status.DEADLINE_EXCEEDED,
    Status.UNAVAILABLE,
]


class MountFailed(BridgeError):
    """Several per-object failures gathered into one message (all or nothing)."""

    def __init__(self, failures: Sequence[tuple[str, BridgeError]], context: str = "") -> None:
        self.failures = list(failures)
        codes = {err.code for _, err in failures}
        self.code = min(codes, key=_PRIORITY.index) if codes else Status.INTERNAL
        self.transient = all(err.transient for _, err in failures)
        parts = [_named(name, err) for name, err in failures]
        where = f" ({context})" if context else ""
        head = "" if len(parts) == 1 else f"{len(parts)} objects failed: "
        super().__init__(head + "; ".join(parts) + where)
        self._listing = (head, parts, where)

    def brief(self, limit: int = MAX_MESSAGE_BYTES) -> str:
        listing = getattr(self, "_listing", None)
        if listing is None or self.message != listing[0] + "; ".join(listing[1]) + listing[2]:
            return cut(self.message, limit)  # restated by its caller
        head, parts, where = listing
        return listed(head, parts, where, "objects", limit)


def _named(name: str, err: BridgeError) -> str:
    """`object 'x': cause`, without repeating the prefix when the cause already names it."""
    text = str(err)
    if name and text.startswith(f"{name}: "):
        return text  # a selector's failure, listed under its field (select[0])
    prefix = f"object {name!r}: "
    return text if text.startswith(prefix) else prefix + text


# Bytes gRPC's Status-Message trailer carries as they are: printable ASCII but `%` (its HTTP/2
# protocol); any other byte of the UTF-8 text is sent as `%XX`.
_PLAIN = bytes(b for b in range(0x20, 0x7F) if b != 0x25)
_ELLIPSIS = "…"


def wire_bytes(text: str) -> int:
    """The bytes `text` takes in gRPC's Status-Message trailer (percent-encoded UTF-8)."""
    data = text.encode("utf-8", "surrogatepass")
    return len(data) + 2 * len(data.translate(None, _PLAIN))


def _char_bytes(char: str) -> int:
    code = ord(char)
    if 0x20 <= code < 0x7F and code != 0x25:
        return 1
    return 3 * (1 if code < 0x80 else 2 if code < 0x800 else 3 if code < 0x10000 else 4)


def cut(text: str, limit: int = MAX_MESSAGE_BYTES) -> str:
    """`text` within `limit` wire bytes, cut between two characters (never inside one's UTF-8
    bytes) and ended with `…` when cut."""
    if len(text) * 12 <= limit or wire_bytes(text) <= limit:
        return text
    budget = limit - wire_bytes(_ELLIPSIS)
    if budget < 0:
        return ""
    used = 0
    for index, char in enumerate(text):
        used += _char_bytes(char)
        if used > budget:
            return text[:index] + _ELLIPSIS
    return text  # not reached: the whole text is over the limit


def listed(head: str, parts: Sequence[str], tail: str, noun: str, limit: int) -> str:
    """`head` and `parts` joined by `; ` then `tail`, within `limit` wire bytes: the first parts
    that fit (each cut to MAX_PART_BYTES), then `; and N more <noun>`."""
    whole = head + "; ".join(parts) + tail
    if wire_bytes(whole) <= limit:
        return whole
    # Room for the longest "; and N more" there can be.
    used = wire_bytes(head) + wire_bytes(tail) + wire_bytes(f"; and {len(parts)} more {noun}")
    kept: list[str] = []
    for part in parts:
        room = limit - used - (2 if kept else 0)
        shown = cut(part, min(MAX_PART_BYTES, room))
        if not shown or (shown != part and kept and room < MAX_PART_BYTES):
            break  # no room left for this one, whole or cut to its share
        used += wire_bytes(shown) + (2 if kept else 0)
        kept.append(shown)
    rest = len(parts) - len(kept)
    more = f"; and {rest} more {noun}" if rest else ""
    return cut(head + "; ".join(kept) + more + tail, limit)


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
