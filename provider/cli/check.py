"""`secrets-bridge check FILE... [--json]`: validate classes offline with the parser `Mount`
uses — the migration tool.

Each file (or `-`, standard input) may hold several SecretProviderClasses, or a List of them as
`kubectl get secretproviderclasses -A -o yaml` prints it. No provider flags beyond the limits
`serve` applies (`--max-objects`, `--max-response-bytes`, `--strict-parameters`, and the bounds
of a class's refreshInterval, serve's defaults unless given; read from the same
SECRETS_BRIDGE_* variables), no file reads beyond the manifests, no network: a parameter that
would fall back to a provider-level default (the Vault address, the GCP pool) is a warning.

Exit status: 0 every class is valid (warnings allowed); 1 a class is invalid, or a file cannot
be read or holds no SecretProviderClass; 2 usage (unknown flag, bad flag value).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from typing import Any

from backends import registry
from provider.cli import spc
from provider.cli.flags import check_refresh_bounds
from provider.core.errors import InvalidParameters
from provider.core.model import describe
from provider.core.settings import CoreSettings
from provider.mount.planning import MountPlan, RefreshBounds, parse_plan, selects
from provider.mount.stores import NamedStore

EXIT_OK, EXIT_INVALID, EXIT_USAGE = 0, 1, 2


@dataclasses.dataclass
class Limits:
    max_objects: int = 100
    max_response_bytes: int = 4 * 1024 * 1024
    strict_parameters: bool = False
    #: serve's bounds of a class's refreshInterval (its defaults unless given to `check`).
    min_refresh_interval: float = CoreSettings.min_refresh_interval
    max_refresh_interval: float = CoreSettings.max_refresh_interval


def limits_from_args(args: argparse.Namespace) -> Limits:
    """`check`'s flags as serve's limits; the refresh bounds are serve's defaults unless given."""
    limits = Limits(
        max_objects=int(args.max_objects),
        max_response_bytes=int(args.max_response_bytes),
        strict_parameters=args.strict_parameters,
        min_refresh_interval=getattr(args, "min_refresh_interval", Limits.min_refresh_interval),
        max_refresh_interval=getattr(args, "max_refresh_interval", Limits.max_refresh_interval),
    )
    check_refresh_bounds(limits.min_refresh_interval, limits.max_refresh_interval)
    return limits


def run(files: list[str], *, as_json: bool = False, limits: Limits | None = None) -> int:
    limits = limits or Limits()
    reports: list[dict[str, Any]] = []
    for path in files:
        reports.extend(_check_file(path, limits))
    if as_json:
        document = {
            "valid": all(r["valid"] for r in reports),
            "limits": dataclasses.asdict(limits),
            "classes": reports,
        }
        print(json.dumps(document, indent=2, default=str))
    else:
        for report in reports:
            _print_text(report)
    return EXIT_OK if all(r["valid"] for r in reports) else EXIT_INVALID


def _check_file(path: str, limits: Limits) -> list[dict[str, Any]]:
    source = "<stdin>" if path == "-" else path
    try:
        classes = spc.load(path)
    except InvalidParameters as exc:
        return [_report(source, None, problems=exc.problems)]
    return [_check_class(source, cls, limits) for cls in classes]


def _check_class(source: str, cls: spc.SecretProviderClass, limits: Limits) -> dict[str, Any]:
    problems: list[str] = []
    warnings: list[str] = []
    if cls.provider != spc.PROVIDER_NAME:
        problems.append(
            f"spec.provider is {cls.provider!r}; set it to {spc.PROVIDER_NAME!r} so the "
            "driver calls secrets-bridge"
        )
    plan = None
    try:
        plan = parse_plan(
            cls.parameters,
            options_for=None,
            enable_test_stores=True,
            max_objects=limits.max_objects,
            strict=limits.strict_parameters,
            refresh_bounds=RefreshBounds(limits.min_refresh_interval, limits.max_refresh_interval),
        )
    except InvalidParameters as exc:
        problems.extend(exc.problems)
        warnings.extend(getattr(exc, "warnings", ()))
    else:
        warnings.extend(plan.warnings)
        flags = {(s.plan.backend, registry.enabled_by(s.plan.backend)) for s in plan.stores}
        warnings.extend(f"backend {n!r} is accepted only with {f}" for n, f in sorted(flags) if f)
    return _report(source, cls, plan, problems, warnings)


def _report(
    source: str,
    cls: spc.SecretProviderClass | None,
    plan: MountPlan | None = None,
    problems: list[str] | None = None,
    warnings: list[str] | None = None,
) -> dict[str, Any]:
    problems = problems or []
    report: dict[str, Any] = {
        "source": source,
        "name": cls.name if cls else None,
        "namespace": cls.namespace if cls else None,
        "valid": not problems,
        "backend": plan.backend if plan else None,
        "store": _plain(plan.store.store) if plan and not plan.named else None,
        "audiences": _audiences(plan) if plan else [],
        "files": _files(plan) if plan else [],
        "warnings": warnings or [],
        "errors": problems,
    }
    if plan is not None and plan.named:
        report["stores"] = [_store(named) for named in plan.stores]
    if plan is not None and plan.refresh is not None:
        # Held to the bounds, as serve holds it (a warning says when it was moved).
        report["refresh_interval_s"] = plan.refresh
    return report


def _store(named: NamedStore) -> dict[str, Any]:
    """One store of a class of several: its settings, pod token audiences and objects."""
    # A store with no fallbacks has none listed (a store only selectors read has no objects).
    fallbacks = named.fallbacks or (None,) * len(named.plan.objects)
    listed = list(zip(named.plan.objects, fallbacks, strict=True))
    return {
        "name": named.name,
        "backend": named.plan.backend,
        "store": _plain(named.plan.store),
        "audiences": list(_store_audiences(named)),
        "objects": [
            {
                "path": spec.name,
                "object": spec.field,
                "fallback": fallback.spec.field if fallback else None,
            }
            for spec, fallback in listed
            if not selects(spec)
        ],
        "selects": [
            {"directory": spec.name, "object": spec.field, "selects": describe(spec.ref)}
            for spec, _ in listed
            if selects(spec)
        ],
        "fallback_objects": [
            {"path": spec.name, "object": spec.field}
            for spec in (named.fallback_plan.objects if named.fallback_plan else ())
        ],
    }


def _plain(store: Any) -> Any:
    if dataclasses.is_dataclass(store) and not isinstance(store, type):
        return dataclasses.asdict(store)
    return str(store)


def _audiences(plan: MountPlan) -> list[str]:
    """The audiences the kubelet must mint the pods' tokens for (the CSIDriver's
    tokenRequests); empty when the store does not log in with the pod's token, or offline
    when it comes from the provider's flags (GCP)."""
    audiences: list[str] = []
    for named in plan.stores:
        audiences += [a for a in _store_audiences(named) if a not in audiences]
    return audiences


def _store_audiences(named: NamedStore) -> tuple[str, ...]:
    module = registry.dialect_module(named.plan.backend)
    return tuple(module.audiences(named.plan.store))


def _mode(mode: int | None) -> str | None:
    # None: the driver's `permission` (the volume's default, usually 0644).
    return None if mode is None else f"{mode:04o}"


def _files(plan: MountPlan) -> list[dict[str, Any]]:
    files: list[dict[str, Any]] = []
    for named in plan.stores:
        for spec in named.plan.objects:
            if not spec.transforms.file:
                continue
            selector = selects(spec)
            entry = {
                "path": spec.name,
                "mode": _mode(spec.mode),
                "object": spec.field,
                "version_id": spec.version_id or spec.name,
                # explode, or a selector: files under this directory.
                "directory": spec.transforms.explode or selector,
                "lifetime": _lifetime(named.plan.backend, spec.ref),
            }
            if selector:  # what it selects, as the store names it (never a value)
                entry["selects"] = describe(spec.ref)
            if named.name:
                entry["store"] = named.name
            if spec.transforms.optional:  # a not-found leaves it out
                entry["optional"] = True
            files.append(entry)
    for tmpl in plan.templates:
        files.append(
            {
                "path": tmpl.path,
                "mode": _mode(tmpl.mode),
                "object": tmpl.field,
                "version_id": tmpl.path,
                "directory": False,
                "lifetime": None,
            }
        )
    return files


def _lifetime(backend: str, ref: Any) -> dict[str, str] | None:
    """Whether the object is expected to be a credential with a lifetime (a lease, a
    certificate: held per pod, renewed at two thirds of its life), and why; the answer decides
    at each read, so a plain-looking path that answers with a lease is held too."""
    found = registry.dialect_module(backend).lifetime(ref)
    return None if found is None else {"kind": found[0], "why": found[1]}


def _print_text(report: dict[str, Any]) -> None:
    where = report["source"]
    if report["name"] is not None:
        where += f": SecretProviderClass {report['name']}"
    for warning in report["warnings"]:
        print(f"{where}: warning: {warning}")
    for problem in report["errors"]:
        print(f"{where}: error: {problem}")
    if report["valid"]:
        paths = ", ".join(f["path"] for f in report["files"])
        audiences = ", ".join(report["audiences"]) or "none"
        backend = "several stores" if "stores" in report else report["backend"]
        print(f"{where}: valid ({backend}; files: {paths}; pod token audiences: {audiences})")
        for store in report.get("stores", ()):
            _print_store(store)


def _print_store(store: dict[str, Any]) -> None:
    objects = ", ".join(
        o["path"] + (f" (fallback: {o['fallback']})" if o["fallback"] else "")
        for o in store["objects"]
    )
    fallbacks = ", ".join(o["path"] for o in store["fallback_objects"])
    audiences = ", ".join(store["audiences"]) or "none"
    line = f"  store {store['name']} ({store['backend']}): objects: {objects or 'none'}"
    if store["selects"]:
        line += "; selects: " + ", ".join(
            f"{s['selects']} into {s['directory'] or 'the volume root'}" for s in store["selects"]
        )
    if fallbacks:
        line += f"; fallback for: {fallbacks}"
    print(f"{line}; pod token audiences: {audiences}")
