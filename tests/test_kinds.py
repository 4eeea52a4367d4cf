"""The kinds' own interfaces: the registry (and which kinds it loads), the machine-call interface.

A kind reaches an agent's machine through ``kinds.machine`` alone, so one written outside this
repository runs on a machine without importing Graphene's server: shown here in a fresh
interpreter that has neither Django nor an app loaded, with a small implementation of the
interface of its own (as the author of a third-party kind would test it). The agents app's
implementation is what the system tests in ``tests/agents/`` drive, against a real agent.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from apps.agents.machine import AgentMachines
from kinds import TEST_KIND_PREFIX, load, registry
from kinds.machine import machines

REPO = Path(__file__).resolve().parent.parent

# A third-party kind and an implementation of the interface, in a module of their own (a
# function's source is what travels to the machine, so it must come from a file).
THIRD_PARTY = '''
import json
import sys
from types import SimpleNamespace

from kinds import Kind
from kinds.machine import Abandoned, Call, MachinesNotInstalled, install, machines


def stamp(path, text):
    """Self-contained: what runs on the machine."""
    import hashlib

    return {"path": path, "digest": hashlib.sha256(text.encode()).hexdigest()}


class StampKind(Kind):
    name = "example.stamp"

    def create(self, record):
        call = Call(stamp, [record.spec["path"], record.spec["text"]], in_process=True)
        return machines().run(record, record.spec["agent"], "write", call)

    def observe(self, record):
        return machines().observe(record, record.spec["agent"], Call(stamp, [record.spec["path"], ""]))

    def delete(self, record):
        try:
            call = Call(stamp, [record.spec["path"], ""])
            machines().run(record, record.spec["agent"], "remove", call, deleting=True)
        except Abandoned as exc:
            machines().abandon(record, exc, left=f"the stamp {record.spec['path']}")


class LocalMachines:
    """Runs each call here, from its payload, as an agent would; every machine is gone for deletions."""

    def __init__(self):
        self.log = []

    def _call(self, call):
        payload = json.loads(json.dumps(call.payload()))  # what travels is JSON
        namespace = {}
        exec(payload["source"], namespace)
        return namespace[payload["name"]](*payload["args"], **payload["kwargs"])

    def run(self, record, agent_id, op, call, *, deleting=False, wait=2.0):
        self.log.append(["run", op, deleting, call.in_process])
        if deleting:
            raise Abandoned(f"{op} on agent {agent_id}: its agent record is deleted")
        return self._call(call)

    def observe(self, record, agent_id, call):
        self.log.append(["observe"])
        return self._call(call)

    def request(self, record, agent_id, op, call, *, purpose, timeout):
        return self._call(call)

    def abandon(self, record, error, *, left):
        self.log.append(["abandon", str(error), left])


try:
    machines()
    missing = "installed"
except MachinesNotInstalled as exc:
    missing = str(exc)
local = LocalMachines()
install(local)
record = SimpleNamespace(pk="r1", spec={"agent": "a1", "path": "/srv/stamp", "text": "hello"})
kind = StampKind()
outputs = kind.create(record)
kind.observe(record)
kind.delete(record)
server = sorted({m.split(".")[0] for m in sys.modules if m.split(".")[0] in ("apps", "django", "graphene_project")})
print(json.dumps({"missing": missing, "outputs": outputs, "log": local.log, "server": server}))
'''


def _python(script: str, tmp_path: Path, **env: str) -> str:
    """Run ``script`` in a fresh interpreter with only the repository on its path and none of
    this session's settings (no ``DJANGO_SETTINGS_MODULE``, no ``GRAPHENE_*``) but ``env``."""
    path = tmp_path / "script.py"
    path.write_text(textwrap.dedent(script))
    clean = {k: v for k, v in os.environ.items() if not k.startswith("GRAPHENE_") and k != "DJANGO_SETTINGS_MODULE"}
    clean.update(PYTHONPATH=str(REPO), GRAPHENE_DATA_DIR=str(tmp_path / "data"), **env)
    proc = subprocess.run(
        [sys.executable, str(path)], cwd=tmp_path, env=clean, capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip().splitlines()[-1]


def test_a_kind_runs_on_a_machine_through_the_interface_without_the_server(tmp_path: Path) -> None:
    found = json.loads(_python(THIRD_PARTY, tmp_path))
    # Before an implementation is installed, the error says what to do.
    assert "kinds.machine.install" in found["missing"]
    assert "apps.agents" in found["missing"]
    # The function travelled as its source and JSON arguments and ran from those.
    assert found["outputs"]["path"] == "/srv/stamp"
    assert len(found["outputs"]["digest"]) == 64
    assert found["log"] == [
        ["run", "write", False, True],
        ["observe"],
        ["run", "remove", True, False],
        ["abandon", "remove on agent a1: its agent record is deleted", "the stamp /srv/stamp"],
    ]
    # Neither Django nor any of Graphene's server modules was imported to do it.
    assert found["server"] == []


def test_the_agents_app_installs_its_machines_when_django_starts() -> None:
    assert isinstance(machines(), AgentMachines)


def test_a_registry_built_without_test_kinds_has_none() -> None:
    without = load(test_kinds=False)
    assert not [name for name in without if name.startswith(TEST_KIND_PREFIX)]
    assert {"file", "agent", "git.checkout", "docker.container"} <= set(without)
    with_them = load(test_kinds=True)
    assert set(with_them) - set(without) == {"test.sleep", "test.flaky"}
    # The test settings turn them on: the suite's records are mostly test objects.
    assert {"test.sleep", "test.flaky"} <= set(registry())


PROBE = """
import json
import django

django.setup()
from kinds import UnknownKind, get_kind, registry

try:
    get_kind("test.sleep")
    refused = ""
except UnknownKind as exc:
    refused = str(exc)
print(json.dumps({"kinds": sorted(registry()), "refused": refused}))
"""

# Production settings only need these to be present (nothing connects to them here).
PROD_ENV = {
    "DJANGO_SETTINGS_MODULE": "graphene_project.settings.prod",
    "GRAPHENE_SECRET_KEY": "test-only-4kP9xV2mQ7wZ1rT6yB3nH8cJ5sL0dF2gA7uE4iO9-not-secret",
    "GRAPHENE_DATABASE_URL": "postgresql://graphene:unused@127.0.0.1:5432/graphene",
    "GRAPHENE_BROKER_URL": "redis://127.0.0.1:6379/0",
    "GRAPHENE_CHANNEL_LAYER_URL": "redis://127.0.0.1:6379/1",
    "GRAPHENE_SECRETS_KEY": "test-only-secrets-key-not-secret",
}


@pytest.mark.parametrize(
    ("env", "loaded"),
    [
        pytest.param(PROD_ENV, False, id="production-default-off"),
        pytest.param({**PROD_ENV, "GRAPHENE_TEST_KINDS": "1"}, True, id="production-turned-on"),
        pytest.param({"DJANGO_SETTINGS_MODULE": "graphene_project.settings.dev"}, True, id="development-default-on"),
    ],
)
def test_the_test_kinds_setting_decides_what_the_registry_loads(
    tmp_path: Path, env: dict[str, str], loaded: bool
) -> None:
    found = json.loads(_python(PROBE, tmp_path, **env))
    assert ({"test.sleep", "test.flaky"} <= set(found["kinds"])) is loaded
    assert "file" in found["kinds"]
    assert "agent" in found["kinds"]
    if not loaded:
        assert not [name for name in found["kinds"] if name.startswith(TEST_KIND_PREFIX)]
        assert "GRAPHENE_TEST_KINDS" in found["refused"]
