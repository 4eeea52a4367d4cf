"""Every write of the agent gateway, cut at its seams (each module says more of its own):

* ``identity``: declaration and install data, bootstrap tokens and credentials, and the
  authentication of a connecting agent.
* ``connection``: the hello, heartbeats, disconnects and lost agents, as the record's phase
  and its ``Connected`` and ``NeedsMet`` conditions.
* ``payloads``: each kind of command's payload, checked and normalized.
* ``commands``: submitting and cancelling commands, sealing, delivery, the agent's answers,
  the end of a command (``CommandFinished``), taking results, retiring an agent.
* ``terminals``: the trail of terminal sessions.
* ``capabilities``: what a machine offers, and the needs declared of it.
* ``base``: what they share (the record kind, the errors, the connection's group, helpers).

Imports run one way, so none is a cycle: base ← payloads ← commands ← connection ←
capabilities ← identity (``terminals`` needs none of them). Callers import from here.
"""

from apps.agents.services.base import AGENT_KIND, AgentRefused, IllegalCommandTransition, agent_group
from apps.agents.services.capabilities import CAPABILITY_NAME_MAX, capability_publish, needs_clean
from apps.agents.services.commands import (
    MAX_TAIL_CHARS,
    RESULT_KEYS,
    SEALED,
    SYNC_OPERATION,
    agent_retire,
    command_accepted,
    command_cancel,
    command_finish,
    command_output,
    command_submit,
    command_take,
    commands_deliver,
    logs_beyond_subtree,
    record_wake_on_command,
)
from apps.agents.services.connection import agent_connect, agent_disconnect, agent_heartbeat, agents_mark_lost
from apps.agents.services.identity import (
    BOOTSTRAP_PREFIX,
    CREDENTIAL_PREFIX,
    STANDALONE_OWNER,
    AgentEnrollment,
    AgentInstall,
    Authenticated,
    agent_authenticate,
    agent_bootstrap_issue,
    agent_credentials_revoke,
    agent_declare,
    agent_enroll,
    agent_env_file,
    agent_install_script,
    agent_record_declare,
    agent_server_ca,
)
from apps.agents.services.payloads import MAX_ARGV, MAX_TIMEOUT_SECONDS, command_payload_validate
from apps.agents.services.terminals import terminal_closed, terminal_opened, terminal_refused

__all__ = [
    "AGENT_KIND",
    "BOOTSTRAP_PREFIX",
    "CAPABILITY_NAME_MAX",
    "CREDENTIAL_PREFIX",
    "MAX_ARGV",
    "MAX_TAIL_CHARS",
    "MAX_TIMEOUT_SECONDS",
    "RESULT_KEYS",
    "SEALED",
    "STANDALONE_OWNER",
    "SYNC_OPERATION",
    "AgentEnrollment",
    "AgentInstall",
    "AgentRefused",
    "Authenticated",
    "IllegalCommandTransition",
    "agent_authenticate",
    "agent_bootstrap_issue",
    "agent_connect",
    "agent_credentials_revoke",
    "agent_declare",
    "agent_disconnect",
    "agent_enroll",
    "agent_env_file",
    "agent_group",
    "agent_heartbeat",
    "agent_install_script",
    "agent_record_declare",
    "agent_retire",
    "agent_server_ca",
    "agents_mark_lost",
    "capability_publish",
    "command_accepted",
    "command_cancel",
    "command_finish",
    "command_output",
    "command_payload_validate",
    "command_submit",
    "command_take",
    "commands_deliver",
    "logs_beyond_subtree",
    "needs_clean",
    "record_wake_on_command",
    "terminal_closed",
    "terminal_opened",
    "terminal_refused",
]
