"""Starting a run is safe to retry: a start carries an idempotency key, a second start with the
key answers the first run, a broker failing after the commit cannot turn a start into a 500,
and clients that lose answers and retry start every run once."""

from __future__ import annotations

import threading
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.db import connection
from graphene_sdk import Client
from rest_framework.test import APIClient

from apps.pipelines import services
from apps.pipelines.models import Run
from tests import factories
from tests.harness import tls
from tests.harness.relay import Relay
from tests.harness.web import ProductionWeb, WebServer

KEY = "build-4711"


def _start(api: APIClient, pipeline: str, inputs: dict[str, Any], key: str | None = KEY) -> Any:
    headers = {"Idempotency-Key": key} if key is not None else {}
    return api.post(f"/api/v1/pipelines/{pipeline}/runs/", {"inputs": inputs}, format="json", headers=headers)


@pytest.mark.django_db
def test_the_same_key_and_inputs_answer_the_first_run_and_start_nothing(api: APIClient) -> None:
    first = _start(api, "sample.noop", {"steps": 1})
    assert first.status_code == 201, first.content
    assert "Idempotent-Replayed" not in first
    again = _start(api, "sample.noop", {"steps": 1})
    assert again.status_code == 201
    assert again["Idempotent-Replayed"] == "true"
    assert again.json()["id"] == first.json()["id"]
    assert set(again.json()) == set(first.json())
    assert Run.objects.count() == 1
    # Keys are the pipeline's own: another pipeline's start with the key is another run.
    other = _start(api, "sample.team-b", {"steps": 1})
    assert other.status_code in (201, 404)  # 404: alice may not see team-b's pipeline
    assert _start(api, "sample.chatter", {"lines": 0}).json()["id"] != first.json()["id"]


@pytest.mark.django_db
def test_the_same_key_with_other_inputs_is_a_422_naming_the_key(api: APIClient) -> None:
    first = _start(api, "sample.noop", {"steps": 1})
    reused = _start(api, "sample.noop", {"steps": 2})
    assert reused.status_code == 422
    body = reused.json()
    assert body["error"] == "idempotency_key_reused"
    assert KEY in body["detail"]
    assert list(body["fields"]) == ["Idempotency-Key"]
    assert list(Run.objects.values_list("pk", flat=True)) == [Run.objects.get(pk=first.json()["id"]).pk]


@pytest.mark.django_db
@pytest.mark.parametrize("key", ["has space", "x" * 256, "é", "tab\tkey"])
def test_a_malformed_key_is_a_400_and_starts_nothing(api: APIClient, key: str) -> None:
    response = _start(api, "sample.noop", {"steps": 1}, key=key)
    assert response.status_code == 400, response.content
    assert list(response.json()["fields"]) == ["Idempotency-Key"]
    assert not Run.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_concurrent_starts_with_one_key_make_one_run() -> None:
    ids: list[str] = []
    errors: list[BaseException] = []
    barrier = threading.Barrier(8)

    def start() -> None:
        try:
            barrier.wait(timeout=30)
            run = services.run_start(pipeline_name="sample.noop", inputs={"steps": 0}, idempotency_key="same")
            ids.append(str(run.pk))
        except BaseException as exc:  # reported below
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=start) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not errors, errors
    assert len(ids) == 8
    assert len(set(ids)) == 1
    assert Run.objects.filter(idempotency_key="same").count() == 1


@pytest.mark.django_db
def test_a_replayed_parent_cannot_start_its_children_twice() -> None:
    parent = services.run_start(pipeline_name="sample.noop", inputs={"steps": 0})
    first = services.run_start_children(
        parent=parent, pipeline_name="sample.noop", inputs=[{"steps": 0}], concurrency=1, group=3
    )
    assert first[0].idempotency_key == f"child:{parent.pk}:3:0"
    with pytest.raises(Exception, match=r"run_unique_idempotency_key|duplicate key"):
        services.run_start_children(
            parent=parent, pipeline_name="sample.noop", inputs=[{"steps": 0}], concurrency=1, group=3
        )


# --- through real processes ----------------------------------------------------------------------


@pytest.fixture
def token(django_user_model: Any) -> str:
    from tests.factories import api_token

    user = django_user_model.objects.create_user(username="ci", password="pw")
    factories.bind(user, "developer")
    return api_token(user)


@pytest.fixture
def broker_relay() -> Iterator[tuple[Relay, str]]:
    """The session's broker (Redis) behind a relay that the test can cut."""
    parts = urllib.parse.urlsplit(settings.CELERY_BROKER_URL)
    relay = Relay(parts.port or 6379)
    yield relay, parts._replace(netloc=f"127.0.0.1:{relay.port}").geturl()
    relay.cut()


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("pipeline", "inputs", "logged"),
    [
        # A parallel start sends the run just before its commit; one that takes turns after it.
        ("sample.noop", {"steps": 0}, "could not send it to a worker"),
        ("sample.queue", {"label": "a"}, "Error calling"),
    ],
)
def test_a_broker_that_cannot_take_the_run_still_answers_it(
    tmp_path: Path, token: str, broker_relay: tuple[Relay, str], pipeline: str, inputs: dict[str, Any], logged: str
) -> None:
    relay, broker_url = broker_relay
    web = ProductionWeb(tmp_path, GRAPHENE_BROKER_URL=broker_url).start()
    try:
        relay.cut()  # the run's transaction commits; handing it to a worker fails
        client = Client(web.url, token=token, ca_file=web.ca_file)
        handle = client.start_by_name(pipeline, inputs, idempotency_key="broker-down")
        run = Run.objects.get(pk=handle.id)
        assert run.status == "queued"  # committed; the reconciler hands it to a worker later
        assert Run.objects.count() == 1
        assert logged in web.log.read_text(errors="replace")  # the failure was logged, not answered
    finally:
        web.kill()


@pytest.mark.django_db(transaction=True)
def test_200_concurrent_starts_through_a_proxy_that_loses_a_third_of_the_answers(web: WebServer, token: str) -> None:
    seen: set[bytes] = set()
    seen_lock = threading.Lock()

    def lose_a_third(head: bytes) -> bool:
        """The answer to the first try of every third start (by its idempotency key) is lost."""
        if not head.startswith(b"POST ") or b"/runs/ " not in head.split(b"\r\n", 1)[0]:
            return False
        key = next(
            (
                line.split(b":", 1)[1].strip()
                for line in head.split(b"\r\n")
                if line.lower().startswith(b"idempotency-key:")
            ),
            b"",
        )
        with seen_lock:
            first_try = key not in seen
            seen.add(key)
            return first_try and len(seen) % 3 == 0

    relay = Relay(int(urllib.parse.urlsplit(web.url).port or 443), drop=lose_a_third, upstream_tls=tls.context())
    learned: dict[str, str] = {}
    errors: list[BaseException] = []
    lock = threading.Lock()

    def client_job(index: int) -> None:
        client = Client(relay.url, token=token, timeout=60, insecure=True)  # plain HTTP to the proxy
        for n in range(8):
            key = f"job-{index}-{n}"
            try:
                handle = client.start_by_name("sample.noop", {"steps": 0}, idempotency_key=key)
            except BaseException as exc:  # reported below
                errors.append(exc)
                continue
            with lock:
                learned[key] = handle.id

    try:
        threads = [threading.Thread(target=client_job, args=(i,)) for i in range(25)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=300)
    finally:
        relay.cut()
    assert not errors, errors[:3]
    assert relay.dropped == 66  # the answers to a third of the starts were lost after the server gave them
    assert len(learned) == 200
    runs = dict(Run.objects.filter(idempotency_key__startswith="job-").values_list("idempotency_key", "pk"))
    assert len(runs) == 200  # each start once
    assert {key: str(pk) for key, pk in runs.items()} == learned  # and each client learned its run
