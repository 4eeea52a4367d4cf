"""The shape of the code, kept by tests: which app may import which.

Read from the source with ``ast`` (nothing is imported), counting every import: at the top of a
module and inside functions alike. Imports under ``if TYPE_CHECKING:`` are for annotations
only and do not count.

* **Domain modules** are everything in an app but its interface modules. Interface modules
  (each app's ``api/``, ``admin.py``, ``views.py``, ``consumers.py``, ``management/``, and the
  whole of ``apps/api`` and ``apps/studio``) may import any app's services and selectors; no
  domain module imports an interface module.
* The apps' domain modules form no import cycle, and ``apps/records`` imports no app but
  ``apps/core``: what records do is told to the apps above through ``apps.core.domain``.
* ``kinds/`` (the interface and the kinds it ships) never import an app's models, and never
  the agents app: a kind reaches a machine through ``kinds.machine``. No app imports a kind's
  implementation; kinds are found by name through the registry.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
INTERFACE_FILES = {"admin.py", "views.py", "consumers.py"}
INTERFACE_DIRS = {"api", "management"}
INTERFACE_APPS = {"api", "studio"}


@dataclass(frozen=True)
class Import:
    source: str  # the importing module, dotted
    target: str  # the imported module, dotted (``from a.b import c`` gives ``a.b.c`` and ``a.b``)
    line: int


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(path: Path) -> Iterator[Import]:
    source = _module_name(path)
    package = source if path.name == "__init__.py" else source.rpartition(".")[0]
    tree = ast.parse(path.read_text(), filename=str(path))

    def visit(node: ast.AST) -> Iterator[Import]:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for other in node.orelse:
                yield from visit(other)
            return
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield Import(source, alias.name, node.lineno)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)] if node.level > 1 else base
                module = ".".join([*base, *([node.module] if node.module else [])])
            else:
                module = node.module or ""
            yield Import(source, module, node.lineno)
            for alias in node.names:
                yield Import(source, f"{module}.{alias.name}", node.lineno)
        for child in ast.iter_child_nodes(node):
            yield from visit(child)

    yield from visit(tree)


def _python_files(top: str) -> Iterator[Path]:
    for path in sorted((REPO / top).rglob("*.py")):
        if "migrations" not in path.parts:
            yield path


def _app(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[0] == "apps" else None


def _node(module: str) -> str | None:
    """The graph node of a module: its app (``records``), ``kinds`` for the kind interface and
    its shared helpers (``kinds``, ``kinds._x``, ``kinds.machine``), or the kind package
    (``kinds.docker``)."""
    app = _app(module)
    if app is not None:
        return app
    parts = module.split(".")
    if parts[0] != "kinds":
        return None
    if len(parts) == 1 or parts[1].startswith("_") or parts[1] == "machine":
        return "kinds"
    return f"kinds.{parts[1]}"


def is_interface(module: str) -> bool:
    parts = module.split(".")
    if parts[0] != "apps" or len(parts) < 2:
        return False
    if parts[1] in INTERFACE_APPS:
        return True
    rest = parts[2:]
    return bool(rest) and (rest[0] in INTERFACE_DIRS or f"{rest[0]}.py" in INTERFACE_FILES)


def all_imports() -> list[Import]:
    found: list[Import] = []
    for top in ("apps", "kinds"):
        for path in _python_files(top):
            found.extend(_imports(path))
    return found


def _real_module(target: str) -> str:
    """The module a dotted import names (``apps.records.services.record_declare`` → ``apps.records.services``)."""
    parts = target.split(".")
    while parts:
        candidate = REPO.joinpath(*parts)
        if candidate.with_suffix(".py").is_file() or (candidate / "__init__.py").is_file():
            return ".".join(parts)
        parts.pop()
    return target


def app_edges() -> dict[tuple[str, str], list[Import]]:
    """(node, node) → the imports that make the edge, between domain modules' apps and kinds."""
    edges: dict[tuple[str, str], list[Import]] = defaultdict(list)
    for imp in all_imports():
        src, dst = _node(imp.source), _node(_real_module(imp.target))
        if src is None or dst is None or src == dst or is_interface(imp.source):
            continue
        edges[(src, dst)].append(imp)
    return edges


def cycles(edges: set[tuple[str, str]]) -> list[list[str]]:
    """Every elementary cycle's smallest-first rotation, found by depth-first search (small graph)."""
    graph: dict[str, set[str]] = defaultdict(set)
    for a, b in edges:
        graph[a].add(b)
    found: set[tuple[str, ...]] = set()

    def walk(start: str, node: str, path: list[str]) -> None:
        for nxt in sorted(graph[node]):
            if nxt == start:
                found.add(tuple(path))
            elif nxt not in path and nxt > start:
                walk(start, nxt, [*path, nxt])

    for start in sorted(graph):
        walk(start, start, [start])
    return [list(c) for c in sorted(found)]


def _where(imps: list[Import]) -> str:
    return ", ".join(sorted({f"{i.source}:{i.line} imports {_real_module(i.target)}" for i in imps})[:4])


def test_the_apps_domain_modules_form_no_import_cycle() -> None:
    edges = app_edges()
    found = cycles(set(edges))
    described = []
    for cycle in found:
        steps = list(zip(cycle, [*cycle[1:], cycle[0]], strict=True))
        described.append(" → ".join([*cycle, cycle[0]]) + "\n    " + "\n    ".join(_where(edges[s]) for s in steps))
    assert not found, "import cycles between apps:\n" + "\n".join(described)


def test_records_import_no_app_but_core() -> None:
    edges = app_edges()
    outward = {dst: imps for (src, dst), imps in edges.items() if src == "records" and dst not in ("core", "kinds")}
    assert not outward, "apps/records imports " + "; ".join(f"{d} ({_where(i)})" for d, i in outward.items())


def test_no_domain_module_imports_an_interface_module() -> None:
    bad = [
        imp
        for imp in all_imports()
        if imp.source.startswith("apps.") and not is_interface(imp.source) and is_interface(_real_module(imp.target))
    ]
    assert not bad, "domain modules importing interface modules: " + _where(bad)


def test_kinds_reach_no_app_models_and_no_agents() -> None:
    bad = [
        imp
        for imp in all_imports()
        if imp.source.split(".")[0] == "kinds"
        and (_real_module(imp.target).endswith(".models") or _app(imp.target) == "agents")
        and _app(imp.target) is not None
    ]
    assert not bad, "kinds importing app models or the agents app: " + _where(bad)


# Libraries under kinds/ that are no kind's implementation: the machine-call interface, and
# the git command line runner (stdlib only) that the git checkout kind and git sources share.
KIND_LIBRARIES = ("kinds.machine", "kinds.git.cli")


def test_no_app_imports_a_kinds_implementation() -> None:
    bad = [
        imp
        for imp in all_imports()
        if imp.source.startswith("apps.")
        and _real_module(imp.target).startswith("kinds.")
        and _real_module(imp.target) not in KIND_LIBRARIES
    ]
    assert not bad, "apps importing a kind's implementation (use the registry): " + _where(bad)


def test_the_interface_rule_names_real_modules() -> None:
    """The rules above are about files that exist: a renamed interface module must be renamed here."""
    modules = {_module_name(p) for p in _python_files("apps")}
    assert "apps.records.api.views" in modules
    assert "apps.records.services" in modules
    assert is_interface("apps.records.api.views")
    assert not is_interface("apps.records.services")
    assert is_interface("apps.agents.consumers")
    assert is_interface("apps.api.urls")
