"""A run that uses secrets every way a pipeline could let a value out: in a record's spec, in a
program's environment on an agent, in a log message about them, printed by the program on
stdout and stderr, and in the error the run fails with. Afterwards no column of any table
(but the secret store's ciphertext) and no log of any process holds a value (invariant I7):
what a program printed is stored masked."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest
from django.db import connection

from apps.observability.models import LogLine
from apps.pipelines import services
from apps.pipelines.choices import TERMINAL, RunStatus
from apps.pipelines.models import Run
from apps.records.models import Record
from apps.secrets.models import Secret
from apps.secrets.services import secret_create, secrets_mask
from tests.conftest import Worker, wait_for
from tests.harness.agents import AGENT_SRC
from tests.harness.web import WebServer
from tests.secrets import pipelines  # noqa: F401 - registers secrets.careless in this process

pytestmark = [pytest.mark.system, pytest.mark.django_db(transaction=True)]


def columns_containing(needle: str, *, besides: tuple[str, ...]) -> list[str]:
    """``table.column`` of every column of every table (information_schema) whose text holds
    ``needle`` in some row, the tables ``besides`` left out."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT table_name, column_name, data_type FROM information_schema.columns"
            " WHERE table_schema = current_schema() ORDER BY table_name, ordinal_position"
        )
        tables: dict[str, list[tuple[str, str]]] = defaultdict(list)
        for table, column, data_type in cursor.fetchall():
            tables[table].append((column, data_type))
        assert len(tables) > 20, sorted(tables)  # the whole schema, not an empty one
        hits = []
        for table, columns in tables.items():
            if table in besides:
                continue
            texts = [
                f"encode(\"{column}\", 'escape')" if data_type == "bytea" else f'"{column}"::text'
                for column, data_type in columns
            ]
            probes = ", ".join(f"coalesce(bool_or(strpos({text}, %s) > 0), false)" for text in texts)
            cursor.execute(f'SELECT {probes} FROM "{table}"', [needle] * len(texts))  # noqa: S608 - names from the catalog
            hits += [f"{table}.{column}" for (column, _), hit in zip(columns, cursor.fetchone(), strict=True) if hit]
    return hits


def files_containing(needle: str, paths: list[Path]) -> list[str]:
    return [str(path) for path in paths if path.is_file() and needle.encode() in path.read_bytes()]


def test_no_secret_value_is_stored_or_logged_anywhere_after_a_careless_run(
    web: WebServer, workers: list[Worker], tmp_path: Path
) -> None:
    token = f"tok-{secrets.token_hex(12)}"
    key_lines = [secrets.token_urlsafe(24) for _ in range(2)]
    key = "-----BEGIN TEST KEY-----\n" + "\n".join(key_lines) + "\n-----END TEST KEY-----\n"
    secret_create(name="deploy-token", value=token)
    secret_create(name="deploy-key", value=key)

    env_path = tmp_path / "agent.env"
    run = services.run_start(
        pipeline_name="secrets.careless",
        inputs={"token": "deploy-token", "key": "deploy-key", "env_path": str(env_path)},
    )
    wait_for(env_path.exists, timeout=60, what="the run to hand over the agent's install config")
    with env_path.open("a") as fh:
        fh.write(f"GRAPHENE_AGENT_STATE_DIR={tmp_path / 'state'}\nGRAPHENE_AGENT_BACKOFF_MAX_SECONDS=1\n")
    agent_log = tmp_path / "agent.log"
    agent = subprocess.Popen(
        [sys.executable, "-m", "graphene_agent", "--config", str(env_path)],
        env={"PATH": os.environ["PATH"], "PYTHONPATH": str(AGENT_SRC), "HOME": str(tmp_path)},
        stdout=agent_log.open("wb"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        wait_for(lambda: Run.objects.get(pk=run.pk).status in TERMINAL, timeout=120, what="the run to end")
        run = Run.objects.get(pk=run.pk)
        assert run.record_id is not None
        wait_for(
            lambda: not Record.objects.filter(created_by_run_id=run.record_id).exclude(phase="deleted").exists(),
            timeout=60,
            what="the run's records (its agent's too) to be deleted",
        )
    finally:
        agent.kill()
        agent.wait(timeout=30)

    # It ran as written: the values reached the programs, which printed them, and it failed.
    assert run.status == RunStatus.FAILED, run.error
    assert "login failed (7): cannot log in as deploy:***" in run.error
    printed = list(LogLine.objects.filter(source__startswith="command/").values_list("message", flat=True))
    # The multi-line key, printed whole, is masked whole (its lines one by one when printed apart).
    expected = ["token=***", "***", "again: ***", "cannot log in as deploy:***"]
    assert sorted(printed) == sorted(expected), printed
    assert Record.objects.get(created_by_run_id=run.record_id, name="db").spec == {
        "value": {"password": {"$secret": "deploy-token"}, "key": {"$secret": "deploy-key"}}
    }
    assert Secret.objects.count() == 2

    # Nowhere else: no column of any table, no log of the processes that served the run.
    logs = [web.log, agent_log, *(worker.log for worker in workers)]
    for needle in [token, *key_lines]:
        assert columns_containing(needle, besides=("secrets_secret",)) == [], needle
        assert files_containing(needle, logs) == [], needle


@pytest.mark.django_db
def test_masking_covers_each_line_of_a_value_and_a_tail_cut_inside_one() -> None:
    key = "-----BEGIN KEY-----\nAbCdEfGhIj0123\nKlMnOpQrSt4567\n-----END KEY-----\n"
    values = ["hunter2-long", key, ""]
    assert secrets_mask("pw=hunter2-long, again hunter2-long", values=values) == "pw=***, again ***"
    assert secrets_mask(key, values=values) == "***"
    assert secrets_mask("line: KlMnOpQrSt4567 end", values=values) == "line: *** end"
    assert secrets_mask("= ==\n", values=["=\n=="]) == "= ==\n", "short lines of a value are not masked alone"
    assert secrets_mask("a", values=["a"]) == "***", "a short value is masked whole"
    # The end of an output begins where its tail was cut: maybe inside a value.
    assert secrets_mask("-long and more", values=values, is_tail=True) == "-long and more", "too short to tell"
    assert secrets_mask("er2-long and more", values=values, is_tail=True) == "*** and more"
    assert secrets_mask("er2-long and more", values=values) == "er2-long and more", "only a tail is cut"
