"""Adding a store touches its own package, its tests and its deploy example only (issue 34).

A copy of the repository gets a throwaway store, `kvmem`, added the way docs/architecture.md
("Adding a store") says: `backends/kvmem/{__init__,options,dialect,store}.py` (a dict-backed
store whose class lists `objects`, with one provider flag and no token audience), its tests in
`tests/backends/kvmem/` and its example `deploy/examples/<store>.yaml` — and no other file of
the copy is edited. Then, inside the copy (subprocesses with the project's interpreter, the copy
first on the import path), everything that knows the stores must know it:

- the registry lists it, `serve` has its flag, and `serve` quiets its SDK's logger;
- `check` accepts a `backend: kvmem` class and a class of several stores mixing it with `fake`;
- a Mount through the dev kit's Harness returns its files, alone and beside `fake`; through the
  gRPC edge, a refused Mount is counted under its own metric label, not "unknown";
- mypy --strict passes on its package (its dialect and backend against the protocols), and
  lint-imports on the whole copy;
- the Helm chart renders with `backends: [kvmem]`, a rate limit for it and its flag through
  `extraArgs`, and the provider accepts what it renders;
- the suite's own store lists take it in: its tests, the examples test, the chart's flag
  coverage and the parser fuzzing, run in the copy;
- the import contract that keeps stores independent covers it (expected to fail until
  pyproject.toml's contract names the stores by a wildcard instead of a list).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
VENV = ROOT / ".venv"
NAME = "kvmem"
#: What is copied: the product, the dev kit, the tests and the deployment, and the settings.
COPIED = ("provider", "backends", "protos", "devkit", "tests", "deploy", "pyproject.toml")
SKIPPED = shutil.ignore_patterns(
    "__pycache__", "*.pyc", ".venv", ".git", "build", "*.egg-info", ".mypy_cache", "hmac.key"
)

# --- the throwaway store, as the docs say to write one ------------------------------------

#: The new store's dialect.py, unindented so that its lines are as long as a store's own.
DIALECT_PY = '''\
"""The kvmem dialect: `objects`, a list of {objectName, key (default: objectName)}."""

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from backends.kvmem.options import Options
from provider.core import parsing
from provider.core.model import ObjectSpec, ParseContext, StorePlan, hashed_once
from provider.core.parsing import ObjectList, Problems, expect_str

KEYS = frozenset({"objects"})
OBJECTS = ObjectList("a kvmem object", frozenset({"objectName", "key", "filePermission"}))
listed = OBJECTS.listed
lifetime = parsing.plain_secrets


@dataclass(frozen=True)
class KvmemStore:
    def describe(self) -> str:
        return "kvmem"


@hashed_once
@dataclass(frozen=True)
class KvmemRef:
    key: str

    def describe(self) -> str:
        return self.key


Plan = StorePlan[KvmemStore, KvmemRef]


def parse(params: Mapping[str, str], ctx: ParseContext[Options]) -> Plan:
    problems = Problems(strict=ctx.strict)

    def entry(obj: Mapping[str, Any], where: str) -> ObjectSpec[KvmemRef]:
        name = expect_str(obj.get("objectName"), f"{where}.objectName", problems, required=True)
        key = expect_str(obj.get("key"), f"{where}.key", problems) or name
        return parsing.file_object(obj, where, name, KvmemRef(key), problems)

    specs = parsing.parse_objects(params.get("objects", ""), OBJECTS, entry, ctx, problems)
    problems.raise_if_any()
    return StorePlan("kvmem", KvmemStore(), tuple(specs), tuple(problems.warnings))


def audiences(store: KvmemStore) -> tuple[str, ...]:
    return ()  # no login with the pod's token
'''

#: Its store.py, likewise.
STORE_PY = '''\
"""The kvmem backend: values from a dict in memory (`DATA`), read through env.retry."""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from backends.kvmem import dialect
from backends.kvmem.dialect import KvmemRef, KvmemStore, Plan
from backends.kvmem.options import Options
from provider.core.backend import Backend, BackendEnv, Dialect
from provider.core.errors import NotFound
from provider.core.identity import pod_scope
from provider.core.model import FetchContext, Fetched, Identity, Pod, SecretValue, identity_key

#: The store's contents: key -> value.
DATA: dict[str, str] = {}


@dataclass
class KvmemBackend:
    env: BackendEnv[Options]
    name: str = "kvmem"

    async def identify(self, plan: Plan, pod: Pod) -> Identity:
        return Identity(key=identity_key("kvmem", pod_scope(self.env, pod)), subject=pod.subject)

    async def fetch(
        self, plan: Plan, identity: Identity, refs: Sequence[KvmemRef], ctx: FetchContext
    ) -> Mapping[KvmemRef, Fetched]:
        async def read() -> dict[KvmemRef, Fetched]:
            return {ref: self._read(ref) for ref in refs}

        return await self.env.retry(read, ctx)

    def _read(self, ref: KvmemRef) -> Fetched:
        value = DATA.get(self.env.options.prefix + ref.key)
        if value is None:
            return NotFound(f"kvmem store: no value at {ref.key!r}")
        return [SecretValue(content=value.encode())]

    async def close(self) -> None:
        return None


def create(env: BackendEnv[Options]) -> Backend[KvmemStore, KvmemRef]:
    return KvmemBackend(env)


DIALECT: Dialect[KvmemStore, KvmemRef, Options] = dialect
'''

STORE_FILES: dict[str, str] = {
    f"backends/{NAME}/__init__.py": '''\
        """kvmem: a throwaway in-memory store (tests/core/test_adding_a_store.py)."""
        ''',
    f"backends/{NAME}/options.py": '''\
        """Provider-level flags of the kvmem store."""

        from dataclasses import dataclass, field

        #: The SDK's loggers, kept at WARNING by `serve`.
        SDK_LOGGERS: tuple[str, ...] = ("kvmem.sdk",)


        @dataclass(frozen=True)
        class Options:
            prefix: str = field(default="", metadata={"help": "prefix of every key read"})
        ''',
    f"backends/{NAME}/dialect.py": DIALECT_PY,
    f"backends/{NAME}/store.py": STORE_PY,
    f"tests/backends/{NAME}/__init__.py": "",
    f"tests/backends/{NAME}/test_{NAME}_dialect.py": '''\
        """The kvmem dialect: objects become refs and files."""

        import pytest

        from backends.kvmem.dialect import KvmemRef, parse
        from provider.core.errors import InvalidParameters
        from provider.core.model import ParseContext


        def test_objects_become_refs_and_files() -> None:
            objects = "- {objectName: a, key: k/a}\\n- objectName: b"
            plan = parse({"objects": objects}, ParseContext())
            assert [(s.name, s.ref) for s in plan.objects] == [
                ("a", KvmemRef("k/a")),
                ("b", KvmemRef("b")),
            ]


        def test_a_class_without_objects_is_refused() -> None:
            with pytest.raises(InvalidParameters, match="objects is required"):
                parse({}, ParseContext())
        ''',
    f"tests/backends/{NAME}/test_{NAME}_identity.py": '''\
        """Whom kvmem reads as: the pod's scope."""

        from backends.kvmem import store
        from backends.kvmem.dialect import parse
        from devkit.testing import make_env, make_pod
        from provider.core.model import ParseContext


        async def test_the_identity_is_the_pods() -> None:
            backend = store.create(make_env("kvmem"))
            plan = parse({"objects": "- objectName: a"}, ParseContext())
            identity = await backend.identify(plan, make_pod(namespace="team"))
            assert identity.key.startswith("kvmem|") and "team" in identity.key
        ''',
    f"tests/backends/{NAME}/test_{NAME}_fetch.py": '''\
        """kvmem reads under the prefix of its flag."""

        from backends.kvmem import store
        from backends.kvmem.dialect import KvmemRef, parse
        from backends.kvmem.options import Options
        from devkit.testing import fetch_ctx, make_env, make_pod
        from provider.core.model import ParseContext


        async def test_reads_under_the_prefix() -> None:
            store.DATA.update({"app/a": "1"})
            backend = store.create(make_env("kvmem", Options(prefix="app/")))
            plan = parse({"objects": "- objectName: a"}, ParseContext())
            identity = await backend.identify(plan, make_pod())
            got = await backend.fetch(plan, identity, [KvmemRef("a")], fetch_ctx())
            found = got[KvmemRef("a")]
            assert isinstance(found, list) and found[0].content == b"1"
        ''',
    f"tests/backends/{NAME}/test_{NAME}_errors.py": '''\
        """A missing kvmem value is the core's NotFound, per ref."""

        from backends.kvmem import store
        from backends.kvmem.dialect import KvmemRef, parse
        from devkit.testing import fetch_ctx, make_env, make_pod
        from provider.core.errors import NotFound
        from provider.core.model import ParseContext


        async def test_a_miss_is_not_found() -> None:
            backend = store.create(make_env("kvmem"))
            plan = parse({"objects": "- objectName: nowhere"}, ParseContext())
            identity = await backend.identify(plan, make_pod())
            got = await backend.fetch(plan, identity, [KvmemRef("nowhere")], fetch_ctx())
            assert isinstance(got[KvmemRef("nowhere")], NotFound)
        ''',
    f"tests/backends/{NAME}/test_{NAME}_mount.py": '''\
        """A Mount of a kvmem class writes its files (the dev kit's Harness)."""

        from pathlib import Path

        from backends.kvmem import store
        from devkit.testing import Harness


        async def test_a_mount_writes_its_files(tmp_path: Path) -> None:
            store.DATA.update({"db/password": "pw"})
            objects = [{"objectName": "db-password", "key": "db/password"}]
            files = await Harness(tmp_path).files(objects, backend="kvmem")
            assert files == {"db-password": b"pw"}
        ''',
    f"deploy/examples/{NAME}.yaml": """\
        # The kvmem store: values from the provider's memory (a throwaway store of the tests).
        apiVersion: secrets-store.csi.x-k8s.io/v1
        kind: SecretProviderClass
        metadata:
          name: app-kvmem
          namespace: default
        spec:
          provider: secrets-bridge
          parameters:
            backend: kvmem
            objects: |
              - objectName: db-password
                key: db/password
                filePermission: 0400
        """,
}

#: The tests every store ships, `tests/backends/<name>/test_<name>_<role>.py`
#: (tests/core/test_store_contract.py requires them).
SHIPPED = ("dialect", "identity", "fetch", "errors", "mount")

# --- what runs inside the copy --------------------------------------------------------------

#: Run in the copy; prints one JSON report of what the registry, the Harness, the gRPC edge,
#: the logs and the chart made of the new store.
PROBE = """\
import asyncio
import json
import logging
import sys
from pathlib import Path

import aiohttp
import yaml

import backends
import provider
from backends import registry
from backends.fake.options import Options as FakeOptions
from backends.kvmem import store as kvmem
from devkit.serving import serving
from devkit.testing import Harness, driver_request, make_pod
from provider.cli.flags import settings_from_args
from provider.core.settings import CoreSettings
from provider.edge import logs
from provider.mount.mounting import MountInput
from tests.deploy.helm_render import lint, notes, render, serve_parser

here = Path(__file__).parent
report = {"sources": [provider.__file__, backends.__file__, registry.__file__]}
report["names"] = registry.names()
report["dests"] = sorted(a.dest for a in serve_parser()._actions)
logs.configure("debug", "json", stream=open("/dev/null", "w"))
report["sdk_level"] = logging.getLogger("kvmem.sdk").level
kvmem.DATA.update({"db/password": "pw-1", "api/key": "key-2"})
tmp = here / "probe-tmp"
tmp.mkdir()
MULTI = {
    "stores": "mem: {backend: kvmem}\\nfk: {backend: fake}",
    "objects": yaml.safe_dump(
        [
            {"store": "mem", "objectName": "db-password", "key": "db/password"},
            {"store": "fk", "objectName": "token", "secretPath": "tok"},
            {
                "store": "mem",
                "objectName": "api-key",
                "key": "missing",
                "fallback": {"store": "fk", "objectName": "api-key", "secretPath": "api"},
            },
        ]
    ),
}


async def harness() -> None:
    h = Harness(tmp)
    h.write({"secrets": {"tok": "t-3", "api": "fallback-4"}})
    objects = [{"objectName": "db-password", "key": "db/password"}, {"objectName": "api/key"}]
    files = await h.files(objects, backend="kvmem")
    report["single"] = {k: v.decode() for k, v in files.items()}
    result = await h.mounter.mount(MountInput(params=MULTI, pod=make_pod(), permission=0o644))
    report["multi"] = {f.path: f.contents.decode() for f in result.files}


async def edge() -> None:
    store_file = tmp / "fake.yaml"
    store_file.write_text(yaml.safe_dump({"secrets": {"tok": "t-3", "api": "fallback-4"}}))
    options = {"fake": FakeOptions(store_file=str(store_file))}
    core = CoreSettings(enable_fake_backend=True)
    async with serving(tmp, backend_options=options, core=core) as s:
        ok = {"backend": "kvmem", "objects": "- {objectName: a, key: db/password}"}
        reply = await s.stub.Mount(driver_request(ok), timeout=10)
        report["edge_files"] = {f.path: f.contents.decode() for f in reply.files}
        missing = {"backend": "kvmem", "objects": "- {objectName: b, key: nowhere}"}
        try:
            await s.stub.Mount(driver_request(missing), timeout=10)
        except Exception as exc:
            report["edge_refused"] = exc.code().name
        async with aiohttp.ClientSession() as http:
            async with http.get(s.health + "/metrics") as resp:
                text = await resp.text()
        report["mount_series"] = sorted(
            line.split(" ")[0]
            for line in text.splitlines()
            if line.startswith("secrets_bridge_mount_requests_total{")
        )


asyncio.run(harness())
asyncio.run(edge())

values = {
    "backends": ["kvmem"],
    "rateLimits": {"kvmem": 5},
    "extraArgs": ["--kvmem-prefix=app/"],
}
report["lint_errors"] = lint(values)["errors"]
(c,) = render(values).one("DaemonSet")["spec"]["template"]["spec"]["containers"]
args = c["args"]
parsed = serve_parser().parse_args(args[1:])
parsed.hmac_key_file = None  # the key the chart mounts is not on this machine
settings = settings_from_args(parsed)
report["rate_limits"] = settings.core.rate_limits
report["prefix"] = settings.backend_options["kvmem"].prefix
report["notes"] = notes(values)
print(json.dumps(report))
"""


def _env(copy: Path) -> dict[str, str]:
    """The copy first on the import path (before the editable install of the checkout)."""
    return {**os.environ, "PYTHONPATH": str(copy)}


def run(copy: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        list(args),
        cwd=copy,
        env=_env(copy),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


@pytest.fixture(scope="module")
def copy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The repository's source copied, with the new store added and nothing else edited."""
    dest = tmp_path_factory.mktemp("repo")
    for name in COPIED:
        source = ROOT / name
        if source.is_dir():
            shutil.copytree(source, dest / name, ignore=SKIPPED)
        else:
            shutil.copy2(source, dest / name)
    before = {p.relative_to(dest) for p in dest.rglob("*") if p.is_file()}
    for relative, text in STORE_FILES.items():
        target = dest / relative
        assert not target.exists(), f"{relative} exists already: pick another name"
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(textwrap.dedent(text))
    # The examples test runs the CLI from <root>/.venv; the copy uses the project's.
    (dest / ".venv").symlink_to(VENV)
    after = {p.relative_to(dest) for p in dest.rglob("*") if p.is_file() and ".venv" not in p.parts}
    assert after - before == {Path(p) for p in STORE_FILES}
    return dest


@pytest.fixture(scope="module")
def probe(copy: Path) -> dict[str, Any]:
    (copy / "probe_new_store.py").write_text(PROBE)
    try:
        result = run(copy, sys.executable, "probe_new_store.py")
    finally:
        (copy / "probe_new_store.py").unlink()
    assert result.returncode == 0, result.stderr[-4000:]
    report: dict[str, Any] = json.loads(result.stdout.splitlines()[-1])
    # What ran is the copy, not the checkout.
    assert all(Path(p).is_relative_to(copy) for p in report["sources"]), report["sources"]
    return report


def test_the_registry_lists_it_and_serve_takes_its_flag_and_quiets_its_sdk(
    probe: dict[str, Any],
) -> None:
    assert NAME in probe["names"] and probe["names"] == sorted(probe["names"])
    assert {"vault", "aws", "gcp", "azure", "fake"} <= set(probe["names"])
    assert f"{NAME}__prefix" in probe["dests"]
    assert probe["sdk_level"] == 30  # logging.WARNING


def check_class(copy: Path, parameters: dict[str, str]) -> dict[str, Any]:
    doc = {
        "apiVersion": "secrets-store.csi.x-k8s.io/v1",
        "kind": "SecretProviderClass",
        "metadata": {"name": "c", "namespace": "default"},
        "spec": {"provider": "secrets-bridge", "parameters": parameters},
    }
    path = copy / "class-under-check.yaml"
    path.write_text(yaml.safe_dump(doc))
    result = run(copy, sys.executable, "-m", "provider.cli.main", "check", "--json", str(path))
    assert result.returncode == 0, result.stdout + result.stderr
    (cls,) = json.loads(result.stdout)["classes"]
    assert cls["valid"] and not cls["errors"], cls
    return dict(cls)


def test_check_accepts_a_class_of_it_and_one_mixing_it_with_fake(copy: Path) -> None:
    one = check_class(
        copy, {"backend": NAME, "objects": "- {objectName: db-password, key: db/password}"}
    )
    assert one["backend"] == NAME and one["audiences"] == []
    assert [f["path"] for f in one["files"]] == ["db-password"]
    mixed = check_class(
        copy,
        {
            "stores": f"mem: {{backend: {NAME}}}\nfk: {{backend: fake, audience: fk}}",
            "objects": "- {store: mem, objectName: a, key: k/a}\n"
            "- {store: fk, objectName: b, secretPath: s/b}",
        },
    )
    assert [(s["name"], s["backend"]) for s in mixed["stores"]] == [("mem", NAME), ("fk", "fake")]
    assert mixed["audiences"] == ["fk"]
    assert [f["path"] for f in mixed["files"]] == ["a", "b"]


def test_a_mount_returns_its_files_alone_beside_fake_and_through_the_edge(
    probe: dict[str, Any],
) -> None:
    assert probe["single"] == {"db-password": "pw-1", "api/key": "key-2"}
    assert probe["multi"] == {"db-password": "pw-1", "token": "t-3", "api-key": "fallback-4"}
    assert probe["edge_files"] == {"a": "pw-1"}
    assert probe["edge_refused"] == "NOT_FOUND"


def test_its_metric_label_is_its_name(probe: dict[str, Any]) -> None:
    series = probe["mount_series"]
    assert f'secrets_bridge_mount_requests_total{{backend="{NAME}",code="OK"}}' in series
    # A refused Mount is labelled from the edge's set of known stores.
    assert f'secrets_bridge_mount_requests_total{{backend="{NAME}",code="NOT_FOUND"}}' in series
    assert not [s for s in series if 'backend="unknown"' in s], series


def test_mypy_strict_passes_on_its_package(copy: Path) -> None:
    result = run(
        copy,
        str(VENV / "bin" / "mypy"),
        "--config-file",
        "pyproject.toml",
        "--cache-dir",
        str(copy / ".mypy_cache"),
        # Only the new package's errors: the rest of the copy is the checkout's to keep.
        "--follow-imports=silent",
        f"backends/{NAME}",
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_lint_imports_passes_on_the_whole_copy(copy: Path) -> None:
    result = run(copy, str(VENV / "bin" / "lint-imports"), "--no-cache")
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_independence_contract_covers_it(copy: Path) -> None:
    dialect = copy / "backends" / NAME / "dialect.py"
    source = dialect.read_text()
    dialect.write_text(source + "\nimport backends.fake.dialect  # noqa: E402,F401\n")
    try:
        result = run(copy, str(VENV / "bin" / "lint-imports"), "--no-cache")
    finally:
        dialect.write_text(source)
    assert result.returncode != 0, result.stdout
    assert f"backends.{NAME} is not allowed to import backends.fake" in result.stdout


def test_the_chart_renders_with_it_and_the_provider_takes_what_it_renders(
    probe: dict[str, Any],
) -> None:
    assert probe["lint_errors"] == []
    assert probe["rate_limits"] == {NAME: 5.0}
    assert probe["prefix"] == "app/"
    assert f"{NAME}:" in probe["notes"] and "secrets-bridge check --json" in probe["notes"]


def test_the_suites_store_lists_take_it_in(copy: Path) -> None:
    result = run(
        copy,
        sys.executable,
        "-m",
        "pytest",
        "-v",
        "--no-header",
        f"tests/backends/{NAME}",
        "tests/deploy/test_deploy_examples.py",
        "tests/deploy/test_deploy_helm.py::test_every_serve_flag_has_a_chart_value_or_a_reason_not_to",
        f"tests/core/test_store_contract.py::test_every_store_ships_its_tests[{NAME}]",
        f"tests/core/test_fuzz_parsing.py::test_dialect_parsers_fail_cleanly[{NAME}]",
        timeout=300,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    # The new store's own cases ran: its tests, its example (checked and in the upstream
    # style), its dialect's fuzzing; nothing was skipped.
    passed = [line.split(" ")[0] for line in result.stdout.splitlines() if " PASSED" in line]
    ran = {case.partition("::")[0] for case in passed} | set(passed)
    for case in (
        *(f"tests/backends/{NAME}/test_{NAME}_{role}.py" for role in SHIPPED),
        f"tests/core/test_store_contract.py::test_every_store_ships_its_tests[{NAME}]",
        f"tests/deploy/test_deploy_examples.py::test_secrets_bridge_check_accepts_the_example[{NAME}.yaml]",
        f"tests/deploy/test_deploy_examples.py::test_one_class_per_backend_in_the_upstream_style[{NAME}.yaml-{NAME}]",
        f"tests/core/test_fuzz_parsing.py::test_dialect_parsers_fail_cleanly[{NAME}]",
    ):
        assert case in ran, (case, result.stdout)
    assert "SKIPPED" not in result.stdout, result.stdout


def test_it_ships_the_tests_every_store_ships(copy: Path) -> None:
    """The contract test requires them: a store without its errors tests is refused by name."""
    shipped = copy / "tests" / "backends" / NAME / f"test_{NAME}_errors.py"
    source = shipped.read_text()
    shipped.unlink()
    try:
        result = run(
            copy, sys.executable, "-m", "pytest", "-q", "tests/core/test_store_contract.py"
        )
    finally:
        shipped.write_text(source)
    assert result.returncode != 0, result.stdout
    assert f"store {NAME!r}: tests/backends/{NAME}/ lacks test_{NAME}_errors.py" in result.stdout


def edited(path: Path, old: str, new: str = "") -> str:
    """`path`'s text with `old` replaced (written back): its original, to restore."""
    source = path.read_text()
    assert old in source, (path, old)
    path.write_text(source.replace(old, new))
    return source


def test_the_registry_refuses_it_without_its_dialect_line(copy: Path) -> None:
    store = copy / "backends" / NAME / "store.py"
    source = edited(store, "DIALECT: Dialect[KvmemStore, KvmemRef, Options] = dialect\n")
    create = "from backends import registry\nfrom devkit.testing import make_env\n"
    create += f"registry.create(make_env({NAME!r}))\n"
    try:
        result = run(copy, sys.executable, "-c", create)
    finally:
        store.write_text(source)
    assert result.returncode != 0
    expected = f"NotAStore: store {NAME!r}: backends/{NAME}/store.py has no 'DIALECT'"
    assert expected in result.stderr, result.stderr


def test_check_refuses_it_without_its_dialects_listed(copy: Path) -> None:
    """Not only a class of several stores (which calls `listed`): any class of the store."""
    dialect = copy / "backends" / NAME / "dialect.py"
    source = edited(dialect, "listed = OBJECTS.listed\n")
    try:
        with pytest.raises(AssertionError) as failed:
            check_class(copy, {"backend": NAME, "objects": "- objectName: a"})
    finally:
        dialect.write_text(source)
    expected = f"store {NAME!r}: backends/{NAME}/dialect.py has no 'listed' (the Dialect protocol"
    assert expected in str(failed.value)
