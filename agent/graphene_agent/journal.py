"""The agent's durable memory of commands, one small JSON file per command id.

``started`` is written before a command's side effects begin, ``result`` when it ends. That
is what makes de-duplication hold across reconnects *and* agent restarts: a re-sent command
whose result is here gets the stored result; one that was started by a previous agent
process and has no result was interrupted, and an at-most-once command in that state is
reported ``unknown`` instead of being run a second time.

Every write is write-then-rename, so an agent process that dies never leaves half a file.
Only an at-most-once command's entries are also fsynced (file and directory), so that they
survive the machine losing power too: that is the promise that needs them. For an
at-least-once command an entry lost with the machine costs at most one more run, which its
guarantee allows, and the two fsyncs were most of an ``exec``'s round trip (several ms each
on ordinary disks, on the agent's only thread). The "acknowledged" mark only lets ``prune``
forget the file; it is never worth an fsync.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from pathlib import Path
from typing import Any

from graphene_agent.protocol import AT_LEAST_ONCE

# Results the server acknowledged are kept this long (a re-sent command still finds them).
KEEP_SECONDS = 7 * 24 * 3600
KEEP_FILES = 10_000


def _check_id(command_id: str) -> str:
    return str(uuid.UUID(command_id))  # also keeps ids from naming paths outside the journal


class Journal:
    def __init__(self, directory: Path) -> None:
        self.directory = directory
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)

    def _path(self, command_id: str) -> Path:
        return self.directory / f"{_check_id(command_id)}.json"

    def get(self, command_id: str) -> dict[str, Any] | None:
        try:
            data: dict[str, Any] = json.loads(self._path(command_id).read_text())
        except FileNotFoundError:
            return None
        except ValueError:
            # A torn write cannot happen (write-then-rename), but never crash on a bad file:
            # treat it as "started, outcome unknown", the conservative reading.
            return {"id": command_id, "state": "started"}
        return data

    def _write(self, command_id: str, data: dict[str, Any], *, durable: bool) -> None:
        path = self._path(command_id)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        fd = os.open(str(tmp), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, json.dumps(data).encode())
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(str(tmp), str(path))
        if not durable:
            return
        dir_fd = os.open(str(self.directory), os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)

    def started(self, command_id: str, kind: str, guarantee: str) -> None:
        self._write(
            command_id,
            {"id": command_id, "kind": kind, "guarantee": guarantee, "state": "started", "started_at": time.time()},
            durable=guarantee != AT_LEAST_ONCE,
        )

    def finished(self, command_id: str, result: dict[str, Any]) -> None:
        entry = self.get(command_id) or {"id": command_id}
        entry.update(state="finished", finished_at=time.time(), result=result)
        # No entry (a cancel before the command arrived): durable, the conservative choice.
        self._write(command_id, entry, durable=entry.get("guarantee") != AT_LEAST_ONCE)

    def acknowledged(self, command_id: str) -> None:
        entry = self.get(command_id)
        if entry is not None and entry.get("state") == "finished" and not entry.get("acked"):
            entry["acked"] = True
            self._write(command_id, entry, durable=False)

    def prune(self) -> int:
        """Forget acknowledged results past their keep time (and the oldest beyond the cap)."""
        now = time.time()
        files = sorted(self.directory.glob("*.json"), key=lambda p: p.stat().st_mtime)
        removed = 0
        for index, path in enumerate(files):
            try:
                entry = json.loads(path.read_text())
            except (OSError, ValueError):
                continue
            old = now - float(entry.get("finished_at") or now) > KEEP_SECONDS
            over = len(files) - index > KEEP_FILES
            if entry.get("acked") and (old or over):
                path.unlink(missing_ok=True)
                removed += 1
        for stale in self.directory.glob(".*.tmp"):
            stale.unlink(missing_ok=True)
        return removed
