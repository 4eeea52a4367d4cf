"""What the access module reads for an actor: their own bindings and their groups', in one
query whatever their number, none for a superuser; and a request of a bound user makes the
same queries with one binding as with many (bench/authz_overhead.py measures the time)."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import AnonymousUser, Group
from django.db import connection
from django.test.utils import CaptureQueriesContext
from rest_framework.test import APIClient

from apps.core import access, rbac
from apps.core.models import Namespace
from apps.records import services
from apps.records.models import Record
from tests import factories
from tests.factories import api_token

pytestmark = pytest.mark.django_db

ROLES = ["admin", "developer", "viewer", "agent-installer"]


def namespaces(*names: str) -> None:
    for name in names:
        Namespace.objects.get_or_create(name=name)


def group_of(user: Any, name: str) -> str:
    """Put ``user`` in group ``name`` (made if missing); the name, for ``role_bind``."""
    group, _ = Group.objects.get_or_create(name=name)
    user.groups.add(group)
    return name


def loaded(user: Any) -> tuple[access.Grants, int]:
    """The user's grants read afresh, and how many queries reading them took."""
    with CaptureQueriesContext(connection) as queries:
        found = access.grants_load(user)
    return found, len(queries)


def pairs_of(role: str) -> frozenset[access.Pair]:
    rules = access.BUILTIN_ROLES[role]["rules"]
    return frozenset((verb, resource) for rule in rules for verb in rule["verbs"] for resource in rule["resources"])


def client_of(user: Any) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {api_token(user)}")
    return client


def test_grants_come_from_the_users_bindings_and_their_groups(django_user_model: Any) -> None:
    namespaces("team-a", "team-b", "team-c")
    ada = django_user_model.objects.create_user("ada")
    factories.bind(ada, "developer", "team-a")
    rbac.role_bind(role="viewer", namespace="team-b", group=group_of(ada, "readers"), actor=None)
    rbac.role_bind(role="agent-installer", namespace="*", group=group_of(ada, "fleet"), actor=None)

    grants, queries = loaded(ada)

    assert queries == 1
    assert grants.allows("start", "runs", "team-a")  # developer, bound directly
    assert grants.allows("get", "records", "team-b")  # viewer, through a group
    assert not grants.allows("delete", "records", "team-b")
    assert grants.allows("create", "agents", "team-c")  # agent-installer in every namespace, through a group
    assert not grants.allows("get", "records", "team-c")
    assert grants.namespaces("get", "records") == {"team-a", "team-b"}
    assert grants.namespaces("list", "agents") is None
    assert grants.everywhere == pairs_of("agent-installer")


def test_other_users_and_groups_bindings_grant_nothing(django_user_model: Any) -> None:
    namespaces("team-a", "team-b")
    ada = django_user_model.objects.create_user("ada")
    group_of(ada, "readers")  # a group of hers that holds no binding
    bob = django_user_model.objects.create_user("bob")
    factories.bind(bob, "admin", "team-a")
    rbac.role_bind(role="admin", namespace="team-b", group=group_of(bob, "ops"), actor=None)
    Group.objects.create(name="nobody")
    rbac.role_bind(role="admin", namespace="*", group="nobody", actor=None)
    services.record_create_root(kind="graphene.stand", name="s", namespace="team-a")

    grants, queries = loaded(ada)

    assert queries == 1
    assert not grants.everywhere
    assert not grants.by_namespace
    assert not grants.anywhere("get", "records")
    assert not access.scope(Record.objects.all(), ada, "get", "records").exists()


def test_a_role_bound_directly_and_through_groups_counts_once(django_user_model: Any) -> None:
    namespaces("team-a")
    ada = django_user_model.objects.create_user("ada")
    factories.bind(ada, "viewer", "team-a")
    rbac.role_bind(role="viewer", namespace="team-a", group=group_of(ada, "readers"), actor=None)
    rbac.role_bind(role="viewer", namespace="team-a", group=group_of(ada, "watchers"), actor=None)

    grants, _ = loaded(ada)

    assert grants.by_namespace == {"team-a": pairs_of("viewer")}
    assert not grants.everywhere


def test_custom_roles_rules_are_read_with_the_bindings(django_user_model: Any) -> None:
    namespaces("team-a")
    ada = django_user_model.objects.create_user("ada")
    rbac.role_create(name="starter", rules=[{"verbs": ["start", "get"], "resources": ["runs"]}], actor=None)
    rbac.role_bind(role="starter", namespace="team-a", user="ada", actor=None)

    grants, queries = loaded(ada)

    assert queries == 1
    assert grants.by_namespace == {"team-a": {("start", "runs"), ("get", "runs")}}


def test_one_query_whatever_the_number_of_bindings(django_user_model: Any) -> None:
    spaces = [f"team-{i}" for i in range(10)]
    namespaces(*spaces)
    few = django_user_model.objects.create_user("few")
    factories.bind(few, "viewer", "team-0")
    many = django_user_model.objects.create_user("many")
    groups = [group_of(many, f"g{i}") for i in range(2)]
    for i, ns in enumerate(spaces):
        for j, role in enumerate(ROLES):  # 40 bindings: half directly, half through two groups
            if (i + j) % 2:
                rbac.role_bind(role=role, namespace=ns, user="many", actor=None)
            else:
                rbac.role_bind(role=role, namespace=ns, group=groups[i % 2], actor=None)

    few_grants, few_queries = loaded(few)
    many_grants, many_queries = loaded(many)

    assert few_queries == many_queries == 1
    assert few_grants.by_namespace == {"team-0": pairs_of("viewer")}
    everything = pairs_of("admin") | pairs_of("developer") | pairs_of("viewer") | pairs_of("agent-installer")
    assert many_grants.by_namespace == dict.fromkeys(spaces, everything)


def test_superusers_and_anonymous_callers_read_no_bindings(django_user_model: Any) -> None:
    root = django_user_model.objects.create_superuser("root")
    idle = django_user_model.objects.create_user("idle", is_active=False)
    factories.bind(idle, "admin", "*")

    root_grants, root_queries = loaded(root)
    idle_grants, idle_queries = loaded(idle)
    anonymous_grants, anonymous_queries = loaded(AnonymousUser())

    assert root_grants.superuser
    assert root_queries == 0
    assert idle_grants == anonymous_grants == access.NO_GRANTS
    assert idle_queries == anonymous_queries == 0


@pytest.mark.parametrize("path", ["/api/v1/records/?limit=50", "/api/v1/runs/?limit=50", "record"])
def test_a_bound_users_request_costs_one_query_more_than_a_superusers_whatever_their_bindings(
    django_user_model: Any, path: str
) -> None:
    spaces = [f"team-{i}" for i in range(5)]
    namespaces(*spaces)
    stand = services.record_create_root(kind="graphene.stand", name="s", namespace="team-0")
    record = factories.sleep(stand, "r")
    root = django_user_model.objects.create_superuser("root")
    one = django_user_model.objects.create_user("one")
    factories.bind(one, "developer", "team-0")
    many = django_user_model.objects.create_user("many")
    for ns in spaces:
        for role in ROLES:
            rbac.role_bind(role=role, namespace=ns, group=group_of(many, f"{role}-{ns}"), actor=None)
    url = f"/api/v1/records/{record.pk}/" if path == "record" else path

    counts = {}
    for name, user in (("root", root), ("one", one), ("many", many)):
        client = client_of(user)
        assert client.get(url).status_code == 200  # warm: nothing read once per process is counted
        with CaptureQueriesContext(connection) as queries:
            assert client.get(url).status_code == 200
        counts[name] = len(queries)

    assert counts["one"] == counts["many"] == counts["root"] + 1, counts
