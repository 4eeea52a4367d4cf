"""Where a git credential's value comes from: the secret store, on the server, at the point of use.

One function (``credentials``) turns the secret *name* a spec or a step carries into the
``Credentials`` git needs. The value lives in memory for the duration of one git command and
is never written to a record, a journal entry, an event or a log (invariant I7).
"""

from __future__ import annotations

from typing import Any

from graphene_sdk._secrets import secret_ref_name

from kinds.git.cli import DEFAULT_USERNAME, Credentials, GitError


def secret_name(auth: Any) -> str | None:
    """The secret name in a spec's ``auth`` (``{"$secret": name}``), a bare name, or ``None``."""
    if auth is None:
        return None
    if isinstance(auth, str):
        return auth
    name = secret_ref_name(auth)
    if name is None:
        raise GitError('auth must be a secret reference, {"$secret": "<name>"}', permanent=True)
    return name


def credentials(auth: Any, username: str | None = None, *, namespace: str | None = None) -> Credentials | None:
    """The credentials named by ``auth``, read from Graphene's secret store; ``None`` without auth.

    The secret is read in ``namespace`` (a checkout's record's), or in the namespace of the run
    whose code is executing (a tag or push from a pipeline's step): never another namespace's.

    A missing secret is a permanent error naming it (never a value) and saying how to create it.
    """
    name = secret_name(auth)
    if name is None:
        return None
    try:
        from django.conf import settings

        settings.INSTALLED_APPS  # noqa: B018 - raises ImproperlyConfigured outside the server
        from apps.core.access import acting_namespace
        from apps.secrets.services import secret_resolve
    except Exception:
        raise GitError(
            f"secret {name!r} can only be read on the Graphene server (there is no secret store here)",
            permanent=True,
        ) from None
    try:
        value = secret_resolve(name=name, namespace=namespace or acting_namespace())
    except Exception as exc:  # SecretNotFound, an undecryptable value: the message names the secret
        raise GitError(f"cannot read secret {name!r} for git: {getattr(exc, 'detail', exc)}", permanent=True) from None
    try:
        return Credentials(username=username or DEFAULT_USERNAME, password=value.strip("\n"))
    except ValueError as exc:
        raise GitError(f"secret {name!r} cannot be used as a git password: {exc}", permanent=True) from None
