"""Every write of the secret store, and the one place a value is decrypted (``secret_resolve``).

Invariant I7: values never enter specs, journals, events, logs or traces. Services here take
a value in and store only its ciphertext; what they log and raise names the secret, never its
value. ``secret_resolve`` is called where a value is used (an SSH install, a kind), on the
server, and its result must not be written anywhere.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Iterable
from typing import Any

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.db import IntegrityError, transaction
from graphene_sdk._secrets import SECRET_REF_KEY, secret_name_error, secret_ref_name

from apps.core import audit
from apps.core.errors import Conflict, NotFound, ValidationFailed
from apps.secrets import crypto
from apps.secrets.models import Secret

logger = logging.getLogger(__name__)

Actor = AbstractBaseUser | AnonymousUser | None
DEFAULT_NAMESPACE = "default"
# A secret is a key, a token or a password, not a file store: 64 KiB of UTF-8.
MAX_VALUE_BYTES = 64 * 1024


class SecretNotFound(NotFound):
    """A secret named in a pipeline or a spec does not exist (yet)."""

    code = "secret_not_found"


def _actor_id(actor: Actor) -> Any:
    return actor.pk if actor is not None and actor.is_authenticated else None


def _audited(secret: Secret) -> dict[str, Any]:
    """What the audit trail's digests cover of a secret: its metadata, never its value or
    ciphertext (a digest of a short value could be guessed back)."""
    return {
        "id": secret.pk,
        "namespace": secret.namespace,
        "name": secret.name,
        "key_id": secret.key_id,
        "updated_at": secret.updated_at,
        "updated_by": secret.updated_by_id,
    }


def _audit(action: str, secret: Secret, *, actor: Actor, before: Secret | None, after: Secret | None) -> None:
    audit.audit_write(
        action=action,
        resource="secrets",
        object_id=secret.pk,
        object_name=secret.name,
        namespace=secret.namespace,
        before=_audited(before) if before is not None else None,
        after=_audited(after) if after is not None else None,
        actor=actor,
    )


def secret_name_validate(name: Any) -> str:
    error = secret_name_error(name)
    if error is not None:
        raise ValidationFailed(f"name: {error}", fields={"name": [error]})
    assert isinstance(name, str)
    return name


def secret_value_validate(value: Any) -> str:
    if not isinstance(value, str):
        message = f"must be a string, not {type(value).__name__}"
        raise ValidationFailed(f"value: {message}", fields={"value": [message]})
    if value == "":
        raise ValidationFailed("value: must not be empty", fields={"value": ["must not be empty"]})
    size = len(value.encode("utf-8"))
    if size > MAX_VALUE_BYTES:
        message = f"is {size} bytes; a secret holds at most {MAX_VALUE_BYTES} bytes (UTF-8)"
        raise ValidationFailed(f"value: {message}", fields={"value": [message]})
    return value


def how_to_create(name: str) -> str:
    return (
        f'create it with POST /api/v1/secrets/ {{"name": "{name}", "value": "..."}} '
        f'or PUT /api/v1/secrets/{name}/ {{"value": "..."}}'
    )


def secret_create(*, name: str, value: str, namespace: str = DEFAULT_NAMESPACE, actor: Actor = None) -> Secret:
    """Store a new secret; ``Conflict`` if one with that name exists (replace it with ``secret_set``)."""
    name = secret_name_validate(name)
    value = secret_value_validate(value)
    ciphertext, key_id = crypto.encrypt(namespace=namespace, name=name, value=value)
    try:
        with transaction.atomic():
            secret = Secret.objects.create(
                namespace=namespace,
                name=name,
                ciphertext=ciphertext,
                key_id=key_id,
                created_by_id=_actor_id(actor),
                updated_by_id=_actor_id(actor),
            )
            _audit("secret.create", secret, actor=actor, before=None, after=secret)
    except IntegrityError:
        raise Conflict(
            f"secret {name!r} already exists; replace its value with PUT /api/v1/secrets/{name}/",
            fields={"name": ["already exists"]},
        ) from None
    logger.info("secret %s/%s created by %s", namespace, name, _actor_id(actor))
    return secret


def secret_set(
    *, name: str, value: str, namespace: str = DEFAULT_NAMESPACE, actor: Actor = None
) -> tuple[Secret, bool]:
    """Create the secret or replace its value; returns ``(secret, created)``."""
    name = secret_name_validate(name)
    value = secret_value_validate(value)
    ciphertext, key_id = crypto.encrypt(namespace=namespace, name=name, value=value)
    for _ in range(2):  # a concurrent create of the same name wins the insert: then replace
        with transaction.atomic():
            secret = Secret.objects.select_for_update().filter(namespace=namespace, name=name).first()
            if secret is not None:
                before = copy.copy(secret)
                secret.ciphertext = ciphertext
                secret.key_id = key_id
                secret.updated_by_id = _actor_id(actor)
                secret.save(update_fields=["ciphertext", "key_id", "updated_by", "updated_at"])
                _audit("secret.set", secret, actor=actor, before=before, after=secret)
                logger.info("secret %s/%s replaced by %s", namespace, name, _actor_id(actor))
                return secret, False
        try:
            return secret_create(name=name, value=value, namespace=namespace, actor=actor), True
        except Conflict:
            continue
    raise Conflict(f"secret {name!r} is being written concurrently; try again")


def secret_delete(*, name: str, namespace: str = DEFAULT_NAMESPACE, actor: Actor = None) -> None:
    """Delete a secret. Pipelines that still name it fail at their next use, saying so."""
    with transaction.atomic():
        secret = Secret.objects.select_for_update().filter(namespace=namespace, name=name).first()
        if secret is None:
            raise SecretNotFound(f"no secret {name!r}")
        _audit("secret.delete", secret, actor=actor, before=secret, after=None)
        secret.delete()
    logger.info("secret %s/%s deleted by %s", namespace, name, _actor_id(actor))


def secret_resolve(*, name: str, namespace: str = DEFAULT_NAMESPACE) -> str:
    """The value of secret ``name``, for use right here. Never store, log or journal it."""
    error = secret_name_error(name)
    if error is not None:
        raise ValidationFailed(f"secret name {error}", fields={"name": [error]})
    row = Secret.objects.filter(namespace=namespace, name=name).values_list("ciphertext", flat=True).first()
    if row is None:
        raise SecretNotFound(f"secret {name!r} does not exist (namespace {namespace!r}); {how_to_create(name)}")
    return crypto.decrypt(namespace=namespace, name=name, ciphertext=row)


def secret_refs_resolve(value: Any, *, namespace: str = DEFAULT_NAMESPACE) -> Any:
    """A copy of ``value`` (e.g. a record's spec) with each ``{"$secret": name}`` replaced by the value.

    For kinds, at the point of use: the record keeps the reference, the copy is used and dropped.
    """
    name = secret_ref_name(value)
    if name is not None:
        return secret_resolve(name=name, namespace=namespace)
    if isinstance(value, dict):
        if SECRET_REF_KEY in value:
            raise ValidationFailed(f"{SECRET_REF_KEY} must be the only key of a secret reference, with a name")
        return {key: secret_refs_resolve(item, namespace=namespace) for key, item in value.items()}
    if isinstance(value, list):
        return [secret_refs_resolve(item, namespace=namespace) for item in value]
    return value


def secret_refs_values(value: Any, *, namespace: str = DEFAULT_NAMESPACE) -> list[str]:
    """The values of the secrets ``value`` references (e.g. a container's ``env``), for
    ``secrets_mask``: what a program given them printed. A missing one is left out: the program
    was never given it."""
    name = secret_ref_name(value)
    if name is not None:
        try:
            return [secret_resolve(name=name, namespace=namespace)]
        except NotFound:
            return []
    if isinstance(value, dict):
        return [found for item in value.values() for found in secret_refs_values(item, namespace=namespace)]
    if isinstance(value, list):
        return [found for item in value for found in secret_refs_values(item, namespace=namespace)]
    return []


# --- masking what a program printed ------------------------------------------------------------

MASK = "***"
# A line of a multi-line value (a private key) is masked on its own, as a program may print it
# alone; shorter lines ("", "==") would mask ordinary text everywhere and are left out.
MIN_LINE_CHARS = 6


def _mask_candidates(values: Iterable[str]) -> list[str]:
    found: set[str] = set()
    for value in values:
        if not value:
            continue
        found.add(value)
        if "\n" in value or "\r" in value:
            found.update(line.strip() for line in value.splitlines() if len(line.strip()) >= MIN_LINE_CHARS)
    return sorted(found, key=len, reverse=True)  # the longest first: a line never splits its value


def secrets_mask(text: str, *, values: Iterable[str], is_tail: bool = False) -> str:
    """``text`` with every occurrence of a secret's value (and of each line of a multi-line
    one) replaced by ``***``.

    For what a program that was given secrets printed (an agent command's output and result):
    its output is stored and shown, the values it was given never are (I7). ``is_tail``: the
    text is the end of a longer output, so it may begin in the middle of a value; a start
    that is the end of a value (``MIN_LINE_CHARS`` or longer) is masked too.
    """
    candidates = _mask_candidates(values)
    for candidate in candidates:
        text = text.replace(candidate, MASK)
    head = text[:MIN_LINE_CHARS]
    if is_tail and len(head) == MIN_LINE_CHARS:
        for candidate in candidates:  # the longest end of a value the text starts with
            start = candidate.find(head, 1)
            while start != -1:
                if text.startswith(candidate[start:]):
                    return MASK + text[len(candidate) - start :]
                start = candidate.find(head, start + 1)
    return text
