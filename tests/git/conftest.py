"""Fixtures of the git tests: upstream repositories, ``git daemon`` and smart HTTP on loopback."""

from __future__ import annotations

import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from apps.records import services
from apps.records.models import Record
from kinds.git.checkout import root
from tests import factories
from tests.git.servers import GitDaemon, GitHTTP, Upstream, make_upstream

HTTP_USER = "ci-bot"
HTTP_TOKEN = "tok-" + uuid.uuid4().hex  # what the secret store holds; must never travel


@pytest.fixture(scope="session")
def served(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The base path both servers serve repositories from."""
    return tmp_path_factory.mktemp("served")


@pytest.fixture(scope="session")
def daemon(served: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GitDaemon]:
    server = GitDaemon(served, tmp_path_factory.mktemp("daemon") / "daemon.log").start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def http_git(served: Path) -> Iterator[GitHTTP]:
    server = GitHTTP(served, HTTP_USER, HTTP_TOKEN).start()
    yield server
    server.stop()


@pytest.fixture
def upstream(served: Path) -> Upstream:
    """A fresh repository for this test (served by both servers)."""
    return make_upstream(served, f"app-{uuid.uuid4().hex[:8]}")


@pytest.fixture(autouse=True)
def _remove_leftover_checkouts() -> Iterator[None]:
    """Checkouts of records that a rolled-back test transaction made vanish: removed after
    each test, so that no later sweep of this session reports them as orphans."""
    before = set(root().iterdir()) if root().is_dir() else set()
    yield
    for path in (set(root().iterdir()) if root().is_dir() else set()) - before:
        shutil.rmtree(path, ignore_errors=True)


def declare(capture: Any, name: str, **spec: Any) -> Record:
    """A ``git.checkout`` declared under a fresh stand, converged before this returns."""
    owner = factories.stand(f"git-{name}-{uuid.uuid4().hex[:6]}")
    with capture(execute=True):
        record = services.record_declare(kind="git.checkout", name=name, owner=owner, spec=spec)
    record.refresh_from_db()
    return record


def delete(capture: Any, record: Record) -> Record:
    with capture(execute=True):
        services.record_delete_request(record=record)
    record.refresh_from_db()
    return record
