"""Fast command output: many lines, coalesced into large chunks, across a server crash.

The agent keeps at most a few output chunks unacknowledged and lets new output join the last
chunk not yet sent (``OUTPUT_WINDOW``); the gateway stores each chunk with one ``COPY``. A
crash of the web process in the middle must still leave every line stored exactly once, in
order, and a line the database cannot hold as it is (a NUL byte) must not stop the stream.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

import pytest

from apps.agents import services
from apps.agents.choices import CommandStatus
from apps.records.choices import Phase
from apps.records.models import Record
from tests.agents.conftest import wait_command, wait_phase
from tests.conftest import wait_for
from tests.harness.agents import AgentProcess
from tests.harness.web import WebServer

pytestmark = [pytest.mark.system, pytest.mark.django_db(transaction=True)]

LINES = 60_000
# Bursts of lines as fast as Python prints them, a short pause between bursts: the server
# falls behind within a burst (so chunks coalesce) and the whole takes long enough to crash it.
PRODUCER = """
import sys, time
for burst in range(30):
    sys.stdout.write("".join(f"line {i} of a fast producer\\n" for i in range(burst * 2000, (burst + 1) * 2000)))
    if burst == 10:
        sys.stdout.write("a NUL \\x00 in the middle\\n")
    sys.stdout.flush()
    time.sleep(0.1)
"""


@pytest.mark.own_web  # it kills the server
def test_a_fast_producer_across_a_server_crash_is_stored_once_in_order(
    agents: Callable[..., tuple[Record, AgentProcess]], web: WebServer
) -> None:
    record, _agent = agents("firehose")
    wait_phase(record, Phase.READY)
    command = services.command_submit(
        agent=record, kind="exec", payload={"argv": [sys.executable, "-c", PRODUCER], "timeout": 120}
    )
    source = f"command/{command.pk}"
    wait_for(lambda: record.log_lines.filter(source=source).count() >= 5_000, timeout=60, what="some output")
    web.kill()  # SIGKILL: chunks in flight are lost with it, unacknowledged
    web.start()
    done = wait_command(command, timeout=120)
    assert done.status == CommandStatus.SUCCEEDED, done.error
    assert done.deliveries >= 2
    assert not done.result.get("output_incomplete")
    lines = list(record.log_lines.filter(source=source).order_by("id").values_list("message", flat=True))
    expected = [f"line {i} of a fast producer" for i in range(LINES)]
    expected.insert(11 * 2000, "a NUL \ufffd in the middle")
    assert len(lines) == len(expected)
    assert lines == expected
