"""Files: ``file(ctx, name, path=..., content=..., on=...)`` declares a ``file`` record.

The file lives on the Graphene server's disk under ``GRAPHENE_FILE_ROOT`` (``path`` is
relative to it) or, with ``on=agent``, on that agent's machine (``path`` is absolute there;
the agent writes it). It is marked with its record id, written when the record converges,
removed when it is deleted, and observed every minute (or ``reconcile_every``): changed
content or mode is drift, healed by rewriting it or, with ``on_drift="report"``, reported.
``protect=True`` declares it protected: a deletion that reaches it stops there until it is
unprotected (see ``ctx.declare``).
``content`` may be text, UTF-8 bytes or ``ctx.secret(name)``: then the record holds only the
secret's name and the server reads the value when it writes the file (outputs carry a
digest, never the content). An artifact (``ctx.publish_artifact`` / ``attach_artifact``) is
stored as ``{"$artifact": id}`` and the server copies its bytes into the file; the drift check
compares the file's digest with the artifact's.

A file on a machine this run declared (``ctx.agent``) is owned by the agent's record unless
``parent`` says otherwise, so it is removed before the agent goes; on an attached machine
(``ctx.attach_agent``) it is owned by the run. At most about 380 KB of content: it travels
in one command to the agent. If the machine is gone for good, its
deletion is given up after ``GRAPHENE_AGENT_LOST_DELETE_DEADLINE_SECONDS`` with an event.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any, Literal

from graphene_sdk._artifacts import ArtifactRef
from graphene_sdk._context import Context
from graphene_sdk._handles import Agent, AttachedAgent, Resource
from graphene_sdk._secrets import SecretRef

SERVER: Literal["server"] = "server"


def file(
    ctx: Context,
    name: str,
    *,
    path: str,
    content: str | bytes | SecretRef | ArtifactRef,
    mode: int = 0o644,
    on: Agent | AttachedAgent | Literal["server"] = SERVER,
    parent: Resource | None = None,
    reconcile_every: timedelta | float | None = None,
    on_drift: Literal["heal", "report"] = "heal",
    protect: bool = False,
) -> Resource:
    """Declare a file at ``path`` with ``content`` and ``mode`` on the server or on the
    machine of agent ``on``; ``ready()`` returns ``{"path", "digest", "size", "mode"}``."""
    if not isinstance(on, Agent | AttachedAgent) and on != SERVER:
        raise ValueError(f"on is 'server' or an agent handle (ctx.agent, ctx.attach_agent...), not {on!r}")
    if isinstance(on, Agent | AttachedAgent) and not path.startswith("/"):
        raise ValueError(f"a path on an agent's machine is absolute (e.g. /etc/app/app.conf), not {path!r}")
    if isinstance(content, bytes):
        try:
            content = content.decode()
        except UnicodeDecodeError:
            raise ValueError("content bytes must be UTF-8 text") from None
    if not isinstance(content, str | SecretRef | ArtifactRef):
        raise TypeError("content is text, UTF-8 bytes, ctx.secret(name) or an artifact (ctx.publish_artifact)")
    if not isinstance(mode, int) or not 0 <= mode <= 0o7777:
        raise ValueError(f"mode must be a permission number such as 0o644, not {mode!r}")
    spec: dict[str, Any] = {"path": path, "content": content, "mode": mode}
    if isinstance(on, Agent | AttachedAgent):
        spec["agent"] = on.id
        if isinstance(on, Agent) and parent is None:
            parent = on  # removed before the agent goes (an attached agent is not this run's)
    options: dict[str, Any] = {"protect": True} if protect else {}  # a deletion stops at it
    return ctx.declare("file", name, spec, parent=parent, reconcile_every=reconcile_every, on_drift=on_drift, **options)
