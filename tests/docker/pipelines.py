"""Pipelines of the docker tests, written with ``graphene_sdk.libs.docker``. Workers load this
module through ``GRAPHENE_PIPELINE_MODULES`` (the tests start them with it); importing it
registers the pipelines in the test process."""

from __future__ import annotations

import re

from graphene_sdk import Context, pipeline
from graphene_sdk.libs import docker
from pydantic import BaseModel


class WebInputs(BaseModel):
    rootfs_tar: str


class WebOutput(BaseModel):
    body: str
    exit_code: int
    web_address: str


@pipeline("docker.web", inputs=WebInputs)
def web(ctx: Context, inputs: WebInputs) -> WebOutput:
    """An image imported from a tar, a network, a web server on it and a job that fetches a page."""
    image = docker.image_import(ctx, "busybox", rootfs_tar=inputs.rootfs_tar)
    net = docker.network(ctx, "net")
    image.ready()  # containers name the image by reference: it must exist before they start
    server = docker.container(
        ctx,
        "web",
        image=image,
        network=net,
        command=["sh", "-c", "echo hello-from-web > /www/index.html && exec httpd -f -p 8080 -h /www"],
        healthcheck=docker.Healthcheck(["wget", "-q", "-O", "/dev/null", "http://127.0.0.1:8080/"], interval=0.2),
        ready_when="healthy",
        parent=net,
    )
    address = server.ready()["ip_address"]
    probe = docker.job(ctx, "probe", image=image, network=net, command=["wget", "-qO-", "http://web:8080/"], timeout=60)
    outputs = probe.ready()
    return WebOutput(body=outputs["stdout_tail"], exit_code=outputs["exit_code"], web_address=address)


class HangInputs(BaseModel):
    image: str


@pipeline("docker.hang", inputs=HangInputs)
def hang(ctx: Context, inputs: HangInputs) -> None:
    """A container that never becomes ready, on a network with a volume: waited on forever."""
    net = docker.network(ctx, "net")
    data = docker.volume(ctx, "data")
    net.ready()
    data.ready()
    stuck = docker.container(
        ctx,
        "stuck",
        image=inputs.image,
        network=net,
        volumes={data: "/data"},
        command=["sh", "-c", "echo not yet; while true; do sleep 1; done"],
        ready_when=re.compile(r"^ready$"),
        ready_timeout=300,
    )
    stuck.ready()
