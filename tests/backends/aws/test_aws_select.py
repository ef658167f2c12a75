"""`select` on AWS through the provider's own mount path, against moto: Secrets Manager by name
prefix and tags, SSM by path; the calls of each poll counted at the wire (the counting proxy).
The cache is off (the default --cache-ttl 0), so every mount reads the store."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from backends.aws.options import Options
from devkit.moto import CountingProxy, MotoServer
from provider.core.errors import LimitExceeded, MountFailed, PermissionDenied
from provider.core.metrics import Metrics
from provider.core.settings import CoreSettings, ServeSettings
from provider.edge.app import Backends, build_mounter
from provider.mount.mounting import Mounter, MountInput
from tests.backends.aws.conftest import REGION, ROLE, irsa_pod

Core = Callable[..., Mounter]


@pytest.fixture
async def make_core(tmp_path: Path, proxy: CountingProxy) -> AsyncIterator[Core]:
    """make(**CoreSettings fields): a mounter as `serve` builds it, its AWS region behind the
    counting proxy."""
    built: list[Backends] = []
    key = tmp_path / "hmac"
    key.write_bytes(b"k" * 32)

    def make(**core: Any) -> Mounter:
        settings = ServeSettings(
            hmac_key_file=str(key),
            core=CoreSettings(**core),
            backend_options={"aws": Options(region=REGION, endpoints=f"{REGION}={proxy.url}")},
        )
        mounter, backends = build_mounter(settings, Metrics())
        built.append(backends)
        return mounter

    yield make
    for backends in built:
        await backends.close()


def params(*selectors: dict[str, Any], objects: list[dict[str, Any]] | None = None) -> dict:
    out = {"backend": "aws", "roleArn": ROLE, "select": yaml.safe_dump(list(selectors))}
    if objects:
        out["objects"] = yaml.safe_dump(objects)
    return out


async def files(mounter: Mounter, parameters: dict[str, str]) -> dict[str, bytes]:
    result = await mounter.mount(MountInput(params=parameters, pod=irsa_pod(), permission=0o644))
    return {f.path: f.contents for f in result.files}


def calls(proxy: CountingProxy, *operations: str) -> dict[str, int]:
    """The counts of the store's operations since the last call (STS logins left out)."""
    seen = {op: proxy.counts[op] for op in operations if proxy.counts[op]}
    for op in operations:
        proxy.counts[op] = 0
    return seen


SM_OPS = ("ListSecrets", "BatchGetSecretValue", "GetSecretValue", "DescribeSecret")
SSM_OPS = ("DescribeParameters", "GetParameters", "GetParametersByPath")


def seed(moto: MotoServer, secrets: dict[str, str], tags: dict[str, dict[str, str]]) -> None:
    client = moto.client("secretsmanager")
    for name, value in secrets.items():
        given = [{"Key": k, "Value": v} for k, v in tags.get(name, {}).items()]
        client.create_secret(Name=name, SecretString=value, Tags=given)


async def test_secrets_by_prefix_and_tags_follow_the_store_poll_by_poll(
    make_core: Core, moto: MotoServer, proxy: CountingProxy
) -> None:
    team = {"team": "pay"}
    seed(
        moto,
        {"app/db": "d", "app/api/key": "k", "app/other": "o", "web/x": "x"},
        {"app/db": team, "app/api/key": team, "app/other": {"team": "web"}, "web/x": team},
    )
    mounter = make_core()
    chosen = params({"namePrefix": "app/", "tags": team, "directory": "app"})
    assert await files(mounter, chosen) == {"app/db": b"d", "app/api/key": b"k"}
    assert calls(proxy, *SM_OPS) == {"ListSecrets": 1, "BatchGetSecretValue": 1}
    assert proxy.bodies["ListSecrets"][0]["Filters"] == [
        {"Key": "name", "Values": ["app/"]},
        {"Key": "tag-key", "Values": ["team"]},
        {"Key": "tag-value", "Values": ["pay"]},
    ]
    # Unchanged: one listing call and one batch all the same (a listing proves permission to
    # list, never to read: every poll's values are read as the pod).
    assert await files(mounter, chosen) == {"app/db": b"d", "app/api/key": b"k"}
    assert calls(proxy, *SM_OPS) == {"ListSecrets": 1, "BatchGetSecretValue": 1}
    # One changed, one added, one deleted: one listing call and one batch of the two listed.
    client = moto.client("secretsmanager")
    client.put_secret_value(SecretId="app/db", SecretString="d2")
    client.create_secret(Name="app/new", SecretString="n", Tags=[{"Key": "team", "Value": "pay"}])
    client.delete_secret(SecretId="app/api/key", RecoveryWindowInDays=7)
    assert await files(mounter, chosen) == {"app/db": b"d2", "app/new": b"n"}
    assert calls(proxy, *SM_OPS) == {"ListSecrets": 1, "BatchGetSecretValue": 1}
    assert len(proxy.bodies["BatchGetSecretValue"][-1]["SecretIdList"]) == 2


async def test_tags_match_as_pairs_and_a_null_value_means_any(
    make_core: Core, moto: MotoServer, proxy: CountingProxy
) -> None:
    seed(
        moto,
        {"a": "1", "b": "2", "c": "3", "d": "4"},
        {
            "a": {"env": "prod", "team": "pay"},
            "b": {"env": "dev", "team": "pay", "tier": "prod"},  # "prod" on another key
            "c": {"env": "prod", "team": ""},
            "d": {"envx": "prod"},  # tag-key is a prefix match at AWS
        },
    )
    mounter = make_core()

    async def chosen(tags: dict[str, str | None]) -> set[str]:
        return set(await files(mounter, params({"tags": tags, "directory": "t"})))

    assert await chosen({"env": "prod"}) == {"t/a", "t/c"}
    assert await chosen({"team": None}) == {"t/a", "t/b", "t/c"}
    assert await chosen({"team": ""}) == {"t/c"}
    assert await chosen({"env": "prod", "team": "pay"}) == {"t/a"}


async def test_ssm_parameters_under_a_path(
    make_core: Core, moto: MotoServer, proxy: CountingProxy
) -> None:
    ssm = moto.client("ssm")
    for name, value in {"/app/db/pass": "p", "/app/db/user": "u", "/app/flags": "f"}.items():
        ssm.put_parameter(Name=name, Value=value, Type="SecureString")
    ssm.put_parameter(Name="/other/x", Value="x", Type="String")
    mounter = make_core()
    deep = params(
        {"objectType": "ssmparameter", "path": "/app", "recursive": True, "directory": "c"}
    )
    expected = {"c/db/pass": b"p", "c/db/user": b"u", "c/flags": b"f"}
    assert await files(mounter, deep) == expected
    assert calls(proxy, *SSM_OPS) == {"DescribeParameters": 1, "GetParameters": 1}
    assert await files(mounter, deep) == expected
    assert calls(proxy, *SSM_OPS) == {"DescribeParameters": 1, "GetParameters": 1}
    ssm.put_parameter(Name="/app/flags", Value="f2", Type="SecureString", Overwrite=True)
    ssm.put_parameter(Name="/app/db/host", Value="h", Type="String")
    ssm.delete_parameter(Name="/app/db/user")
    assert await files(mounter, deep) == {"c/db/pass": b"p", "c/db/host": b"h", "c/flags": b"f2"}
    assert calls(proxy, *SSM_OPS) == {"DescribeParameters": 1, "GetParameters": 1}
    listed = ["/app/db/host", "/app/db/pass", "/app/flags"]
    assert sorted(proxy.bodies["GetParameters"][-1]["Names"]) == listed
    one_level = params({"objectType": "ssmparameter", "path": "/app/", "directory": "cfg"})
    assert await files(mounter, one_level) == {"cfg/flags": b"f2"}


async def test_without_describe_parameters_ssm_lists_by_path(
    make_core: Core, moto: MotoServer, proxy: CountingProxy
) -> None:
    ssm = moto.client("ssm")
    ssm.put_parameter(Name="/app/a", Value="1", Type="SecureString")
    proxy.deny_operations.add("DescribeParameters")
    mounter = make_core()
    chosen = params({"objectType": "ssmparameter", "path": "/app", "directory": "p"})
    assert await files(mounter, chosen) == {"p/a": b"1"}
    assert calls(proxy, *SSM_OPS) == {"DescribeParameters": 1, "GetParametersByPath": 1}
    # Remembered: the next poll does not ask DescribeParameters again.
    ssm.put_parameter(Name="/app/a", Value="2", Type="SecureString", Overwrite=True)
    assert await files(mounter, chosen) == {"p/a": b"2"}
    assert calls(proxy, *SSM_OPS) == {"GetParametersByPath": 1}


async def test_without_batch_get_secrets_are_read_one_by_one(
    make_core: Core, moto: MotoServer, proxy: CountingProxy
) -> None:
    seed(moto, {"s/a": "1", "s/b": "2"}, {})
    proxy.deny_operations.add("BatchGetSecretValue")
    mounter = make_core()
    chosen = params({"namePrefix": "s/", "directory": "s"})
    assert await files(mounter, chosen) == {"s/a": b"1", "s/b": b"2"}
    assert calls(proxy, *SM_OPS) == {
        "ListSecrets": 1,
        "BatchGetSecretValue": 1,
        "GetSecretValue": 2,
    }
    moto.client("secretsmanager").put_secret_value(SecretId="s/a", SecretString="1*")
    assert await files(mounter, chosen) == {"s/a": b"1*", "s/b": b"2"}
    assert calls(proxy, *SM_OPS) == {"ListSecrets": 1, "GetSecretValue": 2}


async def test_a_denied_secret_fails_the_selection(
    make_core: Core, moto: MotoServer, proxy: CountingProxy
) -> None:
    seed(moto, {"s/a": "1", "s/b": "2"}, {})

    def deny_b(body: bytes) -> bytes:
        answer = json.loads(body)
        kept = [v for v in answer["SecretValues"] if v["Name"] != "s/b"]
        denied = [
            {"SecretId": v["ARN"], "ErrorCode": "AccessDeniedException", "Message": "no"}
            for v in answer["SecretValues"]
            if v["Name"] == "s/b"
        ]
        return json.dumps({"SecretValues": kept, "Errors": denied}).encode()

    proxy.rewrite["BatchGetSecretValue"] = deny_b
    with pytest.raises(MountFailed, match=r"s/b.*denied \(AccessDeniedException\)") as info:
        await files(make_core(), params({"namePrefix": "s/", "directory": "s"}))
    assert isinstance(info.value.failures[0][1], PermissionDenied)


async def test_a_secret_deleted_between_list_and_read_is_left_out(
    make_core: Core, moto: MotoServer, proxy: CountingProxy
) -> None:
    seed(moto, {"s/a": "1"}, {})

    def add_ghost(body: bytes) -> bytes:
        answer = json.loads(body)
        ghost = dict(answer["SecretList"][0], Name="s/ghost")
        ghost["ARN"] = ghost["ARN"].replace("s/a", "s/ghost")
        answer["SecretList"].append(ghost)
        return json.dumps(answer).encode()

    proxy.rewrite["ListSecrets"] = add_ghost
    chosen = params({"namePrefix": "s/", "directory": "s"})
    assert await files(make_core(), chosen) == {"s/a": b"1"}


async def test_optional_listed_objects_and_their_jmespath_files_may_be_missing(
    make_core: Core, moto: MotoServer
) -> None:
    seed(moto, {"here": json.dumps({"u": "x"})}, {})
    objects = [
        {"objectName": "here", "objectType": "secretsmanager"},
        {
            "objectName": "gone",
            "objectType": "secretsmanager",
            "optional": True,
            "jmesPath": [{"path": "u", "objectAlias": "gone-u"}],
        },
        {"objectName": "/gone/p", "objectType": "ssmparameter", "optional": True},
    ]
    parameters = {"backend": "aws", "roleArn": ROLE, "objects": yaml.safe_dump(objects)}
    assert await files(make_core(), parameters) == {"here": b'{"u": "x"}'}


async def test_a_selection_over_max_objects_is_refused_naming_the_count(
    make_core: Core, moto: MotoServer, proxy: CountingProxy
) -> None:
    seed(moto, {f"many/{i}": str(i) for i in range(5)}, {})
    with pytest.raises(MountFailed, match=r"matches 5 secrets, over .* limit of 3") as info:
        await files(make_core(max_objects=3), params({"namePrefix": "many/", "directory": "m"}))
    assert isinstance(info.value.failures[0][1], LimitExceeded)
    assert calls(proxy, *SM_OPS) == {"ListSecrets": 1}


async def test_a_large_selection_stops_listing_past_the_limit(
    make_core: Core, moto: MotoServer, proxy: CountingProxy
) -> None:
    ssm = moto.client("ssm")
    for i in range(130):
        ssm.put_parameter(Name=f"/big/p{i}", Value=str(i), Type="String")
    chosen = params({"objectType": "ssmparameter", "path": "/big", "directory": "b"})
    with pytest.raises(MountFailed, match=r"matches more than 25 secrets"):
        await files(make_core(max_objects=25), chosen)
    # moto answers 10 a page whatever MaxResults says: three pages, not thirteen.
    assert calls(proxy, *SSM_OPS) == {"DescribeParameters": 3}


async def test_a_store_that_pages_forever_ends_with_a_clear_error(
    make_core: Core, moto: MotoServer, proxy: CountingProxy
) -> None:
    proxy.rewrite["ListSecrets"] = lambda _body: b'{"SecretList": [], "NextToken": "0"}'
    with pytest.raises(MountFailed, match=r"did not end after 11 pages of ListSecrets") as info:
        await files(make_core(max_objects=3), params({"namePrefix": "s/", "directory": "s"}))
    assert isinstance(info.value.failures[0][1], LimitExceeded)
    assert calls(proxy, *SM_OPS) == {"ListSecrets": 11}


async def test_names_that_traverse_or_collide_are_refused(
    make_core: Core, moto: MotoServer
) -> None:
    seed(moto, {"x/../../etc/passwd": "no"}, {})
    mounter = make_core()
    with pytest.raises(MountFailed, match=r"contains a '\.\.' element"):
        await files(mounter, params({"namePrefix": "x/", "directory": "d"}))
    seed(moto, {"y/a": "1", "y/a/b": "2"}, {})
    with pytest.raises(Exception, match="d/a"):
        await files(mounter, params({"namePrefix": "y/", "directory": "d"}))
    # A prefix that does not end at a '/' leaves one at the start of each name.
    with pytest.raises(MountFailed, match=r"'d//a' is not in clean form"):
        await files(mounter, params({"namePrefix": "y", "directory": "d"}))


async def test_expired_credentials_log_in_again_and_a_denied_listing_says_what_to_grant(
    make_core: Core, moto: MotoServer, proxy: CountingProxy
) -> None:
    seed(moto, {"s/a": "1"}, {})
    mounter = make_core()
    chosen = params({"namePrefix": "s/", "directory": "s"})
    proxy.inject["ListSecrets"].append((400, "ExpiredTokenException"))
    assert await files(mounter, chosen) == {"s/a": b"1"}
    assert proxy.counts["AssumeRoleWithWebIdentity"] == 2
    proxy.deny_operations.add("ListSecrets")
    with pytest.raises(MountFailed, match=r"denied .*allow secretsmanager:ListSecrets") as info:
        await files(mounter, chosen)
    assert isinstance(info.value.failures[0][1], PermissionDenied)


@pytest.mark.parametrize("directory", [None, "d"])
async def test_a_secret_name_too_long_for_a_file_names_the_selector_and_the_secret(
    make_core: Core, moto: MotoServer, proxy: CountingProxy, directory: str | None
) -> None:
    """Issue 41 item 11: a 305-character name under the prefix (AWS allows 512)."""
    head = f"{directory or 'root'}-"
    relative = head + "n" * (300 - len(head) - 5) + "-tail"  # 305 characters with "long/"
    seed(moto, {f"long/{relative}": "v"}, {})
    selector = {"namePrefix": "long/"} | ({"directory": directory} if directory else {})
    with pytest.raises(MountFailed) as info:
        await files(make_core(), params(selector))
    message = str(info.value)
    assert "object ''" not in message
    assert f"select[0]: the selected secret '{directory or 'root'}-nnn" in message
    assert "nnn-tail'" in message and "longer than 255 bytes (300)" in message
    assert "rename the secret, or narrow the selector" in message
    assert "\n" not in message and len(message) < 600
