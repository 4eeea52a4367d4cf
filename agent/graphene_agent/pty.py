"""Terminals: one PTY session per ``pty_open``, relayed over the agent's only connection (I8).

A session is live only. Unlike a command it is not journaled or re-sent: when the connection
drops, every session is hung up (SIGHUP to its process group, the terminal closed, SIGKILL
after a grace), because nobody is left to type into it or read it.

Output is read from the PTY master in chunks of at most ``PTY_CHUNK_BYTES`` and numbered; the
server acknowledges what reached the user, and the agent stops reading the terminal while
``PTY_WINDOW`` chunks are unacknowledged. The kernel's PTY buffer then fills and the program
blocks on write, so a slow reader slows the program down instead of growing a buffer here.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import fcntl
import logging
import os
import pwd
import signal
import struct
import sys
import termios
import time
from collections.abc import Awaitable
from typing import Any, Callable

from graphene_agent import protocol

logger = logging.getLogger("graphene_agent.pty")

Send = Callable[[dict[str, Any]], Awaitable[bool]]

KILL_GRACE_SECONDS = 2.0
# After the program exits, how long to keep reading what it left in the terminal.
DRAIN_SECONDS = 1.0
# Input not yet taken by the program (a large paste into a busy terminal); beyond it is dropped.
MAX_INPUT_BUFFER = 1024 * 1024
MAX_DIMENSION = 1000
MAX_COMMAND = 64 * 1024

# subprocess can start a new session, but making the PTY its controlling terminal needs code in
# the child, and preexec_fn is unsafe in a process with threads (asyncio resolves names in
# one). A tiny interpreter does it and then execs the program: job control works, and closing
# the terminal hangs the program up as a terminal emulator's would.
_CTTY = (
    "import fcntl, os, sys, termios\n"
    "fcntl.ioctl(0, termios.TIOCSCTTY, 0)\n"
    "try:\n"
    "    os.execvp(sys.argv[1], sys.argv[1:])\n"
    "except OSError as exc:\n"
    "    sys.stderr.write('graphene-agent: cannot run %s: %s\\r\\n' % (sys.argv[1], exc.strerror))\n"
    "    sys.exit(127)\n"
)


class Session:
    """One terminal: the program on the slave side, the master end this agent reads and writes."""

    def __init__(self, session_id: str, process: asyncio.subprocess.Process, master: int, argv: list[str]) -> None:
        self.id = session_id
        self.process = process
        self.master = master
        self.argv = argv
        self.started = time.monotonic()
        self.seq = 0  # the last output chunk sent
        self.acked = 0  # the last chunk the server says reached the user
        self.window = asyncio.Event()  # set while fewer than PTY_WINDOW chunks are unacknowledged
        self.window.set()
        self.input = bytearray()
        self.writing = False  # a writer callback waits for the master to take more input
        self.closing = False
        self.orphaned = False  # its connection dropped: it ends without telling anyone
        self.pump: asyncio.Future[None] | None = None
        self.task: asyncio.Future[None] | None = None


def _exit_code(returncode: int) -> tuple[int, int | None]:
    """Shell convention: a process killed by signal N exits 128+N."""
    if returncode < 0:
        return 128 - returncode, -returncode
    return returncode, None


def _dimension(value: Any, default: int) -> int:
    try:
        number = int(value)
    except (TypeError, ValueError):
        return default
    return max(1, min(MAX_DIMENSION, number))


def _set_size(fd: int, rows: int, cols: int) -> None:
    # The kernel sends SIGWINCH to the terminal's foreground process group when it changes.
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


def _shell() -> str:
    candidates = [os.environ.get("SHELL", "")]
    with contextlib.suppress(KeyError):
        candidates.append(pwd.getpwuid(os.getuid()).pw_shell)
    for shell in candidates:
        if shell and os.path.isabs(shell) and os.access(shell, os.X_OK):
            return shell
    return "/bin/sh"


def _argv(command: Any) -> list[str]:
    """``$SHELL -c command``, or the login shell when no command is given."""
    shell = _shell()
    if command:
        return [shell, "-c", str(command)[:MAX_COMMAND]]
    return [shell, "-l"]


def _env(extra: Any) -> dict[str, str]:
    # The agent's own settings (the bootstrap token among them) never reach the terminal.
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRAPHENE_AGENT_")}
    if isinstance(extra, dict):
        env.update({str(k): str(v) for k, v in extra.items()})
    env.setdefault("TERM", "xterm-256color")
    return env


def _home() -> str | None:
    home = os.path.expanduser("~")
    return home if os.path.isdir(home) else None


def _killpg(pid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signum)


class Terminals:
    """The PTY sessions of this agent, served on whichever connection is current."""

    def __init__(self, *, kill_grace: float = KILL_GRACE_SECONDS) -> None:
        self.kill_grace = kill_grace
        self.sessions: dict[str, Session] = {}
        self._send: Send | None = None
        self._killers: set[asyncio.Future[None]] = set()

    # --- connection -------------------------------------------------------------------------

    def attach(self, send: Send) -> None:
        self._send = send

    def detach(self) -> None:
        """The connection dropped: hang up every session (nobody is left at the other end)."""
        self._send = None
        for session in list(self.sessions.values()):
            session.orphaned = True
            self._hangup(session)
        self.sessions.clear()

    async def send(self, message: dict[str, Any]) -> bool:
        send = self._send
        if send is None:
            return False
        return await send(message)

    # --- messages from the server -----------------------------------------------------------

    async def on_message(self, message: dict[str, Any]) -> None:
        kind = message.get("type")
        session_id = str(message.get("session", ""))
        if kind == "pty_open":
            await self._open(session_id, message)
            return
        session = self.sessions.get(session_id)
        if session is None:
            logger.debug("%s for unknown terminal %s", kind, session_id)
            return
        if kind == "pty_input":
            try:
                data = base64.b64decode(str(message.get("data", "")), validate=True)
            except ValueError:
                logger.warning("terminal %s: input is not base64; ignored", session_id)
                return
            self._write(session, data)
        elif kind == "pty_resize":
            if session.master >= 0:
                with contextlib.suppress(OSError):
                    _set_size(session.master, _dimension(message.get("rows"), 24), _dimension(message.get("cols"), 80))
        elif kind == "pty_ack":
            session.acked = max(session.acked, int(message.get("seq") or 0))
            if session.seq - session.acked < protocol.PTY_WINDOW:
                session.window.set()
        elif kind == "pty_close":
            self._hangup(session)

    async def _open(self, session_id: str, message: dict[str, Any]) -> None:
        if not session_id or session_id in self.sessions:
            return  # a repeated open changes nothing
        if len(self.sessions) >= protocol.MAX_PTY_SESSIONS:
            await self._failed(session_id, f"this agent already serves {protocol.MAX_PTY_SESSIONS} terminals")
            return
        argv = _argv(message.get("command"))
        try:
            master, slave = os.openpty()
        except OSError as exc:
            await self._failed(session_id, f"cannot allocate a terminal: {exc.strerror or exc}")
            return
        try:
            _set_size(master, _dimension(message.get("rows"), 24), _dimension(message.get("cols"), 80))
            process = await asyncio.create_subprocess_exec(
                sys.executable or "python3",
                "-I",
                "-S",
                "-c",
                _CTTY,
                *argv,
                stdin=slave,
                stdout=slave,
                stderr=slave,
                env=_env(message.get("env")),
                cwd=_home(),
                start_new_session=True,  # its own session and process group, led by the program
            )
        except OSError as exc:
            os.close(master)
            await self._failed(session_id, f"cannot start {argv[0]}: {exc.strerror or exc}")
            return
        finally:
            os.close(slave)  # the program holds its own copies
        os.set_blocking(master, False)
        session = Session(session_id, process, master, argv)
        self.sessions[session_id] = session
        logger.info("terminal %s: started %s (pid %d)", session_id, " ".join(argv), process.pid)
        await self.send({"type": "pty_opened", "session": session_id, "pid": process.pid, "argv": argv})
        session.pump = asyncio.ensure_future(self._pump(session))
        session.task = asyncio.ensure_future(self._serve(session))

    async def _failed(self, session_id: str, error: str) -> None:
        logger.warning("terminal %s: %s", session_id, error)
        await self.send({"type": "pty_exit", "session": session_id, "exit_code": None, "signal": None, "error": error})

    # --- a session's life -------------------------------------------------------------------

    async def _serve(self, session: Session) -> None:
        returncode = await session.process.wait()
        if session.pump is not None and not session.pump.done():
            # What the program wrote just before it exited is still in the terminal.
            with contextlib.suppress(asyncio.TimeoutError, asyncio.CancelledError):
                await asyncio.wait_for(asyncio.shield(session.pump), DRAIN_SECONDS)
        self._close_master(session)
        if self.sessions.get(session.id) is session:
            del self.sessions[session.id]
        exit_code, signum = _exit_code(returncode)
        logger.info("terminal %s: %s exited with %d", session.id, session.argv[0], exit_code)
        if not session.orphaned:
            await self.send({"type": "pty_exit", "session": session.id, "exit_code": exit_code, "signal": signum})

    async def _pump(self, session: Session) -> None:
        """Terminal output to the server, in numbered chunks, within the window."""
        loop = asyncio.get_running_loop()
        while True:
            await session.window.wait()
            fd = session.master
            if fd < 0:
                return
            try:
                data = os.read(fd, protocol.PTY_CHUNK_BYTES)
            except BlockingIOError:
                await _readable(loop, session, fd)
                continue
            except OSError:  # EIO: every slave end is closed (the program and its children are gone)
                return
            if not data:
                return
            # A terminal hands out at most a few KiB per read; what is already there joins this chunk.
            while len(data) < protocol.PTY_CHUNK_BYTES:
                try:
                    more = os.read(fd, protocol.PTY_CHUNK_BYTES - len(data))
                except OSError:  # EAGAIN (nothing more yet) or EIO (gone): the next round sees which
                    break
                if not more:
                    break
                data += more
            session.seq += 1
            if session.seq - session.acked >= protocol.PTY_WINDOW:
                session.window.clear()
            await self.send(
                {
                    "type": "pty_output",
                    "session": session.id,
                    "seq": session.seq,
                    "data": base64.b64encode(data).decode("ascii"),
                }
            )

    def _write(self, session: Session, data: bytes) -> None:
        if session.master < 0 or session.closing:
            return
        room = MAX_INPUT_BUFFER - len(session.input)
        if len(data) > room:
            logger.warning("terminal %s: the program is not reading; dropped %d bytes of input", session.id, len(data))
            data = data[: max(room, 0)]
        session.input += data
        self._flush_input(session)

    def _flush_input(self, session: Session) -> None:
        loop = asyncio.get_running_loop()
        while session.input and session.master >= 0:
            try:
                written = os.write(session.master, bytes(session.input[: 64 * 1024]))
            except BlockingIOError:
                if not session.writing:
                    loop.add_writer(session.master, self._flush_input, session)
                    session.writing = True
                return
            except OSError:
                session.input.clear()
                break
            del session.input[:written]
        if session.writing and session.master >= 0:
            loop.remove_writer(session.master)
        session.writing = False

    def _hangup(self, session: Session) -> None:
        """SIGHUP to its process group and close the terminal; SIGKILL if it outlives the grace."""
        if session.closing:
            return
        session.closing = True
        if session.process.returncode is None:
            _killpg(session.process.pid, signal.SIGHUP)
        self._close_master(session)
        killer = asyncio.ensure_future(self._kill_later(session))
        self._killers.add(killer)
        killer.add_done_callback(self._killers.discard)

    async def _kill_later(self, session: Session) -> None:
        try:
            await asyncio.wait_for(asyncio.shield(session.process.wait()), self.kill_grace)
        except asyncio.TimeoutError:
            logger.warning("terminal %s: still running %.0fs after the hangup; killing it", session.id, self.kill_grace)
            _killpg(session.process.pid, signal.SIGKILL)

    def _close_master(self, session: Session) -> None:
        fd = session.master
        if fd < 0:
            return
        session.master = -1
        loop = asyncio.get_running_loop()
        # Unregister before closing: the number may be reused by the next terminal at once.
        loop.remove_reader(fd)
        loop.remove_writer(fd)
        session.writing = False
        session.input.clear()
        os.close(fd)
        if session.pump is not None:
            session.pump.cancel()
        session.window.set()  # a pump waiting for acks wakes and sees the terminal is gone


async def _readable(loop: asyncio.AbstractEventLoop, session: Session, fd: int) -> None:
    ready: asyncio.Future[None] = loop.create_future()

    def wake() -> None:
        if not ready.done():
            ready.set_result(None)

    loop.add_reader(fd, wake)
    try:
        await ready
    finally:
        if session.master == fd:  # not closed (and maybe reused) meanwhile
            loop.remove_reader(fd)
