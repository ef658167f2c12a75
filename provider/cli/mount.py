"""`secrets-bridge mount`: play the driver (and the kubelet) for one SecretProviderClass.

Builds the MountRequest exactly as the driver does, calls a running provider's socket (or an
in-process one on a temporary socket, through the same gRPC path), refuses what the driver would
refuse, and writes the answer with the driver's atomic `..data` symlink layout. With
`--csidriver` it also applies the kubelet's rules: no inline volume unless the CSIDriver lists
`Ephemeral`, and tokens only for the audiences its `tokenRequests` lists.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import json
import logging
import os
import shutil
import stat
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass

# gRPC's C core logs through absl at INFO unless told otherwise, read once as grpc loads: a
# loaded machine's in-process provider, stopping, sends a GOAWAY the client logs as
# `I… chttp2_transport.cc… Got goaway` on stderr, a second line beside the command's own.
# An operator's own GRPC_VERBOSITY (debugging gRPC) wins.
os.environ.setdefault("GRPC_VERBOSITY", "ERROR")

import grpc  # after GRPC_VERBOSITY, which it reads as it loads
import yaml

from backends import registry
from protos import provider_pb2, provider_pb2_grpc
from provider.cli import spc
from provider.core.errors import InvalidParameters
from provider.core.files import path_problem
from provider.core.settings import ServeSettings

DATA_DIR = "..data"


class Unusable(Exception):
    """A path or file `mount` (or `bench`) cannot use, as one line: `exit_code` is 2 when the
    command line alone is wrong, 1 when what it names on this node is."""

    def __init__(self, message: str, *, usage: bool = False) -> None:
        super().__init__(message)
        self.exit_code = 2 if usage else 1


def provider_socket(path: str, flag: str) -> str:
    """The absolute path of a running provider's socket, checked the way a dial would fail, so
    that the failure is one line naming the path and the fix instead of gRPC's log noise (a
    relative path is resolved against the working directory, as every path flag is)."""
    from provider.edge.startup import UNIX_PATH_MAX, connect_error

    full = os.path.abspath(path)
    named = f"{flag} {path}" + (f" ({full})" if full != path else "")
    size = len(os.fsencode(full))
    if size > UNIX_PATH_MAX:
        raise Unusable(
            f"{named}: {size} bytes is too long for a Unix socket path (at most "
            f"{UNIX_PATH_MAX}); name it through a shorter path, such as a symlink to its directory",
            usage=True,
        )
    try:
        st = os.stat(full)
    except (FileNotFoundError, NotADirectoryError):
        raise Unusable(
            f"{named}: nothing there; start the provider (secrets-bridge serve --socket {full}), "
            "or name the socket it serves on (on a node, "
            "/var/run/secrets-store-csi-providers/secrets-bridge.sock)"
        ) from None
    except OSError as exc:
        raise Unusable(f"{named}: cannot reach it ({_reason(exc)}); run as root") from None
    if not stat.S_ISSOCK(st.st_mode):
        kind = "a directory" if stat.S_ISDIR(st.st_mode) else "a file"
        raise Unusable(f"{named}: not a socket ({kind}); name the socket the provider serves on")
    refused = connect_error(full)
    if refused is None:
        return full
    if refused.errno in (errno.EACCES, errno.EPERM):
        raise Unusable(
            f"{named}: permission denied (the socket admits uid {st.st_uid} and gid {st.st_gid} "
            f"only, like the driver, which dials as root; this process runs as uid "
            f"{os.geteuid()}); run as root"
        )
    if refused.errno == errno.ECONNREFUSED:
        raise Unusable(
            f"{named}: nobody is listening there (the socket of a provider that stopped); start "
            "the provider, or name the socket of one that serves"
        )
    raise Unusable(f"{named}: cannot connect ({_reason(refused)}); is the provider running?")


def _reason(exc: OSError) -> str:
    return (exc.strerror or str(exc) or type(exc).__name__).lower()


def _read(named: str, path: str) -> str:
    """The text of the file at `path`, which `named` (the flag and its value) names; Unusable
    (exit 1) when it cannot be read."""
    try:
        with open(path, encoding="utf-8") as fh:
            return fh.read()
    except (OSError, UnicodeDecodeError) as exc:
        why = _reason(exc) if isinstance(exc, OSError) else "not UTF-8 text"
        raise Unusable(f"{named}: cannot read it ({why})") from None


def _yaml(flag: str, path: str) -> object:
    try:
        return yaml.safe_load(_read(f"{flag} {path}", path))
    except yaml.YAMLError as exc:
        where = getattr(exc, "problem_mark", None)
        at = f" at line {where.line + 1}" if where is not None else ""
        raise Unusable(f"{flag} {path}: not valid YAML{at}") from None


def usage_problem(args: argparse.Namespace) -> str | None:
    """What is wrong with the command line itself (exit 2), before anything is read."""
    try:
        mode = int(args.permission, 8)
    except ValueError:
        mode = -1
    if not 0 <= mode <= 0o777:
        return f"--permission {args.permission}: expected an octal file mode such as 0644"
    if not args.timeout > 0:
        return f"--timeout {args.timeout:g}: expected a number of seconds above 0"
    for item in args.volume_attribute:
        if "=" not in item:
            return f"--volume-attribute {item!r}: expected KEY=VALUE"
    for item in args.token:
        audience, sep, path = item.partition("=")
        if not sep or not audience or not path:
            return f"--token {item!r}: expected AUDIENCE=FILE"
    return None


def add_mount_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("file", help="YAML file holding the SecretProviderClass")
    p.add_argument("--target", required=True, help="directory to write the volume into")
    p.add_argument("--provider-socket", help="call a running provider (default: in-process)")
    p.add_argument("--namespace", help="pod namespace (default: the class's namespace)")
    p.add_argument(
        "--pod-name", default="secrets-bridge-mount", help="the pod's name, as the kubelet sends it"
    )
    p.add_argument("--pod-uid", default="", help="the pod's uid (keys --cache-scope pod)")
    p.add_argument(
        "--service-account",
        default="default",
        help="the pod's service account: part of the identity every store sees",
    )
    p.add_argument(
        "--token",
        action="append",
        default=[],
        metavar="AUDIENCE=FILE",
        help="a service account token file for an audience (repeatable)",
    )
    p.add_argument(
        "--volume-attribute",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="the inline volume's volumeAttributes (repeatable)",
    )
    p.add_argument(
        "--node-publish-secret",
        metavar="FILE",
        help="YAML/JSON map: the nodePublishSecretRef Secret's data",
    )
    p.add_argument("--csidriver", metavar="FILE", help="apply this CSIDriver's kubelet rules")
    p.add_argument("--permission", default="0644", help="default file mode (octal)")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds, like the kubelet's")
    p.add_argument("--print-contents", action="store_true", help="print each file's contents")


@dataclass(frozen=True)
class CSIDriverRules:
    ephemeral: bool
    audiences: frozenset[str] | None
    pod_info: bool


def load_csidriver(path: str) -> CSIDriverRules:
    doc = _yaml("--csidriver", path) or {}
    spec = (doc.get("spec") if isinstance(doc, dict) else None) or {}
    modes = spec.get("volumeLifecycleModes") or ["Persistent"]
    requests = spec.get("tokenRequests")
    audiences = None if requests is None else frozenset(r.get("audience", "") for r in requests)
    return CSIDriverRules("Ephemeral" in modes, audiences, bool(spec.get("podInfoOnMount")))


def kubelet_keys(
    *,
    pod_name: str,
    namespace: str,
    uid: str,
    service_account: str,
    tokens: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """What the kubelet adds to an inline volume's context: the pod's identity and, when the
    CSIDriver requests tokens, their JSON — a string inside the attributes JSON
    (docs/architecture.md)."""
    keys = {
        "csi.storage.k8s.io/pod.name": pod_name,
        "csi.storage.k8s.io/pod.namespace": namespace,
        "csi.storage.k8s.io/pod.uid": uid,
        "csi.storage.k8s.io/serviceAccount.name": service_account,
        "csi.storage.k8s.io/ephemeral": "true",
    }
    if tokens:
        expiry = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + 3600))
        keys["csi.storage.k8s.io/serviceAccount.tokens"] = json.dumps(
            {aud: {"token": tok, "expirationTimestamp": expiry} for aud, tok in tokens.items()}
        )
    return keys


def build_request(
    cls: spc.SecretProviderClass,
    args: argparse.Namespace,
    tokens: Mapping[str, str],
    rules: CSIDriverRules | None,
) -> provider_pb2.MountRequest:
    """The driver's request: SPC parameters overlaid by the volume context."""
    attributes: dict[str, str] = dict(cls.parameters)
    for item in args.volume_attribute:
        key, sep, value = item.partition("=")
        if not sep:
            raise InvalidParameters(f"--volume-attribute {item!r}: expected KEY=VALUE")
        attributes[key] = value
    attributes["secretProviderClass"] = cls.name
    pod = kubelet_keys(
        pod_name=args.pod_name,
        namespace=args.namespace or cls.namespace,
        uid=args.pod_uid or str(uuid.uuid4()),
        service_account=args.service_account,
        tokens=tokens,
    )
    if rules is not None and not rules.pod_info:
        # Without podInfoOnMount the kubelet sends tokens but not the pod's keys.
        pod = {k: v for k, v in pod.items() if k.endswith("serviceAccount.tokens")}
    attributes.update(pod)
    secrets = "null"
    if args.node_publish_secret:
        secrets = json.dumps(_yaml("--node-publish-secret", args.node_publish_secret) or {})
    return provider_pb2.MountRequest(
        attributes=json.dumps(attributes),
        secrets=secrets,
        target_path=os.path.abspath(args.target),
        permission=str(int(args.permission, 8)),
    )


def read_tokens(items: list[str], rules: CSIDriverRules | None) -> dict[str, str]:
    tokens = {}
    for item in items:
        audience, sep, path = item.partition("=")
        if not sep:
            raise InvalidParameters(f"--token {item!r}: expected AUDIENCE=FILE")
        if rules is not None and rules.audiences is not None and audience not in rules.audiences:
            print(
                f"kubelet: no token for audience {audience!r}: the CSIDriver's tokenRequests "
                f"lists only {sorted(rules.audiences)}",
                file=sys.stderr,
            )
            continue
        tokens[audience] = _read(f"--token {item}", path).strip()
    return tokens


def missing_audiences(cls: spc.SecretProviderClass, rules: CSIDriverRules) -> list[str]:
    """Every audience the class's stores need a pod token for that the CSIDriver's
    tokenRequests does not list (the kubelet mints no token for them), each with its store."""
    from provider.mount.planning import parse_plan

    try:
        plan = parse_plan(cls.parameters, options_for=None, enable_test_stores=True)
    except InvalidParameters:
        return []  # the provider's answer names the class's problems
    listed = rules.audiences or frozenset()
    missing: list[str] = []
    for named in plan.stores:
        module = registry.dialect_module(named.plan.backend)
        for audience in module.audiences(named.plan.store):
            # Offline, GCP's pool audience is a placeholder from the provider's flags.
            if audience not in listed and not audience.startswith("<"):
                where = f"store {named.name!r}" if named.name else named.plan.backend
                missing.append(f"{audience!r} ({where})")
    return missing


def check_response(response: provider_pb2.MountResponse) -> None:
    """Refuse what the driver refuses (docs/architecture.md)."""
    if response.error.code:
        raise InvalidParameters(f"the provider answered error code {response.error.code!r}")
    if not response.object_version:
        raise InvalidParameters(
            "the provider answered no object versions (missing object "
            "versions): the driver fails such a mount"
        )
    problems = [f"{f.path!r}: {p}" for f in response.files if (p := path_problem(f.path))]
    problems += [
        f"{f.path!r}: mode {f.mode} outside 0..511"
        for f in response.files
        if not 0 <= f.mode <= 0o777
    ]
    if problems:
        raise InvalidParameters("the driver would refuse the answer: " + "; ".join(problems))


def write_atomically(target: str, files: list[tuple[str, int, bytes]]) -> None:
    """The kubelet/driver AtomicWriter layout: files in a timestamped directory, `..data`
    pointing at it, and one symlink per top-level name pointing through `..data`."""
    os.makedirs(target, exist_ok=True)
    stamp = tempfile.mkdtemp(prefix=time.strftime("..%Y_%m_%d_%H_%M_%S."), dir=target)
    os.chmod(stamp, 0o755)  # noqa: S103 - readable like the driver's own layout
    for path, mode, contents in files:
        full = os.path.join(stamp, path)
        os.makedirs(os.path.dirname(full), exist_ok=True)
        with open(full, "wb") as fh:
            fh.write(contents)
        os.chmod(full, mode)
    data_link = os.path.join(target, DATA_DIR)
    old = os.readlink(data_link) if os.path.islink(data_link) else None
    tmp_link = os.path.join(target, "..data_tmp")
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp_link)
    os.symlink(os.path.basename(stamp), tmp_link)
    os.rename(tmp_link, data_link)
    top = {p.split("/", 1)[0] for p, _, _ in files}
    for name in top:
        link = os.path.join(target, name)
        if not os.path.lexists(link):
            os.symlink(os.path.join(DATA_DIR, name), link)
    for name in os.listdir(target):
        full = os.path.join(target, name)
        if not name.startswith("..") and name not in top and os.path.islink(full):
            os.unlink(full)
    if old:
        shutil.rmtree(os.path.join(target, old), ignore_errors=True)


@contextlib.asynccontextmanager
async def _provider(args: argparse.Namespace, settings: ServeSettings) -> AsyncIterator[str]:
    if args.provider_socket:
        yield provider_socket(args.provider_socket, "--provider-socket")
        return
    from provider.core.metrics import Metrics
    from provider.edge.app import build_mounter
    from provider.edge.server import ProviderServicer, build_server

    if settings.log_level != "debug":
        # The in-process provider's line for this one mount says what the command's own last
        # line says; `--log-level debug` shows it (and the rest of the provider's log).
        logging.getLogger("secrets_bridge.server").setLevel(logging.ERROR)
    with tempfile.TemporaryDirectory(prefix="secrets-bridge-") as tmp:
        socket = os.path.join(tmp, "provider.sock")
        metrics = Metrics()
        # One mount's versions are only printed: a random key is fine, and warning about it on
        # every run would only teach people to ignore warnings.
        mounter, backends = build_mounter(settings, metrics, warn_random_key=False)
        server = build_server(
            ProviderServicer(mounter=mounter, metrics=metrics),
            max_send_bytes=settings.core.max_response_bytes + 65536,
        )
        server.add_insecure_port(f"unix://{socket}")
        await server.start()
        try:
            yield socket
        finally:
            await server.stop(None)
            await backends.close()


def _not_a_directory(path: str) -> bool:
    return os.path.lexists(path) and not os.path.isdir(path)


def _fail(message: str) -> int:
    """One line on stderr, as every other command reports a failure; stdout keeps the files."""
    print(f"secrets-bridge mount: {message}", file=sys.stderr)
    return 1


async def run(args: argparse.Namespace, settings: ServeSettings) -> int:
    from provider.edge.server import dial

    if problem := usage_problem(args):
        print(
            f"secrets-bridge mount: error: {problem}; see secrets-bridge mount --help",
            file=sys.stderr,
        )
        return 2
    if _not_a_directory(args.target):
        return _fail(f"--target {args.target} exists and is not a directory; name a directory")
    try:
        rules = load_csidriver(args.csidriver) if args.csidriver else None
        if rules is not None and not rules.ephemeral:
            return _fail(
                "kubelet: the CSIDriver does not list Ephemeral in spec.volumeLifecycleModes, "
                "so pods cannot use it in an inline volume"
            )
        try:
            cls = spc.load(args.file)[0]
        except InvalidParameters as exc:
            return _fail(f"{args.file}: {exc}")
        if rules is not None:
            missing = missing_audiences(cls, rules)
            if missing:
                print(
                    "kubelet: the CSIDriver's spec.tokenRequests lacks audiences the class needs "
                    f"pod tokens for: {', '.join(missing)}; add each as {{audience: ...}}",
                    file=sys.stderr,
                )
        request = build_request(cls, args, read_tokens(args.token, rules), rules)
        async with _provider(args, settings) as socket, dial(socket) as channel:
            stub = provider_pb2_grpc.CSIDriverProviderStub(channel)
            response = await stub.Mount(request, timeout=args.timeout, wait_for_ready=True)
        check_response(response)
    except Unusable as exc:
        print(f"secrets-bridge mount: {exc}", file=sys.stderr)
        return exc.exit_code
    except InvalidParameters as exc:
        return _fail(f"mount refused: {exc}")
    except grpc.aio.AioRpcError as exc:
        return _fail(f"mount failed: {exc.code().name}: {exc.details()}")
    files = [(f.path, f.mode, f.contents) for f in response.files]
    try:
        write_atomically(args.target, files)
    except OSError as exc:
        return _fail(f"cannot write into --target {args.target}: {exc.strerror or exc}")
    for path, mode, contents in files:
        print(f"{oct(mode)[2:]:>4} {len(contents):>7} {os.path.join(args.target, path)}")
        if args.print_contents:
            print("     " + contents.decode("utf-8", "replace").replace("\n", "\n     "))
    for v in response.object_version:
        print(f"version {v.id} = {v.version}")
    return 0
