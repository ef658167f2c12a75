"""BENCHMARKS.md, "Selectors": AWS store calls per poll, a 50-secret selection against the same
50 secrets listed as objects, unchanged and with 5 changed, counted at the wire (moto).

    .venv/bin/pytest -q -s tests/backends/aws/test_aws_select_bench.py

moto answers DescribeParameters 10 a page whatever MaxResults says (AWS: up to 50), and, like
AWS, with a NextToken after a full page: its 50 parameters take 6 listing calls where AWS takes
one or two.
"""

from __future__ import annotations

import yaml

from devkit.moto import CountingProxy, MotoServer
from tests.backends.aws.conftest import ROLE
from tests.backends.aws.test_aws_select import SM_OPS, SSM_OPS, Core, calls, files, params
from tests.backends.aws.test_aws_select import make_core as make_core  # the fixture

N = 50
CHANGED = 5


def listed(kind: str, names: list[str]) -> dict[str, str]:
    objects = [
        {"objectName": n, "objectType": kind, "objectAlias": f"o{i}"} for i, n in enumerate(names)
    ]
    return {"backend": "aws", "roleArn": ROLE, "objects": yaml.safe_dump(objects)}


async def polls(
    mounter_of: Core, proxy: CountingProxy, parameters: dict, ops: tuple[str, ...], change
) -> list[dict[str, int]]:  # type: ignore[no-untyped-def]
    """The calls of a first read, an unchanged poll and a poll after `change()`."""
    mounter = mounter_of()
    seen = []
    for step in ("first", "unchanged", "changed"):
        if step == "changed":
            change()
        assert len(await files(mounter, parameters)) == N
        seen.append(calls(proxy, *ops))
    return seen


async def test_secrets_manager_selection_against_listed_objects(
    make_core: Core, moto: MotoServer, proxy: CountingProxy
) -> None:
    client = moto.client("secretsmanager")
    names = [f"bench/s{i:02d}" for i in range(N)]
    for name in names:
        client.create_secret(Name=name, SecretString="v")
    round_ = iter(range(1, 100))

    def change() -> None:
        text = f"v{next(round_)}"
        for name in names[:CHANGED]:
            client.put_secret_value(SecretId=name, SecretString=text)

    chosen = params({"namePrefix": "bench/", "directory": "b"})
    selection = await polls(make_core, proxy, chosen, SM_OPS, change)
    objects = await polls(make_core, proxy, listed("secretsmanager", names), SM_OPS, change)
    print(f"\nsecretsmanager selection of {N}: {selection}\nsecretsmanager {N} objects: {objects}")
    # Every poll reads every selected secret (a listing proves permission to list, never to
    # read): 20 a BatchGetSecretValue, changed or not.
    assert selection == [{"ListSecrets": 1, "BatchGetSecretValue": 3}] * 3
    # Listed objects: each confirmed by DescribeSecret (--revalidate-max-age), the changed
    # ones read again.
    assert objects == [
        {"GetSecretValue": N},
        {"DescribeSecret": N},
        {"DescribeSecret": N, "GetSecretValue": CHANGED},
    ]


async def test_ssm_selection_against_listed_objects(
    make_core: Core, moto: MotoServer, proxy: CountingProxy
) -> None:
    ssm = moto.client("ssm")
    names = [f"/bench/p{i:02d}" for i in range(N)]
    for name in names:
        ssm.put_parameter(Name=name, Value="v", Type="SecureString")
    round_ = iter(range(1, 100))

    def change() -> None:
        text = f"v{next(round_)}"
        for name in names[:CHANGED]:
            ssm.put_parameter(Name=name, Value=text, Type="SecureString", Overwrite=True)

    chosen = params({"objectType": "ssmparameter", "path": "/bench", "directory": "b"})
    selection = await polls(make_core, proxy, chosen, SSM_OPS, change)
    objects = await polls(make_core, proxy, listed("ssmparameter", names), SSM_OPS, change)
    proxy.deny_operations.add("DescribeParameters")
    by_path = await polls(make_core, proxy, chosen, SSM_OPS, change)
    print(
        f"\nssm selection of {N}: {selection}\nssm {N} objects: {objects}"
        f"\nssm selection without ssm:DescribeParameters: {by_path}"
    )
    pages = N // 10 + 1  # moto: 10 a page, and a last empty page after a full one
    # Every poll reads every selected parameter, 10 a GetParameters, changed or not.
    assert selection == [{"DescribeParameters": pages, "GetParameters": N // 10}] * 3
    assert objects == [{"GetParameters": N // 10}] * 3
    assert by_path == [
        {"DescribeParameters": 1, "GetParametersByPath": pages},
        {"GetParametersByPath": pages},
        {"GetParametersByPath": pages},
    ]
