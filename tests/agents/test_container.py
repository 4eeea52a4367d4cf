"""The machine-in-a-container path: the agent zipapp in a Docker container, dialling out.

The image is a small root file system with the host's Python (``tests/agents/rootfs.py``),
made with ``docker import`` (no registry) and tagged with its content digest, so later runs
reuse it. The container shares the host's network (``--network host``) and so reaches the
test's daphne on loopback; everything else about it (hostname, files, processes) is its own.
Containers are labelled with this session's token and removed after each test.
"""

from __future__ import annotations

import contextlib
import io
import tarfile
import time
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import docker
import docker.errors
import pytest
from django.utils import timezone

from apps.agents import services
from apps.agents.bundle import agent_bundle
from apps.agents.choices import CommandStatus
from apps.agents.models import Agent
from apps.observability.models import LogLine
from apps.records.choices import Phase
from apps.records.models import Record
from tests.agents import rootfs
from tests.agents.conftest import wait_command, wait_phase
from tests.conftest import wait_for
from tests.harness import docker as harness_docker
from tests.harness.agents import listening_sockets
from tests.harness.web import WebServer

pytestmark = [pytest.mark.system, pytest.mark.django_db(transaction=True)]

IMAGE_REPOSITORY = "graphene-test/agent-python"
IMAGE_LABEL = "graphene.test.image"  # = "agent-rootfs" on every image this module makes
CONTAINER_LABEL = "graphene.test.agents-container"  # = this session's token
SESSION = uuid.uuid4().hex[:12]
PYZ = "/opt/graphene-agent/graphene-agent.pyz"
CONFIG = "/etc/graphene-agent/agent.env"  # the agent's default config path: no --config needed

# Run inside the container by the agent: TCP/UDP sockets in LISTEN state (or bound UDP)
# owned by any process of the container (its PID namespace is all that /proc shows). With
# --network host /proc/net/* lists the host's sockets too, hence the match by inode.
LISTENERS = r"""
import os
inodes = set()
for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        continue
    for fd in fds:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
found = []
for table in ("tcp", "tcp6", "udp", "udp6"):
    with open(f"/proc/net/{table}") as f:
        for line in f.read().splitlines()[1:]:
            fields = line.split()
            listening = fields[3] == ("0A" if table.startswith("tcp") else "07")
            if listening and fields[9] in inodes:
                found.append(f"{table} {fields[1]}")
print("sockets:", len(inodes), "listening:", found)
"""


@pytest.fixture(scope="session")
def docker_client() -> docker.DockerClient:
    return harness_docker.client()


@pytest.fixture(scope="session")
def agent_image(docker_client: docker.DockerClient, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    """(image tag, content digest): built and imported once per machine and host Python."""
    items = rootfs.entries()
    identity = rootfs.digest(items)
    tag = f"{IMAGE_REPOSITORY}:{identity}"
    try:
        docker_client.images.get(tag)
        return tag, identity
    except docker.errors.ImageNotFound:
        pass
    began = time.monotonic()
    tarball = rootfs.build(tmp_path_factory.mktemp("agent-rootfs") / "rootfs.tar", items, identity)
    built = time.monotonic()
    docker_client.api.import_image_from_file(
        str(tarball),
        repository=IMAGE_REPOSITORY,
        tag=identity,
        changes=[f"LABEL {IMAGE_LABEL}=agent-rootfs", "ENV PATH=/usr/bin:/bin", 'CMD ["/bin/sh"]'],
    )
    image = docker_client.images.get(tag)
    print(
        f"agent rootfs {identity}: {len(items)} files, {tarball.stat().st_size / 1e6:.1f} MB tar "
        f"in {built - began:.1f}s, imported in {time.monotonic() - built:.1f}s"
    )
    tarball.unlink()
    # Images of an earlier host Python (or builder) are only in the way now; one in use stays.
    for old in docker_client.images.list(filters={"label": f"{IMAGE_LABEL}=agent-rootfs"}):
        if old.id != image.id:
            with contextlib.suppress(docker.errors.APIError):
                docker_client.images.remove(old.id)
    return tag, identity


@pytest.fixture
def containers(docker_client: docker.DockerClient) -> Iterator[None]:
    """Whatever containers a test started (labelled with this session's token) go afterwards."""
    yield
    for container in docker_client.containers.list(all=True, filters={"label": f"{CONTAINER_LABEL}={SESSION}"}):
        with contextlib.suppress(docker.errors.NotFound):
            container.remove(force=True)


def _files(*members: tuple[str, bytes, int]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name, data, mode in members:
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), mode, int(time.time())
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def _diagnose(container: Any) -> str:
    with contextlib.suppress(docker.errors.APIError):
        container.reload()
        logs = container.logs(tail=60).decode(errors="replace")
        return f"container {container.short_id} is {container.status}; its log:\n{logs}"
    return "the container is gone"


def _exec(record: Record, argv: list[str], container: Any) -> Any:
    command = services.command_submit(agent=record, kind="exec", payload={"argv": argv, "timeout": 30})
    try:
        done = wait_command(command, timeout=30)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{_diagnose(container)}") from None
    assert done.status == CommandStatus.SUCCEEDED, (done.error, done.stderr_tail)
    return done


def test_agent_in_a_container_dials_out_and_runs_commands_inside(
    web: WebServer,
    stand: Record,
    docker_client: docker.DockerClient,
    agent_image: tuple[str, str],
    containers: None,
) -> None:
    image, identity = agent_image
    hostname = f"boxed-{SESSION[:8]}"
    install = services.agent_declare(owner=stand, name="boxed", labels={"suite": "container"}, server_url=web.url)
    record = install.record
    env_file = services.agent_env_file(record=record, bootstrap_token=install.bootstrap_token, server_url=web.url)
    env_file += "GRAPHENE_AGENT_BACKOFF_BASE_SECONDS=0.2\nGRAPHENE_AGENT_BACKOFF_MAX_SECONDS=1.5\n"
    container = docker_client.containers.create(
        image,
        [PYZ],  # run as the install script leaves it: the zipapp's #!/usr/bin/env python3
        name=f"graphene-agent-{SESSION}",
        hostname=hostname,
        network_mode="host",
        labels={CONTAINER_LABEL: SESSION, "graphene.test.record": str(record.pk)},
    )
    # Copied in (not bind-mounted): the daemon may not see this process's files.
    assert container.put_archive(
        "/",
        _files(
            (PYZ.lstrip("/"), agent_bundle().path.read_bytes(), 0o755),
            (CONFIG.lstrip("/"), env_file.encode(), 0o600),  # the agent refuses a readable one
        ),
    )
    container.start()

    try:
        record = wait_phase(record, Phase.READY, timeout=60)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{_diagnose(container)}") from None
    facts = record.outputs["facts"]
    # The facts are the container's: its hostname, its os-release, its interpreter.
    assert facts["hostname"] == hostname
    assert facts["distribution"] == f"Graphene agent rootfs {identity}"
    assert facts["python_executable"] == "/usr/bin/python3"
    assert facts["labels"] == {"suite": "container"}
    assert facts["uid"] == 0

    # A command runs inside: it reads files only the container has.
    done = _exec(record, ["cat", "/etc/graphene-rootfs", "/etc/hostname"], container)
    assert done.stdout_tail == f"{identity}\n{hostname}\n"
    logged = list(LogLine.objects.filter(record=record).order_by("id").values_list("message", flat=True))
    assert logged[-2:] == [identity, hostname]
    assert not Path("/etc/graphene-rootfs").exists()  # (not the host's file)
    # The credential went where a root install keeps it, inside the container.
    done = _exec(record, ["sh", "-c", "stat -c %a /var/lib/graphene-agent/credential"], container)
    assert done.stdout_tail == "600\n"

    # I8 inside the container: no process of it has a listening socket...
    done = _exec(record, ["python3", "-c", LISTENERS], container)
    sockets, _, listening = done.stdout_tail.partition(" listening: ")
    assert listening.strip() == "[]", done.stdout_tail
    assert int(sockets.split()[-1]) >= 1  # (it does see the agent's own, outgoing, socket)
    # ... and, seen from the host, neither has any of its processes.
    pids = [int(row[1]) for row in container.top(ps_args="-eo user,pid,args")["Processes"]]
    assert pids
    assert {pid: listening_sockets(pid) for pid in pids} == {pid: [] for pid in pids}

    # Stopping the container (SIGTERM to the agent, PID 1) disconnects the agent.
    container.stop(timeout=15)
    container.reload()
    assert container.attrs["State"]["ExitCode"] == 0, _diagnose(container)
    wait_for(lambda: Agent.objects.get(pk=record.pk).session is None, timeout=30, what="the disconnect")
    record = Record.objects.get(pk=record.pk)
    connected = next(c for c in record.conditions if c["type"] == "Connected")
    assert connected["status"] == "False"
    # Past the grace period it is lost: the record drifts.
    assert services.agents_mark_lost(now=timezone.now() + timedelta(hours=1)) == 1
    assert Record.objects.get(pk=record.pk).phase == Phase.DRIFTED

    # The machine comes back (the container restarts with its file system): the stored
    # credential gets it in again, the used bootstrap token is not needed.
    container.start()
    try:
        wait_phase(record, Phase.READY, timeout=60)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{_diagnose(container)}") from None
    done = _exec(record, ["hostname"], container)
    assert done.stdout_tail == f"{hostname}\n"
