"""The audit trail: each door's write leaves exactly its rows (who, what, which object, which
namespace, which request, digests), no row holds a secret's value, each reader sees only the
namespaces they may, PostgreSQL refuses UPDATE and DELETE on the table, and retention prunes
only what is old enough."""

from __future__ import annotations

import hashlib
import json
import re
from datetime import timedelta
from typing import Any

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from channels.routing import URLRouter
from channels.testing import WebsocketCommunicator
from django.conf import settings
from django.db import DatabaseError, connection, transaction
from django.test import Client
from django.urls import reverse
from django.utils import timezone
from rest_framework.test import APIClient

from apps.accounts.models import AccessToken, ServiceAccount
from apps.accounts.services import admin_bootstrap
from apps.agents import services as agents
from apps.agents.models import Agent
from apps.core import audit
from apps.core.db import closes_connections
from apps.core.models import AuditEntry
from apps.core.tasks import audit_prune_task
from apps.pipelines import services as pipelines
from apps.pipelines.models import Run
from apps.records import services as records
from apps.records.models import Record
from apps.records.tasks import records_expire_task
from graphene_project.routing import websocket_urlpatterns
from tests import factories
from tests.conftest import wait_for
from tests.harness.driver import Driver
from tests.harness.embedded import Ctl
from tests.harness.web import WebServer

DIGEST = re.compile(r"^[0-9a-f]{64}$")


def _rows_after(mark: int, **filters: Any) -> list[AuditEntry]:
    return list(AuditEntry.objects.filter(id__gt=mark, **filters).order_by("id"))


def _mark() -> int:
    last = AuditEntry.objects.order_by("-id").values_list("id", flat=True).first()
    return last or 0


def _token_client(user: Any) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {factories.api_token(user)}")
    return client


# --- REST -----------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_a_rest_write_leaves_one_row_with_its_user_and_request_id(api: APIClient, user: Any) -> None:
    stand = factories.stand("audited")
    mark = _mark()
    response = api.post(
        "/api/v1/records/",
        {"kind": "test.sleep", "name": "db", "owner": str(stand.pk), "spec": {"create_ms": 0}},
        format="json",
    )
    assert response.status_code == 201, response.content
    request_id = response["X-Request-Id"]
    assert re.fullmatch(r"[0-9a-f]{32}", request_id)
    [row] = _rows_after(mark)
    assert (row.actor_kind, row.actor_id, row.actor_name) == ("user", str(user.pk), "alice")
    assert (row.action, row.resource, row.object_id) == ("record.create", "records", response.json()["id"])
    assert (row.object_name, row.namespace, row.request_id) == ("test.sleep/db", "default", request_id)
    assert row.before_digest is None
    assert DIGEST.match(row.after_digest or "")
    assert row.detail == {"owner": str(stand.pk)}

    # A caller's well-formed request id is kept (a proxy's logs meet the trail); the delete's row has it.
    mark = _mark()
    response = api.delete(f"/api/v1/records/{row.object_id}/", HTTP_X_REQUEST_ID="proxy-7f3a.1")
    assert response.status_code in (200, 202), response.content
    assert response["X-Request-Id"] == "proxy-7f3a.1"
    [deleted] = _rows_after(mark)
    assert (deleted.action, deleted.request_id, deleted.actor_name) == (
        "record.delete_request",
        "proxy-7f3a.1",
        "alice",
    )
    assert deleted.before_digest == row.after_digest  # the object as its create left it
    assert deleted.after_digest is None
    assert deleted.detail == {"reason": "DeleteRequested", "subtree": 1}


@pytest.mark.django_db
def test_a_refused_write_leaves_no_row_and_a_malformed_request_id_is_replaced(viewer_api: APIClient) -> None:
    stand = factories.stand("audited")
    mark = _mark()
    response = viewer_api.post(
        "/api/v1/records/",
        {"kind": "test.sleep", "name": "db", "owner": str(stand.pk), "spec": {}},
        format="json",
        HTTP_X_REQUEST_ID="no spaces; or quotes'",
    )
    assert response.status_code == 403
    assert re.fullmatch(r"[0-9a-f]{32}", response["X-Request-Id"])
    assert _rows_after(mark) == []


@pytest.mark.django_db
def test_every_answer_carries_a_request_id(client: Client) -> None:
    for path in ("/api/v1/records/", "/healthz", "/login/"):
        assert re.fullmatch(r"[0-9a-f]{32}", client.get(path)["X-Request-Id"]), path


# --- the Studio -------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_a_cancel_from_the_run_page_leaves_the_cancel_and_the_deletion_it_causes(django_user_model: Any) -> None:
    ada = django_user_model.objects.create_user(username="ada", password="pw")
    factories.bind(ada, "developer")
    studio = Client()
    studio.force_login(ada)
    run = pipelines.run_start(pipeline_name="sample.noop", inputs={"steps": 0})
    mark = _mark()
    response = studio.post(reverse("admin:studio_run_action", args=[run.pk, "cancel"]))
    assert response.status_code == 302
    rows = _rows_after(mark)
    assert [(r.action, r.object_id) for r in rows] == [
        ("record.delete_request", str(run.record_id)),  # the run's tree, deleted as it ends
        ("run.cancel", str(run.pk)),
    ]
    assert {(r.actor_kind, r.actor_name, r.request_id) for r in rows} == {("user", "ada", response["X-Request-Id"])}
    cancel = rows[1]
    assert cancel.object_name == f"sample.noop#{run.number}"
    assert DIGEST.match(cancel.before_digest or "")
    assert DIGEST.match(cancel.after_digest or "")
    assert cancel.before_digest != cancel.after_digest
    # Cancelling it again changes nothing, and is no row.
    mark = _mark()
    studio.post(reverse("admin:studio_run_action", args=[run.pk, "cancel"]))
    assert _rows_after(mark) == []
    # The run page links to its rows and to what its code changed, for those who may read them.
    run_page = reverse("admin:studio_run", args=[run.pk])
    assert 'id="run-audit"' not in studio.get(run_page).content.decode()  # a developer may not
    studio.force_login(django_user_model.objects.create_superuser(username="root", password="pw"))
    shown = studio.get(run_page).content.decode()
    assert f'{reverse("admin:studio_audit")}?object={run.pk}" id="run-audit"' in shown
    assert f'{reverse("admin:studio_audit")}?actor={run.pk}" id="run-audit-actor"' in shown


# --- a run's code ------------------------------------------------------------------------------------


@pytest.mark.system
@pytest.mark.django_db(transaction=True)
def test_a_runs_declarations_are_the_runs_doing(drive: Driver) -> None:
    run = pipelines.run_start(pipeline_name="sample.tree", inputs={"branches": 1, "leaves": 1})
    drive.run_until(lambda: Run.objects.get(pk=run.pk).status == "succeeded", what="the run to succeed")
    by_run = AuditEntry.objects.filter(actor_kind="run")
    assert {r.actor_id for r in by_run} == {str(run.pk)}
    assert {r.actor_name for r in by_run} == {f"sample.tree#{run.number}"}
    created = {r.object_name: r for r in by_run.filter(action="record.create")}
    assert sorted(created) == ["test.sleep/branch-0", "test.sleep/leaf-0-0"]
    assert created["test.sleep/leaf-0-0"].detail == {"owner": created["test.sleep/branch-0"].object_id}
    # Its end deletes what it still owns: the run's doing too.
    [end] = by_run.filter(action="record.delete_request")
    assert (end.object_id, end.detail["reason"]) == (str(run.record_id), "RunSucceeded")
    # Started here through the service with no user: the system's.
    [started] = AuditEntry.objects.filter(action="run.start", object_id=str(run.pk))
    assert (started.actor_kind, started.actor_name) == ("system", "graphene")
    # Convergence and the deletion of the run's records (tasks) leave no rows of their own.
    assert AuditEntry.objects.count() == 4


# --- an agent -------------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)  # the gateway reads the database from its own threads
def test_what_an_agent_reports_is_the_agents_doing() -> None:
    stand = factories.stand("machines")
    record = agents.agent_record_declare(owner=stand, name="box-1")
    token = agents.agent_bootstrap_issue(record=record)
    mark = _mark()

    async def connect() -> None:
        communicator = WebsocketCommunicator(URLRouter(websocket_urlpatterns), "/agents/connect")
        assert (await communicator.connect(timeout=10))[0]
        await communicator.send_json_to({"type": "bootstrap", "agent_id": str(record.pk), "token": token})
        welcome = await communicator.receive_json_from(timeout=10)
        assert welcome["type"] == "welcome", welcome
        await communicator.send_json_to({"type": "hello", "facts": {"os": "linux"}, "instance": "i-1", "version": "1"})
        # On a thread of its own: the gateway's database calls take the test's thread meanwhile.
        await sync_to_async(closes_connections(wait_for), thread_sensitive=False)(
            lambda: Agent.objects.filter(pk=record.pk, connected_at__isnull=False).exists(), what="the hello"
        )
        await communicator.disconnect()

    async_to_sync(connect)()
    rows = _rows_after(mark)
    assert [r.action for r in rows] == ["agent.bootstrap", "agent.connect"]
    assert {(r.actor_kind, r.actor_id, r.actor_name) for r in rows} == {("agent", str(record.pk), "box-1")}
    assert all(r.request_id == "" and r.resource == "agents" for r in rows)
    assert rows[1].before_digest is None  # its first hello: nothing was known of the machine
    assert rows[1].after_digest == audit.digest({"facts": {"os": "linux"}, "version": "1", "instance": "i-1"})


# --- the system (beat) --------------------------------------------------------------------------------


@pytest.mark.django_db
def test_a_ttl_expiry_is_the_systems_doing_named_after_its_task() -> None:
    stand = factories.stand("ttl")
    held = factories.sleep(stand, "held")
    records.record_set_expiry(record=held, expires_at=timezone.now() + timedelta(seconds=30))
    Record.objects.filter(pk=held.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    mark = _mark()
    assert records_expire_task.apply().get() == 1  # as beat's worker runs it (Celery's signals too)
    [row] = _rows_after(mark)
    assert (row.actor_kind, row.actor_id, row.actor_name) == ("system", "", "records_expire_task")
    assert (row.action, row.object_id, row.request_id) == ("record.delete_request", str(held.pk), "")
    assert row.detail == {"reason": "Expired", "subtree": 1}
    # The context ends with the task: a write after it is the plain system's.
    with transaction.atomic():
        assert audit.audit_write(action="x.y", resource="records", object_id="o", namespace="default").actor_name == (
            "graphene"
        )


# --- secrets ---------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_no_row_holds_a_secrets_value_or_its_digest(api: APIClient) -> None:
    value, other = "hunter2-Zq81-only-here", "correct-horse-Zq81"
    mark = _mark()
    assert api.post("/api/v1/secrets/", {"name": "db-password", "value": value}, format="json").status_code == 201
    assert api.put("/api/v1/secrets/db-password/", {"value": other}, format="json").status_code == 200
    assert api.delete("/api/v1/secrets/db-password/").status_code == 204
    rows = _rows_after(mark)
    assert [r.action for r in rows] == ["secret.create", "secret.set", "secret.delete"]
    assert {r.object_name for r in rows} == {"db-password"}
    assert rows[1].before_digest == rows[0].after_digest
    assert rows[2].before_digest == rows[1].after_digest
    text = json.dumps([{f.attname: str(getattr(r, f.attname)) for f in AuditEntry._meta.fields} for r in rows])
    for secret in (value, other):
        assert secret not in text
        assert hashlib.sha256(secret.encode()).hexdigest() not in text
        assert hashlib.sha256(json.dumps(secret).encode()).hexdigest() not in text


# --- accounts and tokens ------------------------------------------------------------------------------


def _holds_no_key(rows: list[AuditEntry], keys: list[str]) -> None:
    """No column of ``rows`` holds a key, the key's digest (what finds its token), or a long part
    of it; its first characters (what lists show) may be there."""
    text = json.dumps([{f.attname: str(getattr(r, f.attname)) for f in AuditEntry._meta.fields} for r in rows])
    for key in keys:
        assert key not in text
        assert key[12:] not in text
        assert hashlib.sha256(key.encode()).hexdigest() not in text


@pytest.mark.django_db
def test_service_accounts_and_their_tokens_over_rest_leave_their_rows_without_keys(django_user_model: Any) -> None:
    factories.bind_namespace("team-a")
    root = django_user_model.objects.create_superuser(username="root", password="pw")
    api = _token_client(root)
    where = "?namespace=team-a"
    mark = _mark()
    assert api.post(f"/api/v1/accounts/{where}", {"name": "ci"}, format="json").status_code == 201
    account = ServiceAccount.objects.get(namespace="team-a", name="ci")
    issued = []
    for comment in ("one", "two", "three"):
        response = api.post(f"/api/v1/accounts/ci/tokens/{where}", {"comment": comment}, format="json")
        assert response.status_code == 201, response.content
        issued.append(response.json())
    one, two, three = (t["id"] for t in issued)
    assert api.delete(f"/api/v1/accounts/ci/tokens/{one}/{where}").status_code == 200
    assert api.delete(f"/api/v1/accounts/ci/tokens/{one}/{where}").status_code == 200  # again: nothing changes
    assert api.delete(f"/api/v1/accounts/ci/tokens/{where}").json() == {"revoked_tokens": 2}
    four = api.post(f"/api/v1/accounts/ci/tokens/{where}", {}, format="json").json()
    assert api.delete(f"/api/v1/accounts/ci/{where}").json()["revoked_tokens"] == 1
    assert api.delete(f"/api/v1/accounts/ci/{where}").status_code == 200  # deleted already: nothing changes

    rows = _rows_after(mark)
    assert [(r.action, r.object_id) for r in rows] == [
        ("account.create", str(account.pk)),
        ("token.create", one),
        ("token.create", two),
        ("token.create", three),
        ("token.revoke", one),
        ("token.revoke", two),  # --all: a row for each token, oldest first
        ("token.revoke", three),
        ("token.create", four["id"]),
        ("token.revoke", four["id"]),  # the deletion revokes its tokens, then disables it
        ("account.delete", str(account.pk)),
    ]
    assert {(r.actor_kind, r.actor_id, r.actor_name) for r in rows} == {("user", str(root.pk), "root")}
    assert {(r.resource, r.namespace) for r in rows} == {("accounts", "team-a")}
    assert all(re.fullmatch(r"[0-9a-f]{32}", r.request_id) for r in rows)
    username = "system:serviceaccount:team-a:ci"
    created, deleted = rows[0], rows[-1]
    assert (created.object_name, created.detail, created.before_digest) == ("ci", {"username": username}, None)
    assert (deleted.object_name, deleted.detail) == ("ci", {"revoked_tokens": 1})
    assert deleted.before_digest == created.after_digest
    assert DIGEST.match(deleted.after_digest or "")
    assert deleted.after_digest != deleted.before_digest  # disabled, not gone: the row stays
    tokens = {r.object_id: r for r in rows if r.action == "token.create"}
    revokes = {r.object_id: r for r in rows if r.action == "token.revoke"}
    for token in [*issued, four]:
        made, revoked = tokens[token["id"]], revokes[token["id"]]
        assert made.object_name == revoked.object_name == f"{token['prefix']}… of {username}"
        assert made.detail == {"user": username, "expires_at": token["expires_at"].replace("Z", "+00:00")}
        assert made.before_digest is None
        assert revoked.before_digest == made.after_digest
        assert revoked.after_digest not in (None, made.after_digest)
    assert revokes[one].detail == {"user": username, "reason": "revoked"}
    assert revokes[four["id"]].detail == {"user": username, "reason": "the service account was deleted"}
    _holds_no_key(rows, [t["key"] for t in [*issued, four]])


@pytest.mark.django_db
def test_ones_own_tokens_leave_installation_wide_rows(user: Any) -> None:
    api = _token_client(user)
    mark = _mark()
    made = api.post("/api/v1/tokens/", {"comment": "laptop"}, format="json").json()
    assert api.delete(f"/api/v1/tokens/{made['id']}/").status_code == 200
    rows = _rows_after(mark)
    assert [(r.action, r.resource, r.object_id, r.namespace) for r in rows] == [
        ("token.create", "accounts", made["id"], "*"),
        ("token.revoke", "accounts", made["id"], "*"),
    ]
    assert {(r.actor_kind, r.actor_name, r.object_name) for r in rows} == {
        ("user", "alice", f"{made['prefix']}… of alice")
    }
    _holds_no_key(rows, [made["key"]])


@pytest.mark.django_db
def test_the_graphene_token_command_leaves_its_rows_as_itself(
    django_user_model: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    from graphene_project.cli import main

    mark = _mark()
    main(["token", "ci-bot", "--create-user", "-o", "json"])
    first = json.loads(capsys.readouterr().out)
    main(["token", "ci-bot", "--rotate", "-o", "json"])
    second = json.loads(capsys.readouterr().out)
    bot = django_user_model.objects.get(username="ci-bot")
    rows = _rows_after(mark)
    assert [(r.action, r.resource, r.object_id, r.namespace) for r in rows] == [
        ("user.create", "users", str(bot.pk), "*"),
        ("token.create", "accounts", first["id"], "*"),
        ("token.revoke", "accounts", first["id"], "*"),
        ("token.create", "accounts", second["id"], "*"),
    ]
    # Nobody signs in to the command: its rows are the system's, named after it.
    assert {(r.actor_kind, r.actor_id, r.actor_name, r.request_id) for r in rows} == {
        ("system", "", "graphene token", "")
    }
    made_user = rows[0]
    assert (made_user.object_name, made_user.detail, made_user.before_digest) == ("ci-bot", {"api_only": True}, None)
    assert made_user.after_digest == audit.digest(audit.user_fields(bot))  # as the Studio's users' page digests
    assert rows[2].detail == {"user": "ci-bot", "reason": "replaced by graphene token --rotate"}
    _holds_no_key(rows, [first["token"], second["token"]])
    # The context ends with the command: a later write is the plain system's.
    with transaction.atomic():
        assert audit.audit_write(action="x.y", resource="records", object_id="o", namespace="default").actor_name == (
            "graphene"
        )


@pytest.mark.django_db
def test_the_first_admin_and_its_token_leave_rows_without_password_or_key(
    django_user_model: Any, tmp_path: Any
) -> None:
    mark = _mark()
    with audit.acting(audit.who_system("graphene up")):
        creds = admin_bootstrap(data_dir=tmp_path)
    admin = django_user_model.objects.get(username="admin")
    token = AccessToken.objects.get(user=admin)
    rows = _rows_after(mark)
    assert [(r.action, r.resource, r.object_id, r.object_name, r.namespace) for r in rows] == [
        ("user.create", "users", str(admin.pk), "admin", "*"),
        ("token.create", "accounts", str(token.pk), f"{token.prefix}… of admin", "*"),
    ]
    assert {(r.actor_kind, r.actor_name) for r in rows} == {("system", "graphene up")}
    assert rows[0].detail == {"first_admin": True}
    assert rows[0].after_digest == audit.digest(audit.user_fields(admin))
    assert creds.password
    assert creds.password not in json.dumps([r.detail for r in rows])
    _holds_no_key(rows, [creds.token or ""])

    # A later start whose saved token expired issues a new one: its row too, and no second user.
    AccessToken.objects.filter(pk=token.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    mark = _mark()
    renewed = admin_bootstrap(data_dir=tmp_path)
    assert renewed.renewed
    [row] = _rows_after(mark)
    assert (row.action, row.object_id) == ("token.create", str(AccessToken.objects.exclude(pk=token.pk).get().pk))
    _holds_no_key([row], [renewed.token or ""])


# --- who reads what ---------------------------------------------------------------------------------


@pytest.mark.django_db
def test_readers_see_only_the_namespaces_they_may(django_user_model: Any, viewer_api: APIClient) -> None:
    factories.bind_namespace("team-a")
    factories.bind_namespace("team-b")
    for namespace in ("team-a", "team-b"):
        stand = records.record_create_root(kind="graphene.stand", name="s", namespace=namespace)
        factories.sleep(stand, f"thing-{namespace}")
    # A viewer reads workloads, not the trail (it names secrets and accounts, which viewers may not read).
    response = viewer_api.get("/api/v1/audit/")
    assert response.status_code == 403, response.content
    # An admin of team-a alone: team-a's rows, not team-b's, not the installation-wide ones (role bindings in *).
    anna = django_user_model.objects.create_user(username="anna", password="pw")
    factories.bind(anna, "admin", "team-a")
    client = _token_client(anna)
    body = client.get("/api/v1/audit/?limit=1000").json()
    assert {r["namespace"] for r in body["results"]} == {"team-a"}
    assert {r["object_name"] for r in body["results"] if r["action"] == "record.create"} == {
        "graphene.stand/s",
        "test.sleep/thing-team-a",
    }
    assert client.get("/api/v1/audit/?namespace=team-b").status_code == 403
    assert client.get("/api/v1/audit/?namespace=*").status_code == 403
    # An admin everywhere sees both, and the rows in *.
    root = django_user_model.objects.create_user(username="root", password="pw")
    factories.bind(root, "admin", "*")
    everything = _token_client(root).get("/api/v1/audit/?limit=1000").json()["results"]
    assert {"team-a", "team-b", "*"} <= {r["namespace"] for r in everything}


@pytest.mark.django_db
def test_the_list_filters_and_pages_newest_first(admin_api: APIClient) -> None:
    stand = factories.stand("filters")
    things = [factories.sleep(stand, f"t{i}") for i in range(3)]
    records.record_delete_request(record=things[0])
    rows = admin_api.get("/api/v1/audit/?action=record&limit=2").json()
    assert [r["action"] for r in rows["results"]] == ["record.delete_request", "record.create"]
    assert rows["next"]
    newest_first = [r["id"] for r in admin_api.get("/api/v1/audit/?action=record").json()["results"]]
    assert newest_first == sorted(newest_first, reverse=True)
    assert [r["action"] for r in admin_api.get(f"/api/v1/audit/?object={things[0].pk}").json()["results"]] == [
        "record.delete_request",
        "record.create",
    ]
    assert len(admin_api.get("/api/v1/audit/?action=record.create&actor=graphene").json()["results"]) == 4
    assert admin_api.get("/api/v1/audit/?actor=nobody").json()["results"] == []
    future = (timezone.now() + timedelta(minutes=1)).isoformat()
    assert admin_api.get("/api/v1/audit/", {"since": future}).json()["results"] == []
    assert len(admin_api.get("/api/v1/audit/", {"until": future, "action": "record"}).json()["results"]) == 5
    for bad, field in (
        ("since=yesterday", "since"),
        ("until=", "until"),
        ("actor_kind=robot", "actor_kind"),
        ("action=", "action"),
        ("object=" + "x" * 65, "object"),
    ):
        response = admin_api.get(f"/api/v1/audit/?{bad}")
        assert response.status_code == 400, (bad, response.content)
        assert field in response.json()["fields"], (bad, response.content)


# --- append-only --------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_postgresql_refuses_update_and_delete_of_audit_rows() -> None:
    with transaction.atomic():
        row = audit.audit_write(action="record.create", resource="records", object_id="x", namespace="default")
    for sql in (
        "UPDATE core_auditentry SET actor_name = 'mallory' WHERE id = %s",
        "DELETE FROM core_auditentry WHERE id = %s",
    ):
        with pytest.raises(DatabaseError, match="append-only"), transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(sql, [row.pk])
    with pytest.raises(DatabaseError, match="append-only"), transaction.atomic():
        AuditEntry.objects.filter(pk=row.pk).update(action="nothing")
    assert AuditEntry.objects.get(pk=row.pk).actor_name == "graphene"
    # Only a transaction that says it prunes may delete (and it still may not update).
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET LOCAL graphene.audit_prune = 'on'")
        with pytest.raises(DatabaseError, match="append-only"), transaction.atomic():
            cursor.execute("UPDATE core_auditentry SET action = 'x' WHERE id = %s", [row.pk])
        cursor.execute("DELETE FROM core_auditentry WHERE id = %s", [row.pk])
    assert not AuditEntry.objects.filter(pk=row.pk).exists()


@pytest.mark.django_db(transaction=True)  # no test transaction around it
def test_audit_write_refuses_to_run_outside_the_changes_transaction() -> None:
    with pytest.raises(RuntimeError, match="transaction"):
        audit.audit_write(action="record.create", resource="records", object_id="x", namespace="default")


# --- retention ------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_retention_prunes_old_rows_only_in_batches(settings: Any) -> None:
    settings.GRAPHENE_AUDIT_RETENTION_DAYS = 30
    now = timezone.now()
    ages = [31, 31, 31, 45, 29, 0]
    AuditEntry.objects.bulk_create(
        AuditEntry(
            created_at=now - timedelta(days=days),
            actor_kind="system",
            actor_name="graphene",
            action="record.create",
            resource="records",
            object_id=f"o{i}",
            namespace="default",
        )
        for i, days in enumerate(ages)
    )
    assert audit.audit_prune(batch=2) == 4  # two full batches, then one that comes up short
    assert sorted(AuditEntry.objects.values_list("object_id", flat=True)) == ["o4", "o5"]
    assert audit_prune_task.apply().get() == 0


def test_beat_runs_the_retention_task_and_keeps_a_year_by_default() -> None:
    assert settings.CELERY_BEAT_SCHEDULE["audit-prune"]["task"] == audit_prune_task.name
    assert settings.GRAPHENE_AUDIT_RETENTION_DAYS == 365


# --- graphenectl ------------------------------------------------------------------------------------


@pytest.mark.system
@pytest.mark.django_db(transaction=True)
def test_graphenectl_audit_shows_and_filters_the_trail(web: WebServer, django_user_model: Any, tmp_path: Any) -> None:
    root = django_user_model.objects.create_superuser(username="root", password="pw")
    ctl = Ctl(tmp_path / "config", **web.client_env(), GRAPHENE_TOKEN=factories.api_token(root))
    held = ctl.ok("apply", "test.sleep", "held", "--owner", "stand/sample.cli").out.strip().removeprefix("record/")
    ctl.ok("delete", held)

    table = ctl.ok("audit", "--object", f"record/{held}", "--since", "1h").out.splitlines()
    assert table[0].split() == ["TIME", "ACTOR", "ACTION", "OBJECT", "NAMESPACE"]
    assert [line.split()[2:6] for line in table[1:]] == [
        ["user:root", "record.delete_request", "test.sleep/held", "default"],
        ["user:root", "record.create", "test.sleep/held", "default"],
    ]
    rows = ctl.ok(
        "audit", "--action", "record.create", "--actor", "root", "--namespace", "default", "-o", "json"
    ).json()
    # The stand was made on demand when graphenectl looked it up: its row, then the record's (newest first).
    assert [(r["object_name"], r["actor_kind"]) for r in rows] == [
        ("test.sleep/held", "user"),
        ("graphene.stand/sample.cli", "user"),
    ]
    assert re.fullmatch(r"[0-9a-f]{32}", rows[0]["request_id"])
    assert ctl.ok("audit", "--request-id", rows[0]["request_id"], "-o", "name").out.split() == [
        f"audit/{rows[0]['id']}"
    ]
    assert "more exist" in ctl.ok("audit", "--limit", "1").err
    assert "no audit rows match" in ctl.ok("audit", "--actor", "nobody").err
    refused = ctl("audit", "--since", "soon")
    assert refused.code == 2
    assert "--since" in refused.err


@pytest.mark.system
@pytest.mark.django_db(transaction=True)
def test_graphenectl_audit_chooses_its_namespace_as_every_listing_does(
    web: WebServer, django_user_model: Any, tmp_path: Any
) -> None:
    factories.bind_namespace("team-a")
    records.record_create_root(kind="graphene.stand", name="a", namespace="team-a")
    records.record_create_root(kind="graphene.stand", name="d", namespace="default")
    anna = django_user_model.objects.create_user(username="anna", password="pw")
    factories.bind(anna, "admin", "team-a")
    root = django_user_model.objects.create_superuser(username="root", password="pw")
    ctl = Ctl(tmp_path / "config", **web.client_env(), GRAPHENE_TOKEN=factories.api_token(root))  # a row in *
    everywhere = {"team-a", "default", "*"}

    def namespaces(*args: str, env: dict[str, str] | None = None) -> set[str]:
        return {r["namespace"] for r in ctl.ok(*args, "-o", "json", env=env).json()}

    assert namespaces("audit") == everywhere  # none chosen: every namespace the caller may read
    assert namespaces("audit", "-n", "team-a") == {"team-a"}
    assert namespaces("audit", "--namespace", "default") == {"default"}
    assert namespaces("-n", "team-a", "audit") == {"team-a"}  # the global -n
    assert namespaces("audit", "-n", "*") == {"*"}  # the installation-wide objects' rows
    assert namespaces("audit", env={"GRAPHENE_NAMESPACE": "default"}) == {"default"}
    assert namespaces("audit", "-A", env={"GRAPHENE_NAMESPACE": "default"}) == everywhere
    assert namespaces("-n", "default", "audit", "-A") == everywhere  # the command's -A wins
    table = ctl.ok("audit", "-n", "team-a").out.splitlines()
    assert table[0].split() == ["TIME", "ACTOR", "ACTION", "OBJECT", "NAMESPACE"]
    assert {line.split()[-1] for line in table[1:]} == {"team-a"}
    both = ctl("audit", "-n", "team-a", "-A")
    assert both.code == 2, both
    assert "exclude each other" in both.err
    bad = ctl("audit", "-n", "Team_A")
    assert bad.code == 2, bad
    assert "is not a namespace name" in bad.err

    # An admin of team-a reads team-a's rows, chosen or not, and is refused the others.
    as_anna = {"GRAPHENE_TOKEN": factories.api_token(anna)}
    assert namespaces("audit", env=as_anna) == {"team-a"}
    assert namespaces("audit", "-A", env=as_anna) == {"team-a"}
    assert namespaces("audit", "-n", "team-a", env=as_anna) == {"team-a"}
    for where, said in (("default", "in namespace 'default'"), ("*", "in every namespace")):
        refused = ctl("audit", "-n", where, env=as_anna)
        assert refused.code == 1, refused
        assert f"anna may not list audit {said}" in refused.err


# --- the Studio's page ---------------------------------------------------------------------------------


@pytest.mark.django_db
def test_the_studio_audit_page_lists_filters_pages_and_is_linked_for_those_who_may(
    django_user_model: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from apps.studio.views import audit as audit_page

    factories.bind_namespace("team-a")
    stand = records.record_create_root(kind="graphene.stand", name="s", namespace="team-a")
    held = factories.sleep(stand, "held")
    other = factories.sleep(factories.stand("elsewhere"), "theirs")  # in default
    anna = django_user_model.objects.create_user(username="anna", password="pw", is_staff=True)
    factories.bind(anna, "admin", "team-a")
    studio = Client()
    studio.force_login(anna)

    page = studio.get(reverse("admin:studio_audit")).content.decode()
    assert 'id="nav-audit"' in page
    assert "test.sleep/held" in page
    assert "test.sleep/theirs" not in page  # default's rows: not theirs to read
    only = studio.get(reverse("admin:studio_audit"), {"object": str(held.pk)}).content.decode()
    assert only.count('data-action="record.create"') == 1
    assert "graphene.stand/s" not in only
    # What a record's and a run's page link to.
    inspector = studio.get(reverse("admin:records_record_change", args=[held.pk])).content.decode()
    assert f"{reverse('admin:studio_audit')}?object={held.pk}" in inspector

    # Paged by keyset: the older page holds the rest, nothing twice.
    monkeypatch.setattr(audit_page, "PAGE_SIZE", 2)
    first = studio.get(reverse("admin:studio_audit"))
    older = re.search(r'<a href="\?([^"]+)" id="audit-older"', first.content.decode())
    assert older is not None
    second = studio.get(f"{reverse('admin:studio_audit')}?{older.group(1).replace('&amp;', '&')}")
    ids = [[int(i) for i in re.findall(r'data-audit="(\d+)"', r.content.decode())] for r in (first, second)]
    # team-a's three rows: the stand's and the record's creation, anna's binding.
    assert (len(ids[0]), len(ids[1])) == (2, 1)
    assert max(ids[1]) < min(ids[0])
    assert 'id="audit-older"' not in second.content.decode()

    # A developer may not read the trail: no link, and the page refuses.
    dev = django_user_model.objects.create_user(username="dev", password="pw", is_staff=True)
    factories.bind(dev, "developer")
    studio.force_login(dev)
    assert studio.get(reverse("admin:studio_audit")).status_code == 403
    assert 'id="nav-audit"' not in studio.get(reverse("admin:studio_runs")).content.decode()
    assert (
        'id="record-audit"' not in studio.get(reverse("admin:records_record_change", args=[other.pk])).content.decode()
    )


# --- users and groups (the Studio's users' pages) ----------------------------------------------------


@pytest.mark.django_db
def test_changes_to_users_through_the_studio_are_audited_without_their_passwords(django_user_model: Any) -> None:
    root = django_user_model.objects.create_superuser(username="root", password="pw")
    studio = Client()
    studio.force_login(root)
    secret = "Tr0ub4dor&3-audit-only"
    mark = _mark()
    added = studio.post(
        reverse("admin:auth_user_add"),
        {"username": "bob", "usable_password": "true", "password1": secret, "password2": secret},
    )
    assert added.status_code == 302, added.content[:2000]
    bob = django_user_model.objects.get(username="bob")
    changed = studio.post(
        reverse("admin:auth_user_password_change", args=[bob.pk]),
        {"password1": secret + "!", "password2": secret + "!", "usable_password": "true"},
    )
    assert changed.status_code == 302, changed.content[:2000]
    deleted = studio.post(reverse("admin:auth_user_delete", args=[bob.pk]), {"post": "yes"})
    assert deleted.status_code == 302
    rows = _rows_after(mark)
    assert [(r.action, r.object_name, r.namespace, r.actor_name) for r in rows] == [
        ("user.create", "bob", "*", "root"),
        ("user.update", "bob", "*", "root"),
        ("user.delete", "bob", "*", "root"),
    ]
    assert rows[0].before_digest is None
    assert rows[1].detail == {"password_changed": True}
    assert rows[1].before_digest == rows[1].after_digest == rows[0].after_digest  # the password is not digested
    assert rows[2].before_digest == rows[0].after_digest
    assert rows[2].after_digest is None
    assert len({r.request_id for r in rows}) == 3
    assert secret not in json.dumps([r.detail for r in rows])
