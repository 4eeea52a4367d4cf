"""The Studio's agents board, artifacts and topology pages, served by Django's test client:
what they show, their links, queries that do not grow with the rows, and an agent admin
that no form can change."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from apps.agents import services as agents
from apps.agents.models import Agent
from apps.pipelines import services
from apps.pipelines.choices import RunStatus
from apps.records import services as records
from apps.studio import topology
from tests import factories
from tests.artifacts import pipelines  # noqa: F401 - registers the artifact pipelines in this process
from tests.harness.driver import Driver
from tests.pipelines.test_runs import driven, start


def declare_agents(n: int, first: int = 0) -> list[Any]:
    owner = records.record_create_root(kind="graphene.run", name=f"fleet#{first}")
    return [
        agents.agent_record_declare(owner=owner, name=f"m{first + i}", labels={"pool": "ci"}, needs=None)
        for i in range(n)
    ]


@pytest.mark.django_db
def test_the_agents_board_shows_a_card_per_agent_in_the_same_queries_for_3_and_30(studio: Client) -> None:
    three = declare_agents(3)
    agents.capability_publish(agent=three[0], name="docker", version="27.1", labels={"arch": "amd64"})
    with CaptureQueriesContext(connection) as few:
        page = studio.get("/agents/")
    text = page.content.decode()
    assert page.status_code == 200
    assert text.count('class="studio-card studio-agent"') == 3
    card = text.split(f'data-agent="{three[0].pk}"')[1].split("</article>")[0]
    assert 'data-capability="docker"' in card
    assert "docker 27.1" in card
    assert "pool=ci" in card
    assert "never" in card  # never connected: last seen never
    assert 'data-status="disconnected"' in card
    declare_agents(27, first=3)
    with CaptureQueriesContext(connection) as many:
        text = studio.get("/agents/").content.decode()
    assert text.count('class="studio-card studio-agent"') == 30
    assert len(many) == len(few)
    assert 'href="/agents/"' in studio.get("/").content.decode()  # the home page's agent counts link here


@pytest.mark.django_db
def test_no_form_edits_an_agent_and_revoking_needs_the_right(studio: Client, django_user_model: Any) -> None:
    (record,) = declare_agents(1)
    Agent.objects.filter(pk=record.pk).update(peer="10.0.0.7", channel_name="specific.x!y")
    page = studio.get(f"/agents/agent/{record.pk}/change/")
    assert page.status_code == 200
    text = page.content.decode()
    for field in ("peer", "session", "channel_name", "instance", "version"):
        assert f'name="{field}"' not in text, field
    assert 'type="submit"' not in text.split('id="content-main"')[1]
    refused = studio.post(f"/agents/agent/{record.pk}/change/", {"peer": "evil", "channel_name": "x"})
    assert refused.status_code == 403
    assert Agent.objects.get(pk=record.pk).peer == "10.0.0.7"
    assert studio.get("/agents/agent/add/").status_code == 403
    # Viewing is not revoking: the action is offered only to those with the right.
    viewer = django_user_model.objects.create_user(username="viewer", password="pw", is_staff=True)
    factories.bind(viewer, "viewer")
    client = Client()
    client.force_login(viewer)
    listing = client.get("/agents/agent/").content.decode()
    assert "revoke_credentials" not in listing
    assert "revoke_credentials" in studio.get("/agents/agent/").content.decode()


@pytest.mark.django_db(transaction=True)
def test_artifacts_list_their_digest_publisher_and_the_runs_that_attached_them(drive: Driver, studio: Client) -> None:
    published = driven(drive, start("artifacts.publish", text="bytes for the studio\n"))
    assert published.status == RunStatus.SUCCEEDED, published.error
    used = driven(drive, start("artifacts.use", path="studio/app.txt"))
    assert used.status == RunStatus.SUCCEEDED, used.error
    assert published.outputs is not None
    artifact_id = published.outputs["id"]
    listing = studio.get("/artifacts/?pipeline=artifacts.publish").content.decode()
    row = listing.split(f'data-artifact="{artifact_id}"')[1].split("</tr>")[0]
    assert "dist/app.txt" in row
    assert published.outputs["sha256"][:12] in row
    assert f'href="/api/v1/artifacts/{artifact_id}/content/"' in row
    assert "artifacts.publish" in row
    detail = studio.get(f"/artifacts/{artifact_id}/").content.decode()
    assert published.outputs["sha256"] in detail
    publisher = detail.split('id="artifact-publisher"')[1].split("</dd>")[0]
    assert f'href="/runs/{published.pk}/"' in publisher
    attached = detail.split('id="artifact-attached"')[1].split("</ul>")[0]
    assert f'href="/runs/{used.pk}/"' in attached
    assert f'href="/runs/{published.pk}/"' not in attached
    # The download link is the API's, behind the same session and check.
    download = studio.get(f"/api/v1/artifacts/{artifact_id}/content/")
    assert download.status_code == 200
    assert download["X-Content-SHA256"] == published.outputs["sha256"]
    assert download["Content-Length"] == str(len(b"bytes for the studio\n"))
    assert studio.get("/artifacts/00000000-0000-0000-0000-000000000000/").status_code == 404


def node(kind: str, name: str, pk: str, phase: str = "ready", **spec: Any) -> Any:
    outputs = {"name": f"g-{name}-{pk[:8]}"} if kind == "docker.network" else {}
    return SimpleNamespace(kind=kind, name=name, pk=pk, phase=phase, spec=spec, outputs=outputs)


def test_the_topology_puts_records_under_their_machine_and_network_the_same_way_every_time() -> None:
    agent = node("agent", "builder", "a0000000-0000")
    net = node("docker.network", "net", "b0000000-0000")
    remote_net = node("docker.network", "lan", "c0000000-0000", agent=agent.pk)
    tree = [
        node("docker.container", "db", "d1", network="g-net-b0000000"),
        node("docker.container", "web", "d2", network="g-net-b0000000", phase="creating"),
        node("file", "config", "e1"),
        node("git.checkout", "src", "e2", agent=agent.pk),
        node("docker.container", "cache", "e3", agent=agent.pk, network="g-lan-c0000000"),
        node("file", "far", "e4", agent="f0000000-0000"),
        agent,
        net,
        remote_net,
    ]
    boxes, width, height = topology.layout(tree, {"f0000000-0000": "other"})
    assert (boxes, width, height) == topology.layout(list(reversed(tree)), {"f0000000-0000": "other"})
    machines = [b for b in boxes if b.role == "machine"]
    assert [m.label for m in machines] == ["this server", "agent/builder", "agent/other"]
    assert machines[1].record_id == agent.pk

    def inside(box: Any, outer: Any) -> bool:
        return (
            outer.x <= box.x
            and box.x + box.width <= outer.x + outer.width
            and outer.y <= box.y
            and box.y + box.height <= outer.y + outer.height
        )

    by_label = {b.label: b for b in boxes}
    assert inside(by_label["docker.container/db"], by_label["docker.network/net"])
    assert inside(by_label["docker.container/web"], by_label["docker.network/net"])
    assert inside(by_label["docker.network/net"], machines[0])
    assert inside(by_label["file/config"], machines[0])
    assert not inside(by_label["file/config"], by_label["docker.network/net"])
    assert inside(by_label["docker.container/cache"], by_label["docker.network/lan"])
    assert inside(by_label["docker.network/lan"], machines[1])
    assert inside(by_label["git.checkout/src"], machines[1])
    assert inside(by_label["file/far"], machines[2])
    assert by_label["docker.container/web"].phase == "creating"
    # Drawn in order: a network before the containers on it (they sit on top).
    order = [b.label for b in boxes]
    assert order.index("docker.network/net") < order.index("docker.container/db")


@pytest.mark.django_db
def test_a_runs_topology_page_links_every_record(studio: Client) -> None:
    run = services.run_start(pipeline_name="sample.wait", inputs={})
    assert run.record is not None
    made = [records.record_declare(kind="test.sleep", name=n, owner=run.record) for n in ("db", "app")]
    page = studio.get(f"/topology/runs/{run.pk}/")
    assert page.status_code == 200
    text = page.content.decode()
    assert "<svg" in text
    for record in made:
        assert f'href="/records/record/{record.pk}/change/"' in text
    assert "this server" in text
    assert 'href="/topology/runs/' in studio.get(f"/runs/{run.pk}/").content.decode()
    stand = services.stand_get("sample.handoff")
    held = records.record_declare(kind="test.sleep", name="kept", owner=stand)
    stand_page = studio.get("/topology/stands/sample.handoff/").content.decode()
    assert f'href="/records/record/{held.pk}/change/"' in stand_page
    assert studio.get("/topology/stands/nosuch/").status_code == 404
