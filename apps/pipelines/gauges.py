"""The pipelines app's gauges for ``/metrics``, read at scrape time (registered in ``apps.py``)."""

from __future__ import annotations

from collections.abc import Iterator

from django.db.models import Count
from prometheus_client.core import Metric

from apps.observability.metrics import gauge
from apps.pipelines.models import Pipeline, Run


def run_gauges() -> Iterator[Metric]:
    """``graphene_runs``: runs by pipeline and status (a GROUP BY over the status index)."""
    names = dict(Pipeline.objects.values_list("pk", "name"))
    runs = gauge("graphene_runs", "Runs by pipeline and status.")
    for row in Run.objects.order_by().values("pipeline_id", "status").annotate(n=Count("pk")):
        labels = {"pipeline": names.get(row["pipeline_id"], str(row["pipeline_id"])), "status": row["status"]}
        runs.add_sample("graphene_runs", labels, row["n"])
    yield runs
