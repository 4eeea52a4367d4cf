"""Git sources: a namespace's pipeline code at a repository's ref, synced into revisions.

``source_apply`` records where the code is: a repository URL, a ref (a branch, a tag or a
commit), a sub-directory, and the *name* of a secret of the namespace that holds a token for
an http(s) repository (its value is read only while git runs, and never stored, logged or
answered). ``source_sync`` asks the repository which commit the ref names now (one ``git
ls-remote``); when that is the commit synced last, nothing else happens. Otherwise it exports
the commit's tree into a temporary directory and materializes it as a revision
(``revisions.revision_materialize``), activated when the source says so.

A sync that fails (the repository cannot be reached, the ref does not exist, the credential
is refused, the code does not import or defines no pipeline) records why on the source
(``error``, ``error_at``), changes nothing else (the pipelines keep their active revisions),
and raises ``SourceSyncFailed``, which the API answers with a 400 naming the cause.

No database transaction is held while git or the describe subprocess runs: the source is read,
git runs, and the outcome is written in one short transaction of its own.
"""

from __future__ import annotations

import copy
import logging
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import QuerySet
from django.utils import timezone
from graphene_sdk._secrets import secret_name_error
from graphene_sdk.validation import dns_label_problem

from apps.core import access, audit
from apps.core.errors import Conflict, GrapheneError, NotFound, ValidationFailed
from apps.pipelines.delivery import gitsource, revisions
from apps.pipelines.models import Revision, Source
from apps.secrets.models import Secret
from apps.secrets.services import how_to_create, secret_resolve

logger = logging.getLogger(__name__)

# The columns' bounds (models.Source), checked before a row is written.
MAX_URL = 1000
MAX_REF = 255
MAX_SUBDIRECTORY = 500


class SourceSyncFailed(GrapheneError):
    """A sync that made no revision: ``detail`` says why and what to do (never a credential's
    value); ``code`` is the cause's (``unreachable``, ``ref_not_found``, ``credential_refused``,
    ``revision_refused``, ...: gitsource's and the revisions'). The source records it too."""

    status_code = 400
    code = "sync_failed"


@dataclass
class Applied:
    source: Source
    created: bool
    changed: bool  # false: applied as it already was (nothing written)


@dataclass
class Synced:
    source: Source
    revision: Revision
    new: bool  # false: the ref still names the commit synced last; nothing was exported
    created: bool  # a revision was made (false: the namespace had one of the same files)
    activated: list[str] = field(default_factory=list)


# --- writing --------------------------------------------------------------------------------------


def _invalid(name: str, message: str) -> ValidationFailed:
    return ValidationFailed(f"{name}: {message}", fields={name: [message]})


def _checked(
    *, name: Any, url: Any, ref: Any, subdirectory: Any, credential: Any, activate: Any
) -> tuple[str, str, str, str, str, bool]:
    """The settings of a source, each checked (a field error naming the first that is wrong)."""
    problem = dns_label_problem(name)
    if problem is not None:
        raise _invalid("name", problem)
    for key, value in (("url", url), ("ref", ref), ("subdirectory", subdirectory), ("credential", credential)):
        if not isinstance(value, str):
            raise _invalid(key, f"must be a string, not {type(value).__name__}")
    if not isinstance(activate, bool):
        raise _invalid("activate", f"must be true or false, not {type(activate).__name__}")
    for key, value, bound in (
        ("url", url, MAX_URL),
        ("ref", ref, MAX_REF),
        ("subdirectory", subdirectory, MAX_SUBDIRECTORY),
    ):
        if len(value) > bound:
            raise _invalid(key, f"is {len(value)} characters long; at most {bound}")
    if credential:
        error = secret_name_error(credential)
        if error is not None:
            raise _invalid("credential", f"the name of a secret: {error}")
    try:
        gitsource.check_url(url)
    except gitsource.SourceError as exc:
        raise _invalid("url", exc.detail) from None
    if credential:
        try:
            gitsource.check_url(url, with_credentials=True)
        except gitsource.SourceError as exc:
            raise _invalid("credential", exc.detail) from None
    try:
        ref = gitsource.check_ref(ref)
    except gitsource.SourceError as exc:
        raise _invalid("ref", exc.detail) from None
    try:
        subdirectory = gitsource.check_subdirectory(subdirectory)
    except gitsource.SourceError as exc:
        raise _invalid("subdirectory", exc.detail) from None
    return name, url, ref, subdirectory, credential, activate


def source_audited(source: Source) -> dict[str, Any]:
    """What the audit trail's digests cover of a source: its settings and what it synced."""
    return {
        "id": source.pk,
        "namespace": source.namespace,
        "name": source.name,
        "url": source.url,
        "ref": source.ref,
        "subdirectory": source.subdirectory,
        "credential": source.credential,  # a secret's name
        "activate": source.activate,
        "commit": source.commit,
        "revision": source.revision_id,
    }


def _audit(
    action: str, source: Source, *, actor: Any, before: Source | None, after: Source | None, **detail: Any
) -> None:
    audit.audit_write(
        action=action,
        resource="sources",
        object_id=source.pk,
        object_name=source.name,
        namespace=source.namespace,
        before=source_audited(before) if before is not None else None,
        after=source_audited(after) if after is not None else None,
        detail=detail,
        actor=actor,
    )


def source_apply(
    *,
    namespace: str,
    name: str,
    url: str,
    ref: str,
    subdirectory: str = "",
    credential: str = "",
    activate: bool = True,
    actor: Any,
) -> Applied:
    """Create the git source ``name`` of ``namespace``, or change it to these settings.

    ``credential``: the name of a secret of the namespace holding a token or password for an
    http(s) repository (it must exist; its value is read by ``source_sync`` only). A change of
    the URL or the sub-directory, or ``activate`` turned on, makes the next sync export the
    commit again even if the ref still names it. Nothing runs git here."""
    name, url, ref, subdirectory, credential, activate = _checked(
        name=name, url=url, ref=ref, subdirectory=subdirectory, credential=credential, activate=activate
    )
    access.namespace_check(namespace)
    if credential:
        access.require_actor(actor, "read_secret_names", "secrets", namespace)
        if not Secret.objects.filter(namespace=namespace, name=credential).exists():
            message = f"no secret {credential!r} in namespace {namespace!r}"
            raise ValidationFailed(
                f"credential: {message}; {how_to_create(credential)} (with ?namespace={namespace})",
                fields={"credential": [message]},
            )
    settings = {"url": url, "ref": ref, "subdirectory": subdirectory, "credential": credential, "activate": activate}
    for _ in range(2):  # a concurrent create of the same name wins the insert: then change it
        with transaction.atomic():
            source = Source.objects.select_for_update().filter(namespace=namespace, name=name).first()
            if source is not None:
                access.require_actor(actor, "update", "sources", namespace)
                if all(getattr(source, key) == value for key, value in settings.items()):
                    return Applied(source=source, created=False, changed=False)
                before = copy.copy(source)
                if (source.url, source.subdirectory) != (url, subdirectory) or (activate and not source.activate):
                    source.commit = ""  # what was synced no longer describes the source: export again
                for key, value in settings.items():
                    setattr(source, key, value)
                source.save()
                _audit("source.update", source, actor=actor, before=before, after=source)
                logger.info("source %s changed: %s at %s", source, url, ref)
                return Applied(source=source, created=False, changed=True)
        access.require_actor(actor, "create", "sources", namespace)
        who = actor if actor is not None and getattr(actor, "is_authenticated", False) else None
        try:
            with transaction.atomic():
                source = Source.objects.create(namespace=namespace, name=name, created_by=who, **settings)
                _audit("source.create", source, actor=actor, before=None, after=source)
        except IntegrityError:
            continue
        logger.info("source %s created: %s at %s", source, url, ref)
        return Applied(source=source, created=True, changed=True)
    raise Conflict(f"source {name!r} is being written concurrently; try again")


def source_delete(*, source: Source, actor: Any) -> None:
    """Delete a source. Its revisions stay (they no longer name it), and the pipelines keep
    their active revisions."""
    access.require_actor(actor, "delete", "sources", source.namespace)
    with transaction.atomic():
        row = Source.objects.select_for_update().filter(pk=source.pk).first()
        if row is None:
            raise NotFound(f"no source {source.name!r} in namespace {source.namespace!r}")
        _audit("source.delete", row, actor=actor, before=row, after=None)
        row.delete()
    logger.info("source %s deleted", source)


# --- syncing --------------------------------------------------------------------------------------


def _credentials(source: Source) -> gitsource.Credentials | None:
    """The source's credential, read from the secret store now (for this sync only)."""
    if not source.credential:
        return None
    return gitsource.token_credentials(secret_resolve(name=source.credential, namespace=source.namespace))


def source_sync(*, source: Source, actor: Any) -> Synced:
    """Bring the source's revision up to what its ref names now (see the module's docstring).

    Call outside a transaction: git and the describe subprocess run here."""
    namespace = source.namespace
    access.require_actor(actor, "update", "sources", namespace)
    access.require_actor(actor, "create", "revisions", namespace)
    source = Source.objects.select_related("revision").filter(pk=source.pk).first() or _gone(source)
    if source.activate:
        access.require_actor(actor, "update", "pipelines", namespace)
    if not source.url:
        raise ValidationFailed(
            f"source {source.name!r} has no repository URL: it takes pushed directories, and there is nothing to sync",
            code="no_repository",
        )
    try:
        credentials = _credentials(source)
        commit = gitsource.resolve(source.url, source.ref, credentials)
        if commit == source.commit and source.revision is not None:
            return _synced(source, commit=commit, revision=source.revision, new=False, created=False, actor=actor)
        with tempfile.TemporaryDirectory(prefix="graphene-source-") as scratch:
            tree = Path(scratch)
            gitsource.export(
                source.url,
                commit,
                tree,
                subdirectory=source.subdirectory,
                credentials=credentials,
                max_bytes=revisions.max_bytes(),
            )
            materialized = revisions.revision_materialize(
                tree=tree, namespace=namespace, actor=actor, source=source, commit=commit, activate=source.activate
            )
    except access.AccessDenied:
        raise  # the caller's rights, not the source's fault: nothing to record on it
    except (gitsource.SourceError, GrapheneError) as exc:
        raise _failed(source, exc, actor=actor) from None
    return _synced(
        source,
        commit=commit,
        revision=materialized.revision,
        new=True,
        created=materialized.created,
        activated=materialized.activated,
        actor=actor,
    )


def _gone(source: Source) -> Source:
    raise NotFound(f"no source {source.name!r} in namespace {source.namespace!r} (it was deleted)")


def _synced(
    source: Source,
    *,
    commit: str,
    revision: Revision,
    new: bool,
    created: bool,
    actor: Any,
    activated: list[str] | None = None,
) -> Synced:
    """Record a sync that worked: the commit, its revision, when; the error cleared."""
    with transaction.atomic():
        row = Source.objects.select_for_update().filter(pk=source.pk).first() or _gone(source)
        if (row.url, row.ref, row.subdirectory) != (source.url, source.ref, source.subdirectory):
            raise Conflict(
                f"source {source.name!r} was changed while it synced (revision {revision.short} was made of "
                f"commit {commit[:12]} of the settings before); sync it again"
            )
        before = copy.copy(row)
        row.commit = commit
        row.revision = revision
        row.synced_at = timezone.now()
        row.error = ""
        row.error_at = None
        row.save(update_fields=["commit", "revision", "synced_at", "error", "error_at", "updated_at"])
        _audit(
            "source.sync",
            row,
            actor=actor,
            before=before,
            after=row,
            new=new,
            revision=revision.digest,
            activated=activated or [],
        )
    if new:
        logger.info(
            "source %s synced: commit %s is revision %s%s",
            row,
            commit[:12],
            revision.short,
            f", activated {', '.join(activated)}" if activated else "",
        )
    return Synced(source=row, revision=revision, new=new, created=created, activated=list(activated or []))


def _failed(source: Source, exc: Exception, *, actor: Any) -> SourceSyncFailed:
    """Record why a sync failed on the source; the error to raise."""
    detail = str(getattr(exc, "detail", exc))
    code = str(getattr(exc, "code", "") or SourceSyncFailed.code)
    with transaction.atomic():
        row = Source.objects.select_for_update().filter(pk=source.pk).first()
        if row is not None:
            before = copy.copy(row)
            row.error = detail
            row.error_at = timezone.now()
            row.save(update_fields=["error", "error_at", "updated_at"])
            _audit("source.sync", row, actor=actor, before=before, after=row, failed=code)
    logger.warning("source %s: sync failed (%s): %s", source, code, detail.splitlines()[0] if detail else "")
    return SourceSyncFailed(
        f"source {source.name!r} was not synced (its pipelines keep their active revisions): {detail}",
        code=code,
    )


# --- reading --------------------------------------------------------------------------------------


def source_list(*, user: Any, namespace: str | None = None) -> QuerySet[Source]:
    """The sources in the namespaces where ``user`` may list them (``namespace``: that one)."""
    qs = access.scope(Source.objects.all(), user, "list", "sources")
    if namespace:
        qs = qs.filter(namespace=namespace)
    return qs.select_related("revision", "created_by")


def source_get(*, user: Any, name: str, namespace: str) -> Source:
    source = access.scope(Source.objects.all(), user, "get", "sources").filter(namespace=namespace, name=name).first()
    if source is None:
        raise NotFound(f"no source {name!r} in namespace {namespace!r}")
    return source
