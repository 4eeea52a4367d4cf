"""The example pipelines, run with graphene_sdk.testing: no server, no database, no waiting.

    .venv/bin/python -m pytest examples/tests -q

The kinds these examples use (``test.sleep``, ``test.flaky``, ``file``) are simulated with
``World.on_create``: the outputs the pipelines read, and the failures they must survive.
"""

from __future__ import annotations

import hashlib
import importlib.util
import sys
from datetime import timedelta
from pathlib import Path
from types import ModuleType
from typing import Any

from graphene_sdk.testing import World

PIPELINES = Path(__file__).resolve().parent.parent / "pipelines"


def load(stem: str) -> ModuleType:
    """Import an example as the server does (``graphene_pipelines.<stem>``), so that both can
    load it in one process without defining the pipeline twice."""
    name = f"graphene_pipelines.{stem}"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, PIPELINES / f"{stem}.py")
        assert spec is not None
        assert spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def sleep_object(spec: dict[str, Any]) -> dict[str, Any]:
    return {"object": "obj-1", "adopted": False, "value": spec.get("value")}


def flaky_object(spec: dict[str, Any]) -> dict[str, Any]:
    # The real kind retries transient failures; only "permanent" ones make the record fail.
    if spec.get("permanent") and spec.get("create_failures", 0):
        raise RuntimeError("injected create failure (permanent)")
    return sleep_object(spec)


def written_file(spec: dict[str, Any]) -> dict[str, Any]:
    data = spec.get("content", "").encode()
    return {"path": spec["path"], "digest": "sha256:" + hashlib.sha256(data).hexdigest(), "size": len(data)}


def world() -> World:
    w = World()
    w.on_create("test.sleep", sleep_object)
    w.on_create("test.flaky", flaky_object)
    w.on_create("file", written_file)
    return w


def test_hello_pauses_on_the_virtual_clock() -> None:
    hello = load("hello")
    w = world()
    began = w.now
    result = w.run(hello.hello, hello.HelloInputs(name="Ada", pause_seconds=3600))
    greeting = result.unwrap()
    assert greeting is not None
    assert greeting.message == "Hello, Ada!"
    assert w.now - began == timedelta(hours=1)
    assert [line.message for line in result.logs][-1] == "Hello, Ada!"


def test_environment_builds_tests_and_leaves_nothing_behind() -> None:
    environment = load("environment")
    w = world()
    result = w.run(environment.environment, {"branch": "dev", "replicas": 3, "test_seconds": 0})
    report = result.unwrap()
    assert report is not None
    assert report.tests_passed
    assert report.services == ["network", "db", "app-0", "app-1", "app-2"]
    network = result.record("network")
    for name in ("db", "app-0", "app-1", "app-2"):
        assert result.record(name).owner == f"record:{network.id}"
    assert w.deletions[-1] is network  # children first, the network last
    w.assert_no_leaks()


def test_release_survives_a_flaky_staging_slot_or_reports_a_permanent_one() -> None:
    release = load("release")
    w = world()
    result = w.run(release.release, release.ReleaseInputs(version="1.2.3", flaky_build=False))
    report = result.unwrap()
    assert report is not None
    assert report.published
    assert report.artifact == "app-1.2.3.tar.gz"
    w.assert_no_leaks()

    w.kind("test.flaky", fail="no capacity")  # from now on the staging slot cannot be made
    result = w.run(release.release, release.ReleaseInputs(version="1.2.4", flaky_build=False))
    report = result.unwrap()
    assert report is not None
    assert not report.published
    assert report.note == "no staging: test.flaky/staging-slot is create_failed: no capacity"
    w.assert_no_leaks()
