"""An integration-test environment: what a CI job builds, uses and must always tear down.

The records stand in for a network, a database and an application (``test.sleep`` objects,
so it runs where no Docker engine does; ``ephemeral_env.py`` is the same with real
containers) plus a real configuration file. They converge in parallel;
the steps use them; whatever happens — success, failure, cancel — the run's death deletes
them, children first.
"""

from __future__ import annotations

import hashlib
import time

from graphene_sdk import Context, pipeline
from pydantic import BaseModel, Field


class EnvironmentInputs(BaseModel):
    branch: str = Field(default="main", min_length=1, max_length=200, description="the branch under test")
    replicas: int = Field(default=2, ge=1, le=10, description="application replicas")
    boot_ms: int = Field(default=800, ge=0, le=60_000, description="how long each service takes to come up")
    test_seconds: float = Field(default=2.0, ge=0, le=600, description="how long the test suite runs")


class EnvironmentReport(BaseModel):
    branch: str
    services: list[str]
    config_digest: str
    tests_passed: bool


def migrate(database: str, branch: str) -> str:
    return f"migrated {database} to {branch}"


def run_tests(replicas: list[str], seconds: float) -> bool:
    time.sleep(seconds)
    return all(replicas)


@pipeline("environment", inputs=EnvironmentInputs)
def environment(ctx: Context, inputs: EnvironmentInputs) -> EnvironmentReport:
    """Builds network → database + app replicas + config, migrates, tests, reports."""
    network = ctx.declare("test.sleep", "network", {"create_ms": inputs.boot_ms // 4})
    database = ctx.declare("test.sleep", "db", {"create_ms": inputs.boot_ms}, parent=network)
    apps = [
        ctx.declare("test.sleep", f"app-{i}", {"create_ms": inputs.boot_ms}, parent=network)
        for i in range(inputs.replicas)
    ]
    content = f"branch={inputs.branch}\nreplicas={inputs.replicas}\n"
    config = ctx.declare("file", "app-config", {"path": f"environment/{ctx.run_id}/app.conf", "content": content})

    db = database.ready()  # everything above converges in parallel while we wait here
    ctx.log(f"database object {db['object']} is ready")
    ctx.step("migrate", migrate, db["object"], inputs.branch)
    replicas = [app.ready()["object"] for app in apps]
    written = config.ready()
    passed = ctx.step("tests", run_tests, replicas, inputs.test_seconds, timeout=inputs.test_seconds + 60)
    ctx.log("tests passed" if passed else "tests failed", level="info" if passed else "error")
    return EnvironmentReport(
        branch=inputs.branch,
        services=["network", "db", *[a.name for a in apps]],
        config_digest=written["digest"],
        tests_passed=passed and written["digest"] == "sha256:" + hashlib.sha256(content.encode()).hexdigest(),
    )
