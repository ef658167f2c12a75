"""What the bench sends: MountRequests as the driver builds them, serialized once, one per pod.

The classes come from the team's own SecretProviderClass files (`--class FILE[:WEIGHT]`) or
from a store rig of the dev kit (`--store`). Pods get the kubelet's keys (`kubelet_keys`) and
their tokens: from files (`--token AUDIENCE=FILE`, the same token for every pod) or from a
command (`--token-command`), run once per namespace, service account and audience before the
run, with POD_NAMESPACE, POD_NAME, SERVICE_ACCOUNT and AUDIENCE in its environment and the token
on its standard output — e.g. `kubectl create token "$SERVICE_ACCOUNT" -n "$POD_NAMESPACE"
--audience "$AUDIENCE"`.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from protos import provider_pb2
from provider.cli import spc
from provider.cli.mount import Unusable, kubelet_keys
from provider.core.errors import InvalidParameters

#: Tokens for one pod: (namespace, pod name, service account) -> {audience: token}.
TokenSource = Callable[[str, str, str], Mapping[str, str]]


@dataclass(frozen=True)
class BenchClass:
    name: str
    namespace: str
    params: Mapping[str, str]
    weight: int
    tokens: TokenSource


def service_accounts(value: str) -> list[str]:
    """`--service-accounts`: a count (sa-0 … sa-N-1) or comma-separated names."""
    value = value.strip()
    if value.isdigit():
        if int(value) < 1:
            raise InvalidParameters("--service-accounts: at least one")
        return [f"sa-{k}" for k in range(int(value))]
    names = [n.strip() for n in value.split(",") if n.strip()]
    if not names:
        raise InvalidParameters("--service-accounts: a count or comma-separated names")
    return names


def class_files(items: list[str], tokens: TokenSource) -> list[BenchClass]:
    """`--class FILE[:WEIGHT]`: every SecretProviderClass in each file, with the file's weight."""
    out = []
    for item in items:
        path, weight = item, 1
        head, sep, tail = item.rpartition(":")
        if sep and tail.isdigit():
            path, weight = head, int(tail)
        if weight < 1:
            raise InvalidParameters(f"--class {item}: the weight must be at least 1")
        try:
            classes = spc.load(path)
        except InvalidParameters as exc:  # a file that cannot be read or holds no valid class
            raise Unusable(f"--class {path}: {exc}") from None
        out += [BenchClass(c.name, c.namespace, c.parameters, weight, tokens) for c in classes]
    return out


def file_tokens(items: list[str]) -> dict[str, str]:
    tokens = {}
    for item in items:
        audience, sep, path = item.partition("=")
        if not sep or not audience:
            raise InvalidParameters(f"--token {item!r}: expected AUDIENCE=FILE")
        try:
            with open(path, encoding="utf-8") as fh:
                tokens[audience] = fh.read().strip()
        except OSError as exc:
            raise Unusable(f"--token {item}: cannot read it ({exc.strerror})") from None
    return tokens


def token_source(files: list[str], command: str | None, audiences: list[str]) -> TokenSource:
    """Tokens from files (every pod the same), overlaid by the command's (per identity)."""
    fixed = file_tokens(files)
    if command and not audiences:
        raise InvalidParameters("--token-command needs the audiences to mint: --audience AUD")
    minted: dict[tuple[str, str, str], str] = {}

    def tokens(namespace: str, pod: str, service_account: str) -> Mapping[str, str]:
        out = dict(fixed)
        for audience in audiences if command else ():
            key = (namespace, service_account, audience)
            if key not in minted:
                minted[key] = run_token_command(
                    command or "", namespace, pod, service_account, audience
                )
            out[audience] = minted[key]
        return out

    return tokens


def run_token_command(
    command: str, namespace: str, pod: str, service_account: str, audience: str
) -> str:
    env = {
        **os.environ,
        "POD_NAMESPACE": namespace,
        "POD_NAME": pod,
        "SERVICE_ACCOUNT": service_account,
        "AUDIENCE": audience,
    }
    result = subprocess.run(  # noqa: S602 - the operator's own command line, like a shell hook
        command, shell=True, env=env, capture_output=True, text=True, timeout=60, check=False
    )
    token = result.stdout.strip()
    if result.returncode != 0 or not token:
        why = result.stderr.strip().splitlines()[-1:] or [f"exit {result.returncode}"]
        raise Unusable(
            f"--token-command for {namespace}/{service_account} audience {audience!r} "
            f"printed no token: {why[0][:200]}"
        )
    return token


def requests(
    classes: list[BenchClass], *, pods: int, namespace: str | None, accounts: list[str]
) -> list[bytes]:
    """One serialized MountRequest per pod; classes are spread over the pods by weight."""
    cycle = [c for c in classes for _ in range(c.weight)]
    out = []
    for i in range(pods):
        cls = cycle[i % len(cycle)]
        ns = namespace or cls.namespace
        account = accounts[i % len(accounts)]
        pod, uid = f"bench-{i}", f"00000000-0000-4000-8000-{i:012d}"
        attrs = {
            **cls.params,
            "secretProviderClass": cls.name,
            **kubelet_keys(
                pod_name=pod,
                namespace=ns,
                uid=uid,
                service_account=account,
                tokens=cls.tokens(ns, pod, account),
            ),
        }
        request = provider_pb2.MountRequest(
            attributes=json.dumps(attrs),
            secrets="null",
            target_path=f"/var/lib/kubelet/pods/{uid}/volumes/kubernetes.io~csi/secrets/mount",
            permission="420",
        )
        out.append(request.SerializeToString())
    return out
