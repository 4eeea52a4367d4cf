"""Pipelines of the agent call tests (``put_file``, ``get_file``, ``run``). Workers load them
through ``GRAPHENE_PIPELINE_MODULES`` (the tests start them with it); importing the module
registers them in the test process.

The functions that run on the machine are plain module-level ``def``s that import what they
need in their bodies; their annotations name types the machine never sees (they are not
evaluated there).
"""

from __future__ import annotations

import os
from typing import Any

from graphene_sdk import Context, RemoteError, ResourceFailed, pipeline
from pydantic import BaseModel

BIG = bytes(range(256)) * 2048  # 512 KiB: the most a put_file (and a get_file) carries
TOO_BIG_TO_GET = 600 * 1024  # bytes: too big for get_file; a function writes such a file on the machine


def count_lines(path: str) -> dict[str, Any]:
    """Runs on the machine: a file's line count and digest, and which process read it."""
    import hashlib
    import os

    with open(path, "rb") as fh:
        data = fh.read()
    print(f"counted {path}")
    return {
        "lines": len(data.splitlines()),
        "sha256": hashlib.sha256(data).hexdigest(),
        "pid": os.getpid(),
        "ppid": os.getppid(),
    }


def refuse(path: str, *, why: str = "no entry") -> None:
    """Runs on the machine and raises there."""
    raise PermissionError(f"{why}: {path}")


def mark_and_wait(path: str, seconds: float) -> int:
    """Runs on the machine: appends its pid to ``path``, waits, returns how many lines it holds."""
    import os
    import time

    with open(path, "a") as fh:
        fh.write(f"{os.getpid()}\n")
    time.sleep(seconds)
    with open(path) as fh:
        return len(fh.read().splitlines())


def write_file(path: str, size: int) -> None:
    """Runs on the machine: data made there instead of sent (put_file carries at most 512 KiB)."""
    with open(path, "wb") as fh:
        fh.write(b"x" * size)


def _uses_the_module() -> int:
    return len(BIG)  # BIG exists here, not on the machine


def _write_private(path: str, text: str) -> str:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    return path


class CallInputs(BaseModel):
    env_path: str
    folder: str  # where the files go on the machine (a directory of the test's)


class CallOutput(BaseModel):
    written: dict[str, Any]
    read_back: str
    big_written: dict[str, Any]
    counted: dict[str, Any]
    big_counted: dict[str, Any]
    worker_pid: int
    remote: dict[str, Any]
    too_big: str
    timed_out: str
    refused: dict[str, str]  # what the SDK refused before sending anything, by case


def _refusals(box: Any, folder: str) -> dict[str, str]:
    """Each of these fails in the SDK with a precise error, before any command or journal entry."""
    offset = 3

    def closure(path: str) -> int:
        return len(path) + offset

    cases: dict[str, Any] = {
        "lambda": lambda: box.run(lambda: 1),
        "closure": lambda: box.run(closure, "/etc"),
        "builtin": lambda: box.run(len, "abc"),
        "module global": lambda: box.run(_uses_the_module),
        "non-JSON argument": lambda: box.run(count_lines, {"path": {1, 2}}),
        "bad arguments": lambda: box.run(count_lines, "/a", "/b"),
        "get_file limit": lambda: box.get_file(f"{folder}/x", max_bytes=1024 * 1024),
        "relative path": lambda: box.put_file("data/x", b""),
        "put_file limit": lambda: box.put_file(f"{folder}/huge", BIG + b"\0"),
    }
    refused = {}
    for case, attempt in cases.items():
        try:
            attempt()
        except (TypeError, ValueError) as exc:
            refused[case] = f"{type(exc).__name__}: {exc}"
        else:
            refused[case] = "not refused"
    return refused


@pipeline("agents.calls", inputs=CallInputs)
def calls(ctx: Context, inputs: CallInputs) -> CallOutput:
    """Puts files on the machine, reads one back, runs functions there (one raises)."""
    box = ctx.agent("box", labels={"role": "calls"})
    ctx.step("install", _write_private, inputs.env_path, box.install_env())
    refused = _refusals(box, inputs.folder)
    path = f"{inputs.folder}/data/lines.txt"
    written = box.put_file(path, "one\ntwo\nthree\n", mode=0o640)
    read_back = box.get_file(path)
    big_written = box.put_file(f"{inputs.folder}/big.bin", BIG)
    counted = box.run(count_lines, path)
    big_counted = box.run(count_lines, path=f"{inputs.folder}/big.bin")
    worker_pid = ctx.step("worker pid", os.getpid)
    try:
        box.run(refuse, path, why="keep out")
    except RemoteError as exc:
        remote = {
            "type": exc.remote_type,
            "message": exc.remote_message,
            "error": str(exc),
            "traceback": exc.remote_traceback,
        }
    box.run(write_file, f"{inputs.folder}/too-big.bin", TOO_BIG_TO_GET)
    try:
        box.get_file(f"{inputs.folder}/too-big.bin")
    except ResourceFailed as exc:
        too_big = str(exc)
    try:
        box.run(mark_and_wait, f"{inputs.folder}/slow", 60, timeout=0.5)
    except ResourceFailed as exc:
        timed_out = str(exc)
    return CallOutput(
        written={"path": written.path, "size": written.size, "sha256": written.sha256},
        read_back=read_back.decode(),
        big_written={"size": big_written.size, "sha256": big_written.sha256},
        counted=counted,
        big_counted=big_counted,
        worker_pid=worker_pid,
        remote=remote,
        too_big=too_big,
        timed_out=timed_out,
        refused=refused,
    )


class FailInputs(BaseModel):
    env_path: str


@pipeline("agents.calls_fail", inputs=FailInputs)
def calls_fail(ctx: Context, inputs: FailInputs) -> None:
    """A function that raises on the machine, uncaught: the run fails with RemoteError."""
    box = ctx.agent("box")
    ctx.step("install", _write_private, inputs.env_path, box.install_env())
    box.run(refuse, "/srv/secret")


class SlowInputs(BaseModel):
    env_path: str
    marker: str
    seconds: float = 4.0


class SlowOutput(BaseModel):
    lines: int


@pipeline("agents.calls_slow", inputs=SlowInputs)
def calls_slow(ctx: Context, inputs: SlowInputs) -> SlowOutput:
    """One slow function on the machine; the test kills the worker while it runs."""
    box = ctx.agent("box")
    ctx.step("install", _write_private, inputs.env_path, box.install_env())
    lines: int = box.run(mark_and_wait, inputs.marker, inputs.seconds, guarantee="at_most_once")
    ctx.log(f"the function saw {lines} line(s)")
    return SlowOutput(lines=lines)
