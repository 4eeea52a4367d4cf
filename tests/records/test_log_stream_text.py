"""The live log stream's text: byte for byte what ``json.dumps`` of the REST shape gives, for
lines that COPY and JSON must escape (the stream builds its text without either per line)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest

from apps.observability.selectors import LOG_FIELDS, LogBatch, log_fetch, log_output, log_rows
from apps.observability.services import LogEntry, log_write_lines, log_write_many
from apps.records.selectors import record_get
from tests import factories

pytestmark = pytest.mark.django_db

AWKWARD = [
    "plain line",
    'quotes " and back\\slash \\n not a newline',
    "tab\there, carriage\rreturn",
    "NUL \x00 byte",
    "non-ASCII: žluťoučký kůň, 日本語, emoji 😀",
    "control \x1b[31mred\x1b[0m and \x7f",
    "",
]


def test_stream_text_and_lines_are_the_rest_shape_byte_for_byte(user: Any) -> None:
    run = factories.run()
    child = factories.sleep(run, "child")
    log_write_lines(record_ids=[run.pk, child.pk], lines=AWKWARD, source="command/x", stream="stderr")
    log_write_many(
        [
            LogEntry(record_id=child.pk, message="two\nlines in one row", at=datetime(2030, 1, 2, 3, 4, 5, tzinfo=UTC)),
            LogEntry(record_id=run.pk, message="a source\twith a tab", source="s\\t", severity="error"),
        ]
    )
    log_write_lines(record_ids=[child.pk], lines=["one\nrow", "next"], at=datetime(2030, 1, 2, 3, 4, 5, 120, UTC))

    lines, _covered = log_rows(record=record_get(user=user, record_id=run.pk))
    rest = log_output(lines.values(*LOG_FIELDS))
    messages = [line["message"] for line in rest]
    assert messages == [
        *[m.replace("\x00", "\ufffd") for m in AWKWARD],
        *[m.replace("\x00", "\ufffd") for m in AWKWARD],
        "two\nlines in one row",
        "a source\twith a tab",
        "one\nrow",
        "next",
    ], "stored as written (NUL as U+FFFD), one row per line"
    assert {line["record_name"] for line in rest} == {run.name, child.name}
    assert "2030-01-02T03:04:05Z" in {line["at"] for line in rest}, "no fraction when there is none"
    assert "2030-01-02T03:04:05.000120Z" in {line["at"] for line in rest}

    batch = log_fetch(lines, 0)
    assert isinstance(batch, LogBatch)
    assert batch.lines() == rest
    expected = "".join(f"id: {line['id']}\nevent: log\ndata: {json.dumps(line)}\n\n" for line in rest)
    assert batch.events() == expected

    # In pages, from any line on.
    middle = rest[5]["id"]
    first = log_fetch(lines, middle, limit=4)
    assert first.lines() == rest[6:10]
    assert log_fetch(lines, first.last_id).lines() == rest[10:]
    assert not log_fetch(lines, rest[-1]["id"])
