"""The gcp backend against a fake Google on the wire: workload identity, reads, errors."""

from __future__ import annotations

from tests.backends.gcp.conftest import STS_AUDIENCE, Stack
from tests.backends.gcp.fake_google import POOL
from tests.helpers import fetch_ctx


async def test_gcp_fetch_as_pod_through_sts(stack: Stack) -> None:
    name = stack.google.add_version("projects/proj/secrets/db", '{"user":"u"}', "ksa:default/app")
    plan = stack.plan({"secrets": f"- resourceName: {name}\n  path: db.json\n"})
    pod = stack.pod()
    identity = await stack.backend.identify(plan, pod)
    ref = plan.objects[0].ref
    got = await stack.backend.fetch(plan, identity, [ref], fetch_ctx())
    values = got[ref]
    assert not isinstance(values, Exception), values
    assert values[0].content == b'{"user":"u"}'
    assert values[0].version == name
    [sts] = stack.google.sts_requests
    assert sts["subject_token"] == "pod-token-default-app"
    assert sts["audience"] == STS_AUDIENCE
    assert POOL in pod.tokens
