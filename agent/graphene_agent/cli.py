"""Command line: ``python -m graphene_agent [--config FILE] [--server URL] ...``."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import sys
from pathlib import Path

from graphene_agent import __version__, facts
from graphene_agent.client import Agent, Refused
from graphene_agent.config import Config, ConfigError, load, parse_labels
from graphene_agent.protocol import CLOSE_DELETED

EXIT_CONFIG = 2
# EX_CONFIG: refused for good. The systemd unit lists it in RestartPreventExitStatus.
EXIT_REFUSED = 78

DEFAULT_CONFIG = "/etc/graphene-agent/agent.env"


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="graphene-agent",
        description=(
            "Graphene machine agent. Dials out to the Graphene server over a websocket and runs "
            "the commands it is given; it listens on no port. Settings come from flags, then "
            "GRAPHENE_AGENT_* environment variables, then the config file (KEY=VALUE lines, "
            "mode 0600)."
        ),
    )
    p.add_argument(
        "--config",
        metavar="FILE",
        help=f"env file with GRAPHENE_AGENT_* keys (default: $GRAPHENE_AGENT_CONFIG, else {DEFAULT_CONFIG} "
        "if it exists)",
    )
    p.add_argument("--server", help="server address, e.g. https://graphene.example.com (GRAPHENE_AGENT_SERVER)")
    p.add_argument("--agent-id", help="this agent's record id (GRAPHENE_AGENT_ID)")
    p.add_argument(
        "--bootstrap-token",
        help="single-use enrollment token (GRAPHENE_AGENT_BOOTSTRAP_TOKEN; prefer the config file: "
        "command lines are visible to other users)",
    )
    p.add_argument("--state-dir", help="credential and command journal directory (GRAPHENE_AGENT_STATE_DIR)")
    p.add_argument(
        "--label", action="append", default=[], metavar="KEY=VALUE", help="a label reported in the facts (repeatable)"
    )
    p.add_argument(
        "--ca-file",
        help="CA bundle (PEM) for a wss:// server with a private CA (GRAPHENE_AGENT_CA_FILE); the install data "
        "usually carries the server's CA instead (GRAPHENE_AGENT_SERVER_CA)",
    )
    p.add_argument("--backoff-max", metavar="SECONDS", help="cap of the reconnect backoff (default 60)")
    p.add_argument("--log-level", help="DEBUG, INFO (default), WARNING or ERROR")
    p.add_argument("--print-facts", action="store_true", help="print the facts the hello would carry, and exit")
    p.add_argument("--version", action="version", version=f"graphene-agent {__version__}")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        extra = parse_labels(",".join(args.label))
        if args.print_facts:
            print(json.dumps(facts.collect(extra), indent=2))
            return 0
        config_path = args.config or os.environ.get("GRAPHENE_AGENT_CONFIG")
        if config_path is None and Path(DEFAULT_CONFIG).exists():
            config_path = DEFAULT_CONFIG
        flags: dict[str, str | None] = {
            "SERVER": args.server,
            "ID": args.agent_id,
            "BOOTSTRAP_TOKEN": args.bootstrap_token,
            "STATE_DIR": args.state_dir,
            "CA_FILE": args.ca_file,
            "BACKOFF_MAX_SECONDS": args.backoff_max,
            "LOG_LEVEL": args.log_level,
        }
        config = load(
            config_file=Path(config_path) if config_path else None,
            flags=flags,
            environ=os.environ,
            extra_labels=extra,
        )
    except ConfigError as exc:
        print(f"graphene-agent: error: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    logging.basicConfig(
        level=getattr(logging, config.log_level, logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    logging.getLogger("websockets").setLevel(logging.WARNING)
    try:
        return asyncio.run(_serve(config))
    except ConfigError as exc:
        print(f"graphene-agent: error: {exc}", file=sys.stderr)
        return EXIT_CONFIG


async def _serve(config: Config) -> int:
    agent = Agent(config)
    main_task = asyncio.ensure_future(agent.run_forever())
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, main_task.cancel)
    try:
        await main_task
    except Refused as exc:
        logging.getLogger("graphene_agent").error("%s; not reconnecting", exc)
        if exc.code == CLOSE_DELETED:  # the record is gone: forget the credential, like an uninstall
            agent.credentials.remove()
        await agent.executor.shutdown()
        return EXIT_REFUSED
    except asyncio.CancelledError:
        logging.getLogger("graphene_agent").info("stopping: killing running commands")
        await agent.executor.shutdown()
        return 0
    return 0
