"""graphenectl: one command-line grammar for Graphene's records and the run lifecycle.

It talks to the REST API (``/api/v1/``) with a token and never imports the server's code, so
it installs and runs on any machine that can reach the server.
"""

from __future__ import annotations

__version__ = "0.1.0"
