"""Docker on an agent's machine: the docker.* kinds reach the engine through a real agent
(its socket on this machine), with the web server and a Celery worker that cannot reach any
dockerd itself (``GRAPHENE_DOCKER_HOST`` points nowhere), so everything goes through the agent.

The workers (and this process) share the Redis channel layer with the web server, so engine
requests go as live calls over the agent's connection and leave no command rows; with an
in-memory layer (embedded mode) they go as ``call`` commands."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import docker
import docker.errors
import pytest
from django.conf import settings as django_settings
from django.utils import timezone
from graphene_sdk.libs.docker import object_name

from apps.agents.machine import AWAY_RETRY_SECONDS
from apps.agents.models import Agent, AgentCommand
from apps.records import services as records
from apps.records.choices import Phase
from apps.records.models import Event, Record
from kinds import get_kind
from kinds.docker._agent import CHUNK_BYTES, OPERATION
from kinds.docker._common import LABEL_RECORD
from tests.agents.conftest import wait_phase
from tests.conftest import Worker, wait_for
from tests.harness import docker as harness_docker
from tests.harness.agents import AgentProcess
from tests.harness.docker import busybox_image, busybox_rootfs_tar, counts
from tests.harness.web import CHANNEL_LAYER_URL

# The workers have no engine of their own (whatever works went through the agent), and they
# tell the web process about their commands through Redis, as a production worker does (the
# test settings' in-memory layer would leave them to the agent's next poll).
pytestmark = [
    pytest.mark.system,
    pytest.mark.django_db(transaction=True),
    pytest.mark.xdist_group("docker-on-agent"),  # one xdist process starts their workers
    pytest.mark.worker_env(
        GRAPHENE_DOCKER_HOST="unix:///nonexistent/graphene-test-docker.sock",
        DJANGO_SETTINGS_MODULE="tests.harness.web_settings",
        GRAPHENE_TEST_AGENTS_CHANNEL_LAYER_URL=CHANNEL_LAYER_URL,
        GRAPHENE_AGENT_LOST_DELETE_DEADLINE_SECONDS="30",
    ),
]


@pytest.fixture(scope="module")
def docker_client() -> docker.DockerClient:
    return harness_docker.client()


@pytest.fixture(scope="module")
def image(docker_client: docker.DockerClient, tmp_path_factory: pytest.TempPathFactory) -> str:
    """The busybox image of tests/docker, imported once per machine."""
    return busybox_image(docker_client, busybox_rootfs_tar(tmp_path_factory.mktemp("rootfs")))


@pytest.fixture
def worker(workers: list[Worker]) -> Worker:
    return workers[0]


@pytest.fixture(autouse=True)
def _no_leftovers(docker_client: docker.DockerClient, transactional_db: None) -> Iterator[None]:
    yield
    from tests.harness.docker import labelled

    for container in labelled(docker_client)["containers"]:
        docker_client.api.remove_container(container.id, force=True, v=True)
    for network in labelled(docker_client)["networks"]:
        network.remove()


def declare(agent: Record, kind: str, name: str, **spec: Any) -> Record:
    return records.record_declare(kind=f"docker.{kind}", name=name, owner=agent, spec={**spec, "agent": str(agent.pk)})


def commands_of(record: Record) -> list[AgentCommand]:
    return list(AgentCommand.objects.filter(waiting_record_id=record.pk, operation=OPERATION).order_by("created_at"))


# An agent from before live calls: the same agent, whose hello offers no features.
AGENT_WITHOUT_LIVE_CALLS = [
    sys.executable,
    "-c",
    "import sys; from graphene_agent import cli, protocol; protocol.FEATURES = (); sys.exit(cli.main(sys.argv[1:]))",
]


def test_network_container_and_job_on_an_agents_machine(
    agents: Callable[..., tuple[Record, AgentProcess]],
    worker: Worker,
    docker_client: docker.DockerClient,
    image: str,
    settings: Any,
) -> None:
    shared_layer = settings.CHANNEL_LAYERS
    agent, _process = agents("dockerhost")
    wait_phase(agent, Phase.READY)
    net = declare(agent, "network", "net")
    net_name = object_name(net.name, str(net.pk))
    app = declare(
        agent,
        "container",
        "app",
        image=image,
        command=["sh", "-c", "echo app is up; exec sleep 600"],
        network=net_name,
        ready_when={"log": "app is up"},
        pull="never",
    )
    ready_net = wait_phase(net, Phase.READY, timeout=60)
    ready_app = wait_phase(app, Phase.READY, timeout=60)
    job = declare(
        agent, "job", "hello", image=image, command=["sh", "-c", "echo hello from the job; echo oops >&2"], pull="never"
    )
    ready_job = wait_phase(job, Phase.READY, timeout=60)
    # The worker's engine requests went as live calls: not one command row.
    assert commands_of(net) == commands_of(app) == commands_of(job) == []

    # Made on the engine the agent reaches, labelled with their records.
    assert ready_net.outputs["name"] == net_name
    assert ready_net.outputs["adopted"] is False
    assert ready_app.outputs["running"] is True
    assert ready_app.outputs["networks"].keys() == {net_name}
    found = docker_client.containers.get(ready_app.outputs["id"])
    assert found.labels[LABEL_RECORD] == str(app.pk)
    assert docker_client.networks.get(net_name).attrs["Labels"][LABEL_RECORD] == str(net.pk)
    assert ready_job.outputs["exit_code"] == 0
    assert ready_job.outputs["stdout_tail"] == "hello from the job"
    from apps.observability.selectors import log_lines

    job_log = {(line.stream, line.message) for line in log_lines(record=job, include_descendants=False)}
    assert {("stdout", "hello from the job"), ("stderr", "oops")} <= job_log
    app_log = [line.message for line in log_lines(record=app, include_descendants=False)]
    assert "app is up" in app_log

    # A create run again (a retry after a crash) finds the objects by label and adopts them;
    # called here with an in-memory channel layer, which reaches no gateway: as call commands.
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
    again_net = get_kind("docker.network").create(Record.objects.get(pk=net.pk))
    again_app = get_kind("docker.container").create(Record.objects.get(pk=app.pk))
    settings.CHANNEL_LAYERS = shared_layer
    assert again_net["adopted"] is True
    assert again_net["id"] == ready_net.outputs["id"]
    assert again_app["adopted"] is True
    assert again_app["id"] == ready_app.outputs["id"]
    assert counts(docker_client, [net, app, job]) == {"containers": 2, "networks": 1, "volumes": 0, "images": 0}

    # Removed behind Graphene's back: the observation (through the agent) sees it gone, heals it.
    docker_client.api.remove_container(ready_app.outputs["id"], force=True)
    observed = records.records_observe(record_ids=[app.pk])
    assert observed["healing"] == 1, observed
    wait_for(lambda: Record.objects.get(pk=app.pk).heals == 1, timeout=60, what="the heal")
    healed = wait_phase(app, Phase.READY, timeout=60)
    assert healed.outputs["id"] != ready_app.outputs["id"]
    assert docker_client.containers.get(healed.outputs["id"]).status == "running"
    assert counts(docker_client, app)["containers"] == 1

    # Deleting the agent deletes its objects first, through the agent.
    records.record_delete_request(record=agent)
    for record in (app, job, net, agent):
        wait_phase(record, Phase.DELETED, timeout=60)
    assert counts(docker_client, [net, app, job]) == {"containers": 0, "networks": 0, "volumes": 0, "images": 0}
    for record in (app, net):
        methods = {c.payload.get("kwargs", {}).get("method") for c in commands_of(record)}
        assert methods == {"GET"}, (record, methods)  # the adoptions above; the workers' requests went live
        assert {c.status for c in commands_of(record)} == {"succeeded"}
    assert commands_of(job) == []
    for record in (app, job, net):
        assert not Event.objects.filter(record=record, reason="DeletionAbandoned").exists()
    # Every command was taken by the worker that waited for it; none is left open.
    assert not AgentCommand.objects.filter(agent=agent, status__in=["queued", "sent", "running"]).exists()


def test_an_image_imported_on_an_agents_machine(
    agents: Callable[..., tuple[Record, AgentProcess]],
    worker: Worker,
    docker_client: docker.DockerClient,
    tmp_path: Path,
) -> None:
    """The root file system tar is on the server; it is uploaded in pieces through the agent."""
    agent, _process = agents("imports")
    wait_phase(agent, Phase.READY)
    tar = busybox_rootfs_tar(tmp_path)
    image = declare(agent, "image", "box", rootfs_tar=str(tar), changes=['CMD ["/bin/sh"]'])
    assert tar.stat().st_size > 2 * CHUNK_BYTES  # more than one live call carries
    ready = wait_phase(image, Phase.READY, timeout=90)
    assert commands_of(image) == []
    assert ready.outputs["reference"] in docker_client.images.get(ready.outputs["id"]).tags
    records.record_delete_request(record=agent)
    wait_phase(image, Phase.DELETED, timeout=60)
    wait_phase(agent, Phase.DELETED, timeout=30)
    assert counts(docker_client, image)["images"] == 0


def test_a_create_waits_for_an_agent_that_is_away(
    agents: Callable[..., tuple[Record, AgentProcess]],
    worker: Worker,
    docker_client: docker.DockerClient,
) -> None:
    agent, process = agents("away")
    wait_phase(agent, Phase.READY)
    process.stop()
    wait_for(lambda: Agent.objects.get(pk=agent.pk).session is None, what="the disconnect")

    net = declare(agent, "network", "later")

    # Several tries while the agent is away: each finds it away and lets go, its next try
    # AWAY_RETRY_SECONDS on (beyond the lease a try in progress holds).
    let_go_at: set[Any] = set()
    beyond = timedelta(seconds=django_settings.GRAPHENE_OPERATION_LEASE_SECONDS + AWAY_RETRY_SECONDS / 2)

    def tried_twice() -> bool:
        at = Record.objects.get(pk=net.pk).next_attempt_at
        if at is not None and at - timezone.now() > beyond:
            let_go_at.add(at)
        return len(let_go_at) >= 2

    wait_for(tried_twice, timeout=30, what="two tries of the create while the agent is away")
    waiting = Record.objects.get(pk=net.pk)
    assert waiting.phase in (Phase.PENDING, Phase.CREATING), waiting.phase
    assert waiting.attempts == 0  # waiting for the machine is not a failed attempt
    assert not AgentCommand.objects.filter(waiting_record_id=net.pk).exists()  # nothing queued for later
    assert counts(docker_client, net)["networks"] == 0

    process.start()
    ready = wait_phase(net, Phase.READY, timeout=60)
    assert ready.outputs["adopted"] is False
    assert counts(docker_client, net)["networks"] == 1
    records.record_delete_request(record=agent)
    wait_phase(net, Phase.DELETED, timeout=60)
    assert counts(docker_client, net)["networks"] == 0


def test_an_agent_without_live_calls_gets_call_commands(
    agents: Callable[..., tuple[Record, AgentProcess]],
    worker: Worker,
    docker_client: docker.DockerClient,
    image: str,
) -> None:
    """An agent whose hello offers no live calls (one from before them) is sent each engine
    request as a ``call`` command, and the create works the same."""
    agent, _process = agents("older", command=AGENT_WITHOUT_LIVE_CALLS)
    wait_phase(agent, Phase.READY)
    app = declare(
        agent,
        "container",
        "app",
        image=image,
        command=["sh", "-c", "echo app is up; exec sleep 600"],
        ready_when={"log": "app is up"},
        pull="never",
    )
    ready = wait_phase(app, Phase.READY, timeout=60)
    assert docker_client.containers.get(ready.outputs["id"]).labels[LABEL_RECORD] == str(app.pk)
    commands = commands_of(app)
    assert len(commands) >= 5  # list, create, start, inspect, logs...
    assert {(c.kind, c.status) for c in commands} == {("call", "succeeded")}
    assert {c.payload.get("kwargs", {}).get("method") for c in commands} >= {"GET", "POST"}
    records.record_delete_request(record=agent)
    wait_phase(app, Phase.DELETED, timeout=60)
    assert counts(docker_client, app)["containers"] == 0


def test_an_agent_that_leaves_mid_request_stops_the_create_until_it_is_back(
    agents: Callable[..., tuple[Record, AgentProcess]],
    worker: Worker,
    docker_client: docker.DockerClient,
    image: str,
) -> None:
    """The job's create waits for the exit in a long poll (a live call in flight); the agent
    stops meanwhile: the call ends ``lost`` and the create lets go as for an agent that is
    away (no failed attempt). Back, the create tried again adopts the same container."""
    agent, process = agents("leaves")
    wait_phase(agent, Phase.READY)
    job = declare(agent, "job", "slow", image=image, command=["sh", "-c", "sleep 4; echo finished"], pull="never")

    def running() -> bool:
        found = harness_docker.labelled(docker_client, job)["containers"]
        return bool(found) and found[0].status == "running"

    wait_for(running, timeout=60, what="the job's container to run")
    process.stop()
    wait_for(lambda: Agent.objects.get(pk=agent.pk).session is None, what="the disconnect")
    process.start()
    ready = wait_phase(job, Phase.READY, timeout=60)
    assert ready.outputs["exit_code"] == 0
    assert ready.outputs["stdout_tail"] == "finished"
    assert ready.outputs["adopted"] is True
    assert counts(docker_client, job)["containers"] == 1
    # The machine going away was no failed attempt: the create waited for it, with no error.
    assert not Event.objects.filter(record=job, type="error").exists()
    assert commands_of(job) == []
    records.record_delete_request(record=agent)
    wait_phase(job, Phase.DELETED, timeout=60)
    assert counts(docker_client, job)["containers"] == 0


def test_a_container_with_a_secret_on_an_agents_machine(
    agents: Callable[..., tuple[Record, AgentProcess]],
    worker: Worker,
    docker_client: docker.DockerClient,
    image: str,
) -> None:
    """Its requests are sealed live calls: opened by the gateway only, the value reaches the
    engine, and inspect answers come back with the environment blanked."""
    from apps.secrets.services import secret_create

    value = "s3cret-through-a-live-call"
    secret_create(name="live-token", value=value)
    agent, _process = agents("sealed")
    wait_phase(agent, Phase.READY)
    app = declare(
        agent,
        "container",
        "app",
        image=image,
        command=["sh", "-c", "echo app is up; exec sleep 600"],
        env={"TOKEN": {"$secret": "live-token"}},
        ready_when={"log": "app is up"},
        pull="never",
    )
    ready = wait_phase(app, Phase.READY, timeout=60)
    assert f"TOKEN={value}" in docker_client.containers.get(ready.outputs["id"]).attrs["Config"]["Env"]
    assert value not in str(ready.outputs)
    assert commands_of(app) == []
    records.record_delete_request(record=agent)
    wait_phase(app, Phase.DELETED, timeout=60)
    assert counts(docker_client, app)["containers"] == 0
