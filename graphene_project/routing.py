"""Websocket routes (Channels)."""

from django.urls import path

from apps.agents.consumers import AgentGatewayConsumer, AgentTerminalConsumer
from apps.pipelines.consumers import RunsConsumer
from apps.records.consumers import RecordLogsConsumer, RecordsConsumer

websocket_urlpatterns = [
    path("ws/records/", RecordsConsumer.as_asgi()),
    path("ws/records/<uuid:record_id>/logs/", RecordLogsConsumer.as_asgi()),
    path("ws/runs/", RunsConsumer.as_asgi()),
    path("ws/runs/<uuid:run_id>/", RunsConsumer.as_asgi()),
    # A terminal on an agent's machine, relayed over the agent's own (outbound) connection.
    path("ws/agents/<uuid:agent_id>/pty/", AgentTerminalConsumer.as_asgi()),
    # Agents dial this (outbound from the machine); they authenticate in the first message.
    path("agents/connect", AgentGatewayConsumer.as_asgi()),
]
