"""Object versions: change exactly when content changes, stable across restarts and nodes.

Versions are readable by anyone in the namespace (SecretProviderClassPodStatus), so they are
never a plain hash of the content: either the store's own version id, or an HMAC under the
installation key (`--hmac-key-file`; without it a random per-process key, with a warning).

The HMAC input starts with the scope, the pod's namespace: with one key for the installation
and only the object name and content as input, namespace B could confirm a guess of A's value
(a short PIN) by mounting its own secret holding the guess under A's object name and comparing
the two versions. The namespace is the boundary (every pod of a namespace may use any of its
service accounts and classes), so versions stay equal for every pod of a namespace, across
restarts and nodes with the same key. Adding the scope changed every version once (upgrade).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Iterable


class Versioner:
    def __init__(self, key: bytes) -> None:
        if not key:
            raise ValueError("the HMAC key must not be empty")
        self._key = key

    @classmethod
    def random(cls) -> Versioner:
        return cls(secrets.token_bytes(32))

    @classmethod
    def from_file(cls, path: str) -> Versioner:
        return cls(read_installation_key(path))

    def of_content(self, object_id: str, content: bytes, *, scope: str) -> str:
        # Neither a namespace nor a file path contains NUL, so the fields cannot run together.
        message = scope.encode() + b"\0" + object_id.encode() + b"\0" + content
        return hmac.new(self._key, message, hashlib.sha256).hexdigest()[:32]

    def of_inputs(
        self, object_id: str, versions: Iterable[str], content: bytes, *, scope: str
    ) -> str:
        """A derived file's version: from its inputs' versions and its own content."""
        joined = "\0".join(versions).encode()
        return self.of_content(object_id, joined + b"\0\0" + content, scope=scope)


def read_installation_key(path: str) -> bytes:
    """The installation key of `--hmac-key-file` (object versions and the audit trail's MACs
    both derive from it): OSError if unreadable, ValueError if shorter than 16 bytes."""
    with open(path, "rb") as fh:
        key = fh.read().strip()
    if len(key) < 16:
        raise ValueError(f"--hmac-key-file {path}: the key must be at least 16 bytes")
    return key
