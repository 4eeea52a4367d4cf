"""Nothing crosses a namespace: owners, child runs, agents a run may use, secrets a run reads."""

from __future__ import annotations

import pytest

from apps.agents import selectors as agent_selectors
from apps.agents import services as agents
from apps.core import access
from apps.core.errors import ValidationFailed
from apps.pipelines import services as pipelines
from apps.records import services as records
from apps.secrets import services as secrets
from kinds.git.auth import credentials
from kinds.git.cli import GitError
from tests import factories

pytestmark = pytest.mark.django_db

OTHER = "team-b"


@pytest.fixture(autouse=True)
def other_namespace() -> None:
    factories.bind_namespace(OTHER)


def test_a_record_is_never_given_to_an_owner_of_another_namespace() -> None:
    home = records.record_create_root(kind="graphene.stand", name="home")
    away = records.record_create_root(kind="graphene.stand", name="away", namespace=OTHER)
    held = records.record_declare(kind="test.sleep", name="held", owner=home, spec={})
    with pytest.raises(ValidationFailed, match="an owner is always in its records' namespace"):
        records.record_transfer(record=held, new_owner=away)
    held.refresh_from_db()
    assert (held.parent_id, held.namespace) == (home.pk, "default")
    child = records.record_declare(kind="test.sleep", name="child", owner=away, spec={})
    assert child.namespace == OTHER  # a declaration takes its owner's namespace


def test_a_run_starts_child_runs_only_in_its_own_namespace() -> None:
    parent = pipelines.run_start(pipeline_name="sample.noop", inputs={"steps": 0})
    with pytest.raises(access.AccessDenied, match="runs start child runs only in their own namespace"):
        pipelines.run_start_children(
            parent=parent, pipeline_name="sample.team-b", inputs=[{"steps": 0}], concurrency=1, group=1
        )
    child_namespace = pipelines.run_start(pipeline_name="sample.team-b", inputs={"steps": 0}).namespace
    assert (parent.namespace, child_namespace) == ("default", OTHER)


def test_a_run_selects_and_attaches_only_agents_of_its_namespace() -> None:
    home = records.record_create_root(kind="graphene.stand", name="machines")
    away = records.record_create_root(kind="graphene.stand", name="machines", namespace=OTHER)
    mine = agents.agent_record_declare(owner=home, name="box", labels={"pool": "ci"})
    theirs = agents.agent_record_declare(owner=away, name="box", labels={"pool": "ci"})
    assert [r.pk for r in agent_selectors.agents_select(labels={"pool": "ci"}, namespace="default")] == [mine.pk]
    assert [r.pk for r in agent_selectors.agent_find(name_or_id="box", namespace=OTHER)] == [theirs.pk]
    assert agent_selectors.agent_find(name_or_id=str(theirs.pk), namespace="default") == []


def test_a_run_reads_secrets_of_its_own_namespace_only() -> None:
    secrets.secret_create(name="git-token", value="default-value")
    with access.acting_in(OTHER), pytest.raises(GitError, match="git-token"):
        credentials({"$secret": "git-token"})  # exists in default, not in team-b
    secrets.secret_create(name="git-token", value="team-b-value", namespace=OTHER)
    with access.acting_in(OTHER):
        found = credentials({"$secret": "git-token"})
    assert found is not None
    assert found.password == "team-b-value"
    assert credentials({"$secret": "git-token"}).password == "default-value"  # type: ignore[union-attr]
