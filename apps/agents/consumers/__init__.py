"""The agents app's websockets: the gateway every agent dials, and terminals on agents' machines."""

from apps.agents.consumers.gateway import AgentGatewayConsumer
from apps.agents.consumers.terminal import AgentTerminalConsumer

__all__ = ["AgentGatewayConsumer", "AgentTerminalConsumer"]
