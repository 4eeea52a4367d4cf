"""An ephemeral environment for one commit: real containers, the code's own tests, the app kept an hour.

What a CI job for a pull request does, with real objects in the Docker engine the Graphene
workers reach (``graphene_sdk.libs.docker``) and a real checkout (``graphene_sdk.libs.git``):

1. import an image from a root file system tar on the server (no registry needed), make a
   network, check the code under test out;
2. start a "database" (ready when it logs ``database ready``) and an "app" (ready when its
   healthcheck passes) on the network, and write the app's configuration file;
3. read the test script from the checkout and the configuration from the file, and run the
   script in a throwaway job container on the network, with both in its environment and the
   containers' names as ``DB_HOST`` / ``APP_HOST``; its output goes to the run's log;
4. on success, hand the app to the pipeline's stand for an hour (to look at it); everything
   else is deleted with the run, children first — on failure, everything.

Ownership is deletion order: an owner is deleted after what it owns, so what a container
runs on owns it. The app is declared under the network, which is under the image, and the
stand is given that subtree: the app cannot outlive its network and image (Docker refuses to
remove either while the app uses them), so they are kept with it, and deleting the holding
removes app, network, image in that order. The database and the test job are the run's own.

``examples/ephemeral_env.py`` (``make demo`` when Docker is available) prepares the inputs,
runs this and checks the Docker engine afterwards.
"""

from __future__ import annotations

import re
from datetime import timedelta
from pathlib import Path

from graphene_sdk import Context, pipeline
from graphene_sdk.libs import docker, git
from pydantic import BaseModel, Field

KEEP_FOR = timedelta(hours=1)
APP_PORT = 8080
DB_PORT = 5432
# The job writes what it receives to files and runs the script with the config's path, as a
# CI runner would run a repository's test entry point.
RUN_TESTS = (
    'printf "%s" "$TESTS_SH" > /tmp/tests.sh && printf "%s" "$APP_CONF" > /tmp/app.conf'
    " && exec sh /tmp/tests.sh /tmp/app.conf"
)


class EphemeralEnvInputs(BaseModel):
    rootfs_tar: str = Field(
        pattern=r"^/", description="absolute path, on the Graphene server, of a root file system tar with busybox"
    )
    repository: str = Field(min_length=1, description="clone URL of the code under test (it has tests.sh)")
    ref: str = Field(default="HEAD", min_length=1, description="branch, tag or commit to test")
    tests: str = Field(default="tests.sh", min_length=1, description="the test script, relative to the checkout")


class EphemeralEnvReport(BaseModel):
    commit: str
    exit_code: int
    output: list[str]
    kept_container: str = Field(description="the Docker name of the app container kept on the stand")
    kept_holding: str = Field(description="the stand's holding (record id) the app is kept in")


def read_inputs(checkout: str, tests: str, config: str) -> dict[str, str]:
    """The test script from the checkout and the config as written (both on the server)."""
    root = Path(checkout).resolve()
    script = (root / tests).resolve()
    if not script.is_relative_to(root):
        raise ValueError(f"the test script {tests!r} is outside the checkout")
    return {"tests": script.read_text(), "config": Path(config).read_text()}


@pipeline("ephemeral_env", inputs=EphemeralEnvInputs, timeout=timedelta(minutes=15))
def ephemeral_env(ctx: Context, inputs: EphemeralEnvInputs) -> EphemeralEnvReport:
    """Image, network, checkout → database, app, config → tests in a job → the app to the stand."""
    # The holding's root carries the run's id: a stand holds one live record per kind and name.
    image = docker.image_import(ctx, f"busybox-{ctx.run_id[:8]}", rootfs_tar=inputs.rootfs_tar)
    net = docker.network(ctx, "net", parent=image)
    src = git.checkout(ctx, "src", repository=inputs.repository, ref=inputs.ref, depth=1)
    # Containers name the image and network without waiting for them (their creates would be
    # retried until they exist): wait here instead, while the checkout goes on in parallel.
    image.ready()
    net.ready()

    database = docker.container(
        ctx,
        "database",
        image=image,
        network=net,
        command=[
            "sh",
            "-c",
            # httpd without -f returns once it listens: "ready" is printed when it is true.
            f"mkdir -p /db && echo 'rows: 3' > /db/index.html && httpd -p {DB_PORT} -h /db"
            " && echo 'database ready' && while :; do sleep 3600; done",
        ],
        ready_when=re.compile(r"^database ready$"),
        ready_timeout=120,
    )
    checked_out = src.ready()
    commit = checked_out["commit"]
    app = docker.container(
        ctx,
        "app",
        image=image,
        network=net,
        env={"APP_COMMIT": commit},
        command=[
            "sh",
            "-c",
            f'mkdir -p /www && echo "app $APP_COMMIT" > /www/index.html && exec httpd -f -p {APP_PORT} -h /www',
        ],
        healthcheck=docker.Healthcheck(f"wget -q -O /dev/null http://127.0.0.1:{APP_PORT}/", interval=0.5),
        ready_when="healthy",
        ready_timeout=120,
        parent=net,
    )
    db_host = docker.object_name(database.name, database.id)
    app_host = docker.object_name(app.name, app.id)
    content = (
        f"# app.conf of run {ctx.run_id}\n"
        f"commit = {commit}\n"
        f"database = {db_host}:{DB_PORT}\n"
        f"listen = {app_host}:{APP_PORT}\n"
    )
    config = ctx.declare("file", "app-config", {"path": f"ephemeral/{ctx.run_id}/app.conf", "content": content})

    database.ready()
    app.ready()
    ctx.log(f"database {db_host} and app {app_host} are ready on network {docker.object_name(net.name, net.id)}")
    given = ctx.step("read tests and config", read_inputs, checked_out["path"], inputs.tests, config.ready()["path"])
    job = docker.job(
        ctx,
        "tests",
        image=image,
        network=net,
        command=["sh", "-c", RUN_TESTS],
        env={
            "TESTS_SH": given["tests"],
            "APP_CONF": given["config"],
            "DB_HOST": db_host,
            "DB_PORT": str(DB_PORT),
            "APP_HOST": app_host,
            "APP_PORT": str(APP_PORT),
            "COMMIT": commit,
        },
        timeout=300,
    )
    outputs, failed = job.try_ready()
    if failed is not None:
        # The error ends with the job's last lines of output: publish them before failing.
        for line in str(failed).splitlines():
            ctx.log(line, level="error")
        raise failed
    assert outputs is not None
    lines = outputs["stdout_tail"].splitlines()
    for line in lines:
        ctx.log(f"tests: {line}")

    ctx.to_stand(image, keep_for=KEEP_FOR)  # the app, with the network and image it runs on
    ctx.log(f"kept {app_host} on the stand for {KEEP_FOR}")
    return EphemeralEnvReport(
        commit=commit,
        exit_code=outputs["exit_code"],
        output=lines,
        kept_container=app_host,
        kept_holding=image.id,
    )
