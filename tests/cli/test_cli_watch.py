"""`secrets-bridge watch` on the command line: its help, and a wrong command line refused with
one line that names the flag and the fix, exit 2, nothing started."""

from __future__ import annotations

import socket

import pytest

from provider.cli.main import EXIT_FAILED, EXIT_OK, EXIT_USAGE, main


def test_help_describes_the_feed_and_every_source(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["watch", "--help"])
    assert exit_.value.code == EXIT_OK
    out = capsys.readouterr().out
    assert "never a value" in out
    for flag in (
        "--vault-audit-listen",
        "--aws-queue-url",
        "--azure-queue-url",
        "--gcp-subscription",
    ):
        assert flag in out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], "no event source: give --vault-audit-listen"),
        (["--vault-audit-listen", ":9200"], "--vault-audit-listen needs --vault-address"),
        (
            ["--vault-audit-listen", "nowhere", "--vault-address", "http://v:8200"],
            "expected [host]:port",
        ),
        (["--aws-queue-url", "https://sqs/q"], "--aws-queue-url needs --aws-region"),
        (["--azure-queue-url", "https://a/q"], "--azure-queue-url needs --azure-vaults"),
        (["--gcp-subscription", "projects/p/subscriptions/s"], "needs --gcp-projects"),
        (
            ["--gcp-subscription", "subscriptions/s", "--gcp-projects", "p"],
            "is not a subscription name",
        ),
    ],
)
def test_a_wrong_command_line_is_one_line_and_exit_2(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["watch", "--namespace", "sb", *args]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err and "Traceback" not in err


def test_without_a_namespace_outside_a_pod(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("POD_NAMESPACE", raising=False)
    assert main(["watch", "--aws-queue-url", "https://sqs/q", "--aws-region", "r"]) == EXIT_USAGE
    assert "--namespace is required" in capsys.readouterr().err


def test_a_taken_metrics_address_is_one_line_and_exit_1(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code = main(
            [
                "watch",
                "--namespace=sb",
                f"--metrics-address=127.0.0.1:{port}",
                "--kube-api-url=http://127.0.0.1:9",
                "--aws-queue-url=https://sqs.invalid/q",
                "--aws-region=us-east-1",
            ]
        )
    assert code == EXIT_FAILED
    err = capsys.readouterr().err
    assert "cannot listen" in err and "Traceback" not in err


async def test_each_sources_flags_build_that_source(tmp_path: object) -> None:
    """Every source's flags reach its store's `changes.create` as arguments it takes; nothing
    connects until the source runs."""
    from provider.cli import watch as watching
    from provider.cli.main import build_parser
    from provider.watch.run import create_sources

    args = build_parser("watch").parse_args(
        [
            "watch",
            "--namespace=sb",
            "--vault-audit-listen=127.0.0.1:9200",
            "--vault-address=https://vault:8200,https://vault.sb.svc:8200",
            "--aws-queue-url=https://sqs.eu-west-1.amazonaws.com/111122223333/q",
            "--aws-region=eu-west-1",
            "--azure-queue-url=https://acct.queue.core.windows.net/kv-events",
            "--azure-vaults=KV-A,kv-b",
            "--gcp-subscription=projects/my-project/subscriptions/sm-events",
            "--gcp-projects=my-project,123",
        ]
    )
    sources = create_sources(watching.settings_from_args(args).sources)
    try:
        found = {s.store: s for s in sources}
        assert set(found) == {"vault", "aws", "azure", "gcp"}
        assert found["vault"].scopes == {"https://vault:8200", "https://vault.sb.svc:8200"}
        assert found["aws"].scopes == {"eu-west-1"}
        assert found["azure"].scopes == {"kv-a", "kv-b"}
        assert found["gcp"].scopes == {"my-project", "123"}
        assert [s.pulled for s in sources] == [False, True, True, True]
        assert len({s.name for s in sources}) == 4
    finally:
        for source in sources:
            await source.close()
