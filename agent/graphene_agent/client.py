"""The connection loop: dial out, authenticate, hello, serve; on any loss, back off and dial again.

The agent opens no listening socket (I8): its only socket is the one it dials to the server.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import os
import random
import ssl
import uuid
from pathlib import Path
from typing import Any

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus
from websockets.typing import Origin

from graphene_agent import __version__, facts, protocol
from graphene_agent.commands import Executor
from graphene_agent.config import Config, ConfigError
from graphene_agent.journal import Journal
from graphene_agent.pty import Terminals

logger = logging.getLogger("graphene_agent")

WELCOME_TIMEOUT = 30.0
# A connection that lasted this long resets the backoff (it was not a crash loop).
STABLE_SECONDS = 30.0


class Refused(Exception):
    """The server refused this agent for good (bad, used, revoked or foreign credential; deleted)."""

    def __init__(self, code: int, reason: str) -> None:
        super().__init__(f"refused by the server ({code}): {reason}")
        self.code = code
        self.reason = reason


class CredentialStore:
    """The long-lived credential, in ``<state dir>/credential`` (0600, in a 0700 directory)."""

    def __init__(self, state_dir: Path) -> None:
        self.path = state_dir / "credential"

    def load(self, agent_id: str) -> dict[str, str] | None:
        try:
            data: dict[str, str] = json.loads(self.path.read_text())
        except FileNotFoundError:
            return None
        except ValueError:
            raise ConfigError(f"{self.path} is not valid JSON; remove it and bootstrap again") from None
        if data.get("agent_id") != agent_id:
            raise ConfigError(
                f"{self.path} belongs to agent {data.get('agent_id')}, not {agent_id}: "
                "use another state directory for another agent"
            )
        return data

    def save(self, data: dict[str, str]) -> None:
        tmp = self.path.with_name(".credential.tmp")
        fd = os.open(str(tmp), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, json.dumps(data).encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(str(tmp), str(self.path))

    def remove(self) -> None:
        self.path.unlink(missing_ok=True)


def token_digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def backoff_delay(attempt: int, base: float, cap: float) -> float:
    """Capped exponential backoff with jitter (between half and all of the step)."""
    step = min(cap, base * (2 ** min(attempt, 30)))
    return random.uniform(step / 2, step)  # noqa: S311 - jitter, not crypto


class Agent:
    def __init__(self, config: Config) -> None:
        self.config = config
        config.state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(str(config.state_dir), 0o700)
        self.credentials = CredentialStore(config.state_dir)
        self.journal = Journal(config.state_dir / "commands")
        self.executor = Executor(self.journal)
        self.terminals = Terminals()  # PTY sessions: live only, hung up when the connection drops
        self.instance = uuid.uuid4().hex  # this process; changes on every start
        self._send_lock = asyncio.Lock()
        self.connected = asyncio.Event()  # set while a session is up
        self._tasks: set[asyncio.Future[None]] = set()
        self._refused_reason = ""

    # --- the loop -------------------------------------------------------------------------

    async def run_forever(self) -> None:
        """Connect, serve, reconnect with backoff; returns only by raising ``Refused``."""
        removed = self.journal.prune()
        if removed:
            logger.info("forgot %d acknowledged command results past their keep time", removed)
        attempt = 0
        level = logging.WARNING
        while True:
            started = asyncio.get_running_loop().time()
            try:
                await self.session()
                reason = "the server closed the connection"
            except Refused:
                raise
            except ConnectionClosed as exc:
                code = exc.rcvd.code if exc.rcvd is not None else None
                reason = f"connection lost ({code or 'no close frame'})"
            except InvalidStatus as exc:
                reason = f"the server answered HTTP {exc.response.status_code} instead of a websocket"
            except ssl.SSLCertVerificationError as exc:
                # Before anything is sent: the bootstrap token or credential never reaches it.
                reason = (
                    f"refusing the server at {self.config.websocket_url}: its certificate does not chain to "
                    f"{self.config.pinned} ({exc.verify_message or exc}); nothing was sent to it"
                )
                level = logging.ERROR
            except (OSError, InvalidHandshake, asyncio.TimeoutError, ValueError) as exc:
                reason = f"{type(exc).__name__}: {exc}"
            finally:
                self.connected.clear()
            if asyncio.get_running_loop().time() - started > STABLE_SECONDS:
                attempt = 0
            delay = backoff_delay(attempt, self.config.backoff_base, self.config.backoff_max)
            attempt += 1
            logger.log(level, "%s; reconnecting in %.1fs (attempt %d)", reason, delay, attempt)
            level = logging.WARNING
            await asyncio.sleep(delay)

    def _ssl(self) -> ssl.SSLContext | None:
        """For wss://: the CA the install data gave (``SERVER_CA``) and ``CA_FILE``, and only
        them, when either is set; else the system's trust store. Host names are checked."""
        if not self.config.websocket_url.startswith("wss://"):
            return None
        return ssl.create_default_context(cafile=self.config.ca_file, cadata=self.config.server_ca or None)

    def _first_message(self) -> dict[str, Any]:
        """Credential if we have one for this enrollment, else the bootstrap token."""
        stored = self.credentials.load(self.config.agent_id)
        token = self.config.bootstrap_token
        if stored is not None and (token is None or stored.get("bootstrap_sha256") == token_digest(token)):
            return {"type": "auth", "agent_id": self.config.agent_id, "credential": stored["credential"]}
        if token is None:
            raise Refused(
                protocol.CLOSE_UNAUTHENTICATED,
                f"no credential in {self.credentials.path} and no bootstrap token configured",
            )
        # A token we have not used yet: a first install, or a re-install with a fresh token.
        return {"type": "bootstrap", "agent_id": self.config.agent_id, "token": token}

    async def session(self) -> None:
        first = self._first_message()
        if self.config.websocket_url.startswith("wss://"):
            logger.info("connecting to %s (trusting %s)", self.config.websocket_url, self.config.pinned)
        else:
            logger.info("connecting to %s (plain ws://: unencrypted)", self.config.websocket_url)
        async with connect(
            self.config.websocket_url,
            origin=Origin(self.config.origin),
            ssl=self._ssl(),
            user_agent_header=f"graphene-agent/{__version__}",
            open_timeout=20,
            ping_interval=20,
            ping_timeout=20,
            close_timeout=5,
            max_size=protocol.MAX_SERVER_MESSAGE,
        ) as ws:
            await ws.send(json.dumps(first))
            welcome = await self._welcome(ws)
            if welcome.get("credential"):
                assert self.config.bootstrap_token is not None
                self.credentials.save(
                    {
                        "agent_id": self.config.agent_id,
                        "credential": str(welcome["credential"]),
                        "bootstrap_sha256": token_digest(self.config.bootstrap_token),
                    }
                )
                logger.info("exchanged the bootstrap token for a credential (stored in %s)", self.credentials.path)
            heartbeat = float(welcome.get("heartbeat_s") or 15)

            async def send(message: dict[str, Any]) -> bool:
                try:
                    async with self._send_lock:
                        await ws.send(json.dumps(message))
                except ConnectionClosed:
                    return False
                return True

            hello = {
                "type": "hello",
                "instance": self.instance,
                "version": __version__,
                "facts": facts.collect(self.config.labels),
                "features": list(protocol.FEATURES),
            }
            await send(hello)
            self.executor.attach(send)
            self.terminals.attach(send)
            self.connected.set()
            logger.info("connected as agent %s", self.config.agent_id)
            beat = asyncio.ensure_future(self._heartbeats(send, heartbeat))
            try:
                async for raw in ws:
                    await self._dispatch(json.loads(raw))
            except ConnectionClosed:
                self._check_close(ws)  # a refusal mid-session (revoked, deleted) ends the agent
                raise
            finally:
                beat.cancel()
                self.executor.detach()
                self.terminals.detach()
            self._check_close(ws)

    async def _welcome(self, ws: ClientConnection) -> dict[str, Any]:
        try:
            raw = await asyncio.wait_for(ws.recv(), timeout=WELCOME_TIMEOUT)
        except ConnectionClosed:
            self._check_close(ws)
            raise
        message: dict[str, Any] = json.loads(raw)
        if message.get("type") == "refused":
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(ws.wait_closed(), timeout=5)
            code = ws.close_code or protocol.CLOSE_REFUSED
            raise Refused(code, str(message.get("reason", "")))
        if message.get("type") != "welcome":
            raise ValueError(f"expected a welcome, got {message.get('type')!r}")
        return message

    def _check_close(self, ws: ClientConnection) -> None:
        code = ws.close_code
        if code in protocol.REFUSED_CODES:
            raise Refused(code or 0, ws.close_reason or self._refused_reason)
        if code == protocol.CLOSE_SUPERSEDED:
            logger.warning("another connection of this agent took over (is a second copy running with the same state?)")

    async def _heartbeats(self, send: Any, interval: float) -> None:
        while True:
            await asyncio.sleep(interval)
            await send({"type": "heartbeat", "running": self.executor.running})

    async def _dispatch(self, message: dict[str, Any]) -> None:
        kind = message.get("type")
        if kind == "command":
            await self.executor.on_command(message)
        elif kind == "cancel":
            # Killing takes up to the grace period; keep reading messages meanwhile.
            self._tasks.add(asyncio.ensure_future(self.executor.on_cancel(message)))
            self._tasks = {t for t in self._tasks if not t.done()}
        elif kind == "ack":
            self.executor.on_ack(message)
        elif kind == protocol.LIVE_CALL:
            self.executor.on_live_call(message)
        elif isinstance(kind, str) and kind.startswith("pty_"):
            await self.terminals.on_message(message)
        elif kind == "refused":  # the close (and its code) follows
            self._refused_reason = str(message.get("reason", ""))
        else:
            logger.debug("ignoring message of type %r", kind)
