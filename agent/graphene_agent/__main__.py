"""``python -m graphene_agent`` (and the zipapp's entry point)."""

from __future__ import annotations

import sys

from graphene_agent.cli import main

if __name__ == "__main__":
    sys.exit(main())
