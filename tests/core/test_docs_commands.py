"""Every command in the README, SECURITY.md, BENCHMARKS.md and docs/*.md runs as written
(issues 33, 41).

What counts as a command:

- every command of a ```sh / ```bash / ```shell block (continuation lines joined, a here-document
  kept whole, comments dropped), and every `$ ` line of a ```console block, whose following
  lines are the output it shows;
- in a bare ``` block, a `$ ` line, or a line that starts with a program (`secrets-bridge`,
  `kubectl`, `helm`, `make`, `python`, ...): a usage synopsis or a command;
- an inline code span that starts with a program, except a program or a subcommand named in
  prose (`secrets-bridge`, `secrets-bridge check`, `kubectl debug`: at most two words, the second
  not a flag; `make <target>` is a command).

Each command is classified by the first rule of RULES its text matches, and no command may be
left unclassified (the test lists any new one):

- RUN: the test runs it as written, with the repository's .venv/bin first on PATH, in a
  workspace holding a copy of deploy/, a link to .venv and every file the document shows as a
  ```yaml block whose first line is a `# <name>` comment (`# spc.yaml`). A document's commands
  run in its order, in one workspace, as a reader following it would. The exit code is the one
  the document implies (0 unless the rule says otherwise), and a ```console block's output must
  be what the command prints.
- COVERED: named tests run it (a synopsis with placeholders, `make demo`); each named test must
  exist. A synopsis's flags must also be in its command's `--help`.
- NEEDS: a cluster, a registry, a container engine, the network or a tool this machine does not
  have, with the reason; the part that runs offline is checked where there is one (a Helm
  install's chart and values render; an `apply -k` directory renders with `kubectl kustomize`).
- PARSES: a measurement of BENCHMARKS.md that takes minutes (a bench, a probe, a soak): its
  command line is handed to the program's own argument parser, which must accept it as written;
  a test file or script it names must exist.
- WRONG: a form that cannot run as written (the console script's `bench --store`, which needs
  the dev kit): the test fails on it, saying how to write it.
"""

from __future__ import annotations

import ast
import json
import os
import re
import shlex
import shutil
import subprocess
import textwrap
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy.conftest import copy_deploy

ROOT = Path(__file__).resolve().parents[2]
VENV_BIN = ROOT / ".venv" / "bin"
DOCS = sorted(
    [
        ROOT / "README.md",
        ROOT / "SECURITY.md",
        ROOT / "BENCHMARKS.md",
        *(ROOT / "docs").glob("*.md"),
    ]
)

PROGRAMS = (
    "secrets-bridge",
    "kubectl",
    "helm",
    "make",
    "python",
    "python3",
    "docker",
    "podman",
    "openssl",
    "kustomize",
    ".venv/bin/",
)
SHELL_BLOCKS = {"sh", "bash", "shell"}
FENCE = re.compile(r"^(\s*)```(\S*)\s*$")
NAMED_FILE = re.compile(r"#\s*([\w.-]+\.(?:ya?ml|json))\s*$")
HEREDOC = re.compile(r"<<-?\s*'?\"?(\w+)'?\"?")


# --- extraction ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Command:
    doc: str  # the document, relative to the repository
    line: int  # where the command starts (1-based)
    text: str  # as a shell runs it: continuation lines and here-documents kept
    inline: bool = False  # from a code span in the prose
    output: str | None = None  # what a ```console block shows it printing

    @property
    def flat(self) -> str:
        """One line, for matching: continuations joined, whitespace collapsed."""
        first, *_ = self.text.replace("\\\n", " ").split("\n")
        return " ".join(first.split())

    def __str__(self) -> str:
        return f"{self.doc}:{self.line}: {self.flat}"


@dataclass(frozen=True)
class Block:
    line: int  # the opening fence's line (1-based)
    info: str
    lines: list[str]  # dedented by the fence's indentation


def blocks(text: str) -> tuple[list[Block], str]:
    """The fenced blocks of a document, and its prose with the blocks blanked out."""
    found: list[Block] = []
    prose: list[str] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if not opening:
            prose.append(lines[i])
            i += 1
            continue
        indent, info = len(opening.group(1)), opening.group(2)
        start, body = i, []
        i += 1
        while i < len(lines) and not re.match(r"^\s*```\s*$", lines[i]):
            line = lines[i]
            body.append(
                line[indent:] if line[:indent].isspace() else line.lstrip() if indent else line
            )
            i += 1
        found.append(Block(start + 1, info, body))
        prose.extend([""] * (i - start + 1))
        i += 1
    return found, "\n".join(prose)


def strip_comment(line: str) -> str:
    """A shell line without its trailing `# comment` (a `#` outside quotes after a blank)."""
    quote = ""
    for n, ch in enumerate(line):
        if quote:
            if ch == quote:
                quote = ""
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (n == 0 or line[n - 1].isspace()):
            return line[:n].rstrip()
    return line.rstrip()


def shell_commands(block: Block) -> Iterator[tuple[int, str]]:
    """(line, command) for each command of a shell block."""
    lines = block.lines
    i = 0
    while i < len(lines):
        line = strip_comment(lines[i])
        start = i
        i += 1
        if not line.strip():
            continue
        parts = [line]
        while parts[-1].endswith("\\") and i < len(lines):
            parts.append(strip_comment(lines[i]))
            i += 1
        heredoc = HEREDOC.search(" ".join(parts))
        if heredoc:
            while i < len(lines):
                parts.append(lines[i])
                i += 1
                if lines[i - 1].strip() == heredoc.group(1):
                    break
        yield block.line + 1 + start, "\n".join(parts)


def console_commands(block: Block) -> Iterator[tuple[int, str, str]]:
    """(line, command, output shown) for each `$ ` line of a console block."""
    lines = block.lines
    starts = [n for n, line in enumerate(lines) if line.startswith("$ ")]
    for k, n in enumerate(starts):
        end = starts[k + 1] if k + 1 < len(starts) else len(lines)
        output = "\n".join(line.rstrip() for line in lines[n + 1 : end]).strip("\n")
        yield block.line + 1 + n, lines[n][2:].strip(), output


def starts_with_program(text: str) -> bool:
    return any(text == p or text.startswith(p if p.endswith("/") else p + " ") for p in PROGRAMS)


def commands(doc: Path) -> list[Command]:
    name = str(doc.relative_to(ROOT))
    found, prose = blocks(doc.read_text())
    out: list[Command] = []
    for block in found:
        if block.info in SHELL_BLOCKS:
            out += [Command(name, n, text) for n, text in shell_commands(block)]
        elif block.info == "console":
            out += [Command(name, n, text, output=o) for n, text, o in console_commands(block)]
        elif block.info == "":
            if any(line.startswith("$ ") for line in block.lines):
                out += [Command(name, n, t, output=o) for n, t, o in console_commands(block)]
                continue
            for n, line in enumerate(block.lines):
                if starts_with_program(line):
                    out.append(Command(name, block.line + 1 + n, strip_comment(line)))
    for span in re.finditer(r"`([^`]+)`", prose):
        text = " ".join(span.group(1).split())
        words = text.split()
        if not (starts_with_program(text) or "| secrets-bridge " in text):
            continue
        named_only = len(words) == 2 and not words[1].startswith("-") and words[0] != "make"
        if len(words) < 2 or named_only:
            continue  # a program or a subcommand named in prose, not a command
        at = prose.count("\n", 0, span.start()) + 1
        out.append(Command(name, at, text, inline=True))
    return sorted(out, key=lambda c: c.line)


def named_files(doc: Path) -> dict[str, str]:
    """The files a document shows: ```yaml blocks whose first line is `# <name>`."""
    files: dict[str, str] = {}
    for block in blocks(doc.read_text())[0]:
        if block.info in {"yaml", "yml", "json"} and block.lines:
            named = NAMED_FILE.fullmatch(block.lines[0].strip())
            if named:
                files[named.group(1)] = "\n".join(block.lines) + "\n"
    return files


ALL = [c for doc in DOCS for c in commands(doc)]


# --- classification -----------------------------------------------------------------------------

Check = Callable[["Workspace", Command], None]
Printed = Callable[["Workspace", "subprocess.CompletedProcess[str]"], None]


@dataclass(frozen=True)
class Run:
    exit: int = 0
    stdout: str | None = None  # exactly this (stripped), besides a console block's output
    after: Printed | None = None  # what else to check once it ran


@dataclass(frozen=True)
class Covered:
    tests: tuple[str, ...]
    synopsis: bool = False  # placeholders: its flags must be in `--help`
    why: str = ""


@dataclass(frozen=True)
class Needs:
    why: str
    offline: Check | None = None
    tests: tuple[str, ...] = ()


@dataclass(frozen=True)
class Parses:
    """A measurement that takes minutes (a bench, a probe, a soak): not run here, but its
    command line is handed to the program's own argument parser, which must accept it as
    written (every flag exists, every value converts); a file it names must exist."""

    why: str = "takes minutes; its arguments are parsed by its own parser"


@dataclass(frozen=True)
class Wrong:
    """A form that cannot run as written: the test fails on it, saying how to write it."""

    fix: str


@dataclass(frozen=True)
class Rule:
    pattern: str
    kind: Run | Covered | Needs | Parses | Wrong

    def matches(self, command: Command) -> bool:
        return re.fullmatch(self.pattern, command.flat) is not None


@dataclass
class Workspace:
    """Where a document's commands run: deploy/ copied, .venv linked, its files written."""

    path: Path
    env: dict[str, str]

    @classmethod
    def for_doc(cls, doc: Path, tmp: Path) -> Workspace:
        path = tmp / "checkout"
        path.mkdir()
        copy_deploy(path, with_key=False)
        (path / ".venv").symlink_to(ROOT / ".venv")
        for name, text in named_files(doc).items():
            (path / name).write_text(text)
        env = {k: v for k, v in os.environ.items() if not k.startswith("SECRETS_BRIDGE_")}
        env["PATH"] = f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}"
        return cls(path, env)

    def run(self, *argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            argv, cwd=self.path, env=self.env, capture_output=True, text=True, timeout=60,
            check=False,
        )  # fmt: skip

    def shell(self, text: str) -> subprocess.CompletedProcess[str]:
        return self.run("bash", "-c", text)


def _words(command: Command) -> list[str]:
    return shlex.split(command.text.replace("\\\n", " "), comments=True)


#: Runs modules as `python -m` runs them, each stopped as soon as its parser accepted the
#: command line (its first `parse_args`); prints one JSON list: per command, None or the
#: parser's complaint.
_PARSE_ONLY = r"""
import argparse, contextlib, io, json, runpy, sys

class Accepted(Exception):
    pass

real = argparse.ArgumentParser.parse_args

def parse_args(self, args=None, namespace=None):
    real(self, args, namespace)
    raise Accepted

argparse.ArgumentParser.parse_args = parse_args
results = []
for module, argv in json.loads(sys.argv[1]):
    sys.argv = [module, *argv]
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            if module == "provider.cli.main":  # its parsers check more in their parse_args
                from provider.cli.main import build_parser

                build_parser(argv[0]).parse_args(argv)
                raise Accepted
            runpy.run_module(module, run_name="__main__", alter_sys=True)
        results.append(f"{module} ran without parsing its arguments")
    except Accepted:
        results.append(None)
    except SystemExit as exc:
        results.append(err.getvalue().strip() or f"exit {exc.code}")
    except Exception as exc:
        results.append(f"{type(exc).__name__}: {exc}")
print(json.dumps(results))
"""


def _parsed(command: Command) -> tuple[str, list[str]] | str:
    """(module, argv) as the command names them, or the problem with a file it names."""
    words = _words(command)
    program = words[0].removeprefix(".venv/bin/")
    if program in {"python", "python3"} and words[1] == "-m":
        return words[2], words[3:]
    if program == "secrets-bridge":
        return "provider.cli.main", words[1:]
    missing = [
        w for w in words[1:] if not w.startswith("-") and "/" in w and not (ROOT / w).exists()
    ]
    if program == "pytest":
        return f"names files that do not exist: {missing}" if missing else ("", [])
    script = ROOT / words[0]
    if not script.is_file() or not os.access(script, os.X_OK):
        return f"{words[0]} is not an executable file of the repository"
    syntax = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    return syntax.stderr.strip() or ("", [])


def _check_parsed(found: list[Command]) -> list[str]:
    """The problems of every Parses command of a document, its modules loaded in one process."""
    failures: list[str] = []
    calls: list[tuple[Command, tuple[str, list[str]]]] = []
    for command in found:
        parsed = _parsed(command)
        if isinstance(parsed, str):
            failures.append(f"{command}\n    {parsed}")
        elif parsed[0]:
            calls.append((command, parsed))
    if not calls:
        return failures
    import json

    result = subprocess.run(
        [str(VENV_BIN / "python"), "-c", _PARSE_ONLY, json.dumps([p for _, p in calls])],
        cwd=ROOT, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    for (command, _), problem in zip(
        calls, json.loads(result.stdout.splitlines()[-1]), strict=True
    ):
        if problem is not None:
            failures.append(f"{command}\n    its parser refuses it: {problem[-600:]}")
    return failures


def _key_is_private(ws: Workspace, result: subprocess.CompletedProcess[str]) -> None:
    key = ws.path / "deploy" / "base" / "hmac.key"
    assert key.stat().st_mode & 0o777 == 0o600, oct(key.stat().st_mode)
    assert len(key.read_text().strip()) == 64, "openssl rand -base64 48: 64 characters"


def _renders_a_daemonset(ws: Workspace, result: subprocess.CompletedProcess[str]) -> None:
    """`kubectl kustomize deploy/...` printed the provider's DaemonSet or the bench's Job."""
    kinds = {d["kind"] for d in yaml.safe_load_all(result.stdout) if d}
    assert kinds & {"DaemonSet", "Job"}, kinds


def _daemonset_args(docs: list[dict[str, Any]]) -> list[str]:
    (daemonset,) = (d for d in docs if d["kind"] == "DaemonSet")
    args: list[str] = daemonset["spec"]["template"]["spec"]["containers"][0]["args"]
    return args


def _rendered_chart(ws: Workspace, result: subprocess.CompletedProcess[str]) -> None:
    """The python render of the chart printed what `helm template -f my-values.yaml` would."""
    docs = [d for d in yaml.safe_load_all(result.stdout) if d]
    kinds = {d["kind"] for d in docs}
    assert {"DaemonSet", "ServiceAccount", "Secret", "ServiceMonitor"} <= kinds, kinds
    assert "--vault-addr=https://vault.example.internal:8200" in _daemonset_args(docs)


def _apply_k_renders(ws: Workspace, command: Command) -> None:
    words = _words(command)
    directory = words[words.index("-k") + 1]
    result = ws.run(kubectl(), "kustomize", directory)
    assert result.returncode == 0, f"kubectl kustomize {directory}: {result.stderr}"


def _applied_files_are_manifests(ws: Workspace, command: Command) -> None:
    words = _words(command)
    for n, word in enumerate(words):
        if word == "-f":
            docs = [d for d in yaml.safe_load_all((ws.path / words[n + 1]).read_text()) if d]
            assert docs and all("kind" in d for d in docs), words[n + 1]


def _merge(into: dict[str, Any], values: dict[str, Any]) -> dict[str, Any]:
    for key, value in values.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = value
    return into


def _chart_renders(ws: Workspace, command: Command) -> None:
    """A Helm command of our chart: its values files and --set render (schema included)."""
    import helm_python as helm

    from tests.deploy.helm_render import render

    words = _words(command)
    assert "deploy/helm/secrets-bridge" in words, f"not our chart: {words}"
    values: dict[str, Any] = {}
    for n, word in enumerate(words):
        if word in {"-f", "--values"}:
            _merge(values, yaml.safe_load((ws.path / words[n + 1]).read_text()) or {})
        elif word == "--set":
            _merge(values, helm.parse_set_string(words[n + 1]))
    assert _daemonset_args(render(values).docs)[0] == "serve"


def _driver_values_parse(ws: Workspace, command: Command) -> None:
    words = _words(command)
    values = yaml.safe_load((ws.path / words[words.index("-f") + 1]).read_text())
    assert values["tokenRequests"], values


def _image_name_is_the_bases(ws: Workspace, command: Command) -> None:
    match = re.search(r"set image (\S+)=", command.flat)
    assert match, command.flat
    daemonset = yaml.safe_load((ws.path / "deploy/base/daemonset.yaml").read_text())
    image = daemonset["spec"]["template"]["spec"]["containers"][0]["image"]
    assert image.split(":")[0] == match.group(1), image


def _rule_is_the_sources(ws: Workspace, command: Command) -> None:
    """An EventBridge rule of docs/change-feed.md is one of the AWS source's own patterns."""
    from backends.aws.changes import RULE_PATTERNS

    words = _words(command)
    pattern = json.loads(words[words.index("--event-pattern") + 1])
    assert pattern in json.loads(json.dumps(RULE_PATTERNS)), pattern


CHECK_JSON = "tests/cli/test_cli_check_json.py"
CHECK_MOUNT = "tests/cli/test_cli_check_mount.py"
AUDIT = "tests/cli/test_cli_audit.py"
AUDIT_SEARCH = "tests/cli/test_cli_audit_search.py"
CLUSTER = "needs a Kubernetes cluster"
THIS = "tests/core/test_docs_commands.py"

RULES: list[Rule] = [
    # --- cannot run as written ---
    Rule(
        r"(\.venv/bin/)?secrets-bridge bench --store .*",
        Wrong(
            "the console script does not have the dev kit the bench's rigs come from: write "
            "`.venv/bin/python -m provider.cli.main bench --store ...` (from the repository root)"
        ),
    ),
    # --- run here, as written ---
    Rule(r"(\.venv/bin/)?secrets-bridge( [a-z]+)? --help", Run()),
    Rule(r"(\.venv/bin/)?secrets-bridge --version", Run()),
    Rule(r"secrets-bridge check [\w./-]+\.yaml", Run()),
    Rule(
        r"secrets-bridge mount \S+\.yaml --target \S+( --token \S+=\S+)?( --service-account \S+)?"
        r" --enable-fake-backend --fake-store-file \S+",
        Run(),
    ),
    Rule(r"echo [\w-]+ > [\w.]+", Run()),
    Rule(r"cat mnt/db\.json", Run(stdout="pw")),
    Rule(
        r"\(umask 077; openssl rand -base64 48 > deploy/base/hmac\.key\)",
        Run(after=_key_is_private),
    ),
    Rule(r"kubectl kustomize deploy/\S*", Run(after=_renders_a_daemonset)),
    Rule(r"\.venv/bin/python - my-values\.yaml <<'EOF'", Run(after=_rendered_chart)),
    # --- covered by named tests ---
    Rule(
        r"make demo|python -m devkit\.demo",
        Covered(
            (
                "tests/e2e/test_e2e_demo.py::test_demo_walks_mount_rotation_and_removal",
                f"{THIS}::test_the_make_targets_the_docs_name_run_what_they_say",
            )
        ),
    ),
    Rule(
        r"make install",
        Covered(("tests/deploy/test_deploy_dockerfile.py::test_make_install_installs_the_lock",)),
    ),
    Rule(
        r"make (test|lint)( JOBS=0)?|make soak",
        Covered(
            (
                "tests/deploy/test_deploy_dockerfile.py::test_make_install_installs_the_lock",
                f"{THIS}::test_the_make_targets_the_docs_name_run_what_they_say",
            ),
            why="the linters and this suite itself, which CI runs; the recipe is checked here",
        ),
    ),
    Rule(
        r"secrets-bridge serve",
        Covered(
            (
                "tests/edge/test_server_lifecycle.py::test_sigterm_drains_in_flight_mount_and_exits_zero",
                "tests/edge/test_startup.py::test_the_images_default_against_a_directory_it_may_not_create",
            ),
            why="binds the driver's socket directory, which only the node has",
        ),
    ),
    Rule(
        r"secrets-bridge check (SPC\.yaml|FILE\.\.\.|<spc\.yaml>).*",
        Covered(
            (
                f"{CHECK_MOUNT}::test_check_accepts_the_example",
                f"{CHECK_JSON}::test_json_lists_files_store_and_audiences",
                f"{CHECK_JSON}::test_limits_and_strict_parameters_as_serve_applies_them",
            ),
            synopsis=True,
        ),
    ),
    Rule(
        r"secrets-bridge check --json",
        Covered(
            (
                f"{CHECK_JSON}::test_json_lists_files_store_and_audiences",
                f"{CHECK_JSON}::test_json_says_which_objects_are_credentials_with_a_lifetime_and_why",
            ),
            why="named in prose as the mode; run with a file above",
        ),
    ),
    Rule(
        r"secrets-bridge watch --vault-audit-listen :9200 --vault-address URL \.\.\.",
        Covered(("tests/cli/test_cli_watch.py::test_each_sources_flags_build_that_source",), True),
    ),
    Rule(
        r"secrets-bridge mount SPC\.yaml --target DIR .*",
        Covered(
            (
                f"{CHECK_MOUNT}::test_mount_writes_the_driver_layout",
                f"{CHECK_MOUNT}::test_mount_with_csidriver_rules",
            ),
            synopsis=True,
        ),
    ),
    Rule(
        r"secrets-bridge bench --socket PATH .*",
        Covered(
            (
                "tests/cli/test_cli_bench.py::test_bench_drives_a_running_provider_with_a_class_and_a_token_file",
            ),
            synopsis=True,
        ),
    ),
    Rule(
        r"secrets-bridge audit verify FILE\.\.\. --hmac-key-file KEY",
        Covered(
            (
                f"{AUDIT}::test_an_intact_trail_passes",
                f"{AUDIT}::test_rotated_files_given_oldest_first_are_one_chain",
                f"{AUDIT}::test_files_given_out_of_order_are_refused",
            ),
            synopsis=True,
        ),
    ),
    Rule(
        r"secrets-bridge audit (verify|search)", Covered((f"{AUDIT}::test_an_intact_trail_passes",))
    ),
    Rule(
        r"secrets-bridge audit search FILE\.\.\. --hmac-key-file KEY --secret \S+",
        Covered(
            (
                f"{AUDIT_SEARCH}::test_a_selected_secret_is_found_across_rotated_files_by_whole_segments",
            ),
            synopsis=True,
        ),
    ),
    Rule(
        r"secrets-bridge audit search audit\.log\.2 audit\.log\.1 audit\.log --hmac-key-file KEY "
        r"--secret \S+",
        Covered(
            (
                f"{AUDIT_SEARCH}::test_a_selected_secret_is_found_across_rotated_files_by_whole_segments",
            ),
            synopsis=True,
        ),
    ),
    # --- measurements: parsed by their own parsers (BENCHMARKS.md) ---
    Rule(
        r"(\.venv/bin/)?python -m (devkit(\.\w+)+|tests\.perf\.\w+|provider\.cli\.main bench)"
        r"( .*)?",
        Parses(),
    ),
    Rule(r"secrets-bridge bench --socket \$\w+/.*", Parses()),
    Rule(r"\.venv/bin/pytest -q -s tests/\S+\.py", Parses("a measurement printed by the test")),
    Rule(
        r"\.venv/bin/pytest -q -m bench",
        Covered(
            (f"{THIS}::test_the_make_targets_the_docs_name_run_what_they_say",), why="make soak"
        ),
    ),
    Rule(r"devkit/probes/\w+\.sh( \S+)?", Parses("every figure at once: an hour and more")),
    # --- need what this machine does not have ---
    Rule(
        r"kubectl logs .*\| secrets-bridge audit verify - --hmac-key-file KEY",
        Needs(
            f"{CLUSTER} (the provider's logs)",
            tests=(f"{AUDIT}::test_stderr_lines_are_marked_and_verify_from_stdin",),
        ),
    ),
    Rule(
        r"kubectl get spc -A -o yaml \| secrets-bridge check --json -",
        Needs(
            f"{CLUSTER} (its SecretProviderClasses)",
            tests=(f"{CHECK_JSON}::test_several_files_and_stdin_in_one_run",),
        ),
    ),
    Rule(
        r"helm template secrets-bridge deploy/helm/secrets-bridge .*",
        Needs("a helm binary (the python render below is the way without one)", _chart_renders),
    ),
    Rule(
        r"helm (install|upgrade( --install)?) secrets-bridge deploy/helm/secrets-bridge .*",
        Needs(CLUSTER, _chart_renders),
    ),
    Rule(r"helm uninstall secrets-bridge .*", Needs(CLUSTER)),
    Rule(r"helm repo add .*", Needs("the network (the driver's chart repository)")),
    Rule(
        r"helm upgrade --install csi-secrets-store secrets-store-csi-driver/.*",
        Needs(f"{CLUSTER} and the driver's chart repository", _driver_values_parse),
    ),
    Rule(
        r"docker (build|push) .*",
        Needs(
            "a container engine and a registry",
            tests=("tests/deploy/test_deploy_dockerfile.py::test_hadolint_reports_nothing",),
        ),
    ),
    Rule(
        r"\(cd deploy/base && kustomize edit set image \S+=\S+\)|kustomize edit set image",
        Needs("the kustomize binary (kubectl has no `edit`)", _image_name_is_the_bases),
    ),
    Rule(
        r"vault write auth/\S+/role/.*",
        Needs(
            "a Vault or OpenBao server and its CLI",
            tests=(
                "tests/e2e/test_e2e_sync_controller.py"
                "::test_a_secretsync_is_answered_with_its_files_and_versions",
            ),
        ),
    ),
    Rule(r"aws events put-rule .*", Needs("an AWS account and its CLI", _rule_is_the_sources)),
    Rule(
        r"(aws|az|gcloud) .*|[A-Z_]+=\S+( [A-Z_]+=\S+)*|[A-Z_]+=\$\(gcloud .*\)"
        r"|for rule in .*|done",
        Needs(
            "a cloud account and its CLI (the change feed's setup)",
            tests=(
                "tests/backends/aws/test_aws_watch.py"
                "::test_the_holder_publishes_then_deletes_and_a_takeover_loses_nothing",
                "tests/backends/azure/test_azure_changes.py::test_events_are_published_then_deleted",
                "tests/backends/gcp/test_gcp_changes.py"
                "::test_notifications_published_then_pulled_become_changes",
            ),
        ),
    ),
    Rule(r"kubectl apply -f https://\S+", Needs(f"{CLUSTER} and the network (a release's CRD)")),
    Rule(r"kubectl (apply|delete) -k \S+", Needs(CLUSTER, _apply_k_renders)),
    Rule(r"kubectl apply -f .*", Needs(CLUSTER, _applied_files_are_manifests)),
    Rule(
        r"kubectl (-n \S+ )?(apply|delete|get|exec|logs|label|create|rollout|describe|debug)\b.*",
        Needs(CLUSTER),
    ),
]


def classify(command: Command) -> Rule | None:
    return next((rule for rule in RULES if rule.matches(command)), None)


def kubectl() -> str:
    path = shutil.which("kubectl")
    if path is None:
        pytest.fail("kubectl is missing: install kubectl >= 1.27 for `kubectl kustomize`")
    return path


# --- the tests ----------------------------------------------------------------------------------


def test_commands_are_found_in_every_kind_of_block() -> None:
    """The extraction itself: a shell block, a console block, a synopsis and a code span."""
    by_doc = {str(d.relative_to(ROOT)): commands(d) for d in DOCS}
    flat = {c.flat for cs in by_doc.values() for c in cs}
    assert "secrets-bridge check deploy/examples/vault.yaml" in flat
    assert any(c.output and c.flat == "secrets-bridge check vault.yaml" for c in ALL)
    assert any(c.flat.startswith("secrets-bridge mount SPC.yaml --target DIR") for c in ALL)
    assert any(c.inline and c.flat == "secrets-bridge bench --help" for c in ALL)
    assert all("#" not in c.flat.split("<<")[0] for c in ALL if not c.inline), "comments dropped"


def test_no_command_is_left_unclassified() -> None:
    unclassified = [str(c) for c in ALL if classify(c) is None]
    assert not unclassified, (
        "commands in the docs that this test neither runs, nor maps to a named test, nor marks "
        "as needing a cluster: add a rule to RULES in tests/core/test_docs_commands.py:\n"
        + "\n".join(unclassified)
    )


def test_every_rule_still_matches_a_command() -> None:
    # (A Wrong rule is a guard: it matches nothing once the docs are right.)
    stale = [
        r.pattern
        for r in RULES
        if not isinstance(r.kind, Wrong) and not any(r.matches(c) for c in ALL)
    ]
    assert not stale, f"rules no command in the docs matches any more: {stale}"


def test_the_readme_says_how_the_command_gets_on_path(tmp_path: Path) -> None:
    """`make` leaves `secrets-bridge` in .venv/bin, not on PATH: the README's commands section
    says so before its first bare `secrets-bridge`, and both ways it names work from a shell
    whose PATH lacks the environment."""
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("## The command") :]
    before = section[: section.index("```")]
    assert "`.venv/bin/secrets-bridge`" in before and "`. .venv/bin/activate`" in before, before
    ws = Workspace.for_doc(ROOT / "README.md", tmp_path)
    ws.env["PATH"] = os.pathsep.join(
        p for p in ws.env["PATH"].split(os.pathsep) if not p.startswith(str(ROOT))
    )
    ws.env.pop("VIRTUAL_ENV", None)
    assert ws.shell("command -v secrets-bridge").returncode != 0, "already on PATH"
    for way in (
        ".venv/bin/secrets-bridge --version",
        ". .venv/bin/activate && secrets-bridge --version",
    ):
        result = ws.shell(way)
        assert result.returncode == 0 and result.stdout.startswith("secrets-bridge "), (way, result)


def test_benchmarks_name_no_flag_the_bench_refuses() -> None:
    """Flags the bench dropped stay out of BENCHMARKS.md, even where it quotes a command in a
    table (its code spans there start with `bench`, which the extraction does not take)."""
    text = (ROOT / "BENCHMARKS.md").read_text()
    help_text = subprocess.run(
        [str(VENV_BIN / "python"), "-m", "provider.cli.main", "bench", "--help"],
        cwd=ROOT, capture_output=True, text=True, timeout=60, check=True,
    ).stdout  # fmt: skip
    quoted = re.findall(r"`bench ([^`]*)`", text)
    assert quoted, "BENCHMARKS.md quotes no bench command"
    unknown = {
        flag
        for span in quoted
        for flag in re.findall(r"(?<![=\w-])(--[a-z][a-z0-9-]*)", span)
        if not re.search(rf"{re.escape(flag)}\b", help_text)
    }
    assert "--rss-every" not in text and not unknown, sorted(unknown)


def _defined_tests(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    return {
        node.name
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name.startswith("test")
    }


def test_every_named_test_exists() -> None:
    assert all(r.kind.tests for r in RULES if isinstance(r.kind, Covered)), "name a test"
    named = {
        test for rule in RULES if isinstance(rule.kind, Covered | Needs) for test in rule.kind.tests
    }
    assert named
    missing = []
    for node_id in sorted(named):
        path, _, name = node_id.partition("::")
        if not (ROOT / path).is_file() or name.split("[")[0] not in _defined_tests(ROOT / path):
            missing.append(node_id)
    assert not missing, f"named tests that do not exist: {missing}"


def test_every_synopsis_names_only_flags_its_command_has() -> None:
    env = {**os.environ, "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    for command in ALL:
        rule = classify(command)
        if not (rule and isinstance(rule.kind, Covered) and rule.kind.synopsis):
            continue
        words = command.flat.split()
        sub = words[1:3] if words[1] == "audit" else words[1:2]
        help_text = subprocess.run(
            ["secrets-bridge", *sub, "--help"], capture_output=True, text=True, env=env,
            timeout=30, check=False,
        ).stdout  # fmt: skip
        flags = set(re.findall(r"(--[a-z][a-z0-9-]*)", command.flat))
        missing = {f for f in flags if not re.search(rf"{re.escape(f)}\b", help_text)}
        assert help_text and not missing, f"{command}: not in --help: {sorted(missing)}"


DOCS_WITH_WORK = [
    d
    for d in DOCS
    if any(
        (rule := classify(c)) is not None
        and (
            isinstance(rule.kind, Run | Parses | Wrong)
            or (isinstance(rule.kind, Needs) and rule.kind.offline is not None and not c.inline)
        )
        for c in commands(d)
    )
]


@pytest.mark.parametrize("doc", DOCS_WITH_WORK, ids=lambda p: str(p.relative_to(ROOT)))
def test_the_commands_of_a_document_run_as_written(doc: Path, tmp_path: Path) -> None:
    """Every RUN command of the document, in its order, in one workspace; and the offline
    part of every NEEDS command shown in a block."""
    ws = Workspace.for_doc(doc, tmp_path)
    failures: list[str] = []
    parsed: list[Command] = []
    for command in commands(doc):
        rule = classify(command)
        assert rule is not None, f"unclassified: {command}"
        kind = rule.kind
        if isinstance(kind, Wrong):
            failures.append(f"{command}\n    {kind.fix}")
            continue
        if isinstance(kind, Parses):
            parsed.append(command)
            continue
        try:
            if isinstance(kind, Run):
                result = ws.shell(command.text)
                shown = (result.stdout + result.stderr).strip()
                assert result.returncode == kind.exit, (
                    f"exit {result.returncode}, the doc implies {kind.exit}:\n{shown[-2000:]}"
                )
                if command.output is not None:
                    printed = "\n".join(line.rstrip() for line in result.stdout.splitlines())
                    assert printed.strip("\n") == command.output, (
                        f"printed:\n{printed}\nthe doc shows:\n{command.output}"
                    )
                if kind.stdout is not None:
                    assert result.stdout.strip() == kind.stdout, result.stdout
                if kind.after:
                    kind.after(ws, result)
            elif isinstance(kind, Needs) and kind.offline and not command.inline:
                kind.offline(ws, command)
        except AssertionError as exc:
            failures.append(f"{command}\n    {textwrap.indent(str(exc), '    ').strip()}")
    failures += _check_parsed(parsed)
    assert not failures, f"{len(failures)} command(s) of {doc.name} do not run as written:\n" + (
        "\n".join(failures)
    )


def test_the_make_targets_the_docs_name_run_what_they_say() -> None:
    """`make demo`, `make lint` and `make test` as README.md and docs/architecture.md describe
    them (not run here: `make test` is this suite, `make demo` is run by the e2e test)."""
    makefile = (ROOT / "Makefile").read_text()

    def recipe(target: str) -> str:
        match = re.search(rf"^{target}:(.*)\n((?:\t.*\n)*)", makefile, flags=re.M)
        assert match, f"no target {target}"
        return match.group(1) + "\n" + match.group(2)

    assert "$(BIN)/python -m devkit.demo" in recipe("demo")
    lint = recipe("lint")
    for tool in ("ruff check", "ruff format --check", "mypy", "lint-imports"):
        assert f"$(BIN)/{tool}" in lint, tool
    test = recipe("test")
    assert test.split("\n")[0].split() == ["install", "tools", "lint"]
    assert "$(BIN)/pytest" in test
    # Three workers on the two cores, then the latency tests alone; the soaks left to `make soak`.
    assert "-n $(JOBS)" in test and '-m "not bench and not serial"' in test, test
    assert '-m "serial and not bench"' in test, test
    assert "-m bench" in recipe("soak")
    assert re.search(r"^JOBS \?= 3$", makefile, flags=re.M)
