"""The server's TLS material: the embedded mode's local certificate authority and server
certificate, and the checks of a production certificate and key.

``graphene up`` serves HTTPS and WSS by default. On its first start it makes a certificate
authority of its own in ``<data dir>/tls/`` (``ca.pem``, ``ca-key.pem``) and a server
certificate signed by it (``server.pem``, ``server-key.pem``) for the names clients and agents
use: ``localhost``, ``127.0.0.1``, ``::1``, the machine's host name and
``GRAPHENE_TLS_HOSTNAMES``. Clients pin the CA (``graphenectl login --ca-file`` or
``--ca-fingerprint``), agents get it in their install data. Later starts reuse both; the
server certificate is issued again when it nears its end or the names changed, which clients
do not notice (they trust the CA). The CA itself is never replaced silently: a new CA means
every client and agent must pin again, so an unusable one stops the start with what to do.

Keys are ECDSA P-256: small, fast to make and to handshake with, and understood by every TLS
stack Graphene talks to (OpenSSL under Python and Twisted, Chromium).

No Django here: the ``graphene`` command and the test harness call it before or beside settings.
"""

from __future__ import annotations

import contextlib
import hashlib
import ipaddress
import os
import secrets
import socket
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

CA_FILE = "ca.pem"
CA_KEY_FILE = "ca-key.pem"
SERVER_FILE = "server.pem"
SERVER_KEY_FILE = "server-key.pem"

CA_VALIDITY = timedelta(days=3650)
# Under the 398 days browsers accept for a server certificate, should one trust the CA.
SERVER_VALIDITY = timedelta(days=397)
# A server certificate closer than this to its end is issued again at the next start.
RENEW_BEFORE = timedelta(days=30)
# Certificates start a little in the past: a client whose clock lags still accepts them.
BACKDATE = timedelta(minutes=5)

LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")


class TLSError(Exception):
    """The TLS material cannot be used; the message says which file or setting and what to do."""


def fingerprint(certificate: x509.Certificate | bytes | str) -> str:
    """The SHA-256 fingerprint of a certificate (PEM text, DER bytes or parsed) as
    ``AB:CD:...``, the form ``openssl x509 -noout -fingerprint -sha256`` prints."""
    if isinstance(certificate, str):
        certificate = x509.load_pem_x509_certificate(certificate.encode())
    if isinstance(certificate, x509.Certificate):
        certificate = certificate.public_bytes(serialization.Encoding.DER)
    der = certificate
    return ":".join(f"{b:02X}" for b in hashlib.sha256(der).digest())


def hostnames_default(*, extra: Iterable[str] = ()) -> list[str]:
    """The names the embedded server certificate is for: loopback, this machine's names, and ``extra``
    (``GRAPHENE_TLS_HOSTNAMES``, the host agents dial), in that order, without repeats."""
    names: list[str] = list(LOOPBACK_NAMES)
    for name in (socket.gethostname(), *extra):
        name = name.strip().strip("[]").lower()
        if name and name not in names and name not in {"0.0.0.0", "::"}:  # noqa: S104 - a wildcard bind is no name
            names.append(name)
    return names


def _general_name(name: str, *, setting: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(name))
    except ValueError:
        pass
    if not name.isascii() or any(c.isspace() or c in "/:@" for c in name) or len(name) > 253:
        raise TLSError(f"{setting}: {name!r} is neither an IP address nor a DNS name")
    return x509.DNSName(name)


def _names(names: Sequence[str], *, setting: str) -> list[x509.GeneralName]:
    general: list[x509.GeneralName] = []
    for name in names:
        try:
            item = _general_name(name, setting=setting)
        except TLSError:
            if name.lower() in {socket.gethostname().lower()}:
                continue  # a host name no certificate can carry is simply not in it
            raise
        if item not in general:
            general.append(item)
    return general


def _write_private(path: Path, data: bytes, mode: int) -> None:
    """Write ``data`` atomically (a temporary file, then a rename) with ``mode`` from the start."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _cert_pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def _now() -> datetime:
    return datetime.now(UTC)


def ca_create(
    *, common_name: str, now: datetime | None = None, path_length: int | None = 0
) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    """A new self-signed certificate authority; with ``path_length`` 0 (the local CA's) it may
    sign server certificates only, never another CA."""
    now = now or _now()
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "Graphene"),
            x509.NameAttribute(NameOID.COMMON_NAME, common_name),
        ]
    )
    ski = x509.SubjectKeyIdentifier.from_public_key(key.public_key())
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - BACKDATE)
        .not_valid_after(now + CA_VALIDITY)
        .add_extension(x509.BasicConstraints(ca=True, path_length=path_length), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(ski, critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ski), critical=False)
        .sign(key, hashes.SHA256())
    )
    return cert, key


def server_certificate_issue(
    *,
    ca: x509.Certificate,
    ca_key: ec.EllipticCurvePrivateKey,
    hostnames: Sequence[str],
    now: datetime | None = None,
    validity: timedelta = SERVER_VALIDITY,
    setting: str = "GRAPHENE_TLS_HOSTNAMES",
) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    """A server certificate for ``hostnames`` (DNS names and IP addresses), signed by ``ca``."""
    now = now or _now()
    names = _names(hostnames, setting=setting)
    if not names:
        raise TLSError(f"{setting}: a server certificate needs at least one name")
    key = ec.generate_private_key(ec.SECP256R1())
    first = names[0].value
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, str(first)[:64])]))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - BACKDATE)
        .not_valid_after(min(now + validity, ca.not_valid_after_utc))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=False,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    return cert, key


def certificate_names(cert: x509.Certificate) -> set[str]:
    """The DNS names and IP addresses a certificate is for (its subject alternative names)."""
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return set()
    return {str(n) for n in san.get_values_for_type(x509.DNSName)} | {
        str(n) for n in san.get_values_for_type(x509.IPAddress)
    }


@dataclass(frozen=True)
class LocalTLS:
    """The embedded server's TLS files, and what this start did to them."""

    directory: Path
    ca_path: Path
    cert_path: Path
    key_path: Path
    ca_fingerprint: str
    ca_expires_at: datetime
    hostnames: tuple[str, ...]
    ca_created: bool  # this start made the CA: clients have to pin it
    server_issued: str  # why this start issued the server certificate ("" when it reused it)

    @property
    def ca_pem(self) -> str:
        return self.ca_path.read_text()


def _load_ca(directory: Path) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    ca_path, key_path = directory / CA_FILE, directory / CA_KEY_FILE
    remedy = (
        f"restore it from a backup, or move {directory} away to make a new CA (every client and agent "
        "must then pin the new one)"
    )
    try:
        ca = x509.load_pem_x509_certificate(ca_path.read_bytes())
    except (OSError, ValueError) as exc:
        raise TLSError(f"the local CA {ca_path} cannot be read ({exc}): {remedy}") from None
    try:
        key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
    except FileNotFoundError:
        raise TLSError(f"the local CA's key {key_path} is missing: {remedy}") from None
    except (OSError, ValueError, TypeError) as exc:
        raise TLSError(f"the local CA's key {key_path} cannot be read ({exc}): {remedy}") from None
    if not isinstance(key, ec.EllipticCurvePrivateKey) or key.public_key() != ca.public_key():
        raise TLSError(f"{key_path} is not the key of the CA in {ca_path}: {remedy}")
    return ca, key


def _server_reusable(directory: Path, ca: x509.Certificate, wanted: set[str], now: datetime) -> str:
    """Why the server certificate in ``directory`` must be issued again ("" if it may be reused)."""
    try:
        cert = x509.load_pem_x509_certificate((directory / SERVER_FILE).read_bytes())
        key = serialization.load_pem_private_key((directory / SERVER_KEY_FILE).read_bytes(), password=None)
    except FileNotFoundError:
        return "first start"
    except (OSError, ValueError, TypeError):
        return "the previous one could not be read"
    if key.public_key() != cert.public_key():
        return "the previous key did not match it"
    try:
        cert.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature):
        return "the previous one was not signed by this CA"
    if cert.not_valid_after_utc - now < RENEW_BEFORE:
        return f"the previous one ends {cert.not_valid_after_utc:%Y-%m-%d}"
    if certificate_names(cert) != wanted:
        return "the host names changed"
    return ""


def tls_local_ensure(*, directory: Path, hostnames: Sequence[str], now: datetime | None = None) -> LocalTLS:
    """The local CA and a server certificate for ``hostnames`` in ``directory``: made on the
    first call, reused afterwards, the server certificate issued again when it ends within
    ``RENEW_BEFORE``, its names changed or it is not the CA's. Raises ``TLSError`` when the CA
    cannot be used (unreadable, without its key, expired): never a new CA in its place."""
    now = now or _now()
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(directory, 0o700)
    ca_path = directory / CA_FILE
    ca_created = not ca_path.exists()
    if ca_created:
        # The key is written before the certificate: a crash in between leaves a key without
        # a CA, which no client can have pinned, and the next start simply makes both again.
        suffix = secrets.token_hex(4)
        host = (socket.gethostname().split(".")[0] or "localhost")[:32]
        ca, ca_key = ca_create(common_name=f"Graphene local CA {host} {suffix}", now=now)
        _write_private(directory / CA_KEY_FILE, _key_pem(ca_key), 0o600)
        _write_private(ca_path, _cert_pem(ca), 0o644)
    else:
        ca, ca_key = _load_ca(directory)
    if ca.not_valid_after_utc <= now:
        raise TLSError(
            f"the local CA {ca_path} expired on {ca.not_valid_after_utc:%Y-%m-%d}: move {directory} away to make "
            "a new one, then pin it again in every client and agent"
        )
    general = _names(hostnames, setting="GRAPHENE_TLS_HOSTNAMES")
    wanted = {str(n.value) for n in general}
    reason = _server_reusable(directory, ca, wanted, now)
    if reason:
        cert, key = server_certificate_issue(ca=ca, ca_key=ca_key, hostnames=[str(n.value) for n in general], now=now)
        _write_private(directory / SERVER_KEY_FILE, _key_pem(key), 0o600)
        _write_private(directory / SERVER_FILE, _cert_pem(cert), 0o644)
    return LocalTLS(
        directory=directory,
        ca_path=ca_path,
        cert_path=directory / SERVER_FILE,
        key_path=directory / SERVER_KEY_FILE,
        ca_fingerprint=fingerprint(ca),
        ca_expires_at=ca.not_valid_after_utc,
        hostnames=tuple(sorted(wanted)),
        ca_created=ca_created,
        server_issued=reason,
    )


@dataclass(frozen=True)
class CertificateFiles:
    """A production certificate and key, as checked: the leaf, the chain after it, their files."""

    cert_file: Path
    key_file: Path
    leaf: x509.Certificate
    chain: tuple[x509.Certificate, ...]  # intermediates sent after the leaf

    @property
    def names(self) -> set[str]:
        return certificate_names(self.leaf)

    @property
    def expires_at(self) -> datetime:
        return self.leaf.not_valid_after_utc


def tls_files_check(*, cert_file: str | Path, key_file: str | Path) -> CertificateFiles:
    """Read ``GRAPHENE_TLS_CERT_FILE`` (PEM: the certificate, then any intermediates) and
    ``GRAPHENE_TLS_KEY_FILE`` (an unencrypted PEM key) and check that the key is the
    certificate's. ``TLSError`` names the setting and the problem."""
    cert_path, key_path = Path(cert_file), Path(key_file)
    try:
        certs = x509.load_pem_x509_certificates(cert_path.read_bytes())
    except OSError as exc:
        raise TLSError(f"GRAPHENE_TLS_CERT_FILE={cert_path}: cannot read it: {exc.strerror or exc}") from None
    except ValueError:
        raise TLSError(f"GRAPHENE_TLS_CERT_FILE={cert_path} holds no PEM certificate") from None
    try:
        key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
    except OSError as exc:
        raise TLSError(f"GRAPHENE_TLS_KEY_FILE={key_path}: cannot read it: {exc.strerror or exc}") from None
    except TypeError:
        raise TLSError(f"GRAPHENE_TLS_KEY_FILE={key_path} is encrypted; give the server an unencrypted key") from None
    except ValueError:
        raise TLSError(f"GRAPHENE_TLS_KEY_FILE={key_path} holds no PEM private key") from None
    if key.public_key() != certs[0].public_key():
        raise TLSError(
            f"GRAPHENE_TLS_KEY_FILE={key_path} is not the key of the certificate in GRAPHENE_TLS_CERT_FILE={cert_path} "
            "(the file must start with the server's own certificate, then its intermediates)"
        )
    return CertificateFiles(cert_file=cert_path, key_file=key_path, leaf=certs[0], chain=tuple(certs[1:]))


def ca_file_read(path: Path) -> str:
    """The PEM text of the CA certificate(s) in ``path`` (``GRAPHENE_TLS_CA_FILE``), checked."""
    try:
        text = path.read_text()
        x509.load_pem_x509_certificates(text.encode())
    except OSError as exc:
        raise TLSError(f"GRAPHENE_TLS_CA_FILE={path}: cannot read it: {exc.strerror or exc}") from None
    except ValueError:
        raise TLSError(f"GRAPHENE_TLS_CA_FILE={path} holds no PEM certificate") from None
    return text
