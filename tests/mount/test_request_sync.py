"""The secrets-store-sync-controller's MountRequest fields -> MountInput (docs/sync-controller.md).

The controller has no pod and no volume: it sends the SecretProviderClass's parameters with its
OWN pod's name and uid (from its downward-API env, empty when unset), the SecretSync's namespace
and service account, tokens it minted for that service account (no pod binding, 600 s), `{}` as
secrets and the placeholder target path "/mnt/secrets-store" — and no `secretProviderClass` or
`ephemeral` key. Go's json.Marshal writes the attributes (sorted keys, `<`, `>` and `&` escaped
as \\u003c, \\u003e, \\u0026). These pin that the shape keeps parsing as it does today.
"""

from __future__ import annotations

import json

import pytest

from provider.core.errors import InvalidParameters
from provider.mount.request import (
    POD_NAME,
    POD_NAMESPACE,
    POD_UID,
    SERVICE_ACCOUNT,
    TOKENS,
    parse_request,
)

TARGET = "/mnt/secrets-store"
PARAMETERS = {
    "backend": "vault",
    "roleName": "sync-reader",
    "objects": "- objectName: db-password\n  secretPath: secret/data/team-a/db\n  secretKey: p\n",
    "templates": '- path: url\n  template: "https://a/?u=${db-password}&x=<y>"\n',
}
TOKENS_JSON = {
    "vault": {"token": "jwt-vault", "expirationTimestamp": "2030-01-01T00:10:00Z"},
    "api://AzureADTokenExchange": {
        "token": "jwt-azure",
        "expirationTimestamp": "2030-01-01T00:10:00Z",
    },
}


def go_json(value: object) -> str:
    """encoding/json.Marshal of a map[string]string: sorted keys, HTML characters escaped."""
    text = json.dumps(value, sort_keys=True, separators=(",", ":"))
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def controller_attributes(*, tokens: bool = True, pod: str = "ssc-0", uid: str = "u-ssc") -> str:
    attrs = {
        **PARAMETERS,
        POD_NAME: pod,
        POD_UID: uid,
        POD_NAMESPACE: "team-a",
        SERVICE_ACCOUNT: "reader",
    }
    if tokens:
        attrs[TOKENS] = go_json(TOKENS_JSON)
    return go_json(attrs)


def test_the_controllers_request_parses_to_the_secretsyncs_identity() -> None:
    attributes = controller_attributes()
    assert "\\u0026" in attributes and "\\u003c" in attributes  # as Go writes it
    got = parse_request(attributes, "{}", "420", TARGET)
    assert got.pod.namespace == "team-a" and got.pod.service_account == "reader"
    assert (got.pod.name, got.pod.uid) == ("ssc-0", "u-ssc")  # the controller's own pod
    assert {a: t.token for a, t in got.pod.tokens.items()} == {
        "vault": "jwt-vault",
        "api://AzureADTokenExchange": "jwt-azure",
    }
    assert got.pod.tokens["vault"].expiration == "2030-01-01T00:10:00Z"
    assert got.pod.node_publish_secret == {}
    assert got.permission == 0o644
    assert got.target_path == TARGET
    # The class's parameters arrive as written, HTML characters included.
    assert got.params["templates"] == PARAMETERS["templates"]
    assert TOKENS not in got.params
    assert "secretProviderClass" not in got.params
    assert "csi.storage.k8s.io/ephemeral" not in got.params


def test_a_controller_without_audiences_sends_no_tokens_key() -> None:
    got = parse_request(controller_attributes(tokens=False), "{}", "420", TARGET)
    assert dict(got.pod.tokens) == {}


def test_a_controller_without_its_downward_api_env_sends_an_empty_pod_name_and_uid() -> None:
    got = parse_request(controller_attributes(pod="", uid=""), "{}", "420", TARGET)
    assert (got.pod.name, got.pod.uid) == ("", "")
    assert got.pod.subject == "team-a/reader"


@pytest.mark.parametrize("target", ["/mnt/secrets-store", ""])
def test_a_target_path_that_is_no_kubelet_path_is_kept_as_given(target: str) -> None:
    assert parse_request(controller_attributes(), "{}", "420", target).target_path == target


@pytest.mark.parametrize("missing", [POD_NAMESPACE, SERVICE_ACCOUNT])
def test_the_identity_keys_are_still_required_from_this_caller(missing: str) -> None:
    attrs = json.loads(controller_attributes())
    del attrs[missing]
    with pytest.raises(InvalidParameters, match=f"missing {missing}"):
        parse_request(json.dumps(attrs), "{}", "420", TARGET)
