"""The CLI tests of artifacts use the embedded server of tests/cli (one per session)."""

from tests.cli.conftest import ctl, server

__all__ = ["ctl", "server"]
