"""What crosses to an agent's machine: file contents and Python functions (``Agent.put_file``,
``Agent.get_file``, ``Agent.run``), checked here before any command exists.

The agent has only the standard library and speaks JSON, so ``Agent.run`` sends a function's
*source*, its name and JSON arguments; the machine runs that source in a fresh interpreter.
Whatever would fail there for a reason visible here (a lambda, a closure, a module-level name
the function relies on, an argument that is not JSON) is refused here, with the reason.
"""

from __future__ import annotations

import ast
import builtins
import dis
import functools
import inspect
import json
import math
import textwrap
import types
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

# The wire's limits (``graphene_agent.protocol``; a test keeps the two in step). Every command
# travels in one websocket message of at most 1 MiB, so file contents are small: larger data
# goes through artifacts, or is fetched or built on the machine.
MAX_PUT_FILE_BYTES = 512 * 1024
MAX_GET_FILE_BYTES = 512 * 1024
MAX_CALL_SOURCE_BYTES = 128 * 1024  # as JSON
MAX_CALL_ARGS_BYTES = 512 * 1024  # as JSON
MAX_CALL_RESULT_BYTES = 512 * 1024  # as JSON

# Names every fresh module namespace has on the machine, besides the builtins.
_MODULE_NAMES = frozenset({"__name__", "__doc__", "__builtins__", "__spec__", "__loader__", "__package__"})


@dataclass(frozen=True)
class RemoteCall:
    """A checked ``Agent.run``: what the ``call`` command carries (``args``/``kwargs`` as JSON)."""

    name: str
    source: str
    args: list[Any]
    kwargs: dict[str, Any]


def remote_path(path: str, what: str) -> str:
    """An absolute path on the machine, as the agent requires."""
    if not isinstance(path, str):
        raise TypeError(f"{what} takes the path as a str, not {type(path).__name__}")
    if not path.startswith("/") or "\x00" in path:
        raise ValueError(f"{what} needs an absolute path on the machine without NUL bytes, got {path!r}")
    return path


def file_content(data: bytes | bytearray | memoryview | str) -> bytes:
    """The bytes ``put_file`` writes: bytes as they are, a str encoded as UTF-8.

    The extension point for other sources of content (an artifact reference): whatever they
    are, they become bytes here, and the runtime only ever sees bytes.
    """
    if isinstance(data, str):
        content = data.encode("utf-8")
    elif isinstance(data, bytes | bytearray | memoryview):
        content = bytes(data)
    else:
        raise TypeError(f"put_file writes bytes or a str (encoded as UTF-8), not {type(data).__name__}")
    if len(content) > MAX_PUT_FILE_BYTES:
        raise ValueError(
            f"put_file carries at most {MAX_PUT_FILE_BYTES} bytes ({MAX_PUT_FILE_BYTES // 1024} KiB), "
            f"got {len(content)}; for more, publish it as an artifact or fetch it on the machine"
        )
    return content


def file_mode(mode: int) -> int:
    if isinstance(mode, bool) or not isinstance(mode, int) or not 0 <= mode <= 0o7777:
        raise ValueError(f"mode is a permission mode from 0 to 0o7777 (e.g. 0o644), got {mode!r}")
    return mode


def remote_call(fn: Any, args: Sequence[Any], kwargs: Mapping[str, Any]) -> RemoteCall:
    """Check that ``fn(*args, **kwargs)`` can run on the machine from its source alone."""
    what = _describe(fn)
    _check_callable(fn, what)
    code: types.CodeType = fn.__code__
    if code.co_freevars:
        names = ", ".join(code.co_freevars)
        raise TypeError(
            f"agent.run cannot send {what}: it uses {names} from its enclosing function (a closure), and only "
            f"its source travels to the machine; pass {names} as arguments"
        )
    node, source = _source(fn, what)
    missing = sorted(_globals(code, node) - set(dir(builtins)) - _MODULE_NAMES - {fn.__name__})
    if missing:
        raise TypeError(
            f"agent.run cannot send {what}: it uses {', '.join(missing)} from its module, which will not exist on "
            "the machine (only the function's source is sent); import modules inside the function body and pass "
            "values as arguments"
        )
    try:
        inspect.signature(fn).bind(*args, **kwargs)
    except TypeError as exc:
        raise TypeError(f"agent.run: {what} cannot be called with these arguments: {exc}") from None
    for index, value in enumerate(args):
        _check_json(value, f"args[{index}]", what)
    for key, value in kwargs.items():
        _check_json(value, f"kwargs[{key!r}]", what)
    encoded = json.dumps([list(args), dict(kwargs)], allow_nan=False)
    if len(encoded) > MAX_CALL_ARGS_BYTES:
        raise ValueError(
            f"agent.run: the arguments of {what} are {len(encoded)} bytes of JSON; a call carries at "
            f"most {MAX_CALL_ARGS_BYTES}: put large data on the machine with put_file and pass its path"
        )
    size = len(json.dumps(source))
    if size > MAX_CALL_SOURCE_BYTES:
        raise ValueError(
            f"agent.run: the source of {what} is {size} bytes; a call carries at most {MAX_CALL_SOURCE_BYTES}"
        )
    plain_args, plain_kwargs = json.loads(encoded)  # what the machine receives: tuples are lists...
    return RemoteCall(name=fn.__name__, source=source, args=plain_args, kwargs=plain_kwargs)


def _describe(fn: Any) -> str:
    name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None)
    return f"{name}()" if isinstance(name, str) else repr(fn)


def _check_callable(fn: Any, what: str) -> None:
    hint = "agent.run takes a function defined with def (at module level, or nested without closures)"
    if inspect.ismethod(fn):
        raise TypeError(f"{hint}; {what} is a bound method, and its instance cannot travel to the machine")
    if isinstance(fn, functools.partial):
        raise TypeError(f"{hint}; a functools.partial is not: pass its arguments to agent.run instead")
    if inspect.isbuiltin(fn) or isinstance(fn, types.MethodWrapperType | types.WrapperDescriptorType):
        raise TypeError(f"{hint}; {what} is a builtin: call it from a function of your own")
    if inspect.isclass(fn):
        raise TypeError(f"{hint}; {what} is a class")
    if not inspect.isfunction(fn):
        raise TypeError(f"{hint}, not {type(fn).__name__}")
    if fn.__name__ == "<lambda>":
        raise TypeError(f"{hint}; a lambda's source cannot be sent on its own: define it with def")
    if inspect.iscoroutinefunction(fn) or inspect.isasyncgenfunction(fn):
        raise TypeError(f"{hint}; {what} is async: define it with a plain def (use asyncio.run inside if needed)")
    if inspect.isgeneratorfunction(fn):
        raise TypeError(f"{hint}; {what} is a generator function: return a list instead")


def _source(fn: types.FunctionType, what: str) -> tuple[ast.FunctionDef, str]:
    try:
        source = textwrap.dedent(inspect.getsource(fn))
    except (OSError, TypeError):
        raise TypeError(
            f"agent.run cannot send {what}: its source is not available (defined in an interactive session or "
            "with exec?); agent.run sends a function's source, so define it in a module"
        ) from None
    try:
        tree = ast.parse(source)
    except SyntaxError:
        tree = ast.Module(body=[], type_ignores=[])
    node = tree.body[0] if len(tree.body) == 1 else None
    if not isinstance(node, ast.FunctionDef) or node.name != fn.__name__:
        raise TypeError(f"agent.run cannot send {what}: its source does not read as one def statement")
    if node.decorator_list:
        raise TypeError(
            f"agent.run cannot send {what}: it is decorated, and its decorators would have to run on the machine; "
            "send an undecorated function"
        )
    return node, source


def _globals(code: types.CodeType, node: ast.FunctionDef) -> set[str]:
    """Module-level names the function needs: loaded by its body (and nested code) or by its
    default values (evaluated when the machine runs the ``def``). Annotations are not needed:
    the machine compiles the source with postponed annotations."""
    loaded: set[str] = set()
    stored: set[str] = set()
    for unit in _code_units(code):
        for instruction in dis.get_instructions(unit):
            if instruction.opname == "LOAD_GLOBAL":
                loaded.add(str(instruction.argval))
            elif instruction.opname == "STORE_GLOBAL":
                stored.add(str(instruction.argval))
    defaults = [d for d in [*node.args.defaults, *node.args.kw_defaults] if d is not None]
    for default in defaults:
        loaded.update(n.id for n in ast.walk(default) if isinstance(n, ast.Name))
    return loaded - stored


def _code_units(code: types.CodeType) -> Iterator[types.CodeType]:
    yield code
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _code_units(const)


def _check_json(value: Any, where: str, what: str, depth: int = 0) -> None:
    """Refuse what JSON cannot carry faithfully, naming where it is (``args[1]['hosts'][0]``)."""
    if depth > 100:
        raise ValueError(f"agent.run: {where} of {what} is nested too deeply for JSON")
    if value is None or isinstance(value, bool | int | str):
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"agent.run: {where} of {what} is {value}, which JSON cannot carry")
        return
    if isinstance(value, list | tuple):
        for index, item in enumerate(value):
            _check_json(item, f"{where}[{index}]", what, depth + 1)
        return
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise TypeError(f"agent.run: {where} of {what} has the key {key!r}; JSON object keys are strings")
            _check_json(item, f"{where}[{key!r}]", what, depth + 1)
        return
    raise TypeError(
        f"agent.run: {where} of {what} is a {type(value).__name__}, which is not JSON-serializable; arguments "
        "travel as JSON (None, bool, int, float, str, list, dict with str keys)"
    )
