"""graphene-agent: an outbound-only machine agent for Graphene.

It listens on no port (invariant I8): it dials ``ws(s)://<server>/agents/connect``, proves
who it is, says hello with facts about the machine and then serves commands (``exec``,
``put_file``, ``get_file``, ``cancel``) until the connection drops, and dials again with
capped exponential backoff, forever. Standard library and ``websockets`` only, Python >= 3.9,
so that it runs from a single zipapp on a bare machine.
"""

from __future__ import annotations

__version__ = "0.1.0"
