"""The wire protocol between the agent and the server's gateway (shared by both sides).

JSON text messages over one websocket that the agent opens. In order:

1. agent -> ``{"type": "auth", "agent_id", "credential"}`` or
   ``{"type": "bootstrap", "agent_id", "token"}`` (the first connect: a single-use token).
2. server -> ``{"type": "welcome", "agent_id", "heartbeat_s", "credential"?}``
   (``credential`` only in answer to a bootstrap: the agent stores it and never sends the
   token again), or ``{"type": "refused", "reason"}`` followed by a close with a code below.
3. agent -> ``{"type": "hello", "facts", "instance", "version"}``; the server marks the agent
   connected and (re)sends every command that is not finished.
4. Then, in any order:
   server -> ``command`` ``{id, kind, payload, guarantee, redelivery, output_seq}``,
   ``cancel`` ``{id}``, ``ack`` ``{id, seq}`` / ``{id, result: true}``;
   agent -> ``heartbeat``, ``accepted`` ``{id}``, ``output`` ``{id, seq, stream, data}``,
   ``result`` ``{id, status, exit_code, signal, error, stdout_tail, stderr_tail, output_seq, ...}``.

Commands are de-duplicated by id on the agent; output chunks carry a per-command sequence
number so that a chunk re-sent after a reconnect is stored once and none is skipped.

Terminals (PTY sessions) ride the same connection; unlike commands they are live only: nothing
is stored or re-sent, and when the connection drops the agent hangs up every one of them.
``session`` is an id the server chooses; ``data`` is base64 of raw terminal bytes.

   server -> ``pty_open`` ``{session, cols, rows, command?, env?}`` (``command``: a shell line run
   with ``$SHELL -c``; without it the user's login shell), ``pty_input`` ``{session, data}``,
   ``pty_resize`` ``{session, cols, rows}``, ``pty_ack`` ``{session, seq}`` (output up to ``seq``
   was delivered), ``pty_close`` ``{session}`` (hang up: SIGHUP, then SIGKILL after a grace);
   agent -> ``pty_opened`` ``{session, pid, argv}``, ``pty_output`` ``{session, seq, data}`` (at most
   ``PTY_CHUNK_BYTES`` each, and at most ``PTY_WINDOW`` chunks beyond the last ``pty_ack``: the
   agent stops reading the terminal until the reader catches up), ``pty_exit`` ``{session,
   exit_code, signal, error?}`` (the last message of a session; ``exit_code`` is null when it
   could not start).

Live calls ride it too, for a function of the server's own that a worker waits for in place
(the docker kinds' engine requests): like terminals, nothing is stored, journaled or re-sent.
An agent that serves them says so in its hello (``features``: ``LIVE_CALL``); the server sends
none to an agent that did not.

   server -> ``live_call`` ``{id, payload: {name, source, args, kwargs, timeout}}`` (a ``call``
   command's payload): the agent calls the function in a thread of its own process;
   agent -> ``live_result`` ``{id, status, value | error, error_type, error_message, traceback,
   duration_s}`` (a ``call``'s result fields). If the connection drops first, the result is
   lost with it: the server tells the waiting worker that the connection ended.
"""

from __future__ import annotations

PATH = "/agents/connect"

# Close codes (4000-4999 are the application's). The agent stops retrying on REFUSED_CODES.
CLOSE_PROTOCOL = 4400  # a malformed or unexpected message
CLOSE_UNAUTHENTICATED = 4401  # no or unknown credential / token
CLOSE_REFUSED = 4403  # known but not acceptable: used token, revoked/expired credential, another agent's
CLOSE_AUTH_TIMEOUT = 4408  # no auth message in time
CLOSE_SUPERSEDED = 4409  # a newer connection of the same agent took over
CLOSE_DELETED = 4410  # the agent's record is being deleted: uninstall, do not come back
REFUSED_CODES = frozenset({CLOSE_UNAUTHENTICATED, CLOSE_REFUSED, CLOSE_DELETED})

# Command kinds and delivery guarantees.
EXEC = "exec"
PUT_FILE = "put_file"
GET_FILE = "get_file"
CALL = "call"
COMMAND_KINDS = (EXEC, PUT_FILE, GET_FILE, CALL)
# What this agent serves beyond commands and terminals (sent in its hello as ``features``).
LIVE_CALL = "live_call"
FEATURES = (LIVE_CALL,)
AT_LEAST_ONCE = "at_least_once"
AT_MOST_ONCE = "at_most_once"
GUARANTEES = (AT_LEAST_ONCE, AT_MOST_ONCE)

# Result statuses an agent reports (the server's command statuses are a superset).
SUCCEEDED = "succeeded"
FAILED = "failed"
CANCELLED = "cancelled"
UNKNOWN = "unknown"

# Sizes. The server (daphne) accepts messages up to 1 MiB from the agent, and sends none larger
# either (its limit holds both ways: a larger command would break the connection every time it
# is sent). The agent accepts larger ones. So every command, with its JSON escaping, fits 1 MiB.
MAX_AGENT_MESSAGE = 1024 * 1024
MAX_SERVER_MESSAGE = 64 * 1024 * 1024
MAX_PUT_FILE_BYTES = 512 * 1024  # base64 makes it 4/3 larger; it must fit one server message
MAX_GET_FILE_BYTES = 512 * 1024  # base64 makes it 4/3 larger; it must fit one agent message
# A call carries a function's source and its arguments, measured as JSON (escapes included);
# its JSON result must fit one agent message with the output tails.
MAX_CALL_SOURCE_BYTES = 128 * 1024
MAX_CALL_ARGS_BYTES = 512 * 1024
MAX_CALL_RESULT_BYTES = 512 * 1024
OUTPUT_CHUNK_BYTES = 64 * 1024
TAIL_BYTES = 16 * 1024

# Terminals: output chunk size (before base64), chunks in flight before the agent waits for an
# ack, and how many sessions one agent serves at once.
PTY_CHUNK_BYTES = 16 * 1024
PTY_WINDOW = 16
MAX_PTY_SESSIONS = 32
