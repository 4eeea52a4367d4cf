"""``graphene_sdk.libs.docker`` builds the specs the docker kinds accept (in the SDK's in-memory world)."""

from __future__ import annotations

import re
import uuid
from typing import Any

import pytest
from graphene_sdk import Context, pipeline
from graphene_sdk.libs import docker
from graphene_sdk.testing import World
from pydantic import BaseModel

from apps.records.services import spec_validate
from kinds import get_kind


class Nothing(BaseModel):
    pass


@pipeline("docker-sdk.specs", inputs=Nothing)
def specs(ctx: Context, inputs: Nothing) -> None:
    image = docker.image_import(ctx, "tools", rootfs_tar="/srv/rootfs.tar", changes=['CMD ["/bin/sh"]'])
    net = docker.network(ctx, "net", internal=True)
    data = docker.volume(ctx, "data")
    docker.container(
        ctx,
        "db",
        image=image,
        command=["sh", "-c", "serve"],
        env={"PASSWORD": ctx.secret("db-password"), "MODE": "test"},
        network=net,
        volumes={data: "/data", "/srv/config": "/etc/app"},
        ports={5432: None, "53/udp": 5353},
        healthcheck=docker.Healthcheck("pg_isready", interval=0.5),
        ready_when="healthy",
        parent=net,
    )
    docker.container(ctx, "logger", image="busybox", ready_when=re.compile(r"listening on \d+"))
    docker.job(ctx, "migrate", image=image, command=["migrate"], network=net, timeout=30)


def declared() -> dict[str, Any]:
    result = World().run(specs, Nothing())
    assert result.succeeded, result.error_text
    return {r.name: r for r in result.records}


def test_specs_name_other_resources_by_their_deterministic_object_names() -> None:
    records = declared()
    net, data, image = records["net"], records["data"], records["tools"]
    db = records["db"].spec
    assert db["image"] == docker.image_reference("tools", image.id)
    assert db["network"] == docker.object_name("net", net.id)
    assert db["volumes"] == [
        {"source": docker.object_name("data", data.id), "target": "/data"},
        {"source": "/srv/config", "target": "/etc/app"},
    ]
    assert db["env"] == {"PASSWORD": {"$secret": "db-password"}, "MODE": "test"}
    assert db["ports"] == [
        {"container": 5432, "protocol": "tcp", "host": None, "host_ip": "127.0.0.1"},
        {"container": 53, "protocol": "udp", "host": 5353, "host_ip": "127.0.0.1"},
    ]
    assert db["healthcheck"]["test"] == ["CMD-SHELL", "pg_isready"]
    assert db["ready_when"] == "healthy"
    assert records["logger"].spec["ready_when"] == {"log": r"listening on \d+"}
    assert records["migrate"].spec["timeout_s"] == 30
    assert records["db"].owner == f"record:{net.id}"


def test_every_spec_the_sdk_builds_is_valid_for_its_kind() -> None:
    for record in declared().values():
        spec_validate(get_kind(record.kind), record.spec)


def test_object_names_are_docker_names_and_differ_between_records() -> None:
    a, b = str(uuid.uuid4()), str(uuid.uuid4())
    assert docker.object_name("db", a) == f"g-db-{a[:8]}"
    assert docker.object_name("db", a) != docker.object_name("db", b)
    assert re.fullmatch(r"g-[a-zA-Z0-9][a-zA-Z0-9_.-]*", docker.object_name("my db/1 (ü)", a))
    assert re.fullmatch(r"graphene/[a-z0-9-]+:[0-9a-f]{8}", docker.image_reference("My Image_2", a))


class Mistake(BaseModel):
    case: int


MISTAKES: list[tuple[dict[str, Any], type[Exception], str]] = [
    ({"ready_when": "ready"}, ValueError, "ready_when must be"),
    ({"ready_when": "healthy"}, ValueError, "needs a healthcheck"),
    ({"command": "echo hi"}, TypeError, "lists of arguments"),
    ({"ports": {"http": 80}}, ValueError, "must be a number"),
    ({"ready_timeout": 0}, ValueError, "must be positive"),
    ({"network": "VOLUME"}, TypeError, "must be a docker.network resource"),
]


@pipeline("docker-sdk.mistake", inputs=Mistake)
def mistake(ctx: Context, inputs: Mistake) -> None:
    options = dict(MISTAKES[inputs.case][0])
    if options.get("network") == "VOLUME":
        options["network"] = docker.volume(ctx, "v")
    docker.container(ctx, "c", image="busybox", **options)


@pytest.mark.parametrize("case", range(len(MISTAKES)))
def test_mistakes_are_refused_at_the_call(case: int) -> None:
    _options, error, message = MISTAKES[case]
    result = World().run(mistake, Mistake(case=case))
    assert isinstance(result.error, error), result.error_text
    assert message in str(result.error)
