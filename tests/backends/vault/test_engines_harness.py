"""The dynamic-secrets harness works against the real servers: OpenBao's database engine makes
and drops real PostgreSQL users (devkit.postgres), and its PKI engine issues real certificates.

One PostgreSQL and one OpenBao for the module; each test reads its own creds.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import hvac.exceptions
import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from devkit import postgres as pgmod
from devkit.openbao import OpenBao
from devkit.postgres import PostgreSQL

DB_ROLE = "app"
PKI_ROLE = "web"


@pytest.fixture(scope="module")
def pg(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PostgreSQL]:
    with pgmod.running(Path(tmp_path_factory.mktemp("postgres"))) as server:
        server.query("CREATE TABLE widgets (id int)")
        yield server


@pytest.fixture(scope="module")
def bao(tmp_path_factory: pytest.TempPathFactory, pg: PostgreSQL) -> Iterator[OpenBao]:
    server = OpenBao.start(Path(tmp_path_factory.mktemp("openbao-engines")))
    try:
        server.configure_database("database", pg)
        server.add_database_role("database", DB_ROLE)
        server.configure_pki("pki")
        server.add_pki_role("pki", PKI_ROLE)
        yield server
    finally:
        server.stop()


@pytest.fixture
def root(bao: OpenBao) -> Any:
    return bao.root()


def test_postgres_listens_on_loopback_with_password_auth(pg: PostgreSQL) -> None:
    assert pg.query("SHOW listen_addresses") == [("127.0.0.1",)]
    assert pg.query("SHOW port") == [(str(pg.port),)]
    assert pg.query("SHOW fsync") == [("off",)]
    assert pg.query("SELECT rolsuper FROM pg_roles WHERE rolname = current_user") == [("t",)]
    assert pg.admin_user in pg.roles()
    assert pg.can_login(pg.admin_user, pg.admin_password)
    assert not pg.can_login(pg.admin_user, pg.admin_password + "x")
    assert pg.connection_url == (
        f"postgresql://{{{{username}}}}:{{{{password}}}}@127.0.0.1:{pg.port}/postgres"
        "?sslmode=disable"
    )


def test_query_returns_rows_of_text(pg: PostgreSQL) -> None:
    rows = pg.query("SELECT 1, NULL, 'a|b' UNION ALL SELECT 2, 'x', E'two\\nlines' ORDER BY 1")
    assert rows == [("1", "", "a|b"), ("2", "x", "two\nlines")]
    assert pg.query("SELECT 1 WHERE false") == []
    assert pg.query("SELECT ''") == [("",)]
    with pytest.raises(RuntimeError, match="does not exist"):
        pg.query("SELECT * FROM no_such_table")


def test_database_creds_are_a_real_user_until_revoked(
    bao: OpenBao, pg: PostgreSQL, root: Any
) -> None:
    creds = root.read(f"database/creds/{DB_ROLE}")
    user, password = creds["data"]["username"], creds["data"]["password"]
    lease_id = creds["lease_id"]
    assert lease_id.startswith(f"database/creds/{DB_ROLE}/")
    assert 0 < creds["lease_duration"] <= 300

    assert user in pg.roles()
    assert pg.can_login(user, password)
    assert not pg.can_login(user, password + "x")
    granted = pg.query(f"SELECT has_table_privilege('{user}', 'public.widgets', 'SELECT')")
    assert granted == [("t",)]
    valid_until = pg.query(f"SELECT rolvaliduntil IS NOT NULL FROM pg_roles WHERE rolname='{user}'")
    assert valid_until == [("t",)]

    lease = bao.lease_lookup(lease_id)
    assert lease is not None
    assert lease["id"] == lease_id
    assert 0 < lease["ttl"] <= 300

    root.sys.revoke_lease(lease_id)

    assert user not in pg.roles()
    assert pg.query(f"SELECT count(*) FROM pg_roles WHERE rolname = '{user}'") == [("0",)]
    assert not pg.can_login(user, password)
    assert bao.lease_lookup(lease_id) is None


def test_each_read_is_a_distinct_user(pg: PostgreSQL, root: Any) -> None:
    first = root.read(f"database/creds/{DB_ROLE}")
    second = root.read(f"database/creds/{DB_ROLE}")
    try:
        assert first["data"]["username"] != second["data"]["username"]
        assert {first["data"]["username"], second["data"]["username"]} <= pg.roles()
    finally:
        for creds in (first, second):
            root.sys.revoke_lease(creds["lease_id"])
    assert not {first["data"]["username"], second["data"]["username"]} & pg.roles()


def test_lease_lookup_of_an_unknown_lease_is_none(bao: OpenBao) -> None:
    assert bao.lease_lookup(f"database/creds/{DB_ROLE}/no-such-lease") is None


def test_pki_issues_a_certificate_from_its_root(bao: OpenBao, root: Any) -> None:
    issued = root.write(f"pki/issue/{PKI_ROLE}", common_name="svc.example.test")["data"]
    assert {"certificate", "private_key", "expiration", "serial_number"} <= issued.keys()

    cert = x509.load_pem_x509_certificate(issued["certificate"].encode())
    ca = x509.load_pem_x509_certificate(issued["issuing_ca"].encode())
    name = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value
    assert name == "svc.example.test"
    ca_name = ca.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value
    assert ca_name == "secrets-bridge test CA"
    cert.verify_directly_issued_by(ca)
    assert isinstance(cert.public_key(), ec.EllipticCurvePublicKey)
    assert format(cert.serial_number, "x") == issued["serial_number"].replace(":", "").lstrip("0")

    now = datetime.datetime.now(datetime.UTC)
    assert cert.not_valid_after_utc.timestamp() == issued["expiration"]
    assert now < cert.not_valid_after_utc <= now + datetime.timedelta(seconds=601)

    bare = root.write(f"pki/issue/{PKI_ROLE}", common_name="example.test")["data"]
    assert bare["certificate"].startswith("-----BEGIN CERTIFICATE-----")
    with pytest.raises(hvac.exceptions.InvalidRequest):
        root.write(f"pki/issue/{PKI_ROLE}", common_name="svc.other.test")


def test_configuring_again_keeps_the_ca_and_the_connection(
    bao: OpenBao, pg: PostgreSQL, root: Any
) -> None:
    ca_before = root.read("pki/cert/ca")["data"]["certificate"]
    bao.configure_pki("pki")
    bao.add_pki_role("pki", PKI_ROLE)
    bao.configure_database("database", pg)
    bao.add_database_role("database", DB_ROLE)
    assert root.read("pki/cert/ca")["data"]["certificate"] == ca_before
    assert root.read("database/config/pg")["data"]["plugin_name"] == "postgresql-database-plugin"
    creds = root.read(f"database/creds/{DB_ROLE}")
    root.sys.revoke_lease(creds["lease_id"])


def test_tune_auth_sets_token_ttls(bao: OpenBao, root: Any) -> None:
    bao.enable_auth("jwt", "jwt-tuned")
    bao.tune_auth("jwt-tuned", "120s", "300s")
    tune = root.read("sys/auth/jwt-tuned/tune")["data"]
    assert (tune["default_lease_ttl"], tune["max_lease_ttl"]) == (120, 300)


def test_binaries_fall_back_to_the_newest_installed_version(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for version in ("9.6", "15", "16"):
        bin_dir = tmp_path / version / "bin"
        bin_dir.mkdir(parents=True)
        for name in ("initdb", "postgres", "psql"):
            (bin_dir / name).touch()
    (tmp_path / "17" / "bin").mkdir(parents=True)  # an incomplete install is passed over
    monkeypatch.setattr(pgmod.shutil, "which", lambda name: None)
    monkeypatch.setattr(pgmod, "PG_LIB", tmp_path)
    found = pgmod.find_binaries()
    assert found.initdb == tmp_path / "16" / "bin" / "initdb"
    assert found.psql == tmp_path / "16" / "bin" / "psql"


def test_no_postgres_installed_is_a_one_line_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pgmod.shutil, "which", lambda name: None)
    monkeypatch.setattr(pgmod, "PG_LIB", tmp_path)
    with pytest.raises(FileNotFoundError, match="PostgreSQL not found") as err:
        pgmod.PostgreSQL.start(tmp_path / "work")
    assert "\n" not in str(err.value)
