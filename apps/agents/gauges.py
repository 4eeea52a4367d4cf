"""The agents app's gauges for ``/metrics``, read at scrape time (registered in ``apps.py``)."""

from __future__ import annotations

from collections.abc import Iterator

from django.db.models import Count, Q
from prometheus_client.core import Metric

from apps.agents.models import Agent
from apps.observability.metrics import gauge


def agent_gauges() -> Iterator[Metric]:
    """``graphene_agents``: agents by connection state (one aggregate over a small table)."""
    agents = gauge("graphene_agents", "Agents by connection state.")
    counts = Agent.objects.aggregate(
        connected=Count("pk", filter=Q(session__isnull=False)),
        lost=Count("pk", filter=Q(session__isnull=True, lost_at__isnull=False)),
        total=Count("pk"),
    )
    disconnected = counts["total"] - counts["connected"] - counts["lost"]
    for state, n in (("connected", counts["connected"]), ("disconnected", disconnected), ("lost", counts["lost"])):
        agents.add_sample("graphene_agents", {"state": state}, n)
    yield agents
