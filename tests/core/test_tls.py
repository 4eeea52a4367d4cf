"""TLS by default, on the server's side: the local CA ``graphene up`` makes and keeps, the
certificate and key production takes from settings, ``graphene web`` refusing to serve without
either (or a proxy, or ``--insecure``), and proxy headers believed only from trusted proxies."""

from __future__ import annotations

import http.client
import ssl
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from django.core.exceptions import ImproperlyConfigured
from graphene_sdk import Client
from rest_framework.authtoken.models import Token

from apps.core.proxy import forwarded_scope
from apps.core.tls import (
    CA_FILE,
    CA_KEY_FILE,
    SERVER_FILE,
    TLSError,
    ca_create,
    certificate_names,
    server_certificate_issue,
    tls_files_check,
    tls_local_ensure,
)
from graphene_project.settings.env import trusted_networks
from tests.harness.embedded import Ctl
from tests.harness.processes import purge_queue
from tests.harness.web import ProductionWeb
from tests.test_foundation import assert_one_line_error, prod_env, run_graphene

# --- the local CA --------------------------------------------------------------------------------


def _pem(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def test_the_local_ca_is_made_once_and_its_server_certificate_issued_again_when_it_must(tmp_path: Path) -> None:
    tls_dir = tmp_path / "tls"
    first = tls_local_ensure(directory=tls_dir, hostnames=["localhost", "127.0.0.1"])
    assert (first.ca_created, first.server_issued) == (True, "first start")
    ca_bytes = (tls_dir / CA_FILE).read_bytes()
    _pem(tls_dir / SERVER_FILE).verify_directly_issued_by(_pem(tls_dir / CA_FILE))
    assert certificate_names(_pem(tls_dir / SERVER_FILE)) == {"localhost", "127.0.0.1"}

    again = tls_local_ensure(directory=tls_dir, hostnames=["localhost", "127.0.0.1"])
    assert (again.ca_created, again.server_issued, again.ca_fingerprint) == (False, "", first.ca_fingerprint)
    server_bytes = (tls_dir / SERVER_FILE).read_bytes()

    renamed = tls_local_ensure(directory=tls_dir, hostnames=["localhost", "127.0.0.1", "graphene.test", "10.1.2.3"])
    assert renamed.server_issued == "the host names changed"
    assert certificate_names(_pem(tls_dir / SERVER_FILE)) == {"localhost", "127.0.0.1", "graphene.test", "10.1.2.3"}
    assert (tls_dir / SERVER_FILE).read_bytes() != server_bytes

    later = datetime.now(UTC) + timedelta(days=380)  # within a month of the server certificate's end
    renewed = tls_local_ensure(directory=tls_dir, hostnames=renamed.hostnames, now=later)
    assert renewed.server_issued.startswith("the previous one ends")
    assert _pem(tls_dir / SERVER_FILE).not_valid_after_utc > later + timedelta(days=300)
    assert (tls_dir / CA_FILE).read_bytes() == ca_bytes, "the CA is never replaced"


def test_an_unusable_local_ca_stops_the_start_and_is_never_replaced(tmp_path: Path) -> None:
    tls_dir = tmp_path / "tls"
    tls_local_ensure(directory=tls_dir, hostnames=["localhost"])
    ca_bytes = (tls_dir / CA_FILE).read_bytes()

    with pytest.raises(TLSError, match="expired on"):
        tls_local_ensure(directory=tls_dir, hostnames=["localhost"], now=datetime.now(UTC) + timedelta(days=4000))
    with pytest.raises(TLSError, match="GRAPHENE_TLS_HOSTNAMES: 'not a name'"):
        tls_local_ensure(directory=tls_dir, hostnames=["localhost", "not a name"])
    (tls_dir / CA_KEY_FILE).unlink()
    with pytest.raises(TLSError, match=r"ca-key\.pem is missing") as missing:
        tls_local_ensure(directory=tls_dir, hostnames=["localhost"])
    assert "pin the new one" in str(missing.value)
    assert (tls_dir / CA_FILE).read_bytes() == ca_bytes
    assert not (tls_dir / CA_KEY_FILE).exists()


def test_production_certificate_files_are_checked_naming_the_setting(tmp_path: Path) -> None:
    ca, ca_key = ca_create(common_name="test CA")
    cert, key = server_certificate_issue(ca=ca, ca_key=ca_key, hostnames=["localhost"])
    cert_file, key_file, other_key = tmp_path / "cert.pem", tmp_path / "key.pem", tmp_path / "other.pem"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM) + ca.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))  # fmt: skip
    other_key.write_bytes(ca_key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                               serialization.BestAvailableEncryption(b"pw")))  # fmt: skip

    files = tls_files_check(cert_file=cert_file, key_file=key_file)
    assert (files.leaf, files.chain) == (cert, (ca,))
    with pytest.raises(TLSError, match=r"GRAPHENE_TLS_KEY_FILE=.* is encrypted"):
        tls_files_check(cert_file=cert_file, key_file=other_key)
    with pytest.raises(TLSError, match=r"GRAPHENE_TLS_KEY_FILE=.* is not the key of the certificate"):
        tls_files_check(cert_file=cert_file, key_file=_other_key(tmp_path))
    with pytest.raises(TLSError, match=r"GRAPHENE_TLS_CERT_FILE=.*: cannot read it"):
        tls_files_check(cert_file=tmp_path / "missing.pem", key_file=key_file)


def _other_key(tmp_path: Path) -> Path:
    path = tmp_path / "unrelated-key.pem"
    path.write_bytes(ec.generate_private_key(ec.SECP256R1()).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))  # fmt: skip
    return path


# --- proxy headers -------------------------------------------------------------------------------

PROXIES = trusted_networks(["10.0.0.5", "10.9.0.0/16"], setting="GRAPHENE_TRUSTED_PROXIES")
FORWARDED = [(b"x-forwarded-proto", b"https"), (b"x-forwarded-for", b"6.6.6.6, 203.0.113.7, 10.9.1.1"), (b"host", b"g")]


def _scope(peer: str, kind: str = "http") -> dict[str, Any]:
    return {
        "type": kind,
        "scheme": "ws" if kind == "websocket" else "http",
        "client": (peer, 5555),
        "headers": FORWARDED,
    }


def test_proxy_headers_are_believed_from_trusted_proxies_only() -> None:
    trusted = forwarded_scope(_scope("10.0.0.5"), PROXIES)
    # The client is the nearest hop that is not one of ours; what it claimed before that is not believed.
    assert (trusted["scheme"], trusted["client"]) == ("https", ("203.0.113.7", 0))
    assert forwarded_scope(_scope("10.0.0.5", "websocket"), PROXIES)["scheme"] == "wss"

    for peer, proxies in (("192.0.2.1", PROXIES), ("10.0.0.5", ())):
        stranger = forwarded_scope(_scope(peer), proxies)
        assert (stranger["scheme"], stranger["client"]) == ("http", (peer, 5555))
        assert stranger["headers"] == [(b"host", b"g")], "nobody downstream may read them"

    with pytest.raises(ImproperlyConfigured, match=r"GRAPHENE_TRUSTED_PROXIES: .proxy\.example. is not an IP"):
        trusted_networks(["proxy.example"], setting="GRAPHENE_TRUSTED_PROXIES")


# --- graphene web --------------------------------------------------------------------------------


@pytest.mark.system
def test_graphene_web_refuses_to_start_without_tls_a_proxy_or_insecure(tmp_path: Path) -> None:
    line = assert_one_line_error(run_graphene(["web", "--port", "1"], prod_env(tmp_path)), "GRAPHENE_TLS_CERT_FILE")
    for named in ("GRAPHENE_TLS_KEY_FILE", "GRAPHENE_TRUSTED_PROXIES", "--insecure"):
        assert named in line
    half = prod_env(tmp_path, GRAPHENE_TLS_CERT_FILE=str(tmp_path / "cert.pem"))
    assert_one_line_error(run_graphene(["web", "--port", "1"], half), "GRAPHENE_TLS_KEY_FILE is not set")


def _chain(tmp_path: Path) -> tuple[Path, Path, Path]:
    """A root CA, an intermediate it signed and a server certificate the intermediate signed:
    the certificate file holds the server's certificate then the intermediate, as CAs deliver them."""
    now = datetime.now(UTC)
    root, root_key = ca_create(common_name="test root", path_length=1)
    inter_key = ec.generate_private_key(ec.SECP256R1())
    inter_name = x509.Name([x509.NameAttribute(x509.NameOID.COMMON_NAME, "test intermediate")])
    inter = (
        x509.CertificateBuilder().subject_name(inter_name).issuer_name(root.subject)
        .public_key(inter_key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(minutes=5)).not_valid_after(now + timedelta(days=30))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(inter_key.public_key()), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(root_key.public_key()), critical=False)
        .sign(root_key, hashes.SHA256())
    )  # fmt: skip
    leaf, leaf_key = server_certificate_issue(ca=inter, ca_key=inter_key, hostnames=["127.0.0.1"])
    pem = serialization.Encoding.PEM
    (tmp_path / "root.pem").write_bytes(root.public_bytes(pem))
    (tmp_path / "cert.pem").write_bytes(leaf.public_bytes(pem) + inter.public_bytes(pem))
    (tmp_path / "key.pem").write_bytes(
        leaf_key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return tmp_path / "root.pem", tmp_path / "cert.pem", tmp_path / "key.pem"


@pytest.mark.system
@pytest.mark.django_db(transaction=True)
def test_graphene_web_serves_https_with_the_certificate_and_chain_from_settings(tmp_path: Path) -> None:
    root, cert, key = _chain(tmp_path)
    web = ProductionWeb(tmp_path, GRAPHENE_TLS_CERT_FILE=str(cert), GRAPHENE_TLS_KEY_FILE=str(key))
    web.ca_file = root  # clients trust the root only: the server must send the intermediate itself
    web.start()  # ready once /healthz answered over HTTPS, verified against the root
    try:
        assert "graphene: TLS: certificate" in web.log.read_text()
        served = ssl.get_server_certificate(("127.0.0.1", web.port))
        assert x509.load_pem_x509_certificate(served.encode()) == x509.load_pem_x509_certificate(cert.read_bytes())
    finally:
        web.stop()
        purge_queue()


@pytest.fixture
def token(django_user_model: Any) -> str:
    return Token.objects.create(user=django_user_model.objects.create_user(username="plain", password="pw")).key


@pytest.mark.system
@pytest.mark.django_db(transaction=True)
def test_behind_a_tls_proxy_its_headers_count_from_its_address_only(tmp_path: Path, token: str) -> None:
    web = ProductionWeb(tmp_path, GRAPHENE_TRUSTED_PROXIES="127.0.0.2", GRAPHENE_SECURE_SSL_REDIRECT="1").start()
    try:
        assert "serving HTTP for the TLS-terminating proxies at 127.0.0.2/32" in web.log.read_text()

        def whoami(source: str, **headers: str) -> int:
            connection = http.client.HTTPConnection("127.0.0.1", web.port, timeout=30, source_address=(source, 0))
            connection.request("GET", "/api/v1/whoami/", headers={"Authorization": f"Token {token}", **headers})
            return connection.getresponse().status

        # Plain HTTP is redirected to HTTPS, unless the trusted proxy says its client used HTTPS.
        assert whoami("127.0.0.1") == 301
        assert whoami("127.0.0.1", **{"X-Forwarded-Proto": "https"}) == 301, "believed from a stranger"
        assert whoami("127.0.0.2", **{"X-Forwarded-Proto": "https"}) == 200
        assert whoami("127.0.0.2") == 301
    finally:
        web.stop()
        purge_queue()


@pytest.mark.system
@pytest.mark.django_db(transaction=True)
def test_insecure_serves_plain_http_saying_so_and_clients_connect_only_when_told(tmp_path: Path, token: str) -> None:
    web = ProductionWeb(tmp_path, "--insecure").start()
    try:
        log = web.log.read_text()
        assert "WARNING: --insecure: serving PLAIN HTTP" in log
        assert "unencrypted" in log
        ctl = Ctl(tmp_path / "ctl")
        assert ctl("login", "--server", web.url, "--token-stdin", stdin=token).code == 2
        login = ctl.ok("login", "--server", web.url, "--insecure", "--token-stdin", stdin=token)
        assert "WARNING: --insecure" in login.err
        assert ctl.ok("whoami", "-o", "json").json()["username"] == "plain"
        assert Client(web.url, token=token, insecure=True).whoami()["username"] == "plain"
    finally:
        web.stop()
        purge_queue()
