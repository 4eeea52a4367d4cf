"""Files: ``file(ctx, name, path=..., content=...)`` declares a ``file`` record.

The file lives on the Graphene server's disk under ``GRAPHENE_FILE_ROOT`` (``path`` is
relative to it), marked with its record id; it is written when the record converges,
removed when it is deleted, and observed every minute (or ``reconcile_every``): changed
content or mode is drift, healed by rewriting it or, with ``on_drift="report"``, reported.
``content`` may be text, UTF-8 bytes or ``ctx.secret(name)``: then the record holds only the
secret's name and the server reads the value when it writes the file (outputs carry a
digest, never the content). Files on agents' machines are not supported yet.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any, Literal

from graphene_sdk._context import Context, Resource
from graphene_sdk._secrets import SecretRef

SERVER: Literal["server"] = "server"


def file(
    ctx: Context,
    name: str,
    *,
    path: str,
    content: str | bytes | SecretRef,
    mode: int = 0o644,
    on: Literal["server"] = SERVER,
    parent: Resource | None = None,
    reconcile_every: timedelta | float | None = None,
    on_drift: Literal["heal", "report"] = "heal",
) -> Resource:
    """Declare a file at ``path`` with ``content`` and ``mode``; ``ready()`` returns
    ``{"path", "digest", "size", "mode"}``."""
    if on != SERVER:
        raise ValueError(
            "files are written on the Graphene server (on='server'); agents' machines are not supported yet"
        )
    if isinstance(content, bytes):
        try:
            content = content.decode()
        except UnicodeDecodeError:
            raise ValueError("content bytes must be UTF-8 text") from None
    if not isinstance(content, str | SecretRef):
        raise TypeError("content is text, UTF-8 bytes or ctx.secret(name)")
    if not isinstance(mode, int) or not 0 <= mode <= 0o7777:
        raise ValueError(f"mode must be a permission number such as 0o644, not {mode!r}")
    spec: dict[str, Any] = {"path": path, "content": content, "mode": mode}
    return ctx.declare("file", name, spec, parent=parent, reconcile_every=reconcile_every, on_drift=on_drift)
