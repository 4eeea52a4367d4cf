"""Encryption at rest for the secret store: Fernet (AES-128-CBC + HMAC-SHA256) from ``cryptography``.

Keys come from ``GRAPHENE_SECRETS_KEY``: one or more comma-separated strings, newest first.
The first encrypts; every one of them decrypts, so a key is rotated by putting the new one in
front and re-saving the secrets (``key_id`` shows which rows still use an old key). Each string
is stretched into a Fernet key with HKDF-SHA256, so any long random string will do.

Without ``GRAPHENE_SECRETS_KEY`` (development, embedded mode, tests) the key is derived from
Django's ``SECRET_KEY`` with a separate HKDF label. That keeps a fresh installation working,
but ties the secrets to ``SECRET_KEY``: change it and the stored secrets can no longer be
read. Production settings therefore require ``GRAPHENE_SECRETS_KEY``.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import json
from dataclasses import dataclass

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from django.conf import settings

from apps.core.errors import GrapheneError

_SALT = b"graphene-secrets-v1"


class SecretUndecryptable(GrapheneError):
    """A stored secret does not decrypt with the configured keys (the key changed, or the row)."""

    status_code = 500
    code = "secret_undecryptable"


@dataclass(frozen=True)
class Keyring:
    fernet: MultiFernet
    current_id: str


def _derive(material: str, label: bytes) -> bytes:
    raw = HKDF(algorithm=hashes.SHA256(), length=32, salt=_SALT, info=label).derive(material.encode())
    return base64.urlsafe_b64encode(raw)


def _key_id(key: bytes) -> str:
    return hashlib.sha256(b"graphene-secrets-key-id" + key).hexdigest()[:16]


@functools.lru_cache(maxsize=4)
def _keyring(configured: tuple[str, ...], fallback: str) -> Keyring:
    if configured:
        keys = [_derive(material, b"fernet") for material in configured]
    else:
        keys = [_derive(fallback, b"fernet-from-django-secret-key")]
    return Keyring(fernet=MultiFernet([Fernet(k) for k in keys]), current_id=_key_id(keys[0]))


def keyring() -> Keyring:
    configured = tuple(k for k in settings.GRAPHENE_SECRETS_KEY if k)
    return _keyring(configured, settings.SECRET_KEY)


def encrypt(*, namespace: str, name: str, value: str) -> tuple[str, str]:
    """``(ciphertext, key_id)`` for ``value``, bound to its namespace and name."""
    ring = keyring()
    payload = json.dumps({"ns": namespace, "n": name, "v": value}).encode()
    return ring.fernet.encrypt(payload).decode("ascii"), ring.current_id


def decrypt(*, namespace: str, name: str, ciphertext: str) -> str:
    try:
        payload = json.loads(keyring().fernet.decrypt(ciphertext.encode("ascii")))
    except (InvalidToken, ValueError, UnicodeError):
        raise SecretUndecryptable(
            f"secret {name!r} cannot be decrypted with the configured keys: GRAPHENE_SECRETS_KEY (or, without it, "
            "SECRET_KEY) changed since it was stored. Put the old key after the new one "
            "(GRAPHENE_SECRETS_KEY=new,old) or store the secret again."
        ) from None
    if payload.get("ns") != namespace or payload.get("n") != name:
        raise SecretUndecryptable(f"secret {name!r}: the stored ciphertext belongs to another secret; store it again")
    return str(payload["v"])
