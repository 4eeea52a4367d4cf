"""Serving commands: exec (streamed), put_file, get_file, call, cancel; de-duplicated by id.

Commands outlive connections. Output is numbered per command and kept until the server
acknowledges it, so after a reconnect the server says what it has (``output_seq``) and the
agent re-sends only what follows: no gaps, no duplicates. A command's result is journaled
before it is sent, so a command re-sent later is answered from the journal, never run again.
"""

from __future__ import annotations

import asyncio
import base64
import codecs
import collections
import contextlib
import hashlib
import inspect
import json
import logging
import os
import shutil
import signal
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Callable

from graphene_agent import call_runner, protocol
from graphene_agent.journal import Journal

logger = logging.getLogger("graphene_agent.commands")

Send = Callable[[dict[str, Any]], Awaitable[bool]]

# Unacknowledged output kept in memory per command while the server is unreachable.
MAX_BUFFERED_OUTPUT = 32 * 1024 * 1024
# After a command exits, how long to keep reading pipes that a leftover child still holds.
DRAIN_SECONDS = 2.0
# A partial line is sent after this long without its newline (prompts, progress bars)...
PARTIAL_LINE_SECONDS = 0.2
# ... or this long when the producer was writing in bulk (BULK_BYTES read with no read waiting
# BURST_GAP_SECONDS for them): stopped mid-line by a full pipe or a busy machine, it writes the rest of
# the line as soon as it runs again, and cutting the line in two would be wrong.
PARTIAL_LINE_BULK_SECONDS = 1.0
BULK_BYTES = 32 * 1024
BURST_GAP_SECONDS = 0.1
# Output chunks sent and not yet acknowledged, at most. While the server stores them, new
# output joins the last chunk not yet sent (up to OUTPUT_MERGE_BYTES) instead of becoming a
# chunk of its own: a fast producer is stored in few large transactions (one per chunk on
# the server), a slow one still gets each line out at once (bench/agent_logs.py). The
# gateway stores one chunk at a time, so two in flight keep it busy; more only add to the
# time a line waits behind others.
OUTPUT_WINDOW = 2
# A chunk grows by joining to at most this size as JSON (escapes included: a message must stay
# under the server's 1 MiB). Each chunk costs the server a transaction (its commit, a few round
# trips, thread hops: ~10 ms on a busy 2-core machine); at ~70 bytes a line, 64 KiB chunks
# spent as much on that as on the lines themselves (bench/agent_logs.py).
OUTPUT_MERGE_BYTES = 384 * 1024


class CommandError(Exception):
    """A command could not be carried out; the message is its ``error``."""


@dataclass
class Chunk:
    """Output numbered ``seq``: pieces of text that new output may join until it is sent."""

    seq: int
    stream: str
    parts: list[str]
    chars: int  # len of the text
    size: int  # len of the text as JSON, escapes included

    def text(self) -> str:
        if len(self.parts) > 1:
            self.parts = ["".join(self.parts)]
        return self.parts[0]


@dataclass
class Running:
    """A command this agent process started (running, or finished but not yet acknowledged)."""

    id: str
    kind: str
    guarantee: str
    seq: int = 0  # the last output chunk produced
    sent_upto: int = 0  # the last chunk written to the current connection
    sent_max: int = 0  # the last chunk ever written (to any connection): never grown after
    chunks: collections.deque[Chunk] = field(default_factory=collections.deque)  # consecutive seqs
    buffered: int = 0
    dropped_chunks: int = 0
    tails: dict[str, bytearray] = field(default_factory=lambda: {"stdout": bytearray(), "stderr": bytearray()})
    result: dict[str, Any] | None = None
    process: asyncio.subprocess.Process | None = None
    cancelled: bool = False
    task: asyncio.Task[None] | None = None
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


def _call_request(payload: dict[str, Any]) -> dict[str, Any]:
    """What ``call_runner.outcome`` takes, from a call's payload (checked)."""
    name = payload.get("name")
    source = payload.get("source")
    args = payload.get("args", [])
    kwargs = payload.get("kwargs", {})
    if not isinstance(name, str) or not name.isidentifier():
        raise CommandError(f"call needs the function's name, got {name!r}")
    if not isinstance(source, str) or not isinstance(args, list) or not isinstance(kwargs, dict):
        raise CommandError("call needs the function's source (a str), args (a list) and kwargs (an object)")
    return {"name": name, "source": source, "args": args, "kwargs": kwargs}


def _exit_code(returncode: int) -> tuple[int, int | None]:
    """Shell convention: a process killed by signal N exits 128+N."""
    if returncode < 0:
        return 128 - returncode, -returncode
    return returncode, None


def _child_env(extra: dict[str, str]) -> dict[str, str]:
    # The agent's own settings (the bootstrap token among them) never reach commands.
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRAPHENE_AGENT_")}
    env.update(extra)
    return env


def _pieces(text: str, step: int) -> list[str]:
    """``text`` in pieces of at most ``step`` characters (each message stays well under the
    server's 1 MiB, even after JSON escaping), cut after a newline where the text has one:
    the server stores each chunk's lines, so a cut inside a line would store it as two."""
    pieces: list[str] = []
    start = 0
    if not text:
        return pieces
    while len(text) - start > step:
        cut = text.rfind("\n", start, start + step)
        end = cut + 1 if cut >= start else start + step  # a line longer than a piece is cut
        pieces.append(text[start:end])
        start = end
    pieces.append(text[start:])
    return pieces


def _call_result(name: str, outcome: dict[str, Any]) -> dict[str, Any]:
    """A call's result fields from ``call_runner.outcome``: its value, or the error it raised."""
    if "value" in outcome:
        return {"status": protocol.SUCCEEDED, "value": outcome["value"]}
    kind, message = str(outcome.get("error") or "Exception"), str(outcome.get("message") or "")
    return {
        "status": protocol.FAILED,
        "error": f"{name}() raised {kind}: {message}".rstrip(": "),
        "error_type": kind,
        "error_message": message,
        "traceback": str(outcome.get("traceback") or ""),
    }


async def _feed(process: asyncio.subprocess.Process, data: bytes) -> None:
    """Write ``data`` to the process's stdin and close it; a process that stops reading is its business."""
    assert process.stdin is not None
    try:
        process.stdin.write(data)
        await process.stdin.drain()
        process.stdin.close()
        await process.stdin.wait_closed()
    except (BrokenPipeError, ConnectionResetError):
        pass


class Executor:
    """Runs commands for whichever connection is current (``attach``/``detach``)."""

    def __init__(self, journal: Journal, *, kill_grace: float = 3.0) -> None:
        self.journal = journal
        self.kill_grace = kill_grace
        self.commands: dict[str, Running] = {}
        self.stopping = False
        self._send: Send | None = None
        self._flushes: set[asyncio.Future[None]] = set()  # held: the loop keeps only weak references
        self._live: set[asyncio.Future[None]] = set()  # live calls under way (held, as above)

    # --- connection -----------------------------------------------------------------------

    def attach(self, send: Send) -> None:
        self._send = send
        for state in self.commands.values():
            state.sent_upto = 0  # nothing is known to have reached this connection yet

    def detach(self) -> None:
        self._send = None

    async def send(self, message: dict[str, Any]) -> bool:
        send = self._send
        if send is None:
            return False
        return await send(message)

    @property
    def running(self) -> int:
        return sum(1 for s in self.commands.values() if s.result is None)

    # --- messages from the server ---------------------------------------------------------

    async def on_command(self, message: dict[str, Any]) -> None:
        command_id = str(uuid.UUID(str(message["id"])))
        kind = str(message.get("kind", ""))
        guarantee = str(message.get("guarantee", protocol.AT_LEAST_ONCE))
        known_seq = int(message.get("output_seq") or 0)
        state = self.commands.get(command_id)
        if state is not None:  # running here, or finished and not yet acknowledged
            self._acked_output(state, known_seq)
            state.sent_upto = known_seq
            if state.result is None:
                await self.send({"type": "accepted", "id": command_id})
            await self._flush(state)
            return
        entry = self.journal.get(command_id)
        if entry is not None and entry.get("result") is not None:
            logger.info("command %s was already done; re-sending its stored result", command_id)
            await self.send({"type": "result", "id": command_id, "replayed": True, **entry["result"]})
            return
        if entry is not None and guarantee == protocol.AT_MOST_ONCE:
            # Started by an earlier agent process that died before it ended: it may or may not
            # have had its effect, and at most once forbids finding out by running it again.
            result = {
                "status": protocol.UNKNOWN,
                "error": "the agent restarted while this command ran; its outcome is unknown",
                "output_seq": known_seq,
            }
            self.journal.finished(command_id, result)
            await self.send({"type": "result", "id": command_id, **result})
            return
        if entry is not None:
            logger.info("command %s was interrupted by an agent restart; running it again (at least once)", command_id)
        await self._start(command_id, kind, guarantee, message.get("payload") or {}, start_seq=known_seq)

    async def on_cancel(self, message: dict[str, Any]) -> None:
        command_id = str(uuid.UUID(str(message["id"])))
        state = self.commands.get(command_id)
        if state is not None:
            if state.result is None:
                state.cancelled = True
                if state.process is not None:
                    await self._kill(state.process)
                elif state.task is not None:
                    state.task.cancel()
            else:
                await self._flush(state)
            return
        entry = self.journal.get(command_id)
        if entry is not None and entry.get("result") is not None:
            await self.send({"type": "result", "id": command_id, "replayed": True, **entry["result"]})
            return
        # Never seen (or interrupted by a restart): record the cancel first, so that the
        # command arriving later is answered "cancelled" instead of being started.
        result = {"status": protocol.CANCELLED, "error": "cancelled before it started on the agent", "output_seq": 0}
        if entry is not None:
            result["error"] = "cancelled; it was interrupted by an agent restart"
        self.journal.finished(command_id, result)
        await self.send({"type": "result", "id": command_id, **result})

    def on_ack(self, message: dict[str, Any]) -> None:
        command_id = str(message.get("id", ""))
        state = self.commands.get(command_id)
        if message.get("result"):
            try:
                self.journal.acknowledged(command_id)
            except (OSError, ValueError):
                logger.warning("could not mark command %s acknowledged", command_id, exc_info=True)
            if state is not None and state.result is not None:
                del self.commands[command_id]
            return
        if state is not None and "seq" in message:
            self._acked_output(state, int(message["seq"]))
            if state.chunks and state.chunks[-1].seq > state.sent_upto:  # the window held some back
                flush = asyncio.ensure_future(self._flush(state))
                self._flushes.add(flush)
                flush.add_done_callback(self._flushes.discard)

    def on_live_call(self, message: dict[str, Any]) -> None:
        """A live call (``protocol``): called in a thread now, its result sent on the current
        connection. Nothing is journaled: a live call is never re-sent, so there is nothing to
        de-duplicate; if the connection is gone when it ends, its result goes with it."""
        call = asyncio.ensure_future(self._live_call(str(message.get("id", "")), message.get("payload") or {}))
        self._live.add(call)
        call.add_done_callback(self._live.discard)

    async def _live_call(self, call_id: str, payload: dict[str, Any]) -> None:
        started = time.monotonic()
        try:
            result = await self._call_here(_call_request(payload), payload)
        except CommandError as exc:
            result = {"status": protocol.FAILED, "error": str(exc)}
        except Exception as exc:  # a bug or an OS error: report it, keep serving
            logger.exception("live call %s failed", call_id)
            result = {"status": protocol.FAILED, "error": f"{type(exc).__name__}: {exc}"}
        result["duration_s"] = round(time.monotonic() - started, 3)
        await self.send({"type": "live_result", "id": call_id, **result})

    # --- running --------------------------------------------------------------------------

    async def _start(
        self, command_id: str, kind: str, guarantee: str, payload: dict[str, Any], *, start_seq: int
    ) -> None:
        state = Running(id=command_id, kind=kind, guarantee=guarantee, seq=start_seq, sent_upto=start_seq)
        try:
            # Durable before any side effect: this is what de-duplication stands on.
            self.journal.started(command_id, kind, guarantee)
        except OSError as exc:
            result = {"status": protocol.FAILED, "error": f"the agent cannot write its journal: {exc}"}
            await self.send({"type": "result", "id": command_id, "output_seq": start_seq, **result})
            return
        self.commands[command_id] = state
        await self.send({"type": "accepted", "id": command_id})
        state.task = asyncio.ensure_future(self._run(state, payload))

    async def _run(self, state: Running, payload: dict[str, Any]) -> None:
        started = time.monotonic()
        try:
            if state.kind == protocol.EXEC:
                result = await self._exec(state, payload)
            elif state.kind == protocol.PUT_FILE:
                result = await asyncio.get_running_loop().run_in_executor(None, _put_file, payload)
            elif state.kind == protocol.GET_FILE:
                result = await asyncio.get_running_loop().run_in_executor(None, _get_file, payload)
            elif state.kind == protocol.CALL:
                result = await self._call(state, payload)
            else:
                raise CommandError(f"unknown command kind {state.kind!r}; this agent serves {protocol.COMMAND_KINDS}")
            if state.cancelled and result.get("status") != protocol.CANCELLED:
                result.setdefault("error", "cancel arrived after it finished")
        except asyncio.CancelledError:
            if self.stopping:
                # The agent is stopping: leave the journal at "started", so that the next
                # agent process reports it interrupted (and re-runs it only if at least once).
                raise
            result = {"status": protocol.CANCELLED, "error": "cancelled"}
        except CommandError as exc:
            result = {"status": protocol.FAILED, "error": str(exc)}
        except Exception as exc:  # a bug or an OS error: report it, keep serving
            logger.exception("command %s failed", state.id)
            result = {"status": protocol.FAILED, "error": f"{type(exc).__name__}: {exc}"}
        result["duration_s"] = round(time.monotonic() - started, 3)
        result["output_seq"] = state.seq
        if state.dropped_chunks:
            result["dropped_chunks"] = state.dropped_chunks
        for stream, tail in state.tails.items():
            if tail:
                result[f"{stream}_tail"] = tail.decode("utf-8", "replace")
        try:
            self.journal.finished(state.id, result)
        except OSError:
            logger.warning("could not journal the result of %s", state.id, exc_info=True)
        state.result = result
        state.process = None
        await self._flush(state)

    async def _exec(self, state: Running, payload: dict[str, Any], *, stdin: bytes | None = None) -> dict[str, Any]:
        """Run ``argv``; ``stdin``, when given, is written to the process and its stdin closed."""
        argv = [str(a) for a in payload.get("argv") or []]
        if not argv:
            raise CommandError("exec needs a non-empty argv")
        timeout = payload.get("timeout")
        cwd = payload.get("cwd") or None
        try:
            process = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.DEVNULL if stdin is None else asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                cwd=cwd,
                env=_child_env({str(k): str(v) for k, v in (payload.get("env") or {}).items()}),
                start_new_session=True,  # its own process group: cancel and timeout kill all of it
            )
        except OSError as exc:
            raise CommandError(f"cannot start {argv[0]!r}: {exc.strerror or exc}") from None
        state.process = process
        if state.cancelled:  # a cancel raced the start
            await self._kill(process)
        assert process.stdout is not None
        assert process.stderr is not None
        pumps = [
            asyncio.ensure_future(self._pump(state, "stdout", process.stdout)),
            asyncio.ensure_future(self._pump(state, "stderr", process.stderr)),
        ]
        feeder = None if stdin is None else asyncio.ensure_future(_feed(process, stdin))
        timed_out = False
        try:
            await asyncio.wait_for(process.wait(), timeout=float(timeout) if timeout else None)
        except asyncio.TimeoutError:
            timed_out = True
            await self._kill(process)
        except asyncio.CancelledError:  # the agent is shutting down
            await self._kill(process)
            raise
        if feeder is not None:
            feeder.cancel()  # done already, unless the process ended without reading it all
        _done, pending = await asyncio.wait(pumps, timeout=DRAIN_SECONDS)
        for pump in pending:  # a leftover child holds the pipe open; stop reading it
            pump.cancel()
        exit_code, signum = _exit_code(process.returncode if process.returncode is not None else -signal.SIGKILL)
        result: dict[str, Any] = {"exit_code": exit_code, "signal": signum}
        if state.cancelled:
            result.update(status=protocol.CANCELLED, error="cancelled: the process group was killed")
        elif timed_out:
            result.update(status=protocol.FAILED, error=f"timed out after {timeout}s: the process group was killed")
            result["timed_out"] = True
        elif exit_code != 0:
            result.update(status=protocol.FAILED, error=f"exited with status {exit_code}")
        else:
            result["status"] = protocol.SUCCEEDED
        return result

    async def _call(self, state: Running, payload: dict[str, Any]) -> dict[str, Any]:
        """Run a Python function from its source in a fresh, isolated interpreter.

        The interpreter is an ``exec`` of this agent's Python (``-I``: no user site, no
        ``PYTHON*`` variables, not the working directory on ``sys.path``; ``-u``: output streams
        as it is written) running ``call_runner``, so output, timeout and cancel are exec's.
        The request (which may hold secrets: a checkout's token) goes on the interpreter's
        stdin and never touches the disk; the outcome comes back through a 0600 file in a
        private directory.
        """
        request = _call_request(payload)
        name = request["name"]
        if payload.get("in_process") is True:
            return await self._call_here(request, payload)
        directory = tempfile.mkdtemp(prefix="graphene-call-")  # 0700, this agent's user only
        try:
            outcome_path = os.path.join(directory, "result.json")
            argv = [sys.executable or "python3", "-I", "-u", "-c", _runner_source(), outcome_path]
            stdin = json.dumps(request).encode()
            result = await self._exec(state, {"argv": argv, "timeout": payload.get("timeout")}, stdin=stdin)
            if state.cancelled or result.get("timed_out"):
                return result  # killed: exec's account of it is the whole story
            outcome = _read_outcome(outcome_path)
        finally:
            shutil.rmtree(directory, ignore_errors=True)
        if outcome is None:
            code = result.get("exit_code")
            how = f"was killed by signal {result['signal']}" if result.get("signal") else f"exited with status {code}"
            result.update(status=protocol.FAILED, error=f"the Python process running {name}() {how} before it returned")
        else:
            result.pop("error", None)
            result.update(_call_result(name, outcome))
        return result

    async def _call_here(self, request: dict[str, Any], payload: dict[str, Any]) -> dict[str, Any]:
        """A function of the server's own (``in_process``: self-contained, bounded by its own
        timeouts) called in a thread of this process: no interpreter to start, about 100 ms a
        call. Its result is a call's; a timeout or cancel stops waiting for the thread."""
        name = request["name"]
        timeout = payload.get("timeout")
        work = asyncio.get_running_loop().run_in_executor(None, partial(call_runner.outcome, request, isolated=False))
        try:
            done = await asyncio.wait_for(asyncio.shield(work), timeout=float(timeout) if timeout else None)
        except asyncio.TimeoutError:
            return {"status": protocol.FAILED, "error": f"{name}() did not return within {timeout}s", "timed_out": True}
        return _call_result(name, done)

    async def _pump(self, state: Running, stream: str, reader: asyncio.StreamReader) -> None:
        """Read one pipe; send whole lines as they come (a partial line after a short pause)."""
        decoder = codecs.getincrementaldecoder("utf-8")("replace")
        tail = state.tails[stream]
        pending = ""
        burst = 0  # bytes read since the producer last paused (a read waited for it)
        while True:
            patience = PARTIAL_LINE_BULK_SECONDS if burst >= BULK_BYTES else PARTIAL_LINE_SECONDS
            asked = time.monotonic()
            try:
                data = await asyncio.wait_for(
                    reader.read(protocol.OUTPUT_CHUNK_BYTES), timeout=patience if pending else None
                )
            except asyncio.TimeoutError:
                try:  # a held-up event loop (a busy machine) is no pause of the producer: look again
                    data = await asyncio.wait_for(reader.read(protocol.OUTPUT_CHUNK_BYTES), timeout=0.02)
                except asyncio.TimeoutError:
                    await self._emit(state, stream, pending)
                    pending = ""
                    continue
            if not data:
                rest = pending + decoder.decode(b"", final=True)
                if rest:
                    await self._emit(state, stream, rest)
                return
            burst = (0 if time.monotonic() - asked > BURST_GAP_SECONDS else burst) + len(data)
            tail.extend(data)
            if len(tail) > protocol.TAIL_BYTES:
                del tail[: len(tail) - protocol.TAIL_BYTES]
            text = pending + decoder.decode(data)
            cut = text.rfind("\n")
            if cut == -1:
                pending = text
                if len(pending) >= protocol.OUTPUT_CHUNK_BYTES:
                    await self._emit(state, stream, pending)
                    pending = ""
            else:
                pending = text[cut + 1 :]
                await self._emit(state, stream, text[: cut + 1])

    async def _emit(self, state: Running, stream: str, text: str) -> None:
        for piece in _pieces(text, protocol.OUTPUT_CHUNK_BYTES):
            size = len(json.dumps(piece)) - 2  # at most 12 bytes a character: a piece alone always fits
            last = state.chunks[-1] if state.chunks else None
            if (
                last is not None
                and last.seq > state.sent_max  # never sent: nobody has seen this chunk yet
                and last.stream == stream
                and last.parts[-1].endswith("\n")  # whole lines only: a partial line stays a line of its own
                and last.size + size <= OUTPUT_MERGE_BYTES
            ):
                last.parts.append(piece)  # joined once, when sent: small pieces cost no copies
                last.chars += len(piece)
                last.size += size
            else:
                state.seq += 1
                state.chunks.append(Chunk(state.seq, stream, [piece], len(piece), size))
            state.buffered += len(piece)
            while state.buffered > MAX_BUFFERED_OUTPUT and state.chunks:
                state.buffered -= state.chunks.popleft().chars
                state.dropped_chunks += 1
        if state.lock.locked():
            # A flush is sending (waiting for the socket to drain): it reads the deque again
            # when that send returns, so this output goes next. Waiting for it here would stop
            # reading the pipe, and a producer stopped mid-line by a full pipe has its line
            # cut in two by PARTIAL_LINE_SECONDS.
            return
        await self._flush(state)

    async def _flush(self, state: Running) -> None:
        """Send, in order, the output the current connection has not had, then the result."""
        async with state.lock:
            while state.chunks:
                # Sequence numbers in the deque are consecutive; the ones up to sent_upto are in
                # flight (sent, not acknowledged). Read the chunk now, not from a snapshot: until
                # it is sent, new output may still join it.
                index = max(0, state.sent_upto + 1 - state.chunks[0].seq)
                if index >= len(state.chunks):
                    break
                if index >= OUTPUT_WINDOW:
                    return  # the window is full: the next acknowledgement flushes again
                chunk = state.chunks[index]
                seq = chunk.seq
                state.sent_max = max(state.sent_max, seq)  # before the send: it may reach the server
                message = {"type": "output", "id": state.id, "seq": seq, "stream": chunk.stream, "data": chunk.text()}
                if not await self.send(message):
                    return
                state.sent_upto = seq
            if state.result is not None:
                await self.send({"type": "result", "id": state.id, **state.result})

    @staticmethod
    def _acked_output(state: Running, seq: int) -> None:
        while state.chunks and state.chunks[0].seq <= seq:
            state.buffered -= state.chunks.popleft().chars

    async def _kill(self, process: asyncio.subprocess.Process) -> None:
        """SIGTERM the command's process group, SIGKILL it after the grace period."""
        for signum in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(process.pid, signum)
            except (ProcessLookupError, PermissionError):
                return
            if signum == signal.SIGKILL:
                return
            try:
                await asyncio.wait_for(asyncio.shield(process.wait()), timeout=self.kill_grace)
            except asyncio.TimeoutError:
                continue
            # The leader is gone; whatever it left in its group goes too.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, signal.SIGKILL)
            return

    async def shutdown(self) -> None:
        """The agent is stopping: kill what runs (a restart reports them as interrupted)."""
        self.stopping = True
        for call in list(self._live):
            call.cancel()
        tasks: list[asyncio.Task[None]] = []
        for state in self.commands.values():
            if state.result is None and state.task is not None:
                state.task.cancel()
                tasks.append(state.task)
        if tasks:
            await asyncio.wait(tasks, timeout=self.kill_grace + 2)


_RUNNER_SOURCE: list[str] = []


def _runner_source() -> str:
    """``call_runner``'s source (read once; inspect finds it inside the zipapp too)."""
    if not _RUNNER_SOURCE:
        _RUNNER_SOURCE.append(inspect.getsource(call_runner))
    return _RUNNER_SOURCE[0]


def _read_outcome(path: str) -> dict[str, Any] | None:
    """What the runner wrote, or ``None`` if it wrote nothing usable (the interpreter died)."""
    try:
        if os.path.getsize(path) > protocol.MAX_CALL_RESULT_BYTES + 4 * call_runner.MAX_TEXT_CHARS:
            return {"error": "ValueError", "message": "the call's result file is larger than a call may return"}
        with open(path, encoding="utf-8") as fh:
            outcome = json.load(fh)
    except (OSError, ValueError):
        return None
    return outcome if isinstance(outcome, dict) and ("value" in outcome or "error" in outcome) else None


def _put_file(payload: dict[str, Any]) -> dict[str, Any]:
    path = Path(str(payload.get("path", "")))
    if not path.is_absolute():
        raise CommandError(f"put_file needs an absolute path, got {str(path)!r}")
    data = base64.b64decode(str(payload.get("data", "")), validate=True)
    mode = int(payload.get("mode", 0o644))
    if payload.get("make_dirs", True):
        path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.graphene-tmp")
    try:
        fd = os.open(str(tmp), os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    except OSError as exc:
        raise CommandError(f"cannot write {path}: {exc.strerror or exc}") from None
    try:
        os.write(fd, data)
        os.fchmod(fd, mode)  # the umask narrowed the mode given to open
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(str(tmp), str(path))
    return {"status": protocol.SUCCEEDED, "size": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def _get_file(payload: dict[str, Any]) -> dict[str, Any]:
    path = Path(str(payload.get("path", "")))
    if not path.is_absolute():
        raise CommandError(f"get_file needs an absolute path, got {str(path)!r}")
    limit = min(int(payload.get("max_bytes") or protocol.MAX_GET_FILE_BYTES), protocol.MAX_GET_FILE_BYTES)
    try:
        info = path.stat()
        if info.st_size > limit:
            raise CommandError(f"{path} is {info.st_size} bytes; get_file returns at most {limit}")
        data = path.read_bytes()
    except OSError as exc:
        raise CommandError(f"cannot read {path}: {exc.strerror or exc}") from None
    if len(data) > limit:
        raise CommandError(f"{path} is {len(data)} bytes; get_file returns at most {limit}")
    return {
        "status": protocol.SUCCEEDED,
        "data": base64.b64encode(data).decode(),
        "size": len(data),
        "sha256": hashlib.sha256(data).hexdigest(),
        "mode": info.st_mode & 0o7777,
    }
