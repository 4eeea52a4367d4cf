"""docs/sdk-client.md's examples run, in order, as a user would: against ``graphene up``
(the example pipelines), connected through the context ``graphenectl login`` saved."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.harness.embedded import Ctl, Server
from tests.harness.processes import REPO

PAGE = REPO / "docs" / "sdk-client.md"


@pytest.mark.xdist_group("graphene-up")
def test_the_client_page_examples_run_against_graphene_up(server: Server, ctl: Ctl, tmp_path: Path) -> None:
    blocks = re.findall(r"```python\n(.*?)```", PAGE.read_text(), flags=re.S)
    assert len(blocks) >= 8, "every example of the page"
    script = tmp_path / "examples.py"
    script.write_text("\n".join(blocks))
    env = ctl.env(PYTHONPATH=str(REPO / "examples" / "pipelines"))
    done = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert f"{server.url} from context 'test'" in out
    assert "Hello, Ada!" in out
    assert "-> succeeded" in out
    assert "cancelled\nqueued\ncancelled\n" in out
    assert "[environment#" in out or "database object" in out, "the follow printed the run's lines"
    assert "400 validation_failed {'inputs.name':" in out
    assert (tmp_path / "smoke.txt").read_text() == "all green\n"
