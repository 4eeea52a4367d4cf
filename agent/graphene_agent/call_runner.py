"""Runs one ``call`` command: ``python -I -c <this module's source> RESULT``, the request on stdin.

The agent starts a fresh, isolated interpreter for each call, so the function cannot disturb
the agent and its stdout/stderr are the command's output, streamed like ``exec``'s. This
module is that interpreter's program: it imports nothing of the agent (it runs as a bare
``-c`` script), only the standard library, and stays Python 3.9 compatible.

The request is JSON on stdin, ``{"name", "source", "args", "kwargs"}``, written by the agent,
which then closes stdin. It never touches the disk, since its arguments may hold secrets. It
is read whole before the function runs, so the function finds stdin at its end, as an
``exec``'s command does. The source is compiled with postponed annotations (annotations are
never evaluated, so they may name types that do not exist here) and executed in a fresh
module namespace; then ``name(*args, **kwargs)`` is called. RESULT (JSON, 0600) is
``{"value": ...}`` or ``{"error": type name, "message", "traceback"}`` — also when the
function's result is not JSON or too large. No RESULT at all means the interpreter died.

The server's own functions (its kinds' operations on the machine, marked ``in_process``) skip
the new interpreter: the agent calls ``outcome`` in a thread of its own process, and keeps the
compiled code of the last ``CODE_CACHE_SIZE`` sources it saw (the same few functions come
again and again: the docker kinds send one per engine request).
"""

from __future__ import annotations
import __future__

import collections
import hashlib
import json
import linecache
import os
import sys
import threading
import traceback
import types
from typing import Any

# The largest result (its JSON), and the longest message or traceback, sent back. The result
# must fit one message to the server (1 MiB) with the output tails; a copy of
# graphene_agent.protocol.MAX_CALL_RESULT_BYTES, since this script imports nothing of the agent.
MAX_RESULT_BYTES = 512 * 1024
MAX_TEXT_CHARS = 16 * 1024
MODULE = "graphene_call"


CODE_CACHE_SIZE = 16
_codes: collections.OrderedDict[str, tuple[types.CodeType, str]] = collections.OrderedDict()
_codes_lock = threading.Lock()


def _compile(source: str, filename: str) -> types.CodeType:
    # Postponed annotations: never evaluated, so they may name types that do not exist here.
    code: types.CodeType = compile(
        source, filename, "exec", flags=__future__.annotations.compiler_flag, dont_inherit=True
    )
    return code


def _cached_code(name: str, source: str) -> types.CodeType:
    """The compiled source of an in-process call, compiled once while it stays in the cache;
    its lines stay in ``linecache`` as long, for tracebacks."""
    digest = hashlib.sha256(f"{name}\0{source}".encode()).hexdigest()
    with _codes_lock:
        found = _codes.get(digest)
        if found is not None:
            _codes.move_to_end(digest)
            return found[0]
    filename = f"<agent.run {name} {digest[:12]}>"
    code = _compile(source, filename)
    with _codes_lock:
        linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
        _codes[digest] = (code, filename)
        while len(_codes) > CODE_CACHE_SIZE:
            _digest, (_code, evicted) = _codes.popitem(last=False)
            linecache.cache.pop(evicted, None)
    return code


def _clip(text: str) -> str:
    if len(text) <= MAX_TEXT_CHARS:
        return text
    half = MAX_TEXT_CHARS // 2
    return f"{text[:half]}\n[... {len(text) - 2 * half} characters cut ...]\n{text[-half:]}"


def _write(path: str, document: dict[str, Any]) -> None:
    data = json.dumps(document).encode()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


def _error(kind: str, message: str, trace: str = "") -> dict[str, Any]:
    return {"error": kind, "message": _clip(message), "traceback": _clip(trace)}


def _raised(exc: BaseException) -> dict[str, Any]:
    """The exception as the machine saw it, without this runner's own frames."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename in _OWN_FILES:
        tb = tb.tb_next
    trace = "".join(traceback.format_exception(type(exc), exc, tb))
    return _error(type(exc).__name__, str(exc), trace)


# This runner's frames: "<string>" when it runs as ``-c``, its file when the agent imports it.
_OWN_FILES = {"<string>", globals().get("__file__", "<string>")}


def outcome(request: dict[str, Any], *, isolated: bool = True) -> dict[str, Any]:
    """Run the request's function: ``{"value": ...}`` or ``{"error", "message", "traceback"}``.

    ``isolated``: this interpreter is the call's own (``main``), so the function's module is
    registered where pickle and dataclasses look functions up, and ``sys.argv`` names it.
    Otherwise (the agent runs a function of the server's in a thread of its own process) the
    interpreter's state is left alone.
    """
    name = str(request["name"])
    source = str(request["source"])
    module = types.ModuleType(MODULE)
    if isolated:
        filename = f"<agent.run {name}>"
        # Tracebacks show the function's lines, as they would for a file.
        linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
        sys.modules[MODULE] = module  # what pickle, dataclasses and friends look functions up in
        sys.argv = [filename]
    try:
        code = _compile(source, filename) if isolated else _cached_code(name, source)
        exec(code, module.__dict__)  # noqa: S102
        value = module.__dict__[name](*request["args"], **request["kwargs"])
    except BaseException as exc:  # SystemExit and KeyboardInterrupt too: that is how the function ended
        return _raised(exc)
    try:
        encoded = json.dumps({"value": value}, allow_nan=False)
    except (TypeError, ValueError, RecursionError) as exc:
        return _error("TypeError", f"the result of {name}() is not JSON-serializable: {exc}")
    size = len(encoded.encode())
    if size > MAX_RESULT_BYTES:
        message = f"the result of {name}() is {size} bytes of JSON; a call returns at most "
        return _error("ValueError", message + f"{MAX_RESULT_BYTES} (write it to a file instead)")
    return {"value": value}


def main(argv: list[str]) -> int:
    (result_path,) = argv
    request = json.loads(sys.stdin.buffer.read().decode("utf-8"))
    _write(result_path, outcome(request))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
