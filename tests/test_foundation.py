"""The foundation's promises: health probes, fail-closed production settings, one-line
start-up errors, the API schema, and the files that describe how Graphene is installed and run.

The start-up tests run the real ``graphene`` command in subprocesses against real PostgreSQL
and Redis (or deliberately unreachable ports) and read what an operator would read.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest
import yaml
from django.conf import settings
from django.test import Client

REPO = Path(__file__).resolve().parent.parent
# What production settings require (prod.py refuses to boot without each).
PROD_REQUIRED = (
    "GRAPHENE_SECRET_KEY",
    "GRAPHENE_DATABASE_URL",
    "GRAPHENE_BROKER_URL",
    "GRAPHENE_CHANNEL_LAYER_URL",
    "GRAPHENE_SECRETS_KEY",
)
UNREACHABLE_DB = "postgresql://postgres@127.0.0.1:1/nope"
UNREACHABLE_BROKER = "redis://127.0.0.1:1/0"
START_DEADLINE = 20.0


def graphene() -> list[str]:
    """The installed ``graphene`` console script next to this interpreter (or its module)."""
    script = Path(sys.executable).parent / "graphene"
    return [str(script)] if script.exists() else [sys.executable, "-m", "graphene_project.cli"]


def reachable_database_url() -> str:
    """The test settings' PostgreSQL server, database ``postgres`` (exists in every cluster)."""
    db = settings.DATABASES["default"]
    auth = db["USER"] + (f":{db['PASSWORD']}" if db["PASSWORD"] else "")
    return f"postgresql://{auth}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/postgres"


def clean_env(tmp_path: Path, **settings_env: str) -> dict[str, str]:
    """This environment without any GRAPHENE_* setting (the test settings put some in), plus ours."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRAPHENE_") and k != "DJANGO_SETTINGS_MODULE"}
    env["GRAPHENE_DATA_DIR"] = str(tmp_path / "data")
    env.update(settings_env)
    return env


def prod_env(tmp_path: Path, **overrides: str) -> dict[str, str]:
    """A complete, reachable production configuration, with ``overrides`` applied."""
    values = {
        "DJANGO_SETTINGS_MODULE": "graphene_project.settings.prod",
        "GRAPHENE_SECRET_KEY": "test-only-4kP9xV2mQ7wZ1rT6yB3nH8cJ5sL0dF2gA7uE4iO9-not-secret",
        "GRAPHENE_DATABASE_URL": reachable_database_url(),
        "GRAPHENE_BROKER_URL": settings.CELERY_BROKER_URL,
        "GRAPHENE_CHANNEL_LAYER_URL": "redis://127.0.0.1:6379/13",
        "GRAPHENE_SECRETS_KEY": "test-only-secrets-key-not-secret",
    }
    values.update(overrides)
    return clean_env(tmp_path, **{k: v for k, v in values.items() if v})


def run_graphene(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """Run ``graphene ARGS``; it must exit by itself before the deadline."""
    try:
        proc = subprocess.run(
            [*graphene(), *args],
            cwd=REPO,
            env=env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=START_DEADLINE,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"graphene {' '.join(args)} was still running after {START_DEADLINE}s: {exc.stderr!r}")
    return proc


def assert_one_line_error(proc: subprocess.CompletedProcess[str], setting: str) -> str:
    """Exit status 2 and exactly one line on stderr, ``graphene: error: ...`` naming ``setting``."""
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, f"exit status {proc.returncode}, stderr: {proc.stderr}"
    assert "Traceback" not in proc.stderr + proc.stdout
    assert len(lines) == 1, f"expected one line, got: {proc.stderr}"
    assert lines[0].startswith("graphene: error: "), lines[0]
    assert setting in lines[0], lines[0]
    return lines[0]


# --- health -----------------------------------------------------------------------------


def test_healthz_answers_without_touching_the_database() -> None:
    # No database access is allowed in this test: liveness must not depend on the stores.
    response = Client().get("/healthz")
    assert response.status_code == 200
    assert response.json() == {"status": "ok"}


@pytest.mark.django_db
def test_readyz_checks_database_broker_and_channel_layer() -> None:
    response = Client().get("/readyz")
    body = response.json()
    assert response.status_code == 200, body
    assert body["status"] == "ok"
    checks = body["checks"]
    assert set(checks) == {"database", "broker", "channel_layer"}
    assert all(check["ok"] for check in checks.values()), checks
    assert checks["database"]["detail"] == "postgresql"
    assert checks["database"]["setting"] == "GRAPHENE_DATABASE_URL"
    assert checks["broker"]["detail"].startswith("redis://")
    assert checks["broker"]["setting"] == "GRAPHENE_BROKER_URL"
    assert checks["channel_layer"]["setting"] == "GRAPHENE_CHANNEL_LAYER_URL"


@pytest.mark.system
def test_readyz_answers_503_naming_an_unreachable_broker(tmp_path: Path) -> None:
    """A server whose broker is down says so on /readyz (a separate process: the broker is
    configured at start-up)."""
    probe = (
        "import django, json; django.setup(); from django.test import Client; "
        "r = Client().get('/readyz', HTTP_HOST='localhost'); print(r.status_code); print(r.content.decode())"
    )
    env = clean_env(
        tmp_path,
        DJANGO_SETTINGS_MODULE="graphene_project.settings.dev",
        GRAPHENE_DATABASE_URL=reachable_database_url(),
        GRAPHENE_BROKER_URL=UNREACHABLE_BROKER,
    )
    proc = subprocess.run(
        [sys.executable, "-c", probe], cwd=REPO, env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.returncode == 0, proc.stderr
    status, body = proc.stdout.strip().split("\n", 1)
    checks = json.loads(body)["checks"]
    assert status == "503"
    assert checks["database"]["ok"] is True
    assert checks["broker"]["ok"] is False
    assert checks["broker"]["setting"] == "GRAPHENE_BROKER_URL"
    assert "127.0.0.1:1" in checks["broker"]["detail"]


# --- production settings fail closed ----------------------------------------------------


@pytest.mark.system
@pytest.mark.parametrize("missing", PROD_REQUIRED)
def test_prod_settings_refuse_to_boot_without(missing: str, tmp_path: Path) -> None:
    env = prod_env(tmp_path, **{missing: ""})
    assert missing not in env

    # Plain Django: importing the settings raises ImproperlyConfigured naming the variable.
    proc = subprocess.run(
        [sys.executable, "-c", "import django; django.setup()"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode != 0
    assert f"ImproperlyConfigured: {missing} is not set" in proc.stderr

    # The graphene command turns that into one line and status 2, never falling back to SQLite.
    line = assert_one_line_error(run_graphene(["web", "--port", "1"], env), missing)
    assert line.startswith(f"graphene: error: {missing} is not set")


# --- one-line start-up errors -----------------------------------------------------------


@pytest.mark.system
@pytest.mark.parametrize("command", ["worker", "web", "beat", "up"])
@pytest.mark.parametrize(
    ("url", "says"),
    [(UNREACHABLE_DB, "cannot reach the database"), ("mysql://root@127.0.0.1:3306/graphene", "scheme 'mysql'")],
    ids=["unreachable", "wrong-scheme"],
)
def test_a_wrong_database_url_stops_the_command_at_once(command: str, url: str, says: str, tmp_path: Path) -> None:
    if command == "up":
        # The embedded command with an explicit (wrong) database: dev settings, no broker.
        env = clean_env(tmp_path, DJANGO_SETTINGS_MODULE="graphene_project.settings.dev", GRAPHENE_DATABASE_URL=url)
    else:
        env = prod_env(tmp_path, GRAPHENE_DATABASE_URL=url)
    proc = run_graphene([command, "--port", "1"] if command in {"web", "up"} else [command], env)
    line = assert_one_line_error(proc, "GRAPHENE_DATABASE_URL")
    assert says in line
    assert not (tmp_path / "data" / "graphene.sqlite3").exists(), "fell back to the embedded database"


@pytest.mark.system
@pytest.mark.parametrize("command", ["worker", "web", "beat", "up"])
def test_an_unreachable_broker_stops_the_command_at_once(command: str, tmp_path: Path) -> None:
    if command == "up":
        env = clean_env(
            tmp_path,
            DJANGO_SETTINGS_MODULE="graphene_project.settings.dev",
            GRAPHENE_DATABASE_URL=reachable_database_url(),
            GRAPHENE_BROKER_URL=UNREACHABLE_BROKER,
        )
    else:
        env = prod_env(tmp_path, GRAPHENE_BROKER_URL=UNREACHABLE_BROKER)
    proc = run_graphene([command, "--port", "1"] if command in {"web", "up"} else [command], env)
    line = assert_one_line_error(proc, "GRAPHENE_BROKER_URL")
    assert "cannot reach the broker" in line
    assert "127.0.0.1:1" in line


@pytest.mark.system
def test_a_broker_password_is_not_printed(tmp_path: Path) -> None:
    env = prod_env(tmp_path, GRAPHENE_BROKER_URL="redis://:hunter2-secret@127.0.0.1:1/0")
    line = assert_one_line_error(run_graphene(["worker"], env), "GRAPHENE_BROKER_URL")
    assert "hunter2-secret" not in line


# --- API schema -------------------------------------------------------------------------


@pytest.mark.django_db
def test_api_schema_is_an_openapi_document(api: Any) -> None:
    response = api.get("/api/schema/", {"format": "json"})
    assert response.status_code == 200
    schema = response.json()
    assert schema["openapi"].startswith("3.")
    assert schema["info"]["title"] == "Graphene API"
    paths = schema["paths"]
    for path in ("/api/v1/records/", "/api/v1/records/{id}/", "/api/v1/records/{id}/tree/", "/api/v1/kinds/"):
        assert path in paths, sorted(paths)
    assert {"get", "post"} <= set(paths["/api/v1/records/"])
    assert "delete" in paths["/api/v1/records/{id}/"]
    # Token authentication is declared, so generated clients know how to authenticate.
    assert "tokenAuth" in schema["components"]["securitySchemes"]


# --- how Graphene is installed and run --------------------------------------------------


def compose() -> dict[str, Any]:
    return dict(yaml.safe_load((REPO / "compose.yaml").read_text()))


def test_compose_describes_the_production_processes() -> None:
    services = compose()["services"]
    assert {"postgres", "redis", "migrate", "web", "worker", "beat"} <= set(services)
    assert services["postgres"]["image"].startswith("postgres:16")
    assert services["redis"]["image"].startswith("redis:7")

    commands = {name: services[name]["command"] for name in ("migrate", "web", "worker", "beat")}
    assert commands["migrate"][:3] == ["graphene", "manage", "migrate"]
    assert commands["web"][:2] == ["graphene", "web"]
    assert commands["worker"][:2] == ["graphene", "worker"]
    assert commands["beat"][:2] == ["graphene", "beat"]

    for name in ("postgres", "redis", "web"):
        test = services[name]["healthcheck"]["test"]
        assert test[0] in {"CMD", "CMD-SHELL"}, (name, test)
    assert "pg_isready" in " ".join(services["postgres"]["healthcheck"]["test"])
    assert "ping" in services["redis"]["healthcheck"]["test"]
    assert "/healthz" in " ".join(services["web"]["healthcheck"]["test"])

    # Migrations run once, after the database is healthy; the processes start after them.
    assert services["migrate"]["depends_on"]["postgres"]["condition"] == "service_healthy"
    assert services["migrate"].get("restart", "no") == "no"
    for name in ("web", "worker", "beat"):
        depends = services[name]["depends_on"]
        assert depends["migrate"]["condition"] == "service_completed_successfully", name
        assert depends["redis"]["condition"] == "service_healthy", name


def test_compose_gives_every_graphene_process_the_production_settings() -> None:
    prod = (REPO / "graphene_project" / "settings" / "prod.py").read_text()
    required = set(re.findall(r'env\.required\(\s*"(GRAPHENE_[A-Z_]+)"', prod))
    assert required == set(PROD_REQUIRED)
    spec = compose()
    services = spec["services"]
    for name in ("migrate", "web", "worker", "beat"):
        service = services[name]
        assert "build" in service or "image" in service, name
        env = service["environment"]
        assert env["DJANGO_SETTINGS_MODULE"] == "graphene_project.settings.prod", name
        assert required <= set(env), (name, required - set(env))
    # The secret key is never a literal in the file: it must come from the operator.
    key = services["web"]["environment"]["GRAPHENE_SECRET_KEY"]
    assert key.startswith("${GRAPHENE_SECRET_KEY"), key


def test_dockerfile_installs_the_pinned_runtime_requirements() -> None:
    dockerfile = (REPO / "Dockerfile").read_text()
    assert re.search(r"^FROM python:3\.11-slim", dockerfile, re.M)
    assert "requirements/base.txt" in dockerfile
    assert "requirements/dev.txt" not in dockerfile


def _name(requirement: str) -> str:
    return re.split(r"[<>=!~\[;\s]", requirement.strip(), maxsplit=1)[0].lower().replace("_", "-").replace(".", "-")


def _lines(path: Path) -> list[str]:
    return [line.strip() for line in path.read_text().splitlines() if line.strip() and not line.startswith("#")]


def test_requirements_are_pinned_and_installed() -> None:
    base = _lines(REPO / "requirements" / "base.txt")
    dev = _lines(REPO / "requirements" / "dev.txt")
    assert dev[0] == "-r base.txt"
    pinned = base + dev[1:]
    for line in pinned:
        assert re.fullmatch(r"[A-Za-z0-9_.\-]+(\[[a-z,]+\])?==[^=\s]+", line), f"not pinned: {line}"
    names = {_name(line) for line in pinned}
    assert len(names) == len(pinned), "a package is pinned twice"
    # Every direct dependency is pinned in the file of its layer (runtime ones in base.txt).
    base_names = {_name(line) for line in base}
    for source, layer in (("base.in", base_names), ("dev.in", names)):
        for line in _lines(REPO / "requirements" / source):
            if not line.startswith("-r"):
                assert _name(line) in layer, f"{line} from {source} is not pinned"
    # And this environment has exactly the pinned versions (``make setup`` keeps it so).
    for line in pinned:
        name, version = line.split("==")
        assert metadata.version(name.split("[")[0]) == version, f"{name} installed is not {version}: run make setup"


def test_readme_commands_are_make_targets() -> None:
    makefile = (REPO / "Makefile").read_text()
    targets = set(re.findall(r"^([a-z][a-z-]*):", makefile, re.M))
    readme = (REPO / "README.md").read_text()
    # Commands in code blocks and in `backticks`, not prose.
    documented = set(re.findall(r"(?:^|`)make ([a-z][a-z-]*)", readme, re.M))
    assert {"demo", "test", "up", "lint", "setup"} <= documented
    assert documented <= targets, documented - targets
    # The test target runs the whole suite with the project's interpreter.
    assert re.search(r"^test: setup.*\n(?:\t.*\n)*\t\$\(PY\) -m pytest", makefile, re.M)


def test_ci_script_runs_lint_and_the_readme_test_command() -> None:
    script = REPO / ".ci" / "run"
    assert os.access(script, os.X_OK)
    text = script.read_text()
    assert text.startswith("#!/usr/bin/env bash") or text.startswith("#!/bin/bash")
    assert "set -euo pipefail" in text
    lint = re.search(r"\bmake( --?[a-z-]+)* lint$", text, re.M)
    test = re.search(r"\bmake( --?[a-z-]+)* test$", text, re.M)
    assert lint, "CI runs make lint"
    assert test, "CI runs make test, the README's test command"
    assert lint.start() < test.start()
    proc = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr


def test_kubernetes_manifest_describes_the_same_processes() -> None:
    docs = [d for d in yaml.safe_load_all((REPO / "deploy" / "kubernetes.yaml").read_text()) if d]
    for doc in docs:
        assert {"apiVersion", "kind", "metadata"} <= set(doc), doc
    by_name = {doc["metadata"]["name"]: doc for doc in docs if doc["kind"] in {"Deployment", "Job", "ConfigMap"}}
    commands = {
        name: by_name[name]["spec"]["template"]["spec"]["containers"][0]["command"]
        for name in ("graphene-migrate", "graphene-web", "graphene-worker", "graphene-beat")
    }
    assert commands["graphene-migrate"][:3] == ["graphene", "manage", "migrate"]
    assert commands["graphene-web"][:2] == ["graphene", "web"]
    assert commands["graphene-worker"][:2] == ["graphene", "worker"]
    assert commands["graphene-beat"][:2] == ["graphene", "beat"]
    web = by_name["graphene-web"]["spec"]["template"]["spec"]["containers"][0]
    assert web["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert web["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert by_name["graphene-beat"]["spec"]["replicas"] == 1
    assert by_name["graphene"]["data"]["DJANGO_SETTINGS_MODULE"] == "graphene_project.settings.prod"


def test_readme_names_only_settings_that_exist() -> None:
    readme = (REPO / "README.md").read_text()
    code = "\n".join(
        path.read_text()
        for folder in ("graphene_project", "apps", "kinds", "examples")
        for path in (REPO / folder).rglob("*.py")
    )
    for name in sorted(set(re.findall(r"\bGRAPHENE_[A-Z_]+[A-Z]\b", readme))):
        assert name in code, f"README documents {name}, which no code reads"


def test_the_studio_is_branded(admin_client: Any) -> None:
    response = admin_client.get("/")
    assert response.status_code == 200
    assert b"Graphene Studio" in response.content
