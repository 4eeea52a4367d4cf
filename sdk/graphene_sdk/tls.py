"""What a client trusts when it connects to a Graphene server (standard library only).

Graphene serves HTTPS by default. ``graphene up`` signs its certificate with a certificate
authority of its own, which no system trusts, so a client *pins* that CA: ``graphenectl login
--ca-file ca.pem`` (the file ``graphene up`` names) or ``--ca-fingerprint AB:CD:...`` (the
fingerprint it prints; the CA is then fetched from the server's ``/tls/ca.pem`` and kept only
if its SHA-256 fingerprint is that one). The context keeps the CA's PEM, and every later
request and websocket of graphenectl and ``graphene_sdk.Client`` trusts that CA and nothing
else for its server. A server with a certificate from a public CA needs no pin: the system's
trust store is used. Plain ``http://`` is refused unless asked for (``--insecure``,
``Client(insecure=True)``, ``GRAPHENE_INSECURE=1``), and then it is said on stderr.
"""

from __future__ import annotations

import hashlib
import ipaddress
import re
import ssl
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field

from graphene_sdk._errors import ConfigError

__all__ = [
    "CA_PATH",
    "Trust",
    "ca_fetch",
    "certificate_error",
    "fingerprint",
    "fingerprint_normalize",
    "pem_certificates",
]

# Where a Graphene server serves the CA that issued its certificate (for --ca-fingerprint).
CA_PATH = "/tls/ca.pem"

_PEM = re.compile(r"-----BEGIN CERTIFICATE-----\s.+?-----END CERTIFICATE-----", re.S)
_HEX = re.compile(r"[0-9a-f]{64}")


def pem_certificates(text: str) -> list[str]:
    """The PEM certificates in ``text``; ``ValueError`` if there is none or one is not a certificate."""
    found = _PEM.findall(text)
    if not found:
        raise ValueError("no PEM certificate (-----BEGIN CERTIFICATE-----) in it")
    for pem in found:
        try:
            ssl.PEM_cert_to_DER_cert(pem)
        except ValueError:
            raise ValueError("a PEM block in it is not a certificate") from None
    return [pem.strip() + "\n" for pem in found]


def fingerprint(pem: str) -> str:
    """The SHA-256 fingerprint of the first certificate in ``pem``, as ``AB:CD:...`` (what
    ``graphene up`` prints and ``openssl x509 -noout -fingerprint -sha256`` shows)."""
    der = ssl.PEM_cert_to_DER_cert(pem_certificates(pem)[0])
    return ":".join(f"{b:02X}" for b in hashlib.sha256(der).digest())


def fingerprint_normalize(text: str) -> str:
    """A SHA-256 fingerprint as typed or pasted (``AB:CD:...``, ``abcd...``, with a
    ``SHA256``/``sha256 Fingerprint=`` prefix) in the form ``fingerprint`` returns."""
    raw = text.strip().lower()
    for prefix in ("sha256 fingerprint=", "sha256:", "sha-256:", "sha256", "sha-256"):
        if raw.startswith(prefix):
            raw = raw[len(prefix) :]
            break
    digits = re.sub(r"[\s:]", "", raw)
    if not _HEX.fullmatch(digits):
        raise ValueError(f"{text.strip()!r} is not a SHA-256 fingerprint (64 hex digits, e.g. AB:CD:...:EF)")
    return ":".join(digits[i : i + 2] for i in range(0, 64, 2)).upper()


@dataclass(frozen=True)
class Trust:
    """What connections to one server trust: the pinned CA certificate(s) ``ca_pem``, else
    the system's trust store; ``insecure`` allows a plain ``http://`` server. ``source`` says
    where the pin or the permission came from (``"context 'prod'"``, ``"GRAPHENE_CA_FILE"``)."""

    ca_pem: str = field(default="", repr=False)
    source: str = ""
    insecure: bool = False

    @property
    def fingerprint(self) -> str:
        """The pinned CA's SHA-256 fingerprint ("" when nothing is pinned)."""
        return fingerprint(self.ca_pem) if self.ca_pem else ""

    def context(self) -> ssl.SSLContext:
        """An SSL context that verifies the server's certificate and host name against the
        pinned CA only, or against the system's trust store when nothing is pinned."""
        if self.ca_pem:
            return ssl.create_default_context(cadata=self.ca_pem)
        return ssl.create_default_context()

    def describe(self) -> str:
        """One line for ``ctx show``: what the connection trusts."""
        if self.insecure:
            return f"none: plain HTTP, unencrypted (--insecure, {self.source})"
        if self.ca_pem:
            return f"pinned CA {self.fingerprint} ({self.source})"
        return "the system's trust store"

    def untrusted(self, server: str, error: ssl.SSLCertVerificationError) -> str:
        """What to say when the server's certificate failed verification, and how to fix it."""
        why = error.verify_message or str(error)
        login = f"graphenectl login --server {server}"
        if self.ca_pem:
            return (
                f"refused {server}: its certificate is not one the pinned CA ({self.fingerprint}, from "
                f"{self.source}) vouches for ({why}). Nothing was sent. If the server's CA was replaced on "
                f"purpose, pin the new one: `{login} --ca-file ca.pem --token-stdin` or `--ca-fingerprint`; "
                "otherwise something else is answering at that address"
            )
        return (
            f"refused {server}: its certificate is not trusted by this system ({why}). Nothing was sent. A "
            f"server started with `graphene up` has a CA of its own: pin it with `{login} --ca-file "
            f"<data dir>/tls/ca.pem --token-stdin` or `--ca-fingerprint <the fingerprint graphene up printed>` "
            "(in Python: Client(ca_file=...) or Client(ca_fingerprint=...); in the environment: GRAPHENE_CA_FILE)"
        )


def certificate_error(exc: BaseException | None) -> ssl.SSLCertVerificationError | None:
    """The certificate verification failure behind ``exc`` (a ``URLError``'s reason, a cause), if any."""
    seen = 0
    while exc is not None and seen < 5:
        if isinstance(exc, ssl.SSLCertVerificationError):
            return exc
        reason = getattr(exc, "reason", None)
        exc = reason if isinstance(reason, BaseException) else exc.__cause__ or exc.__context__
        seen += 1
    return None


def _is_loopback(host: str) -> bool:
    if host in {"localhost", "localhost.localdomain"}:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def ca_fetch(server: str, wanted: str, *, timeout: float = 30.0) -> str:
    """The CA certificate of ``server`` whose SHA-256 fingerprint is ``wanted``, fetched from
    its ``/tls/ca.pem``. That download is not verified (the CA is what is not trusted yet); the
    fingerprint is what makes it trustworthy: any other certificate is refused (``ConfigError``)."""
    try:
        want = fingerprint_normalize(wanted)
    except ValueError as exc:
        raise ConfigError(str(exc), is_usage=True) from None
    url = server.rstrip("/") + CA_PATH
    if urllib.parse.urlsplit(url).scheme != "https":
        raise ConfigError(f"--ca-fingerprint pins the CA of an https:// server, not {server}", is_usage=True)
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE  # checked below, by fingerprint
    handlers: list[urllib.request.BaseHandler] = [urllib.request.HTTPSHandler(context=context)]
    if _is_loopback(urllib.parse.urlsplit(url).hostname or ""):
        handlers.append(urllib.request.ProxyHandler({}))
    opener = urllib.request.build_opener(*handlers)
    try:
        with opener.open(url, timeout=timeout) as response:
            text = response.read(256 * 1024).decode("ascii", errors="replace")
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            raise ConfigError(
                f"{server} serves no CA of its own ({CA_PATH}: 404): its certificate is meant to be checked against "
                "the system's trust store, so log in without --ca-fingerprint (or with --ca-file)"
            ) from None
        raise ConfigError(f"cannot fetch {url}: HTTP {exc.code}") from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise ConfigError(f"cannot fetch the CA from {url}: {reason}") from None
    try:
        offered = pem_certificates(text)
    except ValueError as exc:
        raise ConfigError(f"{url} is not a CA certificate ({exc}): is {server} a Graphene server?") from None
    for pem in offered:
        if fingerprint(pem) == want:
            return pem
    got = ", ".join(fingerprint(pem) for pem in offered)
    raise ConfigError(
        f"refused {server}: the CA it offers has the fingerprint {got}, not {want}. Nothing was pinned or sent. "
        "Check the fingerprint (graphene up prints it; `graphene tls` prints it again): if it is right, something "
        "else is answering at that address"
    )
