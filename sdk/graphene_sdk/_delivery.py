"""Pipeline code as a revision: a directory of modules packed into one canonical archive,
described (its pipelines, their schemas and policies, the imports it needs that are not
installed) and loaded into a package of its own, so that two revisions of one pipeline live
side by side in one process.

graphenectl packs a directory with it (``pipeline push``); the server unpacks, packs again
(so the digest depends on the files alone, never on who packed them), describes the tree in a
subprocess (``python -m graphene_sdk._delivery describe DIR --namespace NS``, which prints one
JSON document) and its workers load revisions with ``load``.

A revision's modules are its top-level ``*.py`` files and packages (a directory with an
``__init__.py``), except names starting with ``_`` or ``.``. They are imported as
``<package>.<module>``, so they import each other relatively (``from . import helpers``): an
absolute import of a sibling (``import helpers``) would find another revision's, or none, and
is refused when the revision is described.
"""

from __future__ import annotations

import ast
import gzip
import importlib
import importlib.util
import io
import json
import os
import stat
import sys
import tarfile
import traceback
import types
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import Any

from graphene_sdk._pipeline import Pipeline, collecting

# Never part of a revision: caches, virtual environments and version control.
SKIPPED_DIRS = frozenset(
    {"__pycache__", ".git", ".hg", ".svn", ".venv", "venv", ".tox", ".mypy_cache", ".pytest_cache", ".ruff_cache"}
)
SKIPPED_SUFFIXES = (".pyc", ".pyo")
PACKAGE_ROOT = "graphene_revisions"


class TreeError(ValueError):
    """A directory or archive that cannot be a revision; the message says why and what to do."""


# --- the canonical archive ------------------------------------------------------------------


def tree_files(tree: Path, *, max_bytes: int) -> list[tuple[str, Path]]:
    """The revision's files under ``tree``, as (posix path relative to it, path), sorted.
    Regular files only; a symbolic link or a tree larger than ``max_bytes`` is refused."""
    if not tree.is_dir():
        raise TreeError(f"{tree} is not a directory")
    found: list[tuple[str, Path]] = []
    total = 0
    for dirpath, dirnames, filenames in os.walk(tree):
        dirnames[:] = sorted(d for d in dirnames if d not in SKIPPED_DIRS)
        here = Path(dirpath)
        for name in dirnames:
            if (here / name).is_symlink():
                raise TreeError(
                    f"{(here / name).relative_to(tree)} is a symbolic link: a revision holds plain files only"
                )
        for name in sorted(filenames):
            path = here / name
            if name.endswith(SKIPPED_SUFFIXES):
                continue
            mode = path.lstat().st_mode
            relative = path.relative_to(tree).as_posix()
            if stat.S_ISLNK(mode):
                raise TreeError(f"{relative} is a symbolic link: a revision holds plain files only")
            if not stat.S_ISREG(mode):
                continue  # sockets, fifos: nothing a pipeline's code is made of
            total += path.stat().st_size
            if total > max_bytes:
                raise TreeError(
                    f"{tree} holds more than {max_bytes:,} bytes (the revision size limit) by {relative}: "
                    "keep data out of the pipeline's directory (artifacts hold data)"
                )
            found.append((relative, path))
    return sorted(found)


def pack(tree: Path, *, max_bytes: int) -> bytes:
    """The canonical archive of ``tree``: a gzipped tar of its files in path order, with no
    times, owners or modes but the executable bit, so the same files always give the same
    bytes (and digest)."""
    raw = io.BytesIO()
    with (
        gzip.GzipFile(fileobj=raw, mode="wb", mtime=0, compresslevel=6) as zipped,
        tarfile.open(fileobj=zipped, mode="w", format=tarfile.USTAR_FORMAT) as archive,
    ):
        for relative, path in tree_files(tree, max_bytes=max_bytes):
            if len(relative.encode()) > 255:
                raise TreeError(f"{relative[:80]}…: a path in a revision is at most 255 bytes")
            info = tarfile.TarInfo(relative)
            info.size = path.stat().st_size
            info.mode = 0o755 if os.access(path, os.X_OK) else 0o644
            info.mtime = 0
            with path.open("rb") as handle:
                archive.addfile(info, handle)
    return raw.getvalue()


def unpack(data: bytes, dest: Path, *, max_bytes: int) -> None:
    """Extract an archive made by ``pack`` (or anyone: it is checked) into the empty directory
    ``dest``: regular files and directories only, inside ``dest``, at most ``max_bytes`` in all."""
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:*") as archive:
            members = archive.getmembers()
            total = 0
            for member in members:
                name = PurePosixPath(member.name)
                if name.is_absolute() or ".." in name.parts:
                    raise TreeError(f"the archive's {member.name!r} points outside it")
                if not (member.isfile() or member.isdir()):
                    raise TreeError(f"the archive's {member.name!r} is not a plain file or directory")
                total += member.size
                if total > max_bytes:
                    raise TreeError(f"the archive unpacks to more than {max_bytes:,} bytes (the revision size limit)")
            archive.extractall(dest, members=members, filter="data")
    except (tarfile.TarError, EOFError, OSError, gzip.BadGzipFile) as exc:
        raise TreeError(f"not a readable tar archive (gzipped or not): {exc}") from None


# --- what a tree holds ------------------------------------------------------------------------


def modules_of(tree: Path) -> list[str]:
    """The revision's top-level modules and packages, by name, sorted."""
    names = []
    for entry in sorted(tree.iterdir()):
        if entry.name.startswith(("_", ".")):
            continue
        if entry.is_file() and entry.suffix == ".py" and entry.stem.isidentifier():
            names.append(entry.stem)
        elif entry.is_dir() and (entry / "__init__.py").is_file() and entry.name.isidentifier():
            names.append(entry.name)
    return names


def _guarded(tree: ast.AST) -> set[int]:
    """Ids of the import nodes inside ``try: ... except ImportError`` (optional imports)."""
    optional: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Try) and any(
            isinstance(h.type, ast.Name) and h.type.id in ("ImportError", "ModuleNotFoundError") for h in node.handlers
        ):
            optional.update(id(n) for stmt in node.body for n in ast.walk(stmt))
    return optional


def imports_of(tree: Path) -> Iterator[tuple[str, str, int]]:
    """(file, top-level module name, line) of every absolute import in the tree's Python files
    that is not guarded by ``except ImportError``."""
    for relative, path in tree_files(tree, max_bytes=sys.maxsize):
        if not relative.endswith(".py"):
            continue
        try:
            parsed = ast.parse(path.read_bytes(), filename=relative)
        except (SyntaxError, ValueError):
            continue  # the import itself reports it, with its line
        optional = _guarded(parsed)
        for node in ast.walk(parsed):
            if id(node) in optional:
                continue
            if isinstance(node, ast.Import):
                for alias in node.names:
                    yield relative, alias.name.partition(".")[0], node.lineno
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                yield relative, node.module.partition(".")[0], node.lineno


def check_imports(tree: Path) -> list[str]:
    """The top-level modules the tree imports that this Python cannot find (sorted); raises
    ``TreeError`` for an absolute import of one of the tree's own modules."""
    own = set(modules_of(tree))
    missing: set[str] = set()
    for relative, name, line in imports_of(tree):
        if name in own:
            raise TreeError(
                f"{relative}:{line} imports {name!r} absolutely: the modules of a revision import each other "
                f"relatively (from . import {name}), so that two revisions never share one"
            )
        if name in sys.stdlib_module_names or name in sys.modules:
            continue
        if importlib.util.find_spec(name) is None:
            missing.add(name)
    return sorted(missing)


# --- loading ----------------------------------------------------------------------------------


def package_name(digest: str, namespace: str) -> str:
    """The package a revision's modules are imported under: its content and where it was
    delivered (the same files in two namespaces define pipelines of each)."""
    return f"{PACKAGE_ROOT}.r{digest[:24]}_{namespace.replace('-', '_')}"


def _root_package() -> None:
    if PACKAGE_ROOT not in sys.modules:
        root = types.ModuleType(PACKAGE_ROOT)
        root.__path__ = []
        sys.modules[PACKAGE_ROOT] = root


def load(tree: Path, package: str, *, namespace: str) -> dict[str, Pipeline[Any, Any]]:
    """Import the revision in ``tree`` as ``package`` (a fresh one) and return its pipelines
    by name; nothing is left in ``sys.modules`` if an import fails. The caller serializes loads."""
    _root_package()
    top = types.ModuleType(package)
    top.__path__ = [str(tree)]
    top.__package__ = package
    sys.modules[package] = top
    try:
        with collecting(namespace) as pipelines:
            for module in modules_of(tree):
                importlib.import_module(f"{package}.{module}")
    except BaseException:
        unload(package)
        raise
    return pipelines


def unload(package: str) -> None:
    """Forget the modules of a loaded revision (objects still referenced stay alive)."""
    for name in [n for n in sys.modules if n == package or n.startswith(package + ".")]:
        del sys.modules[name]


def manifest_of(pipelines: dict[str, Pipeline[Any, Any]], package: str) -> list[dict[str, Any]]:
    """What the server stores of each pipeline: name, namespace, schemas, policies, triggers."""
    described = []
    for name, definition in sorted(pipelines.items()):
        try:
            input_schema = definition.input_schema()
            output_schema = definition.output_schema()
        except Exception as exc:
            raise TreeError(f"pipeline {name!r}: its input or output model has no JSON Schema: {exc}") from exc
        for trigger in definition.triggers:
            if trigger.type == "cron":
                try:
                    definition.inputs.model_validate(trigger.spec()["inputs"])
                except Exception as exc:
                    raise TreeError(
                        f"pipeline {name!r}, trigger {trigger.name!r}: its inputs are not valid: {exc}"
                    ) from exc
        described.append(
            {
                "name": name,
                "namespace": definition.namespace,
                "source": definition.source.removeprefix(package + "."),
                "description": definition.description,
                "input_schema": input_schema,
                "output_schema": output_schema,
                "concurrency": definition.concurrency,
                "max_pending": definition.max_pending,
                "timeout_seconds": int(definition.timeout.total_seconds()) if definition.timeout else None,
                "triggers": [t.spec() for t in definition.triggers],
            }
        )
    return described


def describe(tree: Path, *, namespace: str) -> dict[str, Any]:
    """The revision's manifest: ``{"pipelines": [...], "modules": [...]}``; ``TreeError`` when
    it needs modules that are not installed, holds no pipeline, or cannot be imported."""
    missing = check_imports(tree)
    if missing:
        raise TreeError(
            "the code imports modules that are not installed where Graphene runs: "
            + ", ".join(missing)
            + " (install them on the web and worker machines, or drop the imports)"
        )
    modules = modules_of(tree)
    if not modules:
        raise TreeError("the tree holds no Python module (top-level *.py files or packages define the pipelines)")
    package = package_name("0" * 24, namespace)
    pipelines = load(tree, package, namespace=namespace)
    try:
        if not pipelines:
            raise TreeError(f"no pipeline is defined in {', '.join(modules)}: decorate a function with @pipeline(...)")
        return {"pipelines": manifest_of(pipelines, package), "modules": modules}
    finally:
        unload(package)


def main(argv: list[str]) -> int:
    """``describe DIR --namespace NS``: print ``{"ok": true, "manifest": ...}`` or
    ``{"ok": false, "error": ..., "traceback": ...}`` as one JSON document."""
    if len(argv) != 4 or argv[0] != "describe" or argv[2] != "--namespace":
        print("usage: python -m graphene_sdk._delivery describe DIR --namespace NAMESPACE", file=sys.stderr)
        return 2
    tree = Path(argv[1])
    # What the modules print must not corrupt the document: their stdout goes to stderr.
    out, sys.stdout = sys.stdout, sys.stderr
    try:
        answer: dict[str, Any] = {"ok": True, "manifest": describe(tree, namespace=argv[3])}
    except TreeError as exc:
        answer = {"ok": False, "error": str(exc), "traceback": ""}
    except BaseException as exc:  # the tree's own code failed as it was imported
        trace = traceback.format_exception(exc)
        answer = {
            "ok": False,
            "error": f"importing the code failed: {type(exc).__name__}: {exc}",
            "traceback": "".join(trace),
        }
    finally:
        sys.stdout = out
    print(json.dumps(answer))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
