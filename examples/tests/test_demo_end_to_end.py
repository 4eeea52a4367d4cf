"""``make demo`` for real, and the ``ephemeral_env`` pipeline's both outcomes with the testing kit.

The first test runs ``examples/demo.py`` against a fresh embedded server and the real
dockerd. The demo chooses ``examples/ephemeral_env.py`` when a Docker engine answers; CI has
one (``.ci/run`` starts dockerd and installs busybox-static), so the test insists on that
choice instead of skipping: the reduced tour is not what it tests. It checks the promises a
newcomer reads — the test job's output in the run's log, the app kept on the stand, and
nothing left in Docker afterwards — from the demo's output and from Docker itself.

The kit tests (``graphene_sdk.testing``, no server) cover what the demo does not show: what
the job is given, the order the kept subtree is deleted in, and a failing test suite.
"""

from __future__ import annotations

import importlib.util
import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from graphene_sdk.libs.docker import object_name
from graphene_sdk.testing import World

REPO = Path(__file__).resolve().parents[2]
# The demo waits at most 90 s for the server and 180 s per stage; on a loaded machine the
# whole of it takes about a minute, idle about twenty seconds.
DEADLINE = 480.0
# Runs the demo with SIGINT at its default, so that SIGINT stops it (and its server) as Ctrl-C
# does, even when the test run inherited SIGINT ignored.
WITH_DEFAULT_SIGINT = [
    sys.executable,
    "-c",
    "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); os.execv(sys.argv[1], sys.argv[1:])",
]


def run_demo(data_dir: Path) -> subprocess.CompletedProcess[str]:
    # Nothing from the test settings (PostgreSQL, Redis, a docker scope) may reach the demo.
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRAPHENE_") and k != "DJANGO_SETTINGS_MODULE"}
    command = [sys.executable, str(REPO / "examples" / "demo.py"), "--data-dir", str(data_dir)]
    proc = subprocess.Popen(
        [*WITH_DEFAULT_SIGINT, *command],
        cwd=REPO,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        out, err = proc.communicate(timeout=DEADLINE)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGINT)  # the demo stops its server in its own finally
        try:
            out, err = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate(timeout=10)
        pytest.fail(f"the demo did not finish within {DEADLINE:.0f}s\nstderr:\n{err[-4000:]}\nstdout:\n{out[-4000:]}")
    return subprocess.CompletedProcess(command, proc.returncode, out, err)


def docker_lines(*args: str) -> list[str]:
    done = subprocess.run(["docker", *args], capture_output=True, text=True, timeout=60, check=True)
    return done.stdout.split()


@pytest.mark.system
@pytest.mark.timeout(600)
def test_demo_runs_the_ephemeral_environment_and_leaves_nothing_in_docker(tmp_path: Path) -> None:
    done = run_demo(tmp_path / "demo")
    report = f"exit {done.returncode}\nstderr:\n{done.stderr[-6000:]}\nstdout:\n{done.stdout[-6000:]}"

    assert done.returncode == 0, report
    assert "running examples/ephemeral_env.py" in done.stderr, report  # not the reduced tour
    assert "every check passed" in done.stderr, report
    assert "FAIL" not in done.stderr, report

    out = done.stdout
    assert re.search(r"succeeded; outputs:\n  commit: [0-9a-f]{40}\n  exit_code: 0\n", out), report
    assert "info    tests: all tests passed" in out, report  # the job's output, in the run's log
    kept = re.search(r"kept_container: (g-app-[0-9a-f]{8})", out)
    assert kept, report
    assert f"container  {kept[1]} (running)" in out, report  # kept while the stand held it
    held = out[out.index("The stand of 'ephemeral_env' holds") :]
    assert re.search(r"docker\.image/busybox-[0-9a-f]{8} +ready\n +└── docker\.network/net +ready\n", held), report
    assert out.rstrip().endswith("Left in Docker of the run's records:\n  (nothing)"), report

    # Docker itself agrees: no container, network or image the demo showed is left.
    for container in set(re.findall(r"\bg-(?:app|database|tests)-[0-9a-f]{8}\b", out)):
        assert not docker_lines("ps", "-aq", "--filter", f"name=^/{container}$"), container
    for network in set(re.findall(r"\bg-net-[0-9a-f]{8}\b", out)):
        assert not docker_lines("network", "ls", "-q", "--filter", f"name=^{network}$"), network
    for image in set(re.findall(r"\bgraphene/busybox-[0-9a-f]{8}:[0-9a-f]{8}\b", out)):
        assert not docker_lines("images", "-q", image), image


# --- the pipeline with the testing kit --------------------------------------------------------


def load_pipeline() -> ModuleType:
    """Import the example as the server does (``graphene_pipelines.<stem>``), as the other
    example tests do, so that both can load it in one process."""
    name = "graphene_pipelines.ephemeral_env"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, REPO / "examples" / "pipelines" / "ephemeral_env.py")
        assert spec is not None
        assert spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def kit_world(tmp_path: Path, job: Any) -> World:
    """Checkouts and config files are real files under ``tmp_path`` (the step reads them)."""
    checkout = tmp_path / "checkout"
    checkout.mkdir()
    (checkout / "tests.sh").write_text("echo all tests passed\n")

    def write_file(spec: dict[str, Any]) -> dict[str, Any]:
        path = tmp_path / "files" / spec["path"]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(spec["content"])
        return {"path": str(path)}

    world = World()
    world.on_create("git.checkout", lambda spec: {"path": str(checkout), "commit": "c0ffee" * 6 + "c0ff"})
    world.on_create("file", write_file)
    world.on_create("docker.job", job)
    return world


INPUTS = {"rootfs_tar": "/srv/busybox.tar", "repository": "file:///srv/demo-app"}


def test_the_job_gets_script_config_and_hosts_and_the_app_is_kept_with_what_it_runs_on(tmp_path: Path) -> None:
    example = load_pipeline()
    world = kit_world(tmp_path, lambda spec: {"exit_code": 0, "stdout_tail": "config ok\nall tests passed\n"})
    result = world.run(example.ephemeral_env, INPUTS)
    report = result.unwrap()
    assert report is not None

    image, app, db = (result.record(n) for n in (f"busybox-{result.run_id[:8]}", "app", "database"))
    env = result.record("tests").spec["env"]
    assert env["TESTS_SH"] == "echo all tests passed\n"
    assert f"database = {object_name('database', db.id)}:5432" in env["APP_CONF"]
    assert env["DB_HOST"] == object_name("database", db.id)
    assert env["APP_HOST"] == report.kept_container == object_name("app", app.id)
    assert [line.message for line in result.logs][-3:] == [
        "tests: config ok",
        "tests: all tests passed",
        f"kept {report.kept_container} on the stand for 1:00:00",
    ]

    # The stand holds the app with its network and image; the rest died with the run.
    world.assert_owner(image, "stand:ephemeral_env")
    assert [r.name for r in world.subtree(image)] == [image.name, "net", "app"]
    assert report.kept_holding == image.id
    assert result.record("database").phase == result.record("tests").phase == "deleted"
    world.assert_no_leaks()
    # An hour later the holding expires: the app first, then its network, then its image.
    assert [r.name for r in world.advance(hours=1, minutes=1)] == ["app", "net", image.name]
    assert world.stand("ephemeral_env") == []


def test_a_failing_test_suite_fails_the_run_with_its_output_in_the_log_and_keeps_nothing(tmp_path: Path) -> None:
    example = load_pipeline()

    def failing(spec: dict[str, Any]) -> dict[str, Any]:
        raise RuntimeError("job exited with 1; last lines:\napp says: app 0000\nFAIL: the app serves another commit")

    world = kit_world(tmp_path, failing)
    result = world.run(example.ephemeral_env, INPUTS)
    assert result.status == "failed"
    errors = [line.message for line in result.logs if line.level == "error"]
    assert "FAIL: the app serves another commit" in errors
    assert world.stand("ephemeral_env") == []
    world.assert_no_leaks()
