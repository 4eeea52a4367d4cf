"""``ctx.agent_via_ssh`` on a machine where systemd runs: the agent becomes a supervised unit.

The machine is a container whose PID 1 is the host's own systemd: the image is an empty
skeleton (``docker import``, a fixed tag), ``/usr`` is the host's, read-only, and ``/etc`` is a
minimal one written here — no unit of the host is enabled in it, so nothing runs in the
container but systemd's own services and what the test starts (it shares the host's network:
a host service started there would run in the host's network namespace). sshd runs inside it
(``docker exec``; ``tests/agents/sshd.py``'s config and keys, bind-mounted at the same path) on
a free loopback port, and the install logs in as root: ``ssh_remote._systemctl()`` finds
``/run/systemd/system`` and a writable ``/etc/systemd/system`` and picks the system manager.

The container is removed after each test, pass or fail.
"""

from __future__ import annotations

import contextlib
import io
import shutil
import tarfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker
import docker.errors
import pytest

from apps.agents.models import Agent, AgentToken
from apps.agents.services import agent_record_declare
from apps.agents.ssh_install import agent_ssh_install
from apps.observability.models import LogLine
from apps.observability.selectors import log_lines
from apps.pipelines.choices import RunStatus
from apps.pipelines.models import JournalEntry
from apps.records.choices import Phase
from apps.records.models import Record
from apps.records.services import record_delete_request
from apps.secrets.services import secret_set
from tests.agents import ssh_pipelines  # noqa: F401 - registers agents.ssh in this process
from tests.agents.conftest import wait_phase
from tests.agents.sshd import SSHServer
from tests.agents.test_ssh_install import KEY_SECRET, start_run, target, wait_run
from tests.conftest import Worker, wait_for
from tests.harness import docker as harness_docker
from tests.harness.web import WebServer

pytestmark = [pytest.mark.system, pytest.mark.django_db(transaction=True)]

# Empty directories and four links (0 bytes of files): made once, reused under a fixed tag.
IMAGE = "graphene-test/systemd-machine:skeleton"
CONTAINER_LABEL = "graphene.test.systemd-machine"  # on each container (were a session killed)
# What may run in the container before the install: systemd's own services (the units the
# host's /usr/lib/systemd/system wants statically). Anything else came from the host.
SYSTEMD_OWN = frozenset({"dbus.service", "systemd-journald.service", "systemd-logind.service"})
EXIT_REFUSED = 78  # graphene_agent.cli: refused for good; the unit's RestartPreventExitStatus


def _skeleton() -> bytes:
    """The image: empty directories and the usrmerge links into the bind-mounted /usr."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name in ("usr", "etc", "run", "tmp", "proc", "sys", "dev", "root", "home", "var", "var/lib", "var/log"):
            info = tarfile.TarInfo(name)
            info.type, info.mode = tarfile.DIRTYPE, 0o1777 if name == "tmp" else 0o755
            tar.addfile(info)
        for name in ("bin", "lib", "lib64", "sbin"):
            info = tarfile.TarInfo(name)
            info.type, info.linkname = tarfile.SYMTYPE, f"usr/{name}"
            tar.addfile(info)
    return buffer.getvalue()


def minimal_etc(etc: Path) -> None:
    """An /etc for a machine that runs only what the test starts.

    Users for root and sshd's privilege separation, the loader's cache (the libraries are the
    host's, in the bind-mounted /usr), a machine id (not a first boot: nothing asks anything)
    and an empty /etc/systemd/system, where the install writes its unit. /tmp is never
    cleared (the test's sshd directory is mounted below it); /run/sshd is made at boot.
    """
    for folder in ("systemd/system", "tmpfiles.d", "ld.so.conf.d"):
        (etc / folder).mkdir(parents=True)
    files = {
        "passwd": "root:x:0:0:root:/root:/bin/bash\n"
        "sshd:x:100:65534::/run/sshd:/usr/sbin/nologin\n"
        "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n",
        "group": "root:x:0:\nnogroup:x:65534:\n",
        "shadow": "root:*:19000:0:99999:7:::\nsshd:*:19000:0:99999:7:::\nnobody:*:19000:0:99999:7:::\n",
        "nsswitch.conf": "passwd: files\ngroup: files\nshadow: files\nhosts: files dns\n",
        "machine-id": uuid.uuid4().hex + "\n",
        "tmpfiles.d/graphene-sshd.conf": "d /run/sshd 0755 root root -\n",
    }
    for name, text in files.items():
        (etc / name).write_text(text)
    (etc / "shadow").chmod(0o600)
    (etc / "tmpfiles.d/tmp.conf").symlink_to("/dev/null")  # masks /usr/lib/tmpfiles.d/tmp.conf
    shutil.copyfile("/etc/os-release", etc / "os-release")  # (a link into /usr/lib on the host)
    for name in ("ld.so.cache", "ld.so.conf"):
        shutil.copyfile(Path("/etc") / name, etc / name)
    for conf in Path("/etc/ld.so.conf.d").glob("*.conf"):
        shutil.copyfile(conf, etc / "ld.so.conf.d" / conf.name)


class SystemdMachine:
    """A container with systemd as PID 1 and an sshd inside, on a loopback port of this host."""

    def __init__(self, client: docker.DockerClient, directory: Path) -> None:
        self.client = client
        self.name = f"graphene-systemd-{uuid.uuid4().hex[:12]}"
        self.etc = directory / "etc"
        self.sshd = SSHServer(directory / "sshd", user="root", launcher=["docker", "exec", self.name])
        self.container: Any = None

    def start(self) -> SystemdMachine:
        try:
            self.client.images.get(IMAGE)
        except docker.errors.ImageNotFound:
            repository, tag = IMAGE.split(":")
            self.client.api.import_image_from_data(_skeleton(), repository=repository, tag=tag)
        minimal_etc(self.etc)
        self.container = self.client.containers.run(
            IMAGE,
            ["/lib/systemd/systemd"],
            name=self.name,
            detach=True,
            labels={CONTAINER_LABEL: "1"},
            environment={"container": "docker"},  # systemd: a container, no hardware to set up
            cap_add=["SYS_ADMIN"],  # (--privileged cannot apply its caps on these machines)
            tmpfs={"/run": ""},
            volumes={
                "/usr": {"bind": "/usr", "mode": "ro"},
                str(self.etc): {"bind": "/etc", "mode": "rw"},
                "/sys/fs/cgroup": {"bind": "/sys/fs/cgroup", "mode": "rw"},
                str(self.sshd.dir): {"bind": str(self.sshd.dir), "mode": "rw"},
            },
            network_mode="host",
        )
        wait_for(self._booted, timeout=30, what=f"systemd in container {self.name} to boot")
        assert self.running_services() <= SYSTEMD_OWN, f"the machine runs more: {self.running_services()}"
        self.sshd.start()
        return self

    def _booted(self) -> bool:
        self.container.reload()
        if self.container.status != "running":
            raise AssertionError(f"{self.name} is {self.container.status}:\n{self.diagnose()}")
        return self.systemctl("is-system-running") in ("running", "degraded")

    def run(self, *argv: str) -> tuple[int, str]:
        code, output = self.container.exec_run(list(argv))
        return int(code), output.decode(errors="replace").strip()

    def systemctl(self, *args: str) -> str:
        return self.run("systemctl", *args)[1]

    def running_services(self) -> set[str]:
        listed = self.systemctl("list-units", "--type=service", "--state=running", "--plain", "--no-legend")
        return {line.split()[0] for line in listed.splitlines() if line.strip()}

    def show(self, unit: str, prop: str) -> str:
        return self.systemctl("show", "--property", prop, "--value", unit)

    def diagnose(self) -> str:
        with contextlib.suppress(docker.errors.APIError):
            return self.container.logs(tail=60).decode(errors="replace")
        return "(no log)"

    def remove(self) -> None:
        if self.container is not None:
            # What systemd and the agents said, in the output a failed test shows.
            print(self.run("journalctl", "--no-pager", "--lines=80", "--output=short-monotonic")[1])
            with contextlib.suppress(docker.errors.NotFound):
                self.container.remove(force=True)
        self.sshd.stop()  # (the sshd went with the container; this ends the `docker exec`)


@pytest.fixture(scope="session")
def docker_client() -> docker.DockerClient:
    return harness_docker.client()


@pytest.fixture
def machine(docker_client: docker.DockerClient, tmp_path: Path) -> Iterator[SystemdMachine]:
    if Path("/sys/fs/cgroup/cgroup.controllers").exists():
        # The container gets the host's cgroup v1 hierarchy; with cgroup v2 it would get the
        # host's root in its own cgroup namespace, and its systemd would manage the host's.
        pytest.fail(
            "this host uses cgroup v2 only: this test's systemd-in-a-container needs the cgroup v1 "
            "hierarchy (.ci/run's machine kind has it); the systemd path is not proven here"
        )
    box = SystemdMachine(docker_client, tmp_path / "machine")
    try:
        yield box.start()
    finally:
        box.remove()


def unit_of(record: Record) -> str:
    return f"graphene-agent-{record.pk}.service"


def stopped_for_good(machine: SystemdMachine, unit: str) -> bool:
    """The agent exited refused (78) and systemd did not schedule a restart (no ``auto-restart``)."""
    state = (machine.show(unit, "ActiveState"), machine.show(unit, "SubState"))
    return state == ("failed", "failed") and machine.show(unit, "ExecMainStatus") == str(EXIT_REFUSED)


def test_systemd_supervises_the_agent_a_rerun_converges_and_deletion_stops_it(
    web: WebServer,
    machine: SystemdMachine,
    stand: Record,
    workers: list[Worker],
) -> None:
    # The shared workers know the web server's URL (what the installed agents dial).
    sshd = machine.sshd
    units = machine.etc / "systemd" / "system"  # the machine's /etc/systemd/system
    secret_set(name=KEY_SECRET, value=sshd.user_key.private_openssh)

    # A run's ctx.agent_via_ssh: the agent runs as a unit, connects, runs the run's commands
    # (with the login's $HOME, as a background agent would), and stops for good with the run.
    run = wait_run(start_run(sshd))

    assert run.status == RunStatus.SUCCEEDED, run.error
    assert run.outputs == {"exit_code": 0, "home": str(sshd.home)}
    entry = JournalEntry.objects.get(run=run, seq=1)
    assert entry.call == "agent_via_ssh box"
    assert entry.result is not None
    assert entry.result["install"]["method"] == "systemd"
    box = Record.objects.get(pk=entry.result["record_id"])
    assert run.record_id is not None
    run_log = log_lines(record=Record.objects.get(pk=run.record_id))  # its agent's lines are its own
    installed = run_log.filter(source="ssh-install").values_list("message", flat=True)
    assert len(installed) == 1
    assert "started with systemd" in installed[0]
    wait_for(lambda: Record.objects.get(pk=box.pk).phase == Phase.DELETED, what="the run's agent record to go")
    wait_for(lambda: stopped_for_good(machine, unit_of(box)), timeout=30, what="the run's agent to stop for good")
    assert machine.show(unit_of(box), "NRestarts") == "0"

    # An agent of a longer-lived owner, installed directly (the service the run called).
    record = agent_record_declare(owner=stand, name="supervised")
    unit = unit_of(record)
    first = agent_ssh_install(record=record, target=target(sshd), server_url=web.url)

    # 1. A unit of the system manager runs it, enabled, and the agent dials out.
    assert (first.changed, first.method) == (True, "systemd")
    assert machine.systemctl("is-active", unit) == "active"
    assert machine.systemctl("is-enabled", unit) == "enabled"
    assert machine.show(unit, "FragmentPath") == f"/etc/systemd/system/{unit}"
    assert (units / unit).is_file()
    assert machine.show(unit, "MainPID") == str(first.pid)
    directory = sshd.home / ".graphene-agent" / str(record.pk)
    assert Path(first.directory) == directory
    assert not (directory / "agent.pid").exists()  # (the background path's pid file)
    logged = LogLine.objects.filter(record=record, source="ssh-install").values_list("message", flat=True)
    assert [f"started with systemd, pid {first.pid}" in message for message in logged] == [True]
    record = wait_phase(record, Phase.READY, timeout=30)
    connected = Agent.objects.get(pk=record.pk)
    assert connected.session is not None
    assert len(sshd.agent_processes()) == 1  # (the run's agent is gone)

    # 2. systemd restarts a killed agent, which connects again: a new process, a new session.
    assert machine.run("kill", "-9", str(first.pid))[0] == 0
    wait_for(
        lambda: machine.show(unit, "MainPID") not in ("0", str(first.pid)) and machine.show(unit, "NRestarts") == "1",
        timeout=30,
        what=f"systemd to restart {unit}",
    )
    restarted_pid = int(machine.show(unit, "MainPID"))

    def reconnected() -> Agent | None:
        agent = Agent.objects.get(pk=record.pk)
        fresh = agent.session not in (None, connected.session) and agent.instance != connected.instance
        return agent if fresh else None

    again_connected = wait_for(reconnected, timeout=30, what="the restarted agent to connect again")
    assert again_connected is not None
    assert Record.objects.get(pk=record.pk).phase == Phase.READY
    tokens = AgentToken.objects.filter(agent=record).count()

    # 3. Installing again changes nothing: the same unit, the same process, the same session.
    again = agent_ssh_install(record=record, target=target(sshd), server_url=web.url)

    assert (again.changed, again.method, again.pid) == (False, "systemd", restarted_pid)
    assert machine.show(unit, "MainPID") == str(restarted_pid)
    assert machine.show(unit, "NRestarts") == "1"
    assert sorted(path.name for path in units.glob("graphene-agent-*")) == sorted([unit, unit_of(box)])
    assert len(sshd.agent_processes()) == 1
    assert Agent.objects.get(pk=record.pk).session == again_connected.session
    assert AgentToken.objects.filter(agent=record).count() == tokens  # no new bootstrap token
    logged = (
        LogLine.objects.filter(record=record, source="ssh-install").order_by("id").values_list("message", flat=True)
    )
    assert f"already runs on root@127.0.0.1:{sshd.port} (pid {restarted_pid}, systemd)" in list(logged)[-1]

    # 4. Deleting the record stops the agent for good: told so, it exits 78, and the unit's
    # RestartPreventExitStatus keeps systemd from starting it again.
    record_delete_request(record=record)
    wait_for(lambda: Record.objects.get(pk=record.pk).phase == Phase.DELETED, what="the agent record to be deleted")
    wait_for(lambda: stopped_for_good(machine, unit), timeout=30, what=f"{unit} to stop for good")
    assert machine.show(unit, "NRestarts") == "1"
    assert sshd.agent_processes() == []
