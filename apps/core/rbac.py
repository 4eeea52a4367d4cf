"""Writes of the access model: namespaces, custom roles and role bindings.

Every write names its actor and is checked here (the access module's ``require``), so the API,
graphenectl and the Studio all get the same answer. Reads are in ``apps.core.selectors``.
"""

from __future__ import annotations

import re
from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.db import IntegrityError, transaction
from django.db.models import Q

from apps.core import access, audit
from apps.core.errors import Conflict, NotFound, ValidationFailed
from apps.core.models import Namespace, Role, RoleBinding

NAME = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")

# A record's tombstone: ``apps.records.choices.Phase.DELETED`` (core imports no app above it).
TOMBSTONE_PHASE = "deleted"

# What a namespace may still hold that keeps it from being deleted, and which of it counts. A
# record's tombstone is history, not something left in the namespace: it stays, with its events,
# until the tombstones' purge (GRAPHENE_TOMBSTONE_RETENTION_DAYS). A record being deleted (its
# deletion requested, ``deleting``, ``delete_failed``) is still there and counts.
NAMESPACE_HOLDERS: tuple[tuple[str, Q], ...] = (
    ("records.Record", ~Q(phase=TOMBSTONE_PHASE)),
    ("pipelines.Run", Q()),
    ("pipelines.Pipeline", Q()),
    ("pipelines.Source", Q()),
    ("secrets.Secret", Q()),
)


def _audit(
    action: str,
    resource: str,
    object_id: Any,
    object_name: str,
    *,
    actor: Any,
    namespace: str = audit.EVERYWHERE,
    before: dict[str, Any] | None = None,
    after: dict[str, Any] | None = None,
    **detail: Any,
) -> None:
    """The audit row of a change to who may do what (namespaces and roles are installation-wide:
    their rows are in ``*``; a binding's are in its namespace)."""
    audit.audit_write(
        action=action,
        resource=resource,
        object_id=object_id,
        object_name=object_name,
        namespace=namespace,
        before=before,
        after=after,
        detail=detail,
        actor=actor,
    )


def _namespace(namespace: Namespace) -> dict[str, Any]:
    return {"name": namespace.name, "description": namespace.description}


def _role(role: Role) -> dict[str, Any]:
    return {"name": role.name, "description": role.description, "rules": role.rules}


def _binding(binding: RoleBinding) -> dict[str, Any]:
    return {
        "role": binding.role.name,
        "namespace": binding.namespace,
        "user": binding.user.get_username() if binding.user is not None else None,
        "group": binding.group.name if binding.group is not None else None,
    }


def _binding_name(binding: RoleBinding) -> str:
    subject = f"user {binding.user.get_username()}" if binding.user is not None else f"group {binding.group}"
    return f"{binding.role.name} for {subject}"


def _check_name(name: str, *, field: str, noun: str) -> None:
    if not isinstance(name, str) or not NAME.match(name):
        raise ValidationFailed(
            f"{noun} name {name!r}: use 1-63 lowercase letters, digits and '-', starting and ending "
            "with a letter or digit",
            fields={field: ["lowercase letters, digits and '-' (at most 63)"]},
        )


@transaction.atomic
def namespace_create(*, name: str, description: str = "", actor: Any) -> Namespace:
    """A new namespace (needs ``create namespaces``, bound in ``*``)."""
    access.require_actor(actor, "create", "namespaces", None)
    _check_name(name, field="name", noun="namespace")
    if Namespace.objects.filter(name=name).exists():
        raise Conflict(f"namespace {name!r} already exists")
    namespace = Namespace.objects.create(
        name=name, description=description, created_by=actor if actor is not None else None
    )
    _audit("namespace.create", "namespaces", namespace.pk, name, actor=actor, after=_namespace(namespace))
    return namespace


@transaction.atomic
def namespace_delete(*, name: str, actor: Any) -> None:
    """Delete an empty namespace and its bindings. One that still holds something it names
    (records that are not tombstones, runs, pipelines, sources, secrets) is refused, counting what is
    left (``NAMESPACE_HOLDERS``)."""
    from django.apps import apps

    access.require_actor(actor, "delete", "namespaces", None)
    if name == access.DEFAULT_NAMESPACE:
        raise Conflict("the default namespace cannot be deleted")
    namespace = Namespace.objects.filter(name=name).first()
    if namespace is None:
        raise NotFound(f"no namespace {name!r}")
    left = []
    for label, counted in NAMESPACE_HOLDERS:
        model = apps.get_model(label)
        count = model.objects.filter(counted, namespace=name).count()
        if count:
            noun = model._meta.verbose_name if count == 1 else model._meta.verbose_name_plural
            left.append(f"{count} {noun}")
    if left:
        raise Conflict(f"namespace {name!r} still holds {', '.join(left)}; delete them first")
    bindings = RoleBinding.objects.filter(namespace=name)
    unbound = sorted(bindings.values_list("pk", flat=True))
    _audit(
        "namespace.delete",
        "namespaces",
        namespace.pk,
        name,
        actor=actor,
        before=_namespace(namespace),
        bindings_deleted=unbound,
    )
    bindings.delete()
    namespace.delete()
    access.namespace_forget(name)


def _check_rules(rules: Any) -> list[dict[str, list[str]]]:
    if not isinstance(rules, list) or not rules:
        raise ValidationFailed("rules: a non-empty list of {verbs, resources}", fields={"rules": ["a non-empty list"]})
    clean = []
    for index, rule in enumerate(rules):
        where = f"rules[{index}]"
        if not isinstance(rule, dict) or set(rule) != {"verbs", "resources"}:
            raise ValidationFailed(f"{where}: an object with verbs and resources", fields={where: ["verbs, resources"]})
        for key, known in (("verbs", access.VERBS), ("resources", access.RESOURCES)):
            values = rule[key]
            if not isinstance(values, list) or not values or not all(isinstance(v, str) for v in values):
                raise ValidationFailed(
                    f"{where}.{key}: a non-empty list of names", fields={f"{where}.{key}": ["names"]}
                )
            unknown = sorted(set(values) - {*known, access.ANY})
            if unknown:
                raise ValidationFailed(
                    f"{where}.{key}: unknown {key} {unknown}; known: {', '.join(known)} (or *)",
                    fields={f"{where}.{key}": [f"unknown: {', '.join(unknown)}"]},
                )
        clean.append({"verbs": list(rule["verbs"]), "resources": list(rule["resources"])})
    return clean


@transaction.atomic
def role_create(*, name: str, rules: Any, description: str = "", actor: Any) -> Role:
    """A custom role: additive rules of verbs by resources."""
    access.require_actor(actor, "create", "roles", None)
    _check_name(name, field="name", noun="role")
    clean = _check_rules(rules)
    if Role.objects.filter(name=name).exists():
        raise Conflict(f"role {name!r} already exists")
    role = Role.objects.create(name=name, rules=clean, description=description)
    _audit("role.create", "roles", role.pk, name, actor=actor, after=_role(role))
    return role


@transaction.atomic
def role_delete(*, name: str, actor: Any) -> None:
    access.require_actor(actor, "delete", "roles", None)
    role = Role.objects.filter(name=name).first()
    if role is None:
        raise NotFound(f"no role {name!r}")
    if role.is_builtin:
        raise Conflict(f"role {name!r} is built in; it cannot be deleted")
    if role.bindings.exists():
        raise Conflict(f"role {name!r} is bound {role.bindings.count()} time(s); unbind it first")
    _audit("role.delete", "roles", role.pk, name, actor=actor, before=_role(role))
    role.delete()


def _subject(user: str | None, group: str | None) -> tuple[Any, Group | None]:
    if (user is None) == (group is None):
        raise ValidationFailed("bind exactly one of user or group", fields={"user": ["one of user, group"]})
    if user is not None:
        found = get_user_model().objects.filter(username=user).first()
        if found is None:
            raise NotFound(f"no user {user!r}", fields={"user": [f"no user {user!r}"]})
        return found, None
    found_group = Group.objects.filter(name=group).first()
    if found_group is None:
        raise NotFound(f"no group {group!r}", fields={"group": [f"no group {group!r}"]})
    return None, found_group


@transaction.atomic
def role_bind(
    *, role: str, namespace: str, user: str | None = None, group: str | None = None, actor: Any
) -> tuple[RoleBinding, bool]:
    """Bind ``role`` to a user or a group in ``namespace`` (``*``: every namespace). Needs
    ``create rolebindings`` where the binding applies; binding again is a no-op (``created`` False)."""
    access.require_actor(actor, "create", "rolebindings", None if namespace == access.EVERY_NAMESPACE else namespace)
    found_role = Role.objects.filter(name=role).first()
    if found_role is None and role in access.BUILTIN_ROLES:
        access.builtins_ensure()
        found_role = Role.objects.filter(name=role).first()
    if found_role is None:
        known = ", ".join(Role.objects.values_list("name", flat=True))
        raise NotFound(f"no role {role!r} (roles: {known})", fields={"role": [f"no role {role!r}"]})
    if namespace != access.EVERY_NAMESPACE:
        access.namespace_check(namespace)
    subject_user, subject_group = _subject(user, group)
    try:
        with transaction.atomic():
            binding, created = RoleBinding.objects.get_or_create(
                role=found_role,
                namespace=namespace,
                user=subject_user,
                group=subject_group,
                defaults={"created_by": actor if actor is not None else None},
            )
    except IntegrityError:  # a concurrent identical bind won
        binding = RoleBinding.objects.get(role=found_role, namespace=namespace, user=subject_user, group=subject_group)
        created = False
    if created:  # binding again changes nothing, and is no row
        _audit(
            "rolebinding.create",
            "rolebindings",
            binding.pk,
            _binding_name(binding),
            namespace=namespace,
            actor=actor,
            after=_binding(binding),
        )
    return binding, created


@transaction.atomic
def role_unbind(*, binding_id: int, actor: Any) -> None:
    binding = RoleBinding.objects.filter(pk=binding_id).first()
    if binding is None:
        raise NotFound(f"no role binding {binding_id}")
    access.require_actor(
        actor, "delete", "rolebindings", None if binding.namespace == access.EVERY_NAMESPACE else binding.namespace
    )
    _audit(
        "rolebinding.delete",
        "rolebindings",
        binding.pk,
        _binding_name(binding),
        namespace=binding.namespace,
        actor=actor,
        before=_binding(binding),
    )
    binding.delete()
