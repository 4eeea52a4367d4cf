"""A secret named in a pipeline: the run's records, journal and logs hold its name, never its value."""

from __future__ import annotations

import pytest

from apps.pipelines import services
from apps.pipelines.choices import TERMINAL, RunStatus
from apps.pipelines.models import JournalEntry, Run
from apps.records.models import Record
from apps.secrets.services import secret_create
from tests.agents.test_ssh_install import tables_containing
from tests.conftest import Worker, wait_for
from tests.secrets import pipelines  # noqa: F401 - registers secrets.spec in this process

pytestmark = [pytest.mark.system, pytest.mark.django_db(transaction=True)]

VALUE = "s3cr3t-value-that-must-not-travel"


def test_a_secret_in_a_spec_is_stored_as_its_name(workers: list[Worker]) -> None:
    secret_create(name="db-password", value=VALUE)

    run = services.run_start(pipeline_name="secrets.spec", inputs={"secret": "db-password"})
    wait_for(lambda: Run.objects.get(pk=run.pk).status in TERMINAL, timeout=120, what="the run to end")

    run = Run.objects.get(pk=run.pk)
    assert run.status == RunStatus.SUCCEEDED, run.error
    reference = {"value": {"env": [{"name": "PGPASSWORD", "value": {"$secret": "db-password"}}]}}
    assert Record.objects.get(created_by_run_id=run.record_id, name="db").spec == reference
    assert run.outputs is not None
    assert run.outputs["outputs"]["value"] == reference["value"]  # the kind echoed what it was given: the name
    assert "db-password" in str(list(JournalEntry.objects.filter(run=run).values_list("result", flat=True)))
    assert tables_containing(VALUE) == []  # not in any table (nor in the store's own row)
