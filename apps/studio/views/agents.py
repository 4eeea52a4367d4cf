"""The agents board: a card per agent (connection, facts, labels, capabilities, commands in
flight), the terminal one click away for those who may open it."""

from __future__ import annotations

from django.contrib.admin import AdminSite
from django.http import HttpRequest, HttpResponse

from apps.agents import selectors
from apps.core import access
from apps.studio.views.common import render


def agent_board(request: HttpRequest, *, site: AdminSite) -> HttpResponse:
    agents = selectors.agent_board(user=request.user)
    terminals = access.visible_namespaces(request.user, "open_terminal", "agents")
    for agent in agents:  # the Terminal button, on the cards of agents the user may open one on
        agent.can_open_terminal = terminals is None or agent.namespace in terminals
    context = {"agents": agents, "connected": sum(1 for a in agents if _connected(a))}
    return render(request, site, "studio/agents.html", context, title="Agents", fragment="studio/_agent_cards.html")


def _connected(record: object) -> bool:
    state = getattr(record, "agent_state", None)
    return state is not None and state.session is not None
