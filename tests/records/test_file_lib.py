"""``graphene_sdk.libs.file`` through a real run: text, bytes and a secret's value on disk."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from django.db import connection

from apps.pipelines import services
from apps.pipelines.models import Run
from apps.records.choices import Phase
from apps.records.models import Record
from apps.secrets.services import secret_create
from tests.conftest import Worker, wait_for

pytestmark = [pytest.mark.system, pytest.mark.django_db(transaction=True)]


def test_the_file_library_writes_text_bytes_and_secrets(workers: list[Worker]) -> None:
    value = f"s3cr3t-{uuid.uuid4()}"
    secret_create(name="deploy-token", value=value)
    folder = f"lib-{uuid.uuid4()}"
    run = services.run_start(pipeline_name="sample.files", inputs={"folder": folder})
    started = wait_for(lambda: Run.objects.filter(pk=run.pk, record__isnull=False).first(), what="the run's record")
    assert started is not None

    def written() -> dict[str, Record] | None:
        found = {r.name: r for r in Record.objects.filter(created_by_run_id=started.record_id, kind="file")}
        return found if len(found) == 3 and all(r.phase == Phase.READY for r in found.values()) else None

    ready = wait_for(written, timeout=60, what="the three files")
    assert ready is not None
    records = ready
    paths = {name: Path(r.outputs["path"]) for name, r in records.items()}
    assert paths["notes"].read_text() == "hello\n"
    assert paths["raw"].read_text() == "bytes too\n"
    assert paths["token"].read_text() == value
    assert paths["token"].stat().st_mode & 0o777 == 0o600
    assert paths["token"].parent.name == folder
    assert records["token"].spec["content"] == {"$secret": "deploy-token"}, "only the name is stored"
    assert value not in str(records["token"].outputs)
    with connection.cursor() as cursor:  # the value is nowhere in the database
        for table in ("records_record", "records_event", "pipelines_journalentry", "observability_logline"):
            cursor.execute(f"SELECT count(*) FROM {table} t WHERE CAST(t.* AS text) LIKE %s", [f"%{value}%"])  # noqa: S608
            assert cursor.fetchone()[0] == 0, table

    services.run_cancel(run=Run.objects.get(pk=run.pk))
    wait_for(lambda: not paths["token"].exists(), what="the run's files to be deleted with it")
    wait_for(
        lambda: all(Record.objects.get(pk=r.pk).phase == Phase.DELETED for r in records.values()),
        what="the file records to be deleted",
    )
