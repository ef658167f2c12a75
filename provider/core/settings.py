"""Provider settings: the `serve` flags, grouped in frozen dataclasses.

Each flag can also come from the environment as SECRETS_BRIDGE_<FLAG> (`--cache-ttl` ->
SECRETS_BRIDGE_CACHE_TTL); a flag on the command line wins. Backend-specific flags are declared
by each backend in `backends/<name>/options.py` as a frozen dataclass and registered here
generically: field `addr` of backend `vault` becomes `--vault-addr` / SECRETS_BRIDGE_VAULT_ADDR
(plus any extra environment names the field lists in metadata["env"], e.g. VAULT_ADDR).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import types
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Union, get_args, get_origin, get_type_hints

from provider.core.files import DRIVER_RECV_BYTES

ENV_PREFIX = "SECRETS_BRIDGE_"
DEFAULT_SOCKET = "/var/run/secrets-store-csi-providers/secrets-bridge.sock"


@dataclass(frozen=True)
class CoreSettings:
    """Behaviour shared by every backend."""

    #: Seconds a fetched secret value is reused for the same identity and object (0 = off).
    cache_ttl: float = 0.0
    #: The bounds of a class's `refreshInterval` (its own reuse window instead of cache_ttl):
    #: a floor, so no class makes every poll read its store, and a ceiling.
    min_refresh_interval: float = 30.0
    max_refresh_interval: float = 3600.0
    #: Seconds the last good value may be served while its store is unavailable (0 = off).
    serve_stale_max_age: float = 0.0
    #: Seconds a stale copy may wait for its store before it is served (serve-stale on).
    serve_stale_wait: float = 3.0
    #: Fetch calls in flight per backend; more wait their turn.
    max_concurrent_fetches: int = 64
    #: Of those, fetch calls one namespace may have in flight per backend (its share).
    max_concurrent_fetches_per_namespace: int = 16
    #: Fraction of a lease's or certificate's life after which a pod's poll renews or
    #: re-issues it (cert-manager's two thirds); a class may ask for less (`renewAt`).
    renew_at: float = 2 / 3
    #: Longest time a pod's credentials are kept (and their leases renewed) without a poll;
    #: a pod seen polling is idle sooner, after three of its own poll intervals.
    lease_idle_after: float = 600.0
    #: Credentials with a lifetime held for pods, all namespaces together (fair shares).
    max_held_credentials: int = 10_000
    #: Fewest seconds between two renewals or re-issues of one held credential, whatever a
    #: class's `renewAt` asks (a floor, as --min-refresh-interval is for values).
    min_renew_interval: float = 300.0
    #: Seconds a credential replaced by a re-issue stays live before it is revoked, so the
    #: pod's application can move to the new one (then leases do not pile up in the store).
    replaced_credential_grace: float = 300.0
    #: Seconds one store call (a login, a read) may take before it counts as "unavailable".
    store_call_timeout: float = 10.0
    #: Backend name -> fetch calls per second (absent = unlimited).
    rate_limits: Mapping[str, float] = field(default_factory=dict)
    #: "serviceaccount" or "pod": the granularity of the identity key of every cache.
    cache_scope: Literal["serviceaccount", "pod"] = "serviceaccount"
    #: Namespaces whose pods may use the node's own identity (empty = none).
    allow_node_identity_namespaces: frozenset[str] = frozenset()
    #: Mint pod tokens through the TokenRequest API when the driver passed none.
    token_request_fallback: bool = False
    max_objects: int = 100
    #: Bytes of store answers all reads in flight may hold together, and one namespace's share.
    max_read_bytes: int = 64 * 1024 * 1024
    max_read_bytes_per_namespace: int = 16 * 1024 * 1024
    #: The serialized answer's limit: the driver's gRPC receive limit (provider/core/files.py).
    max_response_bytes: int = DRIVER_RECV_BYTES
    #: Unknown keys inside objects are refused instead of warned about (upstream drops them).
    strict_parameters: bool = False
    #: Watch the change feed `secrets-bridge watch` publishes (docs/change-feed.md).
    change_feed: bool = False
    #: Seconds a value the feed covers is reused by a class with no refreshInterval of its own.
    feed_window: float = 3600.0
    #: Seconds without an advancing feed heartbeat after which values fall back to their
    #: configured refresh.
    feed_stale_after: float = 90.0
    #: The namespace of the feed's ConfigMaps ("": this pod's, from POD_NAMESPACE or the
    #: service account's namespace file).
    feed_namespace: str = ""
    enable_fake_backend: bool = False
    #: Kubernetes API server URL for the few API reads (default: in-cluster, then kubeconfig).
    kube_api_url: str | None = None
    kube_api_token_file: str = ""
    #: `--aws-sts-endpoint`: the STS endpoint of every STS call the provider makes, whichever
    #: store makes it (the aws store's AssumeRoleWithWebIdentity and AssumeRole, Vault's aws
    #: login's AssumeRoleWithWebIdentity); None: the regional one, or AWS_ENDPOINT_URL_STS.
    #: A core setting because stores may not share each other's options.
    aws_sts_endpoint: str | None = None


#: `--event-loop`: auto (uvloop when installed), uvloop or asyncio.
EventLoop = Literal["auto", "uvloop", "asyncio"]


@dataclass(frozen=True)
class ServeSettings:
    socket: str = DEFAULT_SOCKET
    health_addr: str = "0.0.0.0:8098"
    log_level: str = "info"
    log_format: Literal["json", "text"] = "json"
    #: Seconds between a volume's log lines while its answer is unchanged (0: every mount).
    log_repeats_every: float = 600.0
    #: Seconds in-flight mounts may take to finish after SIGTERM.
    grace_period: float = 10.0
    event_loop: EventLoop = "auto"
    hmac_key_file: str | None = None
    #: `--audit-log`: a file to append the access audit trail to, `-` for stderr, None = off.
    audit_log: str | None = None
    core: CoreSettings = field(default_factory=CoreSettings)
    #: Backend name -> that backend's Options instance.
    backend_options: Mapping[str, Any] = field(default_factory=dict)


def env_name(flag: str) -> str:
    return ENV_PREFIX + flag.lstrip("-").replace("-", "_").upper()


def env_default(flag: str, default: Any, extra_env: tuple[str, ...] = ()) -> Any:
    """The flag's default, overridden by its environment variable(s) when set."""
    for name in (env_name(flag), *extra_env):
        value = os.environ.get(name)
        if value is not None and value != "":
            return value
    return default


def parse_bool(text: str | bool) -> bool:
    if isinstance(text, bool):
        return text
    lowered = text.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off", ""):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def _scalar_type(hint: Any) -> Any:
    """The scalar type of a field hint, unwrapping `X | None`."""
    if get_origin(hint) in (Union, types.UnionType):
        args = [a for a in get_args(hint) if a is not type(None)]
        return args[0]
    return hint


def add_options_flags(parser: argparse.ArgumentParser, prefix: str, options_cls: type) -> None:
    """Register one flag per field of a backend's Options dataclass: its help, default and
    environment variable shown; switches as --flag/--no-flag."""
    group = parser.add_argument_group(f"{prefix} backend")
    hints = get_type_hints(options_cls)
    for f in dataclasses.fields(options_cls):
        flag = f"--{prefix}-{f.name.replace('_', '-')}"
        aliases = tuple(f.metadata.get("flags", ()))
        kind = _scalar_type(hints[f.name])
        extra_env = tuple(f.metadata.get("env", ()))
        default = env_default(flag, f.default, extra_env)
        shown = "" if f.default in (None, "") else f"default: {_shown(f.default)}; "
        help_text = f.metadata.get("help", "") + f" ({shown}env {env_name(flag)})"
        common: dict[str, Any] = {"dest": f"{prefix}__{f.name}", "help": help_text}
        if kind is bool:
            group.add_argument(
                flag,
                *aliases,
                action=argparse.BooleanOptionalAction,
                default=parse_bool(default),
                **common,
            )
        else:
            metavar = f.metadata.get("metavar") or _METAVARS.get(kind, "VALUE")
            group.add_argument(
                flag, *aliases, type=kind, default=default, metavar=metavar, **common
            )


#: How --help names a flag's value when its field does not say.
_METAVARS = {int: "N", float: "NUMBER", str: "VALUE"}


def _shown(value: Any) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    return str(value)


def options_from_args(args: argparse.Namespace, prefix: str, options_cls: type) -> Any:
    values = {f.name: getattr(args, f"{prefix}__{f.name}") for f in dataclasses.fields(options_cls)}
    # argparse applies `type` to string defaults only; coerce environment-provided values too.
    hints = get_type_hints(options_cls)
    for name, value in values.items():
        kind = _scalar_type(hints[name])
        if isinstance(value, str) and kind in (int, float):
            values[name] = kind(value)
    return options_cls(**values)
