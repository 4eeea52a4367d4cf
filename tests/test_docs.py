"""The docs' examples run: a pipeline shown in docs/ is a program that works."""

from __future__ import annotations

import re
import sys
import types
from pathlib import Path
from typing import Any

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
    example = _load(_python_blocks("pipelines.md")[0], "docs_pipelines_block_0")
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


def _code(text: str) -> list[str]:
    """The code in a Markdown page: fenced blocks and inline spans."""
    fenced = re.findall(r"```[a-z]*\n(.*?)```", text, flags=re.S)
    prose = re.sub(r"```[a-z]*\n.*?```", "", text, flags=re.S)
    return fenced + re.findall(r"`([^`\n]+)`", prose)


def _documented_commands() -> dict[str, set[str]]:
    """Every ``graphenectl ...`` command line in the README and docs/, by the page it is on."""
    pages = [DOCS.parent / "README.md", *sorted(DOCS.glob("*.md"))]
    found: dict[str, set[str]] = {}
    for page in pages:
        for snippet in _code(page.read_text()):
            for line in re.findall(r"graphenectl((?: +[^\s|;&)]+)*)", snippet):
                found.setdefault(" ".join(line.split()), set()).add(page.name)
    return found


def test_every_graphenectl_command_in_the_docs_exists() -> None:
    import typer
    from graphenectl._cli import app

    root: Any = typer.main.get_command(app)  # typer's own click: groups are told by their commands
    documented = _documented_commands()
    assert len(documented) > 20, documented  # the docs show graphenectl at work
    unknown = []
    for line, pages in sorted(documented.items()):
        command = root
        words = iter(line.split())
        for word in words:
            if not isinstance(getattr(command, "commands", None), dict):
                break  # a command's arguments and options from here on
            if word in ("--help", "-h"):
                break
            if word.startswith("-"):  # a group's option (``--context prod``): skip its value too
                option = next((p for p in command.params if word in getattr(p, "opts", [])), None)
                if option is None:
                    unknown.append(f"graphenectl {line} ({', '.join(sorted(pages))}): no option {word!r}")
                    break
                if not getattr(option, "is_flag", False):
                    next(words, None)
                continue
            if not re.fullmatch(r"[a-z][a-z-]*", word):
                break  # a placeholder (COMMAND, ID)
            sub = command.commands.get(word)
            if sub is None:
                unknown.append(f"graphenectl {line} ({', '.join(sorted(pages))}): no command {word!r}")
                break
            command = sub
    assert not unknown, "\n".join(unknown)


def test_every_python_block_of_the_pipelines_guide_runs_under_the_testing_kit() -> None:
    from graphene_sdk import Pipeline

    blocks = _python_blocks("pipelines.md")
    assert blocks
    for index, block in enumerate(blocks):
        module = _load(block, f"docs_pipelines_block_{index}")
        defined = [v for v in vars(module).values() if isinstance(v, Pipeline)]
        assert defined, f"block {index} of docs/pipelines.md defines no pipeline"
        for definition in defined:
            world = World()
            world.on_create("test.sleep", lambda spec: {"object": "db-host:5432"})
            result = world.run(definition, definition.inputs())
            assert result.succeeded, f"block {index}, {definition.name}: {result.error_text}"
