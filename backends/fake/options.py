"""Provider-level flags of the fake backend, and the start-up check of its file."""

from dataclasses import dataclass, field
from typing import Any

import yaml

from provider.core.boundedyaml import yaml_problem
from provider.core.errors import InvalidParameters

#: The SDK's loggers, kept at WARNING by `serve`: they log request details (headers, URLs).
SDK_LOGGERS: tuple[str, ...] = ()


@dataclass(frozen=True)
class Options:
    store_file: str | None = field(
        default=None,
        metadata={
            "help": "YAML/JSON file with the fake store's secrets, re-read when it changes "
            "(required with --enable-fake-backend: the store holds nothing else)"
        },
    )
    latency: float = field(
        default=0.0,
        metadata={"help": "seconds every fake read takes (tests of coalescing and deadlines)"},
    )


_KINDS = {list: "a list", str: "text", int: "a number", float: "a number", bool: "true/false"}


def load_store_file(path: str) -> dict[str, Any]:
    """The store file's map, read as the store reads it (`yaml.safe_load`); a problem is one
    line naming the flag, the path and, for bad YAML, its line and column."""
    where = f"--fake-store-file {path}"
    try:
        with open(path, encoding="utf-8") as fh:
            loaded = yaml.safe_load(fh) or {}
    except OSError as exc:
        raise InvalidParameters(
            f"{where}: cannot read it ({exc.strerror or type(exc).__name__}); create it "
            "(docs/fake-store.md shows its shape) or fix the path"
        ) from None
    except UnicodeDecodeError:
        raise InvalidParameters(f"{where}: not UTF-8 text; write it as YAML or JSON") from None
    except yaml.YAMLError as exc:
        raise InvalidParameters(f"{where}: not valid YAML: {yaml_problem(exc)}") from None
    if not isinstance(loaded, dict):
        raise InvalidParameters(
            f"{where}: expected a YAML map (secrets:, and optionally access:, failures:, "
            f"leases:), got {_KINDS.get(type(loaded), 'something else')}"
        )
    return loaded
