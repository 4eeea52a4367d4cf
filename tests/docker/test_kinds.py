"""The docker kinds against the real dockerd: adopt-or-create, readiness, drift, jobs, deletion, sweeping.

Each test declares records through the services (committed ``pending``, as a run would) and
calls the kind's operations itself, as convergence, observation and deletion do; objects are
counted by their ``graphene.record`` label.
"""

from __future__ import annotations

import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

import docker
import docker.errors
import pytest
from graphene_sdk.libs.docker import image_reference, object_name

from apps.core.errors import ValidationFailed
from apps.observability.models import LogLine, MetricPoint
from apps.records import services
from apps.records.choices import Phase
from apps.records.models import Record
from apps.secrets.services import secret_create
from kinds import Drift, KindError, PermanentError, get_kind
from kinds.docker._common import LABEL_KIND, LABEL_RECORD, LABEL_SCOPE, scope
from tests.conftest import wait_for
from tests.docker.conftest import declare
from tests.harness.docker import counts, labelled

pytestmark = pytest.mark.django_db

SERVE = ["sh", "-c", "echo starting; while true; do sleep 1; done"]


def kind(record: Record) -> Any:
    return get_kind(record.kind)


def the_container(client: docker.DockerClient, record: Record) -> Any:
    (found,) = labelled(client, record)["containers"]
    return client.containers.get(found.id)


def log_messages(record: Record) -> list[str]:
    return list(LogLine.objects.filter(record=record).order_by("id").values_list("message", flat=True))


def test_create_adopts_after_a_crash_instead_of_making_a_second_container(
    owner: Record, image: str, docker_client: docker.DockerClient
) -> None:
    record = declare(owner, "container", "db", image=image, command=SERVE)
    first = kind(record).create(record)
    assert first["adopted"] is False
    assert first["name"] == object_name("db", str(record.pk))
    assert first["running"] is True
    # A worker that died after dockerd made the container but before the record said so:
    # the record is still pending and convergence calls create again.
    assert Record.objects.get(pk=record.pk).phase == Phase.PENDING
    again = kind(record).create(record)
    assert again["adopted"] is True
    assert again["id"] == first["id"]
    assert counts(docker_client, record)["containers"] == 1
    container = the_container(docker_client, record)
    assert container.labels[LABEL_RECORD] == str(record.pk)
    assert container.labels[LABEL_SCOPE] == scope()
    assert container.labels[LABEL_KIND] == "docker.container"


def test_a_crash_between_create_and_start_is_adopted_and_started(
    owner: Record, image: str, docker_client: docker.DockerClient
) -> None:
    record = declare(owner, "container", "half", image=image, command=SERVE)
    kind(record).create(record)
    container = the_container(docker_client, record)
    container.stop(timeout=0)
    # As if the first attempt died between "create" and "start": a created-only container.
    docker_client.api.remove_container(container.id, force=True)
    made = docker_client.containers.create(
        image, SERVE, name=object_name("half", str(record.pk)), labels=dict(container.labels)
    )
    outputs = kind(record).create(record)
    assert outputs == {**outputs, "adopted": True, "id": made.id, "running": True}
    assert counts(docker_client, record)["containers"] == 1


def test_a_stopped_container_is_drift_and_create_heals_it(
    owner: Record, image: str, docker_client: docker.DockerClient
) -> None:
    record = declare(owner, "container", "web", image=image, command=SERVE)
    made = kind(record).create(record)
    observed = kind(record).observe(record)
    assert observed is not None
    assert kind(record).diff(record, observed) == []

    the_container(docker_client, record).stop(timeout=0)
    observed = kind(record).observe(record)
    assert observed is not None
    assert observed.outputs["running"] is False
    assert Drift("running", True, False) in kind(record).diff(record, observed)

    healed = kind(record).create(record)
    assert healed["adopted"] is True
    assert healed["id"] == made["id"]
    assert healed["running"] is True
    observed = kind(record).observe(record)
    assert observed is not None
    assert kind(record).diff(record, observed) == []
    assert counts(docker_client, record)["containers"] == 1


def test_a_container_removed_behind_our_back_observes_as_gone_and_is_made_again(
    owner: Record, image: str, docker_client: docker.DockerClient
) -> None:
    record = declare(owner, "container", "gone", image=image, command=SERVE)
    made = kind(record).create(record)
    docker_client.api.remove_container(made["id"], force=True)
    assert kind(record).observe(record) is None
    again = kind(record).create(record)
    assert again["adopted"] is False
    assert again["id"] != made["id"]
    assert counts(docker_client, record)["containers"] == 1


def test_a_moved_image_tag_is_drift_and_healing_replaces_the_container(
    owner: Record, image: str, docker_client: docker.DockerClient
) -> None:
    reference = f"graphene-test/moving:{uuid.uuid4().hex[:8]}"
    docker_client.images.get(image).tag(reference)
    try:
        record = declare(owner, "container", "moving", image=reference, command=SERVE)
        made = kind(record).create(record)
        # The tag now names another image (a new release pushed under the same tag).
        other = docker_client.containers.create(image, ["true"], labels={LABEL_SCOPE: scope()})
        other.commit(*reference.split(":"))
        other.remove()
        observed = kind(record).observe(record)
        assert observed is not None
        assert [d.field for d in kind(record).diff(record, observed)] == ["image"]
        healed = kind(record).create(record)
        assert healed["id"] != made["id"]
        assert healed["image_id"] == docker_client.images.get(reference).id
        assert counts(docker_client, record)["containers"] == 1
    finally:
        docker_client.images.remove(reference, force=True)


def test_ready_when_a_log_line_matches_and_logs_reach_the_record(
    owner: Record, image: str, docker_client: docker.DockerClient
) -> None:
    record = declare(
        owner,
        "container",
        "logger",
        image=image,
        command=["sh", "-c", "echo booting; sleep 1; echo 'listening on :5432' >&2; while true; do sleep 1; done"],
        ready_when={"log": r"listening on :\d+"},
        ready_timeout_s=60,
    )
    outputs = kind(record).create(record)
    assert outputs["running"] is True
    lines = list(LogLine.objects.filter(record=record).order_by("id").values_list("message", "stream"))
    assert ("booting", "stdout") in lines
    assert ("listening on :5432", "stderr") in lines
    # Observing again copies nothing twice.
    kind(record).observe(record)
    assert log_messages(record).count("booting") == 1


def test_ready_when_healthy_waits_for_the_healthcheck(owner: Record, image: str) -> None:
    record = declare(
        owner,
        "container",
        "healthy",
        image=image,
        command=["sh", "-c", "sleep 1; touch /tmp/ok; while true; do sleep 1; done"],
        healthcheck={"test": ["CMD-SHELL", "test -f /tmp/ok"], "interval_s": 0.2, "retries": 1},
        ready_when="healthy",
    )
    outputs = kind(record).create(record)
    assert outputs["health"] == "healthy"


def test_a_container_that_exits_before_it_is_ready_is_retried_with_its_last_lines(owner: Record, image: str) -> None:
    record = declare(owner, "container", "crashy", image=image, command=["sh", "-c", "echo bad config; exit 3"])
    with pytest.raises(KindError, match="exited with code 3") as caught:
        kind(record).create(record)
    assert not isinstance(caught.value, PermanentError)
    assert "bad config" in str(caught.value)


def test_waiting_too_long_for_readiness_is_a_retryable_error(owner: Record, image: str) -> None:
    record = declare(
        owner, "container", "slow", image=image, command=SERVE, ready_when={"log": "never"}, ready_timeout_s=1
    )
    with pytest.raises(KindError, match="timed out after 1s") as caught:
        kind(record).create(record)
    assert not isinstance(caught.value, PermanentError)


def test_observe_copies_new_log_lines_once_and_records_stats(owner: Record, image: str) -> None:
    record = declare(
        owner,
        "container",
        "ticker",
        image=image,
        command=["sh", "-c", "i=0; while true; do echo tick $i; i=$((i+1)); sleep 0.1; done"],
    )
    kind(record).create(record)

    def ticks() -> list[int]:
        return [int(m.split()[1]) for m in log_messages(record) if m.startswith("tick ")]

    wait_for(lambda: kind(record).observe(record) and len(ticks()) >= 5, timeout=30, what="five ticks in the log")
    kind(record).observe(record)
    seen = ticks()
    assert seen == list(range(len(seen))), "every line once, in order"
    names = set(MetricPoint.objects.filter(record=record).values_list("name", flat=True))
    assert {"container_cpu_seconds_total", "container_memory_bytes"} <= names


def test_delete_removes_everything_and_is_idempotent(
    owner: Record, image: str, docker_client: docker.DockerClient
) -> None:
    net = declare(owner, "network", "net")
    vol = declare(owner, "volume", "data")
    net_out = kind(net).create(net)
    vol_out = kind(vol).create(vol)
    assert net_out["name"] == object_name("net", str(net.pk))
    app = declare(
        owner,
        "container",
        "app",
        image=image,
        command=SERVE,
        network=net_out["name"],
        volumes=[{"source": vol_out["name"], "target": "/data"}],
    )
    outputs = kind(app).create(app)
    assert outputs["networks"].keys() == {net_out["name"]}
    assert outputs["ip_address"]
    ids = [net.pk, vol.pk, app.pk]
    assert counts(docker_client, ids) == {"containers": 1, "networks": 1, "volumes": 1, "images": 0}

    # Still in use: the network's and volume's deletes fail in a way that is retried.
    for record in (net, vol):
        with pytest.raises(KindError) as caught:
            kind(record).delete(record)
        assert not isinstance(caught.value, PermanentError)

    for record in (app, net, vol):
        kind(record).delete(record)
    assert counts(docker_client, ids) == {"containers": 0, "networks": 0, "volumes": 0, "images": 0}
    for record in (app, net, vol):
        kind(record).delete(record)  # gone already: success
        assert kind(record).observe(record) is None


def test_containers_on_a_network_reach_each_other_by_record_name(owner: Record, image: str) -> None:
    net = declare(owner, "network", "net")
    name = kind(net).create(net)["name"]
    web = declare(
        owner,
        "container",
        "web",
        image=image,
        network=name,
        command=["sh", "-c", "echo hello-from-web > /www/index.html && exec httpd -f -p 8080 -h /www"],
        healthcheck={"test": ["CMD", "wget", "-q", "-O", "/dev/null", "http://127.0.0.1:8080/"], "interval_s": 0.2},
        ready_when="healthy",
    )
    kind(web).create(web)
    probe = declare(owner, "job", "probe", image=image, network=name, command=["wget", "-qO-", "http://web:8080/"])
    assert kind(probe).create(probe)["stdout_tail"] == "hello-from-web"


def test_published_ports_are_in_the_outputs(owner: Record, image: str) -> None:
    record = declare(
        owner,
        "container",
        "ported",
        image=image,
        command=["httpd", "-f", "-p", "8080", "-h", "/www"],
        ports=[{"container": 8080, "host": None}],
    )
    outputs = kind(record).create(record)
    (binding,) = outputs["ports"]["8080/tcp"]
    assert binding["host_ip"] == "127.0.0.1"
    assert binding["host_port"] > 0


def test_a_job_reports_its_exit_code_and_stdout_tail(
    owner: Record, image: str, docker_client: docker.DockerClient
) -> None:
    script = "for i in $(seq 1 30); do echo line $i; done; echo oops >&2; exit 0"
    record = declare(owner, "job", "report", image=image, command=["sh", "-c", script], timeout_s=60)
    outputs = kind(record).create(record)
    assert outputs["exit_code"] == 0
    assert outputs["stdout_tail"].splitlines() == [f"line {i}" for i in range(11, 31)]
    logged = list(LogLine.objects.filter(record=record).order_by("id").values_list("message", "stream"))
    assert [m for m, s in logged if s == "stdout"] == [f"line {i}" for i in range(1, 31)]
    assert ("oops", "stderr") in logged
    # A create retried after a crash adopts the finished job: it does not run again.
    again = kind(record).create(record)
    assert again["adopted"] is True
    assert again["id"] == outputs["id"]
    assert counts(docker_client, record)["containers"] == 1
    assert len(log_messages(record)) == 31, "no line copied twice"


def test_a_failing_job_makes_the_record_create_failed_with_its_tail(owner: Record, image: str) -> None:
    record = declare(
        owner,
        "job",
        "fails",
        image=image,
        command=["sh", "-c", "echo compiling; echo 'error: no such file' >&2; exit 2"],
    )
    services.record_converge(record_id=record.pk)
    record.refresh_from_db()
    assert record.phase == Phase.CREATE_FAILED
    assert "exited with code 2" in record.last_error
    assert "error: no such file" in record.last_error
    assert "compiling" in log_messages(record)


def test_a_job_past_its_timeout_is_killed_and_fails(
    owner: Record, image: str, docker_client: docker.DockerClient
) -> None:
    record = declare(owner, "job", "hangs", image=image, command=["sh", "-c", "echo started; sleep 600"], timeout_s=1)
    with pytest.raises(PermanentError, match="ran longer than its timeout of 1s") as caught:
        kind(record).create(record)
    assert "started" in str(caught.value)
    assert the_container(docker_client, record).status == "exited"


def test_a_secret_in_the_environment_reaches_the_container_but_not_the_record(owner: Record, image: str) -> None:
    secret_create(name="db-password", value="hunter2-not-in-any-record")
    record = declare(
        owner,
        "job",
        "uses-secret",
        image=image,
        command=["sh", "-c", 'echo "${#PGPASSWORD} ${PGPASSWORD%%-*}"'],
        env={"PGPASSWORD": {"$secret": "db-password"}},
    )
    assert kind(record).create(record)["stdout_tail"] == "25 hunter2"
    record.refresh_from_db()
    assert record.spec["env"] == {"PGPASSWORD": {"$secret": "db-password"}}
    assert "hunter2" not in str(record.spec)


def test_what_a_container_prints_of_its_secrets_is_stored_masked(owner: Record, image: str) -> None:
    secret_create(name="api-token", value="tok-printed-by-a-careless-job")
    env = {"TOKEN": {"$secret": "api-token"}, "MODE": "test-mode"}
    job = declare(
        owner, "job", "prints-it", image=image, command=["sh", "-c", 'echo "token=$TOKEN mode=$MODE"; exit 3'], env=env
    )
    with pytest.raises(PermanentError) as failed:
        kind(job).create(job)
    assert str(failed.value).endswith("last lines:\ntoken=*** mode=test-mode")
    assert log_messages(job) == ["token=*** mode=test-mode"]
    server = declare(
        owner, "container", "dies", image=image, command=["sh", "-c", 'echo "bad token $TOKEN"; exit 1'], env=env
    )
    with pytest.raises(KindError) as died:
        kind(server).create(server)
    assert str(died.value).endswith("last lines:\nbad token ***")
    assert "tok-printed" not in str(LogLine.objects.values_list("message", flat=True))


def test_an_object_of_a_stranger_under_our_name_is_never_adopted(
    owner: Record, image: str, docker_client: docker.DockerClient
) -> None:
    record = declare(owner, "container", "taken", image=image, command=SERVE)
    stranger = docker_client.containers.create(image, SERVE, name=object_name("taken", str(record.pk)))
    try:
        with pytest.raises(PermanentError, match="belongs to no Graphene record"):
            kind(record).create(record)
    finally:
        stranger.remove(force=True)


def test_specs_are_validated_with_field_errors(owner: Record, image: str) -> None:
    with pytest.raises(ValidationFailed) as caught:
        services.record_declare(
            kind="docker.container",
            name="bad",
            owner=owner,
            spec={"image": image, "command": "echo hi", "ports": [{"container": 0}], "ready_when": "healthy"},
        )
    fields = caught.value.fields
    assert "spec.command" in fields
    assert "spec.ports.0.container" in fields
    assert any("healthcheck" in message for message in fields["spec"]), fields
    with pytest.raises(ValidationFailed) as caught:
        services.record_declare(kind="docker.job", name="bad", owner=owner, spec={"command": ["true"], "timeout_s": 0})
    assert {"spec", "spec.timeout_s"} <= set(caught.value.fields)


def test_an_image_is_imported_adopted_and_removed_once_unused(
    owner: Record, rootfs_tar: Path, docker_client: docker.DockerClient
) -> None:
    record = declare(owner, "image", "tools", rootfs_tar=str(rootfs_tar), changes=['ENV GREETING="hi there"'])
    outputs = kind(record).create(record)
    reference = image_reference("tools", str(record.pk))
    assert outputs["reference"] == reference
    assert reference in outputs["tags"]
    assert kind(record).create(record)["adopted"] is True
    assert counts(docker_client, record)["images"] == 1

    job = declare(owner, "job", "greet", image=reference, command=["sh", "-c", 'echo "$GREETING"'], pull="never")
    assert kind(job).create(job)["stdout_tail"] == "hi there"
    with pytest.raises(KindError):
        kind(record).delete(record)  # a (stopped) container still uses it: retried
    kind(job).delete(job)
    kind(record).delete(record)
    kind(record).delete(record)
    assert kind(record).observe(record) is None
    assert counts(docker_client, record)["images"] == 0
    with pytest.raises(docker.errors.ImageNotFound):
        docker_client.images.get(reference)


def test_a_missing_rootfs_tar_is_a_permanent_error(owner: Record) -> None:
    record = declare(owner, "image", "nothing", rootfs_tar="/nonexistent/rootfs.tar")
    with pytest.raises(PermanentError, match="not a file"):
        kind(record).create(record)


def test_the_sweeper_removes_labelled_objects_whose_record_is_gone(
    owner: Record, image: str, docker_client: docker.DockerClient
) -> None:
    live = declare(owner, "container", "live", image=image, command=SERVE)
    kind(live).create(live)
    gone = declare(owner, "container", "gone", image=image, command=SERVE)
    kind(gone).create(gone)
    # Deleted without its delete reaching dockerd (a tombstone), and a record nobody knows.
    Record.objects.filter(pk=gone.pk).update(phase=Phase.DELETED)
    unknown = str(uuid.uuid4())
    labels = {LABEL_RECORD: unknown, LABEL_SCOPE: scope()}
    docker_client.containers.create(image, SERVE, labels={**labels, LABEL_KIND: "docker.container"})
    docker_client.networks.create(f"g-orphan-{unknown[:8]}", labels={**labels, LABEL_KIND: "docker.network"})
    docker_client.volumes.create(f"g-orphan-{unknown[:8]}", labels={**labels, LABEL_KIND: "docker.volume"})
    # Another installation's object (another scope) is not ours to judge.
    elsewhere = docker_client.containers.create(
        image,
        SERVE,
        labels={LABEL_RECORD: unknown, LABEL_SCOPE: "another-installation", LABEL_KIND: "docker.container"},
    )
    try:
        found = services.records_sweep()
        docker_found = {(f["kind"], f["record_id"]) for f in found if f["kind"].startswith("docker.")}
        assert docker_found == {
            ("docker.container", str(gone.pk)),
            ("docker.container", unknown),
            ("docker.network", unknown),
            ("docker.volume", unknown),
        }
        assert all("error" not in f for f in found if f["kind"].startswith("docker.")), found
        assert counts(docker_client, [gone.pk, unknown]) == {"containers": 0, "networks": 0, "volumes": 0, "images": 0}
        assert counts(docker_client, live)["containers"] == 1
        elsewhere.reload()  # still there
    finally:
        elsewhere.remove(force=True)


def test_kinds_are_installed_with_their_drift_interval() -> None:
    for name in ("docker.network", "docker.volume", "docker.container", "docker.image"):
        assert get_kind(name).drift_interval == timedelta(seconds=30)
    assert get_kind("docker.job").drift_interval is None  # a finished job cannot drift


def test_drift_observation_heals_a_stopped_container_through_the_services(
    owner: Record, image: str, docker_client: docker.DockerClient
) -> None:
    record = declare(owner, "container", "healme", image=image, command=SERVE)
    services.record_converge(record_id=record.pk)
    record.refresh_from_db()
    assert record.phase == Phase.READY, record.last_error
    made = record.outputs["id"]
    assert services.records_observe(record_ids=[record.pk])["clean"] == 1

    docker_client.containers.get(made).stop(timeout=0)
    assert services.records_observe(record_ids=[record.pk])["healing"] == 1
    services.record_converge(record_id=record.pk)  # what the heal enqueued
    record.refresh_from_db()
    assert record.phase == Phase.READY, record.last_error
    assert record.outputs["id"] == made
    assert docker_client.containers.get(made).status == "running"
    assert counts(docker_client, record)["containers"] == 1
