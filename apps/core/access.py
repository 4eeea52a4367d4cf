"""Who may do what: the one place that answers ``may(actor, verb, resource, namespace)`` and
narrows querysets to what an actor may see.

Everything a user names lives in a namespace. A user (service accounts are users too) gets
rights only from role bindings: a role is a set of additive rules, verb by resource, and a
binding grants it in one namespace or in every namespace (``*``). Superusers may everything.
Nothing here is cached across requests: the bindings are read once per request (one query,
however many bindings there are) and kept on the user object for that request; a long-lived
websocket re-reads them after ``GRANTS_TTL_SECONDS``.

REST views declare their rules (``access_resource`` and ``access_verbs``) and go through
``apps.api.permissions.AccessPermission``; selectors narrow with ``scope``; services and views
acting on one object call ``require``. tests/access walks every route and proves it.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import json
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, Final, TypeVar

from django.db.models import Model, QuerySet

from apps.core.errors import GrapheneError

DEFAULT_NAMESPACE: Final = "default"
EVERY_NAMESPACE: Final = "*"
ANY: Final = "*"
GRANTS_TTL_SECONDS = 5.0

# The verbs rules speak of. ``get``/``list``/``watch`` read; the rest change something.
VERBS: Final = (
    "get",
    "list",
    "watch",
    "create",
    "update",
    "delete",
    "start",
    "cancel",
    "resume",
    "exec",
    "open_terminal",
    "read_secret_names",
)
READ_VERBS: Final = frozenset({"get", "list", "watch"})

# Resources in a namespace, then the installation-wide ones (bound with namespace ``*``).
NAMESPACED_RESOURCES: Final = (
    "records",
    "runs",
    "pipelines",
    "sources",
    "revisions",
    "stands",
    "secrets",
    "agents",
    "artifacts",
    "accounts",
    "audit",
    "rolebindings",
)
CLUSTER_RESOURCES: Final = ("namespaces", "roles", "users")
RESOURCES: Final = (*NAMESPACED_RESOURCES, *CLUSTER_RESOURCES)

_READ = ["get", "list", "watch"]
_WORKLOADS = ["records", "runs", "pipelines", "sources", "revisions", "stands", "agents", "artifacts"]

# The built-in roles, made by a migration (apps/core/migrations) and refused changes by the API.
BUILTIN_ROLES: Final[dict[str, dict[str, Any]]] = {
    "admin": {
        "description": "everything in the namespace it is bound in (everything everywhere when bound in *)",
        "rules": [{"verbs": [ANY], "resources": [ANY]}],
    },
    "developer": {
        "description": "read everything but the audit trail and accounts; start, cancel and resume runs; "
        "declare, change and delete records, stands and artifacts; deliver pipeline code (sources, "
        "revisions, activation); run commands on agents; store secrets and list their names (no "
        "terminals, no accounts or bindings)",
        "rules": [
            {"verbs": _READ, "resources": _WORKLOADS},
            {
                "verbs": ["create", "update", "delete"],
                "resources": ["records", "stands", "artifacts", "secrets", "sources", "revisions"],
            },
            {"verbs": ["update"], "resources": ["pipelines"]},
            {"verbs": ["start", "cancel", "resume"], "resources": ["runs"]},
            {"verbs": ["exec"], "resources": ["agents"]},
            {"verbs": ["read_secret_names"], "resources": ["secrets"]},
        ],
    },
    # Not the audit trail: its rows name secrets, accounts and role bindings, none of which a
    # viewer may read (an admin binds a custom role with list audit for an auditor).
    "viewer": {
        "description": "read records, runs, pipelines, sources, revisions, stands, agents and artifacts; "
        "change nothing",
        "rules": [{"verbs": _READ, "resources": _WORKLOADS}],
    },
    "agent-installer": {
        "description": "see agents and enroll new machines (declare an agent and get its install token)",
        "rules": [{"verbs": [*_READ, "create"], "resources": ["agents"]}],
    },
}


class AccessDenied(GrapheneError):
    """The actor is known but no role bound to them grants the verb (403)."""

    status_code = 403
    code = "permission_denied"


class UnknownNamespace(GrapheneError):
    status_code = 404
    code = "not_found"


Pair = tuple[str, str]


@dataclass(frozen=True)
class Grants:
    """What one actor may do: verb by resource pairs everywhere and per namespace."""

    superuser: bool = False
    everywhere: frozenset[Pair] = frozenset()
    by_namespace: dict[str, frozenset[Pair]] = field(default_factory=dict)
    loaded_at: float = 0.0

    def allows(self, verb: str, resource: str, namespace: str | None) -> bool:
        if self.superuser or _covers(self.everywhere, verb, resource):
            return True
        if namespace is None or namespace == EVERY_NAMESPACE:
            return False
        return _covers(self.by_namespace.get(namespace, frozenset()), verb, resource)

    def namespaces(self, verb: str, resource: str) -> frozenset[str] | None:
        """The namespaces where ``verb`` on ``resource`` is allowed; ``None`` means all of them."""
        if self.superuser or _covers(self.everywhere, verb, resource):
            return None
        return frozenset(ns for ns, pairs in self.by_namespace.items() if _covers(pairs, verb, resource))

    def bound_namespaces(self) -> frozenset[str] | None:
        """The namespaces the actor holds any binding in; ``None``: all (bound in ``*``)."""
        if self.superuser or self.everywhere:
            return None
        return frozenset(self.by_namespace)

    def anywhere(self, verb: str, resource: str) -> bool:
        found = self.namespaces(verb, resource)
        return found is None or bool(found)


NO_GRANTS = Grants()


def _covers(pairs: frozenset[Pair], verb: str, resource: str) -> bool:
    return (verb, resource) in pairs or (ANY, resource) in pairs or (verb, ANY) in pairs or (ANY, ANY) in pairs


def _pairs(rules: Iterable[dict[str, Any]]) -> set[Pair]:
    out: set[Pair] = set()
    for rule in rules:
        for verb in rule.get("verbs", []):
            for resource in rule.get("resources", []):
                out.add((verb, resource))
    return out


@functools.lru_cache(maxsize=512)
def _parsed_rules(text: str) -> frozenset[Pair]:
    """A role's rules, as the JSON text the database returns, as pairs. Memoized on the text
    itself: a pure parse, not a cache of anyone's rights (changed rules are other text)."""
    return frozenset(_pairs(json.loads(text) or []))


@functools.cache
def _bindings_sql() -> str:
    """The SQL of the actor's bindings: each binding of the user or of a group they belong to,
    with its role's rules (as JSON text), in one round trip.

    Written out rather than built with the ORM because every request of a bound user runs it:
    compiling the equivalent queryset cost ~0.6 ms of CPU, several times the query itself
    (bench/authz_overhead.py). The groups are a sub-select on the membership table, not a join
    through ``auth_group``, so each binding comes once and no ``DISTINCT`` (a sort) is needed.
    Plain SQL that PostgreSQL and SQLite (embedded mode) both run."""
    from django.contrib.auth import get_user_model
    from django.db import connection

    from apps.core.models import Role, RoleBinding

    q = connection.ops.quote_name
    memberships = get_user_model().groups.through._meta.db_table
    # Only the models' own table names are formatted in; the user's id goes as a parameter.
    return (
        f"SELECT b.namespace, b.role_id, r.rules FROM {q(RoleBinding._meta.db_table)} b "  # noqa: S608
        f"JOIN {q(Role._meta.db_table)} r ON r.id = b.role_id "
        f"WHERE b.user_id = %s OR b.group_id IN (SELECT m.group_id FROM {q(memberships)} m WHERE m.user_id = %s)"
    )


def grants_load(user: Any) -> Grants:
    """Read the actor's bindings (one query, whatever their number) into ``Grants``."""
    from django.db import connection

    if user is None or not getattr(user, "is_authenticated", False) or not getattr(user, "is_active", True):
        return NO_GRANTS
    if getattr(user, "is_superuser", False):
        return Grants(superuser=True, loaded_at=time.monotonic())
    with connection.cursor() as cursor:
        cursor.execute(_bindings_sql(), [user.pk, user.pk])
        rows = cursor.fetchall()
    # Many bindings share a few roles: each role's rules are parsed once (and the same text not
    # again), and each namespace's pairs are the union of its distinct roles' pairs in one call.
    rules_of: dict[Any, Any] = {}
    roles_in: dict[str, set[Any]] = {}
    for namespace, role_id, rules in rows:
        rules_of[role_id] = rules
        roles_in.setdefault(namespace, set()).add(role_id)
    pairs_of = {
        role_id: _parsed_rules(rules) if isinstance(rules, str) else frozenset(_pairs(rules or []))
        for role_id, rules in rules_of.items()
    }
    merged = {ns: frozenset().union(*(pairs_of[r] for r in role_ids)) for ns, role_ids in roles_in.items()}
    return Grants(
        everywhere=merged.pop(EVERY_NAMESPACE, frozenset()),
        by_namespace=merged,
        loaded_at=time.monotonic(),
    )


def grants(user: Any) -> Grants:
    """The actor's grants, read once per request (kept on the user object, which Django and
    Channels make per request/connection) and again after ``GRANTS_TTL_SECONDS``."""
    cached: Grants | None = getattr(user, "_graphene_grants", None)
    if cached is not None and time.monotonic() - cached.loaded_at < GRANTS_TTL_SECONDS:
        return cached
    loaded = grants_load(user)
    if user is not None and getattr(user, "is_authenticated", False):
        # An object that takes no attributes is read again next time.
        with contextlib.suppress(AttributeError):
            user._graphene_grants = loaded
    return loaded


def grants_forget(user: Any) -> None:
    """Drop the cached grants (after changing this user's bindings in the same request)."""
    if hasattr(user, "_graphene_grants"):
        del user._graphene_grants


def may(actor: Any, verb: str, resource: str, namespace: str | None) -> bool:
    """Whether ``actor`` may ``verb`` a ``resource`` in ``namespace`` (``None`` or ``*``: the
    installation-wide resources, which need a binding in every namespace)."""
    return grants(actor).allows(verb, resource, namespace)


M = TypeVar("M", bound=Model)


def scope(queryset: QuerySet[M], actor: Any, verb: str, resource: str, *, field: str = "namespace") -> QuerySet[M]:
    """``queryset`` narrowed to the rows in namespaces where ``actor`` may ``verb`` ``resource``."""
    namespaces = grants(actor).namespaces(verb, resource)
    if namespaces is None:
        return queryset
    if not namespaces:
        return queryset.none()
    return queryset.filter(**{f"{field}__in": sorted(namespaces)})


def visible_namespaces(actor: Any, verb: str, resource: str) -> frozenset[str] | None:
    return grants(actor).namespaces(verb, resource)


def _who(actor: Any) -> str:
    return str(getattr(actor, "username", "") or "this caller")


def denial(actor: Any, verb: str, resource: str, namespace: str | None) -> AccessDenied:
    where = "in every namespace" if namespace in (None, EVERY_NAMESPACE) else f"in namespace {namespace!r}"
    ns = EVERY_NAMESPACE if namespace in (None, EVERY_NAMESPACE) else namespace
    return AccessDenied(
        f"{_who(actor)} may not {verb} {resource} {where}: no role bound to them there grants it "
        f"(an admin can bind one: graphenectl role bind ROLE --user {_who(actor)} -n {ns})"
    )


def require(actor: Any, verb: str, resource: str, namespace: str | None) -> None:
    """Raise ``AccessDenied`` (403) unless ``may(actor, verb, resource, namespace)``."""
    if not may(actor, verb, resource, namespace):
        raise denial(actor, verb, resource, namespace)


def require_actor(actor: Any, verb: str, resource: str, namespace: str | None) -> None:
    """``require`` for services: ``actor`` is the person (or service account) asking, or ``None``
    when Graphene acts on its own (the engine, the reconciler, beat), which nothing narrows."""
    if actor is not None:
        require(actor, verb, resource, namespace)


_acting: contextvars.ContextVar[str] = contextvars.ContextVar("graphene_acting_namespace", default=DEFAULT_NAMESPACE)


@contextlib.contextmanager
def acting_in(namespace: str) -> Iterator[None]:
    """While a run's code executes: the namespace its reads of secrets and the like stay in."""
    reset = _acting.set(namespace)
    try:
        yield
    finally:
        _acting.reset(reset)


def acting_namespace() -> str:
    """The namespace of the run whose code is executing here (``default`` outside any run)."""
    return _acting.get()


_known: dict[str, float] = {}
_KNOWN_TTL_SECONDS = 30.0


def namespace_check(name: str) -> str:
    """``name`` if that namespace exists, else a 404 saying how to make it. Existing names are
    remembered for a while in this process (namespaces are made rarely and never renamed)."""
    from apps.core.models import Namespace

    if name == DEFAULT_NAMESPACE:
        return name  # always there (made again by ``builtins_ensure`` if its row was lost)
    seen = _known.get(name)
    if seen is not None and time.monotonic() - seen < _KNOWN_TTL_SECONDS:
        return name
    if not Namespace.objects.filter(name=name).exists():
        raise UnknownNamespace(
            f"no namespace {name!r} (an admin makes it: graphenectl namespace create {name})",
            fields={"namespace": [f"no namespace {name!r}"]},
        )
    _known[name] = time.monotonic()
    return name


def builtins_ensure() -> None:
    """Make the built-in roles and the default namespace if their rows are missing (a database
    emptied by hand or by a test's flush; the first migration makes them)."""
    from apps.core.models import Namespace, Role

    Namespace.objects.get_or_create(name=DEFAULT_NAMESPACE)
    for name, spec in BUILTIN_ROLES.items():
        Role.objects.get_or_create(
            name=name, defaults={"description": spec["description"], "rules": spec["rules"], "is_builtin": True}
        )


def namespace_forget(name: str) -> None:
    _known.pop(name, None)
