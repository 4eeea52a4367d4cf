"""Capabilities: what agents' machines offer, published by runs, matched by needs."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from apps.agents import selectors, services
from apps.agents.models import AgentCapability
from apps.core.errors import Conflict, ValidationFailed
from apps.records import services as records
from apps.records.choices import Phase
from apps.records.models import Event, Record

pytestmark = pytest.mark.django_db


@pytest.fixture
def stand() -> Record:
    return records.record_create_root(kind="graphene.stand", name="capabilities")


def agent(stand: Record, name: str, **labels: str) -> Record:
    return services.agent_record_declare(owner=stand, name=name, labels=labels)


def need(name: str, **kw: Any) -> dict[str, Any]:
    return services.needs_clean([{"name": name, **kw}])[0]


def test_publishing_replaces_and_is_an_event(stand: Record) -> None:
    box = agent(stand, "box")
    services.capability_publish(agent=box, name="docker", version="24.0", labels={"arch": "amd64"})
    services.capability_publish(agent=box, name="docker", version="25.0", labels={"arch": "amd64", "gpu": "no"})
    (docker,) = AgentCapability.objects.filter(agent=box)
    assert (docker.version, docker.labels) == ("25.0", {"arch": "amd64", "gpu": "no"})
    events = Event.objects.filter(record=box, reason="CapabilityPublished").order_by("created_at", "id")
    assert [e.message for e in events] == ["publishes capability docker 24.0", "updated capability docker 25.0"]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"name": ""}, "name: a capability name"),
        ({"name": "x" * 101}, "name: a capability name"),
        ({"name": "docker", "labels": {"arch": 64}}, "labels: must map"),
        ({"name": "docker", "version": 24}, "version: must be a string"),
    ],
)
def test_bad_capabilities_are_refused_and_store_nothing(stand: Record, kwargs: dict[str, Any], message: str) -> None:
    box = agent(stand, "box")
    with pytest.raises(ValidationFailed, match=message):
        services.capability_publish(agent=box, **kwargs)
    assert not AgentCapability.objects.exists()
    assert not Event.objects.filter(reason="CapabilityPublished").exists()


def test_an_agent_being_deleted_takes_no_capability(stand: Record) -> None:
    box = agent(stand, "box")
    records.record_delete_request(record=box)
    with pytest.raises(Conflict, match="being deleted"):
        services.capability_publish(agent=Record.objects.get(pk=box.pk), name="docker")


@pytest.mark.parametrize(
    ("needs", "message"),
    [
        ("docker", "must be a list"),
        ([{"where_label": {}}], "needs.0.name"),
        ([{"name": "docker", "where": {}}], "unknown field"),
        ([{"name": "docker", "where_label": {"arch": 1}}], "needs.0.where_label"),
        ([{"name": "docker", "where_in": {"version": []}}], "needs.0.where_in"),
        ([{"name": "docker", "where_in": {"version": "24"}}], "needs.0.where_in"),
    ],
)
def test_bad_needs_get_precise_errors(needs: Any, message: str) -> None:
    with pytest.raises(ValidationFailed, match=message):
        services.needs_clean(needs)


def test_selection_matches_labels_names_label_values_and_versions(stand: Record) -> None:
    amd = agent(stand, "amd", pool="ci")
    arm = agent(stand, "arm", pool="ci")
    other = agent(stand, "other", pool="prod")
    agent(stand, "bare", pool="ci")
    for box, arch in ((amd, "amd64"), (arm, "arm64"), (other, "amd64")):
        services.capability_publish(agent=box, name="docker", version="24", labels={"arch": arch})
    services.capability_publish(agent=amd, name="gpu", version="1", labels={})

    def names(**kw: Any) -> list[str]:
        return [r.name for r in selectors.agents_select(**kw)]

    assert names() == ["amd", "arm", "bare", "other"]
    assert names(labels={"pool": "ci"}) == ["amd", "arm", "bare"]
    assert names(labels={"pool": "ci"}, needs=[need("docker")]) == ["amd", "arm"]
    assert names(needs=[need("docker", where_label={"arch": "amd64"})]) == ["amd", "other"]
    assert names(needs=[need("docker", where_in={"arch": ["arm64", "s390x"]})]) == ["arm"]
    assert names(needs=[need("docker", where_in={"version": ["23", "24"]}), need("gpu")]) == ["amd"]
    assert names(needs=[need("docker", where_in={"version": ["25"]})]) == []
    records.record_delete_request(record=other)
    assert names(needs=[need("docker")]) == ["amd", "arm"]  # being deleted: not offered any more


def test_unmet_needs_say_what_was_found(stand: Record) -> None:
    box = agent(stand, "box")
    services.capability_publish(agent=box, name="docker", version="24", labels={"arch": "arm64"})
    unmet = selectors.agent_needs_unmet(
        agent=box, needs=[need("docker", where_label={"arch": "amd64"}), need("kvm"), need("docker")]
    )
    assert unmet == [
        "needs docker (arch=amd64): it publishes docker with arch=arm64, version=24",
        "needs kvm: the agent does not publish 'kvm' (it publishes docker 24)",
    ]


def test_find_by_name_or_id(stand: Record) -> None:
    box = agent(stand, "box")
    other_stand = records.record_create_root(kind="graphene.stand", name="elsewhere")
    twin = agent(other_stand, "box")
    assert {r.pk for r in selectors.agent_find(name_or_id="box")} == {box.pk, twin.pk}
    assert [r.pk for r in selectors.agent_find(name_or_id=str(twin.pk))] == [twin.pk]
    assert selectors.agent_find(name_or_id="nobody") == []


def test_the_agents_api_shows_capabilities(stand: Record, api: Any) -> None:
    box = agent(stand, "box")
    services.capability_publish(agent=box, name="docker", version="24", labels={"arch": "amd64"})
    body = api.get(f"/api/v1/agents/{box.pk}/").json()
    assert [(c["name"], c["version"], c["labels"]) for c in body["capabilities"]] == [
        ("docker", "24", {"arch": "amd64"})
    ]
    listed = api.get("/api/v1/agents/").json()
    assert listed["results"][0]["capabilities"][0]["name"] == "docker"


def connect(box: Record) -> None:
    """What the gateway does on the agent's hello."""
    services.agent_connect(
        record_id=box.pk, session=uuid.uuid4(), channel_name="test", instance="i", version="v", facts={}
    )


def test_a_declared_agent_with_needs_is_ready_only_while_its_machine_publishes_them(stand: Record) -> None:
    gpu = need("gpu", where_label={"vendor": "nvidia"})
    box = services.agent_record_declare(owner=stand, name="trainer", needs=[gpu])
    assert box.spec == {"needs": [gpu]}

    connect(box)
    box.refresh_from_db()
    assert box.phase == Phase.CREATING  # connected, but not what it was declared for
    needs_met = {c["type"]: c for c in box.conditions}["NeedsMet"]
    assert needs_met["status"] == "False"
    assert "does not publish 'gpu'" in needs_met["message"]

    services.capability_publish(agent=box, name="gpu", labels={"vendor": "amd"})
    assert Record.objects.get(pk=box.pk).phase == Phase.CREATING
    services.capability_publish(agent=box, name="gpu", labels={"vendor": "nvidia"})
    box.refresh_from_db()
    assert box.phase == Phase.READY
    assert {c["type"]: c["status"] for c in box.conditions} == {"Connected": "True", "NeedsMet": "True"}

    services.capability_publish(agent=box, name="gpu", labels={"vendor": "intel"})  # it changed on the machine
    box.refresh_from_db()
    assert box.phase == Phase.DRIFTED
    reasons = list(Event.objects.filter(record=box, type="phase_changed").values_list("reason", flat=True))
    assert reasons[-2:] == ["NeedsMet", "NeedsUnmet"]

    connect(box)  # a reconnect re-decides from what is published: still not met
    assert Record.objects.get(pk=box.pk).phase == Phase.DRIFTED
    services.capability_publish(agent=box, name="gpu", labels={"vendor": "nvidia"})
    assert Record.objects.get(pk=box.pk).phase == Phase.READY


def test_an_agent_without_needs_is_ready_when_connected(stand: Record) -> None:
    box = agent(stand, "plain")
    connect(box)
    box.refresh_from_db()
    assert box.phase == Phase.READY
    assert "NeedsMet" not in {c["type"] for c in box.conditions}


def test_bad_needs_on_a_declaration_are_refused_and_declare_nothing(stand: Record) -> None:
    with pytest.raises(ValidationFailed, match=r"needs\.0\.name"):
        services.agent_record_declare(owner=stand, name="box", needs=[{"where_label": {}}])
    assert not Record.objects.filter(kind="agent").exists()
