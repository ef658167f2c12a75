"""Every `serve` setting is validated before anything is bound or created: one line naming the
flag (or the environment variable), the bad value and what is expected; exit 2 (a key file the
node cannot give, exit 1); no traceback; no socket left behind. Through the real console
script, as an operator meets it."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from devkit.ports import free_port
from provider.cli.main import build_parser

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = shutil.which("secrets-bridge", path=str(ROOT / ".venv" / "bin")) or "secrets-bridge"

#: (flags, environment, what the one line must say)
BAD = [
    (["--health-addr", "nonsense"], {}, "argument --health-addr: expected HOST:PORT"),
    (["--health-addr", "127.0.0.1:99999"], {}, "argument --health-addr: expected HOST:PORT"),
    (["--log-level", "verbose"], {}, "argument --log-level: expected one of debug, info"),
    (["--log-format", "yaml"], {}, "argument --log-format: invalid choice: 'yaml'"),
    (["--cache-ttl", "-5"], {}, "argument --cache-ttl: expected a number of seconds at least 0"),
    (["--cache-ttl", "soon"], {}, "argument --cache-ttl: expected a number of seconds"),
    (["--grace-period", "-1"], {}, "argument --grace-period: expected a number of seconds"),
    (["--serve-stale-max-age", "nan"], {}, "argument --serve-stale-max-age: expected"),
    (
        ["--store-call-timeout", "0"],
        {},
        "argument --store-call-timeout: expected a number of seconds above 0",
    ),
    (["--max-objects", "0"], {}, "argument --max-objects: expected a whole number of at least 1"),
    (["--max-response-bytes", "1.5"], {}, "argument --max-response-bytes: expected a whole"),
    (["--max-concurrent-fetches", "-3"], {}, "argument --max-concurrent-fetches: expected"),
    (["--cache-scope", "node"], {}, "argument --cache-scope: invalid choice: 'node'"),
    (["--rate-limit", "aws=fast"], {}, "--rate-limit"),
    (["--rate-limit", "nosuch=3"], {}, "--rate-limit"),
    (
        [],
        {"SECRETS_BRIDGE_CACHE_TTL": "-5"},
        "(the value comes from the environment variable SECRETS_BRIDGE_CACHE_TTL)",
    ),
    ([], {"SECRETS_BRIDGE_LOG_LEVEL": "loud"}, "environment variable SECRETS_BRIDGE_LOG_LEVEL"),
    (
        [],
        {"SECRETS_BRIDGE_ENABLE_FAKE_BACKEND": "perhaps"},
        "SECRETS_BRIDGE_ENABLE_FAKE_BACKEND: expected true or false",
    ),
    (["--vault-max-connections", "many"], {}, "argument --vault-max-connections: invalid int"),
]


def serve(tmp_path: Path, argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("SECRETS_BRIDGE_")}
    return subprocess.run(
        [SCRIPT, "serve", "--socket", str(tmp_path / "p.sock"), *argv],
        capture_output=True,
        text=True,
        timeout=30,
        env={**clean, **env},
    )


@pytest.mark.parametrize(("argv", "env", "expected"), BAD, ids=lambda v: str(v)[:40])
def test_a_bad_setting_is_one_line_exit_2_and_nothing_on_disk(
    tmp_path: Path, argv: list[str], env: dict[str, str], expected: str
) -> None:
    if not any(a.startswith("--health-addr") for a in argv):
        argv = [*argv, "--health-addr", f"127.0.0.1:{free_port()}"]
    result = serve(tmp_path, argv, env)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    assert expected in lines[0]
    assert "Traceback" not in result.stderr
    assert list(tmp_path.iterdir()) == []


def test_a_key_file_the_node_cannot_give_is_one_line_exit_1(tmp_path: Path) -> None:
    """The flag is right; the file is missing or holds no key: the node's problem (exit 1)."""
    result = serve(tmp_path, ["--hmac-key-file", "/nonexistent/key"], {})
    assert result.returncode == 1
    (line,) = result.stderr.strip().splitlines()
    assert "--hmac-key-file /nonexistent/key: cannot read it" in line
    assert list(tmp_path.iterdir()) == []


def test_a_short_key_is_named_with_its_fix(tmp_path: Path) -> None:
    key = tmp_path / "key"
    key.write_text("short")
    result = serve(tmp_path, ["--hmac-key-file", str(key)], {})
    assert result.returncode == 1
    (line,) = result.stderr.strip().splitlines()
    assert "at least 16 bytes" in line and "openssl rand" in line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["key"]


def test_version_flag() -> None:
    result = subprocess.run([SCRIPT, "--version"], capture_output=True, text=True, timeout=30)
    assert result.returncode == 0 and re.fullmatch(r"secrets-bridge \S+\n", result.stdout)


def test_help_shows_no_internal_placeholders_and_every_option_is_explained() -> None:
    for command in ("serve", "mount", "check", "bench"):
        parser = build_parser(command)
        text = subprocess.run(
            [SCRIPT, command, "--help"], capture_output=True, text=True, timeout=30
        ).stdout
        assert "__" not in text, f"{command}: an internal dest shows in --help"
        assert "[ENABLE_FAKE_BACKEND]" not in text
        sub = parser._subparsers._group_actions[0].choices[command]  # type: ignore[union-attr]
        for action in sub._actions:
            if action.option_strings and action.dest != "help":
                assert action.help, f"{command} {action.option_strings[0]} has no help"


def test_readme_flag_table_names_every_provider_flag() -> None:
    """The README's table of serve flags, held against the parser so they cannot drift."""
    readme = (ROOT / "README.md").read_text()
    table = readme.split("## The command", 1)[1].split("\n## ", 1)[0]
    in_table = set(re.findall(r"`(--[a-z][a-z0-9-]+)", table))
    parser = build_parser("serve")
    serve_parser = parser._subparsers._group_actions[0].choices["serve"]  # type: ignore[union-attr]
    provider_flags = {
        opt
        for group in serve_parser._action_groups
        if group.title == "provider"
        for action in group._group_actions
        for opt in action.option_strings
        if not opt.startswith("--no-")
    }
    every_flag = {opt for action in serve_parser._actions for opt in action.option_strings}
    assert provider_flags - in_table == set(), "flags missing from the README table"
    assert in_table - every_flag - {"--help"} == set(), "README names flags serve lacks"
