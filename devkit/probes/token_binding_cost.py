"""What checking a request's token against its pod costs (issue 40, item 7): `parse_request`
of a typical Vault request with one projected token, with the claim check and with it left
out, alternated five times; the median of each in microseconds. The check runs once per
distinct request (provider/mount/mounting.py keeps parsed requests), so a cached mount does not
pay it.

    python -m devkit.probes.token_binding_cost
"""

from __future__ import annotations

import argparse
import json
import statistics
import timeit

from devkit.tokens import SigningKey
from provider.core.model import Pod
from provider.mount import request as attributes

ROUNDS = 5
CALLS = 2000


def request() -> str:
    token = SigningKey.generate().pod_token("shop", "web", "vault", pod="web-1")
    tokens = {"vault": {"token": token, "expirationTimestamp": "2030-01-01T00:00:00Z"}}
    return json.dumps(
        {
            "backend": "vault",
            "roleName": "web",
            "objects": "- {objectName: a, secretPath: secret/data/a, secretKey: pw}",
            attributes.POD_NAME: "web-1",
            attributes.POD_NAMESPACE: "shop",
            attributes.POD_UID: "uid-web-1",
            attributes.SERVICE_ACCOUNT: "web",
            attributes.TOKENS: json.dumps(tokens),
        }
    )


def skipped(pod: Pod, where: str) -> None:
    return None


def main() -> None:
    argparse.ArgumentParser(description=__doc__.split("\n\n")[0]).parse_args()
    attrs = request()
    # The module's own name for the check, swapped for a no-op between rounds.
    names = vars(attributes)
    checked = names["check_bound"]
    times: dict[str, list[float]] = {"with the check": [], "without": []}
    try:
        for _ in range(ROUNDS):
            for label, check in (("with the check", checked), ("without", skipped)):
                names["check_bound"] = check
                best = min(
                    timeit.repeat(
                        lambda: attributes.parse_request(attrs, "null", "420", "/t"),
                        number=CALLS,
                        repeat=3,
                    )
                )
                times[label].append(best / CALLS * 1e6)
    finally:
        names["check_bound"] = checked
    for label, values in times.items():
        print(f"parse_request {label}: {statistics.median(values):.1f} us (median of {ROUNDS})")


if __name__ == "__main__":
    main()
