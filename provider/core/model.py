"""The store-neutral types that cross between the Mount use case and the stores.

A Mount travels: attributes (edge) -> the store's dialect parser (`backends/<x>/dialect.py`:
parameters -> a `StorePlan` of `ObjectSpec`s) -> `Backend.identify` (who the pod is for this
store; refuses before any cache is consulted) -> `Backend.fetch` (values per store reference) ->
transforms, templates and files (provider/mount). The interface itself is in `backend.py`.
`StorePlan`, `ObjectSpec` and `ParseContext` are generic over the store's own frozen types, so a
store never downcasts what its own dialect produced.
"""

from __future__ import annotations

import hashlib
import json
import math
import sys
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Literal, Protocol, TypeVar, runtime_checkable

from provider.core.errors import BridgeError

#: A store's frozen per-class settings (address, role, region, ...).
StoreT = TypeVar("StoreT", bound=Hashable)
#: A store's frozen description of one thing to fetch.
RefT = TypeVar("RefT", bound=Hashable)
#: A store's provider-level flags (`backends/<x>/options.py`).
OptionsT = TypeVar("OptionsT")
C = TypeVar("C", bound=type)

Decode = Literal["base64", "hex"]

#: Where a mount's value came from, as the audit trail records it: a store read, the value
#: cache, another mount's read in flight, a held value the store confirmed unchanged (AWS
#: DescribeSecret), or the last good value served while the store was unavailable. A value
#: with a lifetime (provider/mount/lifetimes.py) is `issued` for the pod, `reused` at its later
#: polls, or `renewed` when its lease was extended.
Source = Literal[
    "store",
    "cache",
    "coalesced",
    "revalidated",
    "stale",
    "issued",
    "reused",
    "renewed",
    # An `optional` object the store does not have: its file is left out.
    "absent",
]


def hashed_once(cls: C) -> C:
    """A frozen dataclass whose hash is computed once per object, on first use.

    A store's ref keys several dicts on every mount (the value cache, single-flight, each
    mount's results); the generated hash builds a tuple of the fields each time
    (measured: BENCHMARKS.md, "Refs hash once"). Equal objects still hash equal: the cached
    number is the generated hash of the same frozen fields.
    """
    fields_hash: Callable[[object], int] = cls.__hash__  # type: ignore[assignment]

    def __hash__(self: object) -> int:
        try:
            return self.__dict__["_hash"]  # type: ignore[no-any-return]
        except KeyError:
            value = fields_hash(self)
            object.__setattr__(self, "_hash", value)  # frozen: set as dataclasses' __init__ does
            return value

    cls.__hash__ = __hash__  # type: ignore[assignment, method-assign]
    return cls


@dataclass(frozen=True)
class PodToken:
    """A service-account token the kubelet minted for one audience."""

    token: str = field(repr=False)
    expiration: str = ""


@dataclass(frozen=True)
class Pod:
    """The pod a Mount is for, from the kubelet's own attribute keys (trustworthy)."""

    namespace: str
    name: str
    uid: str
    service_account: str
    tokens: Mapping[str, PodToken] = field(default_factory=dict, repr=False)
    #: Data of the volume's nodePublishSecretRef Secret ({} when none).
    node_publish_secret: Mapping[str, str] = field(default_factory=dict, repr=False)

    @property
    def subject(self) -> str:
        """How messages name the identity: namespace/serviceaccount."""
        return f"{self.namespace}/{self.service_account}"


@dataclass(frozen=True)
class Transforms:
    """What to do with a fetched value before it becomes a file (provider/mount/transforms.py).

    `extract_key` is a literal top-level key (upstream `secretKey`, `extractJSONKey`,
    `extractYAMLKey`); `extract` is a JMESPath expression (ours, and AWS `jmesPath`).
    `decode` runs last, on the bytes of the (extracted) value.
    """

    extract: str | None = None
    extract_key: str | None = None
    #: How to parse the value for extraction: "json", "yaml", or "any" (JSON, then YAML).
    parse_as: Literal["json", "yaml", "any"] = "any"
    explode: bool = False
    decode: Decode | None = None
    file: bool = True
    #: `optional: true`: a not-found leaves the object's files out instead of failing the
    #: mount (a denial, an outage or a bad parameter still fails it). Parsed with the
    #: transforms, as our key of every dialect's objects.
    optional: bool = False

    @property
    def identity(self) -> bool:
        return not (self.extract or self.extract_key or self.explode or self.decode)


@dataclass(frozen=True)
class ObjectSpec(Generic[RefT]):
    """One object of a SecretProviderClass, store-neutral.

    `name` is the file name it gets (and the name templates use); `ref` is the backend's own
    frozen, hashable description of what to fetch. Several specs may share one `ref` (AWS writes
    the whole secret and each jmesPath result from one read); the core fetches each ref once.
    """

    name: str
    ref: RefT
    #: File mode; None means the request's default `permission`.
    mode: int | None = None
    transforms: Transforms = Transforms()
    #: The SPC field that named this object, for messages (e.g. "objects[2].objectName").
    field: str = ""
    #: The ObjectVersion id upstream reports for this object (GCP: the resource name as
    #: written; Azure: `<type>/<name>`); empty means the file path.
    version_id: str = ""


@dataclass(frozen=True)
class StorePlan(Generic[StoreT, RefT]):
    """A parsed SecretProviderClass for one backend."""

    backend: str
    #: The backend's own frozen settings for this class (address, role, region, ...).
    store: StoreT
    objects: tuple[ObjectSpec[RefT], ...]
    warnings: tuple[str, ...] = ()


@dataclass(frozen=True)
class Lifetime:
    """How long a fetched value works: a lease (Vault revokes it at its end, or with the token
    that created it) or a certificate (useless after notAfter). Such a value is a credential of
    one pod, never shared or cached as a plain value (provider/mount/lifetimes.py).

    Times are `time.monotonic()`; `start` is when it was issued or last renewed, `end` when it
    stops working, whichever of its lease, its login token and its notAfter ends first.
    """

    kind: Literal["lease", "certificate"]
    start: float
    end: float
    #: Whether the store can extend it (`Renewing.renew`); a certificate is re-issued instead.
    renewable: bool = False
    #: The backend's own handle for renewing or revoking it (lease id, token): never printed.
    handle: Any = field(default=None, repr=False, compare=False)
    #: Why the value counts as one, for logs and `check`: "lease_id with lease_duration 300s".
    why: str = ""

    def due(self, now: float, renew_at: float) -> bool:
        """Whether `renew_at` (a fraction) of its life has passed at `now`."""
        return now >= self.start + renew_at * (self.end - self.start)


@dataclass(frozen=True)
class SecretValue:
    """One value fetched from a store. Never printed: content and data stay out of reprs."""

    content: bytes = field(repr=False)
    #: The store's own version id (not a content hash), if it has one.
    version: str | None = None
    #: A structured view for transforms, or where it is in the content (`DataAt`), or None:
    #: the content itself is parsed (provider/mount/transforms.py).
    data: Any = field(default=None, repr=False, compare=False)
    #: For an object that yields several files (Azure version history): file `<name>/<suffix>`.
    suffix: str = ""
    #: ObjectVersion id override (Azure history: `<type>/<name>/<i>`); default is the file path.
    version_id: str | None = None
    #: "store", or what a cache marked its held copy with ("revalidated", "stale").
    source: Source = field(default="store", compare=False)
    #: Set when the value is a credential with a lifetime (a lease, a certificate).
    lifetime: Lifetime | None = field(default=None, compare=False, repr=False)

    def view(self) -> Any:
        """The store's structured view: `data`, or the content parsed at `DataAt` (an empty or
        missing view is an empty map, as Vault's was); None when the store gave none. Raises
        ValueError (or RecursionError) when the content is not JSON."""
        if not isinstance(self.data, DataAt):
            return self.data
        found: Any = json.loads(self.content)
        for key in self.data.path:
            found = found.get(key) if isinstance(found, dict) else None
        return found or {}


@dataclass(frozen=True)
class DataAt:
    """`SecretValue.data` kept as where the view is in the content, parsed as JSON (Vault: its
    data map, `("data", "data")` for KV v2), not as the parsed view: a parsed map keeps several
    times its bytes alive in every cached copy (issue 40, item 2)."""

    path: tuple[str, ...]


#: What one held value keeps alive besides its strings: the SecretValue and its dict, its
#: DataAt, the entry's list (measured with tracemalloc: 320 to 610 bytes).
VALUE_OVERHEAD = 1024


def values_size(values: Sequence[SecretValue]) -> int:
    """What a cache entry of `values` counts against its byte bound: what the entry keeps
    alive (issue 40, item 2), not only the contents."""
    seen: set[int] = set()
    return sum(_value_size(v, seen) for v in values)


def _value_size(value: SecretValue, seen: set[int]) -> int:
    size = len(value.content) + len(value.version or "") + len(value.suffix)
    return size + len(value.version_id or "") + VALUE_OVERHEAD + parsed_size(value.data, seen)


def parsed_size(data: object, seen: set[int]) -> int:
    """What a parsed view held beside the content keeps alive (`SecretValue.data` other than
    DataAt, which no store keeps now: a map of short keys is about 9 times its text):
    sys.getsizeof over its dicts, lists and scalars, each object once (`seen`)."""
    if data is None or isinstance(data, DataAt):
        return 0
    total = 0
    stack = [data]
    while stack:
        obj = stack.pop()
        if obj is None or isinstance(obj, bool) or id(obj) in seen:
            continue
        seen.add(id(obj))
        total += sys.getsizeof(obj)
        if isinstance(obj, dict):
            stack.extend(obj.keys())
            stack.extend(obj.values())
        elif isinstance(obj, list | tuple):
            stack.extend(obj)
    return total


@runtime_checkable
class Describable(Protocol):
    """A store's frozen settings or ref that can name itself for the audit trail."""

    def describe(self) -> str:
        """Where or what it is (an address, a path, an ARN): never a value or credential."""
        ...


def describe(thing: object) -> str:
    """`thing.describe()`, or only its type's name: a ref's fields are never printed."""
    return thing.describe() if isinstance(thing, Describable) else type(thing).__name__


def lifetime_of(values: Sequence[SecretValue]) -> Lifetime | None:
    """The lifetime of a fetched value, if it has one (all its values share one read)."""
    for value in values:
        if value.lifetime is not None:
            return value.lifetime
    return None


#: A plan of any store, as the store-neutral layers hold it.
AnyPlan = StorePlan[Any, Any]

#: What a fetch yields per ref: one or more values, or the error for that object.
Fetched = Sequence[SecretValue] | BridgeError


@dataclass(frozen=True)
class Identity:
    """Who the store sees. `key` keys every cache; it never contains secret material."""

    key: str
    #: namespace/serviceaccount, for messages.
    subject: str
    #: The backend's login material (pod token, client secret, ...).
    credential: Any = field(default=None, repr=False, compare=False)
    #: `time.monotonic()` until which identify answers the same for the same request: when
    #: what it read besides the request (a ServiceAccount's annotation) is read again. A
    #: request answered again without identify (provider/mount/mounting.py) is so only until then.
    expires: float = field(default=math.inf, compare=False)


@dataclass(frozen=True)
class FetchContext:
    """Per-Mount limits handed to the backend."""

    #: `time.monotonic()` after which the driver has given up on this Mount.
    deadline: float
    #: `time.monotonic()` after which no retry may start (about a third of the deadline).
    retry_deadline: float

    @classmethod
    def within(cls, seconds: float, now: float, retries: bool = True) -> FetchContext:
        """A deadline `seconds` from `now` (time.monotonic()); retries may start within its
        first third (the driver re-sends a failed mount, and the re-send joins the read),
        or not at all."""
        return cls(deadline=now + seconds, retry_deadline=now + seconds / 3 if retries else now)


@dataclass(frozen=True)
class ParseContext(Generic[OptionsT]):
    """What a dialect parser may know besides the parameters.

    `options` is the backend's `Options` instance for `serve`/`mount`, or None under `check`,
    which takes no provider flags: a parameter that would fall back to a provider-level default
    is then a warning, not an error.
    """

    options: OptionsT | None = None
    max_objects: int = 100
    #: `serve --strict-parameters`: unknown object keys are errors, not warnings.
    strict: bool = False
    #: The class reads this store through selectors (`select`): it may list no object by name.
    selects: bool = False

    @property
    def offline(self) -> bool:
        return self.options is None


def identity_key(backend: str, *parts: object) -> str:
    """A readable, secret-free cache key: backend|part|part|... (parts must not be secrets)."""
    return "|".join([backend, *(str(p) for p in parts)])


def credential_hash(data: Mapping[str, str]) -> str:
    """A key part for nodePublishSecretRef credentials: a hash, never the credentials."""
    digest = hashlib.sha256()
    for k in sorted(data):
        digest.update(k.encode() + b"\0" + data[k].encode() + b"\0")
    return "cred:" + digest.hexdigest()[:32]
