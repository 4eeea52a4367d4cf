"""A small root file system with a working Python, for running the agent zipapp in a container.

No registry is reachable, so the image is made with ``docker import`` from a tarball built
here out of what the host already has:

* the interpreter this test session runs on (the base interpreter behind ``.venv``: pyenv's
  or Debian's ``python3.11``), at the same absolute paths, so that it finds its standard
  library and its ``libpython`` (RUNPATH) exactly as on the host;
* the standard library without what the agent can never use (tests, IDLE, tkinter, ensurepip,
  lib2to3, site-packages, the static ``libpython`` of ``config-*``), with the byte code the
  host compiled (the container then starts without compiling anything);
* the extension modules of ``lib-dynload`` whose shared libraries can all be found, and those
  libraries plus the dynamic loader, as ``ldd`` names them;
* ``busybox`` (static; Debian's ``busybox-static``, as for the docker kind tests) with a
  symlink per applet, for ``/bin/sh``, ``cat``, ``hostname`` and friends;
* ``/usr/bin/python3`` (so the zipapp's ``#!/usr/bin/env python3`` works), ``/etc/os-release``
  naming this image and ``/etc/graphene-rootfs`` with the content digest: facts and files
  only the container has.

The digest covers every file's path, size and modification time and the builder's own
source, so an image tagged with it is reused until the host's Python (or this file) changes.
"""

from __future__ import annotations

import hashlib
import io
import os
import re
import subprocess
import sys
import sysconfig
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

BUSYBOX = Path("/bin/busybox")
# Standard library parts the agent never imports (directories anywhere in the tree, by name).
SKIP_DIRS = frozenset(
    {
        "test",
        "tests",
        "idle_test",
        "idlelib",
        "tkinter",
        "turtledemo",
        "ensurepip",
        "lib2to3",
        "pydoc_data",
        "site-packages",
        "dist-packages",
    }
)
SKIP_DYNLOAD = re.compile(r"^(_tkinter|_test|xx|_xx|_ctypes_test|_sqlite3|_curses|readline|_dbm|_gdbm|nis)")
LDD_LINE = re.compile(r"(?:=>\s*)?(/\S+)\s+\(0x[0-9a-f]+\)")


@dataclass(frozen=True)
class Entry:
    """One member of the tarball: a file copied from ``source``, or a symlink to ``link``."""

    name: str  # path inside the image, without the leading slash
    source: Path | None = None
    link: str | None = None
    mode: int = 0o755


def interpreter() -> Path:
    """The real interpreter behind this process (a virtualenv's ``python`` is a symlink to it)."""
    base = getattr(sys, "_base_executable", None) or sys.executable
    return Path(base).resolve()


def shared_libraries(binary: Path) -> list[str] | None:
    """Absolute paths of the libraries ``binary`` loads (and the loader); ``None`` if one is missing."""
    out = subprocess.run(["ldd", str(binary)], capture_output=True, text=True, check=False)
    if out.returncode != 0:
        return [] if "not a dynamic executable" in out.stdout + out.stderr else None
    if "not found" in out.stdout:
        return None
    return [m.group(1) for m in LDD_LINE.finditer(out.stdout)]


def _stdlib_files(stdlib: Path, dynload: Path, tag: str) -> Iterator[Path]:
    for folder, dirs, files in os.walk(stdlib):
        here = Path(folder)
        dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS and not d.startswith("config-") and here / d != dynload)
        for name in sorted(files):
            path = here / name
            if here.name == "__pycache__":
                # Only the plain byte code of this interpreter (not -O/-OO, not other versions).
                if name.endswith(f".{tag}.pyc"):
                    yield path
            elif name.endswith(".py"):
                yield path


def entries() -> list[Entry]:
    """Everything the image holds, sorted and de-duplicated by path."""
    python = interpreter()
    stdlib = Path(sysconfig.get_path("stdlib")).resolve()
    dynload = Path(str(sysconfig.get_config_var("DESTSHARED"))).resolve()
    tag = sys.implementation.cache_tag  # cpython-311
    found: dict[str, Entry] = {}

    def add(path: Path | str, *, source: Path | None = None, mode: int = 0o644) -> None:
        name = str(path).lstrip("/")
        found.setdefault(name, Entry(name=name, source=source or Path(path).resolve(), mode=mode))

    libraries = shared_libraries(python)
    if libraries is None:
        raise AssertionError(f"ldd cannot resolve every library of {python}")
    add(python, mode=0o755)
    for lib in libraries:
        add(lib, mode=0o755)
    for path in _stdlib_files(stdlib, dynload, tag):
        add(path)
    for module in sorted(dynload.glob("*.so")):
        if SKIP_DYNLOAD.match(module.name):
            continue
        needed = shared_libraries(module)
        if needed is None:
            continue  # a module whose library the host lacks (e.g. _curses without ncurses)
        add(module, mode=0o755)
        for lib in needed:
            add(lib, mode=0o755)
    add("/bin/busybox", source=BUSYBOX.resolve(), mode=0o755)
    applets = subprocess.run([str(BUSYBOX), "--list"], capture_output=True, text=True, check=True).stdout.split()
    for applet in applets:
        if applet != "busybox":
            found.setdefault(f"bin/{applet}", Entry(name=f"bin/{applet}", link="busybox"))
    for name in ("usr/bin/env", "usr/bin/sh"):
        found.setdefault(name, Entry(name=name, link="/bin/busybox"))
    found["usr/bin/python3"] = Entry(name="usr/bin/python3", link=str(python))
    return [found[name] for name in sorted(found)]


def digest(items: list[Entry]) -> str:
    """Content identity of the image: paths, sizes and mtimes of the sources, and this builder."""
    h = hashlib.sha256(Path(__file__).read_bytes())
    for item in items:
        if item.source is not None:
            info = item.source.stat()
            h.update(f"{item.name}\0{info.st_size}\0{int(info.st_mtime)}\0{item.mode:o}\n".encode())
        else:
            h.update(f"{item.name}\0->{item.link}\n".encode())
    return h.hexdigest()[:16]


def _dir(tar: tarfile.TarFile, name: str, mode: int = 0o755) -> None:
    info = tarfile.TarInfo(name)
    info.type = tarfile.DIRTYPE
    info.mode = mode
    tar.addfile(info)


def _text(tar: tarfile.TarFile, name: str, text: str, mode: int = 0o644) -> None:
    data = text.encode()
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = mode
    tar.addfile(info, io.BytesIO(data))


def build(target: Path, items: list[Entry], identity: str) -> Path:
    """Write the tarball (uncompressed: ``docker import`` reads it straight away)."""
    made: set[str] = set()
    with tarfile.open(target, "w", format=tarfile.GNU_FORMAT) as tar:
        for name in ("tmp", "root", "etc", "proc", "sys", "dev", "run", "var", "var/lib", "opt"):
            _dir(tar, name, 0o1777 if name == "tmp" else 0o755)
            made.add(name)
        _text(tar, "etc/passwd", "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n")
        _text(tar, "etc/group", "root:x:0:\nnogroup:x:65534:\n")
        _text(
            tar,
            "etc/os-release",
            f'NAME="Graphene agent test rootfs"\nID=graphene-rootfs\nPRETTY_NAME="Graphene agent rootfs {identity}"\n',
        )
        _text(tar, "etc/graphene-rootfs", f"{identity}\n")
        for item in items:
            parents = Path(item.name).parents
            for parent in reversed(list(parents)[:-1]):  # "a", "a/b", ... without "."
                if str(parent) not in made:
                    _dir(tar, str(parent))
                    made.add(str(parent))
            if item.link is not None:
                info = tarfile.TarInfo(item.name)
                info.type = tarfile.SYMTYPE
                info.linkname = item.link
                tar.addfile(info)
                continue
            assert item.source is not None
            info = tar.gettarinfo(str(item.source), arcname=item.name)
            info.mode = item.mode
            info.uid = info.gid = 0
            info.uname = info.gname = "root"
            with item.source.open("rb") as data:
                tar.addfile(info, data)
    return target
