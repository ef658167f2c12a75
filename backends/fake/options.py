"""Provider-level flags of the fake backend."""

from dataclasses import dataclass, field

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
