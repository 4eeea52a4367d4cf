"""Command payloads: what each kind of command carries, checked and normalized before it is
stored. Every error names its field (``argv.2``, ``env.PATH``, ``kwargs.x``)."""

from __future__ import annotations

import base64
import binascii
import json
import keyword
from collections.abc import Mapping
from typing import Any

from graphene_agent import protocol

from apps.agents.choices import CommandKind
from apps.agents.services.base import _fail
from apps.core.errors import ValidationFailed

MAX_ARGV = 4096
MAX_TIMEOUT_SECONDS = 7 * 24 * 3600


def _absolute_path(payload: Mapping[str, Any], field: str = "path") -> str:
    path = payload.get(field)
    if not isinstance(path, str) or not path:
        raise _fail(field, "required: an absolute path on the agent's machine")
    if not path.startswith("/") or "\x00" in path:
        raise _fail(field, f"must be an absolute path without NUL bytes, got {path!r}")
    return path


def command_payload_validate(kind: str, payload: Any) -> dict[str, Any]:
    """Check and normalize a command's payload; every error names its field."""
    if kind not in CommandKind.values:
        raise _fail("kind", f"unknown command kind {kind!r}; kinds are {CommandKind.values}")
    if not isinstance(payload, Mapping):
        raise _fail("payload", "must be a JSON object")
    allowed = {
        CommandKind.EXEC: {"argv", "env", "cwd", "timeout"},
        CommandKind.PUT_FILE: {"path", "data", "mode", "make_dirs"},
        CommandKind.GET_FILE: {"path", "max_bytes"},
        CommandKind.CALL: {"name", "source", "args", "kwargs", "timeout"},
    }[CommandKind(kind)]
    unknown = sorted(set(payload) - allowed)
    if unknown:
        raise ValidationFailed(
            f"unknown field(s) {unknown} for {kind}; allowed: {sorted(allowed)}",
            fields={name: ["unknown field"] for name in unknown},
        )
    if kind == CommandKind.EXEC:
        return _exec_payload(payload)
    if kind == CommandKind.CALL:
        return _call_payload(payload)
    if kind == CommandKind.PUT_FILE:
        data = payload.get("data")
        if not isinstance(data, str):
            raise _fail("data", "required: the file's content, base64-encoded")
        try:
            size = len(base64.b64decode(data, validate=True))
        except (binascii.Error, ValueError):
            raise _fail("data", "is not valid base64") from None
        if size > protocol.MAX_PUT_FILE_BYTES:
            raise _fail("data", f"{size} bytes is more than the {protocol.MAX_PUT_FILE_BYTES} a put_file carries")
        mode = payload.get("mode", 0o644)
        if not isinstance(mode, int) or isinstance(mode, bool) or not 0 <= mode <= 0o7777:
            raise _fail("mode", "must be an integer between 0 and 0o7777 (4095)")
        make_dirs = payload.get("make_dirs", True)
        if not isinstance(make_dirs, bool):
            raise _fail("make_dirs", "must be true or false")
        return {"path": _absolute_path(payload), "data": data, "mode": mode, "make_dirs": make_dirs}
    max_bytes = payload.get("max_bytes", protocol.MAX_GET_FILE_BYTES)
    if (
        not isinstance(max_bytes, int)
        or isinstance(max_bytes, bool)
        or not 0 < max_bytes <= protocol.MAX_GET_FILE_BYTES
    ):
        raise _fail("max_bytes", f"must be an integer between 1 and {protocol.MAX_GET_FILE_BYTES}")
    return {"path": _absolute_path(payload), "max_bytes": max_bytes}


def _call_payload(payload: Mapping[str, Any]) -> dict[str, Any]:
    """A Python function for the agent's machine: its source, its name, JSON arguments."""
    source = payload.get("source")
    if not isinstance(source, str) or not source.strip():
        raise _fail("source", "required: the function's source code (a def statement)")
    if "\x00" in source:
        raise _fail("source", "contains a NUL byte")
    if len(json.dumps(source)) > protocol.MAX_CALL_SOURCE_BYTES:
        size = len(json.dumps(source))
        raise _fail("source", f"{size} bytes of JSON, more than the {protocol.MAX_CALL_SOURCE_BYTES} a call carries")
    name = payload.get("name")
    if not isinstance(name, str) or not name.isidentifier() or keyword.iskeyword(name):
        raise _fail("name", f"must be the function's name (a Python identifier), got {name!r}")
    args = payload.get("args", [])
    if not isinstance(args, list):
        raise _fail("args", "must be a list (the positional arguments, as JSON)")
    kwargs = payload.get("kwargs", {})
    if not isinstance(kwargs, Mapping):
        raise _fail("kwargs", "must be an object (the keyword arguments, as JSON)")
    for key in kwargs:
        if not isinstance(key, str) or not key.isidentifier():
            raise ValidationFailed(
                f"kwargs: {key!r} is not a parameter name", fields={f"kwargs.{key}": ["not an identifier"]}
            )
    size = len(json.dumps([args, kwargs]).encode())
    if size > protocol.MAX_CALL_ARGS_BYTES:
        raise _fail(
            "args",
            f"the arguments are {size} bytes of JSON, more than the {protocol.MAX_CALL_ARGS_BYTES} a call carries",
        )
    timeout = _timeout(payload)
    return {"name": name, "source": source, "args": list(args), "kwargs": dict(kwargs), "timeout": timeout}


def _timeout(payload: Mapping[str, Any]) -> float | None:
    timeout = payload.get("timeout")
    if timeout is not None:
        if not isinstance(timeout, int | float) or isinstance(timeout, bool):
            raise _fail("timeout", "must be a number of seconds")
        if not 0 < timeout <= MAX_TIMEOUT_SECONDS:
            raise _fail("timeout", f"must be more than 0 and at most {MAX_TIMEOUT_SECONDS} seconds")
    return timeout


def _exec_payload(payload: Mapping[str, Any]) -> dict[str, Any]:
    argv = payload.get("argv")
    if not isinstance(argv, list) or not argv:
        raise _fail("argv", "required: a non-empty list of strings (the program and its arguments)")
    if len(argv) > MAX_ARGV:
        raise _fail("argv", f"at most {MAX_ARGV} arguments")
    for index, arg in enumerate(argv):
        if not isinstance(arg, str):
            raise ValidationFailed(
                f"argv.{index}: must be a string, got {type(arg).__name__}", fields={f"argv.{index}": ["not a string"]}
            )
        if "\x00" in arg:
            raise ValidationFailed(f"argv.{index}: contains a NUL byte", fields={f"argv.{index}": ["NUL byte"]})
    if not argv[0]:
        raise ValidationFailed("argv.0: the program must not be empty", fields={"argv.0": ["empty"]})
    env = payload.get("env") or {}
    if not isinstance(env, Mapping):
        raise _fail("env", "must be an object mapping variable names to string values")
    for key, value in env.items():
        if not isinstance(key, str) or not key or "=" in key or "\x00" in key:
            raise ValidationFailed(
                f"env: {key!r} is not a valid variable name", fields={f"env.{key}": ["invalid variable name"]}
            )
        if not isinstance(value, str) or "\x00" in value:
            raise ValidationFailed(
                f"env.{key}: must be a string without NUL bytes", fields={f"env.{key}": ["must be a string"]}
            )
    cwd = payload.get("cwd")
    if cwd is not None and cwd != "":
        cwd = _absolute_path(payload, "cwd")
    timeout = _timeout(payload)
    return {"argv": list(argv), "env": dict(env), "cwd": cwd or None, "timeout": timeout}
