"""A live log stream never skips a line that committed after a line with a higher id.

Two writers take ids in one order and may commit in the other. The stream sends lines up to
the horizon (``observability.selectors.log_horizon``): below every writer still open. Real
PostgreSQL sessions, one per thread, as the gateway and a worker are.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.db import connection, transaction

from apps.observability.models import LogLine
from apps.observability.selectors import log_fetch, log_horizon, log_rows
from apps.observability.services import log_write, log_write_lines
from apps.records.selectors import record_get
from tests import factories

pytestmark = pytest.mark.django_db(transaction=True)


class OpenWriter:
    """A transaction in another session that wrote lines and stays open until told."""

    def __init__(self, write: Callable[[], object]) -> None:
        self.wrote = threading.Event()
        self.finish = threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, args=(write,), daemon=True)
        self.thread.start()
        assert self.wrote.wait(30), f"the writer did not write: {self.error!r}"

    def _run(self, write: Callable[[], object]) -> None:
        try:
            with transaction.atomic():
                write()
                self.wrote.set()
                assert self.finish.wait(30)
        except BaseException as exc:
            self.error = exc
            self.wrote.set()
        finally:
            connection.close()

    def commit(self) -> None:
        self.finish.set()
        self.thread.join(30)
        assert self.error is None, self.error


@pytest.fixture
def writers() -> Iterator[list[OpenWriter]]:
    started: list[OpenWriter] = []
    yield started
    for writer in started:
        writer.finish.set()
        writer.thread.join(30)


def messages(batch: Any) -> list[str]:
    return [row[-1] for row in batch.rows]


@pytest.mark.parametrize("early", ["log_write", "log_write_lines"])
def test_a_line_committed_late_with_a_lower_id_is_sent_not_skipped(
    user: Any, writers: list[OpenWriter], early: str
) -> None:
    run = factories.run()
    step = factories.sleep(run, "step")

    def write_early() -> None:
        if early == "log_write":
            log_write(record_id=step.pk, message="early")
        else:
            log_write_lines(record_ids=[step.pk], lines=["early", "early too"])

    slow = OpenWriter(write_early)
    writers.append(slow)
    log_write_lines(record_ids=[run.pk], lines=["late 1", "late 2"])  # committed at once, higher ids
    late_ids = sorted(LogLine.objects.filter(message__startswith="late").values_list("id", flat=True))
    assert len(late_ids) == 2, "the committed lines are stored"

    rows, _covered = log_rows(record=record_get(user=user, record_id=run.pk))
    held = log_fetch(rows, 0)
    assert messages(held) == [], "the lines above an open writer's ids wait for it"
    horizon = log_horizon()
    assert horizon is not None
    assert horizon < min(late_ids)

    slow.commit()
    sent = log_fetch(rows, 0)
    expected = ["early", "late 1", "late 2"] if early == "log_write" else ["early", "early too", "late 1", "late 2"]
    assert messages(sent) == expected, "in id order, the late commit first"
    assert [row[0] for row in sent.rows] == sorted(row[0] for row in sent.rows)
    assert not log_fetch(rows, sent.last_id)


def test_a_transaction_that_writes_no_lines_holds_no_stream_back(user: Any, writers: list[OpenWriter]) -> None:
    """Only log writers bound the horizon: a long transaction elsewhere does not stall streams."""
    run = factories.run()
    busy = OpenWriter(lambda: factories.sleep(run, "unrelated"))  # open, writing other rows
    writers.append(busy)
    log_write(record_id=run.pk, message="line")
    rows, _covered = log_rows(record=record_get(user=user, record_id=run.pk))
    assert messages(log_fetch(rows, 0)) == ["line"]
    busy.commit()


def test_a_writer_announces_once_per_transaction() -> None:
    """Many writes in one transaction hold one lock (the lock table is shared and bounded)."""
    run = factories.run()
    with transaction.atomic():
        for n in range(50):
            log_write(record_id=run.pk, message=f"line {n}")
            log_write_lines(record_ids=[run.pk], lines=[f"chunk {n}"])
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid() AND granted"
            )
            assert cursor.fetchone()[0] == 1
    assert LogLine.objects.filter(record=run).count() == 100
