"""``manage.py build_agent``: build the agent zipapp served at /agents/download."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand

from apps.agents.bundle import agent_bundle


class Command(BaseCommand):
    help = "Build the graphene-agent zipapp (agent + vendored websockets) into the data directory."

    def handle(self, *args: Any, **options: Any) -> None:
        bundle = agent_bundle(rebuild=True)
        self.stdout.write(f"{bundle.path}\nsha256 {bundle.sha256}\nsize {bundle.size} bytes, agent {bundle.version}")
