"""The test session's TLS: a local CA and a server certificate for loopback, made as ``graphene
up`` makes its own (``apps.core.tls``) in the session's data directory, where the processes
the tests start find it too (``GRAPHENE_TLS_DIR``): the web servers serve with it, and the
install data the shared workers and web render carries its CA to agents. Tests trust it
through ``context()`` (urllib, websockets, http.client), ``ca_file()`` (graphenectl, the SDK,
httpx, requests) and ``spki_pin()`` (Chromium).
"""

from __future__ import annotations

import base64
import functools
import hashlib
import ssl
from pathlib import Path

from apps.core.tls import LocalTLS, tls_local_ensure

HOSTNAMES = ["localhost", "127.0.0.1", "::1"]


@functools.cache
def session_tls() -> LocalTLS:
    """The session's CA and server certificate (made on first use, once per pytest-xdist process)."""
    from django.conf import settings

    return tls_local_ensure(directory=Path(settings.GRAPHENE_TLS_DIR), hostnames=HOSTNAMES)


def ca_file() -> Path:
    return session_tls().ca_path


@functools.cache
def context_for(ca: Path) -> ssl.SSLContext:
    """A client context that trusts the CA in ``ca`` only (host names checked)."""
    return ssl.create_default_context(cafile=str(ca))


def context() -> ssl.SSLContext:
    """A client context that trusts the session's CA only."""
    return context_for(ca_file())


def spki_pin(cert: Path | None = None) -> str:
    """The base64 SHA-256 of a certificate's public key (the session's server certificate by
    default), as Chromium's --ignore-certificate-errors-spki-list takes it."""
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    leaf = x509.load_pem_x509_certificate((cert or session_tls().cert_path).read_bytes())
    spki = leaf.public_key().public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return base64.b64encode(hashlib.sha256(spki).digest()).decode()


def endpoint(port: int, *, tls: LocalTLS | None = None) -> str:
    """daphne's ``-e`` endpoint: TLS on 127.0.0.1:``port`` with the session's certificate."""
    from graphene_project.cli import ServeTLS
    from graphene_project.cli import endpoint as cli_endpoint

    tls = tls or session_tls()
    return cli_endpoint(host="127.0.0.1", port=port, tls=ServeTLS(cert_file=tls.cert_path, key_file=tls.key_path))
