"""The suite-wide leak guard (tests/conftest.py) catches what it is meant to catch."""

from __future__ import annotations

import logging

from devkit.leaks import leaks_in


def record(msg: str, **fields: object) -> logging.LogRecord:
    rec = logging.LogRecord("secrets_bridge.x", logging.WARNING, __file__, 1, msg, None, None)
    rec.fields = fields
    return rec


def test_guard_flags_tokens_keys_and_known_values_in_messages_and_fields() -> None:
    jwt = "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJzeXN0ZW06c2EifQ.c2lnbmF0dXJlLWJ5dGVz"
    assert leaks_in([record(f"login with {jwt}")])
    assert leaks_in([record("mount", error="-----BEGIN PRIVATE KEY-----")])
    assert leaks_in([record("read", token="hvs.CAESIJ1234567890abcdefghij")])
    assert leaks_in([record("value pw-1 served")])
    assert not leaks_in([record("mount", namespace="default", pod="app-0", files=3)])
