"""The docs' examples run: a pipeline shown in docs/ is a program that works."""

from __future__ import annotations

import re
import sys
import types
from pathlib import Path

from graphene_sdk.testing import World

DOCS = Path(__file__).resolve().parent.parent / "docs"


def _python_blocks(page: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", (DOCS / page).read_text(), flags=re.S)


def _load(source: str, name: str) -> types.ModuleType:
    """Run a code block as a module (pydantic and the SDK need its types importable)."""
    if name in sys.modules:
        return sys.modules[name]
    module = types.ModuleType(name)
    sys.modules[name] = module
    exec(compile(source, f"<{name}>", "exec"), module.__dict__)  # noqa: S102 - our own docs
    return module


def test_the_first_pipeline_example_runs_twice_and_its_stand_keeps_the_newest_db() -> None:
    example = _load(_python_blocks("pipelines.md")[0], "docs_pipelines_first_example")
    world = World()
    world.on_create("test.sleep", lambda spec: {"object": "db-host:5432"})
    first = world.run(example.integration, example.Inputs())
    assert first.succeeded, first.error_text
    second = world.run(example.integration, example.Inputs())
    assert second.succeeded, second.error_text
    held = world.stand(example.integration)
    assert [(r.name, r.alive) for r in held if r.alive] == [("db", True)]
    old_db = first.record("db")
    assert not old_db.alive
    assert old_db.deletion_reason == "Replaced"
    assert held[-1].id == second.record("db").id
