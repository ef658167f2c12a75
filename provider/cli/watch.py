"""`secrets-bridge watch`'s flags: where the feed lives, and one group of flags per event source
(each source is on when its first flag is given). docs/change-feed.md says what each store
needs set up, and what the watcher's identity must be granted."""

from __future__ import annotations

import argparse
import os
import socket
from typing import Any

from provider.cli.flags import flag, host_port, log_level, seconds
from provider.core.errors import InvalidParameters
from provider.core.kube import pod_namespace
from provider.watch.run import SourceSpec, WatchSettings

DESCRIPTION = (
    "the change feed's cluster component: read each store's own event service (Vault's audit "
    "stream, an SQS queue fed by EventBridge, a Storage queue fed by Event Grid, a Pub/Sub "
    "subscription) and publish which secrets changed — names and versions, never a value — "
    "into ConfigMaps every node provider watches (serve --change-feed). Run as a Deployment of "
    "two replicas: one holds the Lease and publishes, the other takes over"
)


def add_watch_flags(cmd: argparse.ArgumentParser) -> None:
    cmd.description = DESCRIPTION
    g = cmd.add_argument_group("the feed")
    flag(
        g,
        "--namespace",
        "",
        "namespace of the Lease and the feed's ConfigMaps (default: POD_NAMESPACE)",
        metavar="NS",
    )
    flag(
        g,
        "--identity",
        "",
        "this replica's name in the Lease (default: POD_NAME, else the host name)",
        metavar="NAME",
    )
    flag(
        g,
        "--heartbeat",
        30.0,
        "seconds between two heartbeats (below the nodes' --feed-stale-after)",
        metavar="SECONDS",
        type=seconds(above=True),
    )
    flag(
        g,
        "--metrics-address",
        "0.0.0.0:9102",
        "host:port of /healthz, /readyz and /metrics",
        type=host_port,
    )
    flag(
        g,
        "--kube-api-url",
        "",
        "the Kubernetes API (default: in-cluster, else the kubeconfig)",
        metavar="URL",
    )
    flag(
        g,
        "--kube-api-token-file",
        "",
        "a bearer token file for --kube-api-url",
        metavar="FILE",
    )
    flag(
        g,
        "--lease-duration",
        15.0,
        "seconds a Lease holder that stopped renewing keeps it",
        metavar="SECONDS",
        type=seconds(above=True),
    )
    flag(g, "--log-level", "info", "debug, info, warning or error", type=log_level)
    flag(g, "--log-format", "json", "json or text", choices=("json", "text"))

    v = cmd.add_argument_group("Vault/OpenBao: its socket audit device")
    flag(v, "--vault-audit-listen", "", "[host]:port the socket audit device dials", metavar="ADDR")
    flag(
        v,
        "--vault-address",
        "",
        "Vault's address as classes write vaultAddress (comma-separated spellings)",
        metavar="URL,...",
    )
    flag(
        v,
        "--vault-canary-token-file",
        "",
        "a token (default policy) to read a canary path with, proving the audit stream works",
        metavar="FILE",
    )
    flag(
        v, "--vault-canary-namespace", "", "the Vault namespace of the canary's token", metavar="NS"
    )
    flag(v, "--vault-ca-file", "", "CA bundle for the canary's https", metavar="FILE")

    a = cmd.add_argument_group("AWS: an SQS queue an EventBridge rule feeds")
    flag(a, "--aws-queue-url", "", "the queue's URL", metavar="URL")
    flag(
        a,
        "--aws-region",
        "",
        "the region of the queue and of the secrets it covers",
        metavar="REGION",
    )
    flag(a, "--aws-endpoint-url", "", "SQS endpoint (tests; default: the region's)", metavar="URL")

    z = cmd.add_argument_group("Azure: a Storage queue an Event Grid subscription feeds")
    flag(
        z,
        "--azure-queue-url",
        "",
        "the queue's URL (https://<account>.queue.core.windows.net/<queue>)",
        metavar="URL",
    )
    flag(
        z, "--azure-vaults", "", "the Key Vault names the queue's events cover", metavar="NAME,..."
    )
    flag(
        z,
        "--azure-connection-string-file",
        "",
        "a Storage connection string (tests, Azurite; default: the workload identity)",
        metavar="FILE",
    )

    p = cmd.add_argument_group("Google: a Pub/Sub subscription of Secret Manager's topic")
    flag(p, "--gcp-subscription", "", "projects/<p>/subscriptions/<s>", metavar="NAME")
    flag(
        p,
        "--gcp-projects",
        "",
        "the ids and numbers of the projects whose secrets notify it",
        metavar="ID,...",
    )
    flag(
        p,
        "--gcp-pubsub-endpoint",
        "",
        "Pub/Sub host:port (tests; default pubsub.googleapis.com:443)",
        metavar="HOST:PORT",
    )
    flag(p, "--gcp-ca-file", "", "CA bundle for the Pub/Sub endpoint", metavar="FILE")


def _list(text: str) -> list[str]:
    return [item.strip() for item in text.split(",") if item.strip()]


def _port(listen: str) -> int:
    _host, _, port = listen.rpartition(":")
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise InvalidParameters(f"--vault-audit-listen {listen!r}: expected [host]:port")
    return int(port)


def sources_from_args(args: argparse.Namespace) -> tuple[SourceSpec, ...]:
    specs = []
    if args.vault_audit_listen:
        addresses = _list(args.vault_address)
        if not addresses:
            raise InvalidParameters(
                "--vault-audit-listen needs --vault-address: the address classes write "
                "as vaultAddress, which the records name"
            )
        options: dict[str, Any] = {"listen": args.vault_audit_listen, "addresses": addresses}
        if args.vault_canary_token_file:
            options.update(
                token_file=args.vault_canary_token_file,
                namespace=args.vault_canary_namespace,
                ca_file=args.vault_ca_file,
            )
        specs.append(SourceSpec("vault", options, _port(args.vault_audit_listen)))
    if args.aws_queue_url:
        if not args.aws_region:
            raise InvalidParameters("--aws-queue-url needs --aws-region: the region it covers")
        options = {"queue_url": args.aws_queue_url, "region": args.aws_region}
        if args.aws_endpoint_url:
            options["endpoint"] = args.aws_endpoint_url
        specs.append(SourceSpec("aws", options))
    if args.azure_queue_url:
        vaults = _list(args.azure_vaults)
        if not vaults:
            raise InvalidParameters("--azure-queue-url needs --azure-vaults: the vaults it covers")
        options = {"queue_url": args.azure_queue_url, "vaults": vaults}
        if args.azure_connection_string_file:
            options["connection_string_file"] = args.azure_connection_string_file
        specs.append(SourceSpec("azure", options))
    if args.gcp_subscription:
        projects = _list(args.gcp_projects)
        if not projects:
            raise InvalidParameters(
                "--gcp-subscription needs --gcp-projects: the project ids and numbers it covers"
            )
        options = {"subscription": args.gcp_subscription, "projects": projects}
        if args.gcp_pubsub_endpoint:
            options["endpoint"] = args.gcp_pubsub_endpoint
        if args.gcp_ca_file:
            options["ca_file"] = args.gcp_ca_file
        specs.append(SourceSpec("gcp", options))
    if not specs:
        raise InvalidParameters(
            "no event source: give --vault-audit-listen, --aws-queue-url, --azure-queue-url "
            "or --gcp-subscription (docs/change-feed.md)"
        )
    return tuple(specs)


def settings_from_args(args: argparse.Namespace) -> WatchSettings:
    namespace = args.namespace or pod_namespace()
    if not namespace:
        raise InvalidParameters("--namespace is required outside a pod (no POD_NAMESPACE)")
    return WatchSettings(
        namespace=namespace,
        identity=args.identity or os.environ.get("POD_NAME") or socket.gethostname(),
        sources=sources_from_args(args),
        heartbeat=args.heartbeat,
        metrics_address=args.metrics_address,
        kube_api_url=args.kube_api_url or None,
        kube_api_token_file=args.kube_api_token_file,
        lease_duration=args.lease_duration,
        renew_deadline=args.lease_duration * 2 / 3,
        retry_period=args.lease_duration / 7.5,
        pod_ip=os.environ.get("POD_IP", ""),
    )
