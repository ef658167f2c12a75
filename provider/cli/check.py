"""`secrets-bridge check SPC.yaml`: validate a class offline with the parser `Mount` uses.

No provider flags, no file reads beyond the manifest, no network: a parameter that would fall
back to a provider-level default (the Vault address, the GCP pool) is a warning here.
"""

from __future__ import annotations

from provider.cli import spc
from provider.core.errors import InvalidParameters
from provider.mount.planning import parse_plan


def run(path: str) -> int:
    try:
        classes = spc.load(path)
    except InvalidParameters as exc:
        _print_problems(path, exc.problems)
        return 1
    ok = True
    for cls in classes:
        label = f"SecretProviderClass {cls.name}"
        problems: list[str] = []
        warnings: list[str] = []
        if cls.provider != spc.PROVIDER_NAME:
            problems.append(
                f"spec.provider is {cls.provider!r}; set it to {spc.PROVIDER_NAME!r} so the "
                "driver calls secrets-bridge"
            )
        try:
            plan = parse_plan(cls.parameters, options_for=None, enable_fake=True)
        except InvalidParameters as exc:
            problems.extend(exc.problems)
        else:
            warnings.extend(plan.warnings)
            if plan.store.backend == "fake":
                warnings.append("backend 'fake' is accepted only with --enable-fake-backend")
        for w in warnings:
            print(f"{path}: {label}: warning: {w}")
        if problems:
            ok = False
            _print_problems(f"{path}: {label}", problems)
        else:
            print(f"{path}: {label}: valid")
    return 0 if ok else 1


def _print_problems(where: str, problems: list[str]) -> None:
    for p in problems:
        print(f"{where}: error: {p}")
