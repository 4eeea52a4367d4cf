"""Websocket routes (Channels)."""

from django.urls import path

from apps.agents.consumers import AgentGatewayConsumer
from apps.pipelines.consumers import RunsConsumer
from apps.records.consumers import RecordLogsConsumer, RecordsConsumer

websocket_urlpatterns = [
    path("ws/records/", RecordsConsumer.as_asgi()),
    path("ws/records/<uuid:record_id>/logs/", RecordLogsConsumer.as_asgi()),
    path("ws/runs/", RunsConsumer.as_asgi()),
    path("ws/runs/<uuid:run_id>/", RunsConsumer.as_asgi()),
    # Agents dial this (outbound from the machine); they authenticate in the first message.
    path("agents/connect", AgentGatewayConsumer.as_asgi()),
]
