"""The proxy environment every store call follows (backends/wire.py `Proxies`): which variable
wins, which hosts NO_PROXY sends direct, what an unusable value does, and the aiohttp request
class that applies it. Each store's own client is tested through a real proxy in
tests/backends/<store>/test_<store>_proxy.py."""

from __future__ import annotations

import asyncio
import base64
import logging

import aiohttp
import pytest
from yarl import URL

from backends.proxies import Proxies, proxied_requests
from devkit.connect_proxy import VARIABLES
from provider.core.errors import StoreUnavailable

PROXY = "http://proxy.corp:3128"


def proxies(**environ: str) -> Proxies:
    return Proxies(environ)


def via(p: Proxies, url: str) -> str | None:
    chosen = p.for_url(url)
    return None if chosen is None else str(chosen.url)


def test_nothing_set_means_direct_and_a_plain_request_class() -> None:
    p = proxies()
    assert not p and p.for_url("https://vault:8200") is None
    assert proxied_requests(p) is aiohttp.ClientRequest


def test_each_scheme_has_its_own_variable() -> None:
    p = proxies(HTTPS_PROXY=PROXY)
    assert via(p, "https://vault:8200") == PROXY
    assert via(p, "http://vault:8200") is None
    p = proxies(HTTP_PROXY="http://plain:8080")
    assert via(p, "http://169.254.170.23/v1/credentials") == "http://plain:8080"
    assert via(p, "https://vault:8200") is None
    assert p.for_url("https://vault:8200") is None
    chosen = proxies(HTTPS_PROXY=PROXY).for_url("https://vault")
    assert chosen is not None and chosen.variable == "HTTPS_PROXY"


def test_lower_case_wins_and_empty_means_none() -> None:
    p = proxies(https_proxy="http://lower:1", HTTPS_PROXY="http://upper:2")
    assert via(p, "https://vault") == "http://lower:1"
    assert via(proxies(https_proxy="", HTTPS_PROXY="http://upper:2"), "https://vault") is None
    p = proxies(no_proxy="", NO_PROXY="vault", HTTPS_PROXY=PROXY)
    assert via(p, "https://vault") == PROXY


def test_host_and_port_without_scheme_is_http() -> None:
    assert via(proxies(HTTPS_PROXY="proxy.corp:3128"), "https://vault") == PROXY


def test_credentials_become_a_header_never_part_of_the_url() -> None:
    p = proxies(HTTPS_PROXY="http://us%40er:p%3Ass@proxy.corp:3128")
    chosen = p.for_url("https://vault")
    assert chosen is not None
    assert str(chosen.url) == PROXY and "p:ss" not in str(chosen) + repr(chosen)
    expected = "Basic " + base64.b64encode(b"us@er:p:ss").decode()
    assert chosen.headers == {"Proxy-Authorization": expected}
    assert chosen.configured == "http://us%40er:p%3Ass@proxy.corp:3128"  # gRPC's


@pytest.mark.parametrize(
    ("no_proxy", "url", "direct"),
    [
        ("*", "https://anything.example:1", True),
        ("example.com", "https://example.com", True),
        ("example.com", "https://vault.example.com:8200", True),
        ("example.com", "https://badexample.com", False),
        (".example.com", "https://example.com", True),
        (".example.com", "https://a.b.example.com", True),
        ("*.example.com", "https://a.example.com", True),
        ("EXAMPLE.com", "https://Vault.Example.COM.", True),
        ("vault:8200", "https://vault:8200", True),
        ("vault:8200", "https://vault:8201", False),
        ("10.0.0.0/8", "https://10.20.30.40:8200", True),
        ("10.0.0.0/8", "https://11.0.0.1", False),
        ("10.1.2.3", "https://10.1.2.3", True),
        ("127.0.0.1", "https://127.0.0.1:8200", True),
        # Names are compared as written, never resolved: as curl, Python and gRPC do (Go alone
        # also sends every loopback address and `localhost` direct).
        ("127.0.0.1", "https://localhost:8200", False),
        ("localhost", "https://127.0.0.1:8200", False),
        ("", "https://127.0.0.1:8200", False),
        ("::1", "https://[::1]:8200", True),
        ("[::1]:8200", "https://[::1]:8200", True),
        ("[::1]:8200", "https://[::1]:9200", False),
        ("fd00:ec2::23", "https://[fd00:ec2::23]/v1/credentials", True),
        ("fd00::/8", "https://[fd00:ec2::23]", True),
        ("vault, other  third", "https://third", True),
        ("10.0", "https://192.168.10.0", False),
    ],
)
def test_no_proxy(no_proxy: str, url: str, direct: bool) -> None:
    p = proxies(HTTPS_PROXY=PROXY, NO_PROXY=no_proxy)
    assert (p.for_url(url) is None) is direct


@pytest.mark.parametrize("value", ["socks5://proxy:1080", "https://proxy:3128", "http://"])
def test_an_unusable_proxy_fails_the_calls_it_would_carry(value: str) -> None:
    p = proxies(HTTPS_PROXY=value, NO_PROXY="direct.example")
    with pytest.raises(StoreUnavailable, match="HTTPS_PROXY") as info:
        p.for_url("https://vault:8200")
    assert not info.value.transient and "NO_PROXY" in str(info.value)
    # Never around the proxy: only what NO_PROXY lists, and other schemes, go direct.
    assert p.for_url("https://direct.example") is None
    assert p.for_url("http://vault:8200") is None


def test_from_env_reads_once_and_logs_without_credentials(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    for name in VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HTTPS_PROXY", "http://user:hunter2@proxy.example:3128")
    monkeypatch.setenv("NO_PROXY", "vault.internal")
    with caplog.at_level(logging.INFO, logger="secrets_bridge.wire"):
        p = Proxies.from_env()
    assert via(p, "https://vault.example") == "http://proxy.example:3128"
    assert via(p, "https://vault.internal") is None
    monkeypatch.setenv("HTTPS_PROXY", "http://elsewhere:1")
    assert via(p, "https://vault.example") == "http://proxy.example:3128"  # read once
    text = " ".join(r.getMessage() for r in caplog.records)
    assert "proxy.example:3128 (from HTTPS_PROXY)" in text and "hunter2" not in text


async def test_the_request_class_applies_the_choice_unless_the_caller_names_a_proxy() -> None:
    p = proxies(HTTPS_PROXY="http://u:pw@proxy.corp:3128", NO_PROXY="direct")
    request_class = proxied_requests(p)
    loop = asyncio.get_running_loop()

    def request(url: str, **kw: object) -> aiohttp.ClientRequest:
        return request_class("GET", URL(url), loop=loop, **kw)  # type: ignore[arg-type]

    through = request("https://vault:8200/v1/x")
    assert through.proxy == URL(PROXY)
    assert through.proxy_headers is not None and "Proxy-Authorization" in through.proxy_headers
    assert request("https://direct:8200/").proxy is None
    assert request("http://vault:8200/").proxy is None
    named = request("https://vault:8200/", proxy=URL("http://chosen:1"))
    assert named.proxy == URL("http://chosen:1")
