"""Exit codes and the one error type every command raises; ``main`` turns it into one line."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

# Exit codes are part of the contract (docs/graphenectl.md); scripts branch on them.
EXIT_OK = 0
EXIT_FAILURE = 1  # the operation failed: server unreachable, token refused, server error, timeout
EXIT_USAGE = 2  # the request was wrong: bad option, invalid inputs or spec (nothing was changed)
EXIT_NOT_FOUND = 3  # the record, run, pipeline, stand or kind does not exist
EXIT_RUN_FAILED = 4  # the run ended in failed, cancelled or timed_out
EXIT_INTERRUPTED = 130  # Ctrl-C (the server-side operation continues)


class CliError(Exception):
    """A refused or failed command: ``message`` says what happened and what to do."""

    def __init__(
        self,
        message: str,
        *,
        exit_code: int = EXIT_FAILURE,
        fields: Mapping[str, Sequence[str]] | None = None,
        hint: str | None = None,
        retryable: bool = False,
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.exit_code = exit_code
        self.fields = dict(fields or {})
        self.hint = hint
        # The server was not reached, did not answer in time, or failed (5xx): a request that
        # is safe to repeat (a start with its idempotency key) may be tried again.
        self.retryable = retryable
        # The API's error code (``{"error": code, ...}``) when the server refused the request:
        # what a command branches on (``already_active``, ``revision_refused``), never the text.
        self.code = code


class UsageError(CliError):
    def __init__(self, message: str, *, fields: Mapping[str, Sequence[str]] | None = None, hint: str | None = None):
        super().__init__(message, exit_code=EXIT_USAGE, fields=fields, hint=hint)


class NotFoundError(CliError):
    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message, exit_code=EXIT_NOT_FOUND, hint=hint)
