"""``agent.put_file``, ``agent.get_file`` and ``agent.run`` in the SDK: what it refuses before
sending anything, and how the testing kit's world answers them."""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from graphene_agent import call_runner, protocol
from graphene_sdk import Agent, Context, PutFileResult, RemoteError, ResourceFailed, pipeline
from graphene_sdk import _remote as remote
from graphene_sdk.testing import World
from pydantic import BaseModel

LIMIT = 10


def lines_in(path: str) -> dict[str, Any]:
    import os

    with open(path) as fh:
        return {"lines": len(fh.read().splitlines()), "pid": os.getpid()}


def fails(path: str, *, why: str = "no") -> None:
    raise PermissionError(f"{why}: {path}")


def returns_a_set() -> Any:
    return {1, 2}


def annotated(path: Path) -> dict[str, BaseModel]:
    # Path and BaseModel exist in this module, not on the machine: annotations are not evaluated there.
    return {"path": str(path)}  # type: ignore[dict-item]  # it gets a str: JSON has no Path


def recursive(n: int) -> int:
    return 1 if n <= 1 else n * recursive(n - 1)


def uses_the_module() -> int:
    return LIMIT


def default_from_the_module(limit: int = LIMIT) -> int:
    return limit


def _decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
    return fn


@_decorate
def decorated() -> int:
    return 1


async def asynchronous() -> int:
    return 1


def generator() -> Any:
    yield 1


class Inputs(BaseModel):
    pass


def on_box(body: Callable[[Agent], Any]) -> Any:
    """Run ``body(agent)`` in a pipeline in a fresh world; its result, or the run's error."""

    @pipeline("sdk.agent-calls", inputs=Inputs)
    def program(ctx: Context, inputs: Inputs) -> Any:
        return body(ctx.agent("box"))

    world = World()
    result = world.run(program, Inputs())
    return world, result


def test_the_limits_are_the_protocols() -> None:
    assert remote.MAX_PUT_FILE_BYTES == protocol.MAX_PUT_FILE_BYTES
    assert remote.MAX_GET_FILE_BYTES == protocol.MAX_GET_FILE_BYTES
    assert remote.MAX_CALL_SOURCE_BYTES == protocol.MAX_CALL_SOURCE_BYTES
    assert remote.MAX_CALL_ARGS_BYTES == protocol.MAX_CALL_ARGS_BYTES
    assert remote.MAX_CALL_RESULT_BYTES == protocol.MAX_CALL_RESULT_BYTES == call_runner.MAX_RESULT_BYTES


def test_files_and_functions_in_the_world() -> None:
    def body(box: Agent) -> Any:
        written = box.put_file("/srv/app/conf", "a\nb\n", mode=0o600)
        assert written == PutFileResult(path="/srv/app/conf", size=4, sha256=hashlib.sha256(b"a\nb\n").hexdigest())
        assert box.get_file("/srv/app/conf") == b"a\nb\n"
        return box.run(recursive, 5)

    world, result = on_box(body)
    assert result.unwrap() == 120
    assert world.files == {"box": {"/srv/app/conf": b"a\nb\n"}}
    assert world.calls == [("box", "recursive", [5], {})]


def test_a_function_runs_from_its_source_alone(tmp_path: Path) -> None:
    target = tmp_path / "three"
    target.write_text("1\n2\n3\n")
    _, result = on_box(lambda box: [box.run(lines_in, str(target))["lines"], box.run(annotated, path="/x")])
    assert result.unwrap() == [3, {"path": "/x"}]


def test_what_the_function_raises_is_a_remote_error() -> None:
    _, result = on_box(lambda box: box.run(fails, "/etc/shadow", why="keep out"))
    error = result.error
    assert isinstance(error, RemoteError)
    assert str(error) == "fails() on agent/box raised PermissionError: keep out: /etc/shadow"
    assert (error.function, error.remote_type, error.remote_message) == (
        "fails",
        "PermissionError",
        "keep out: /etc/shadow",
    )
    assert error.remote_traceback.startswith('Traceback (most recent call last):\n  File "<agent.run fails>"')
    assert 'raise PermissionError(f"{why}: {path}")' in error.remote_traceback


def test_a_result_that_is_not_json_is_a_remote_error() -> None:
    _, result = on_box(lambda box: box.run(returns_a_set))
    assert isinstance(result.error, RemoteError)
    assert result.error.remote_type == "TypeError"
    assert "the result of returns_a_set() is not JSON-serializable" in result.error.remote_message


def test_a_handler_answers_calls() -> None:
    def handler(agent: str, name: str, args: list[Any], kwargs: dict[str, Any]) -> Any:
        if name == "fails":
            raise FileNotFoundError(args[0])
        return {"agent": agent, "name": name, "args": args}

    @pipeline("sdk.agent-calls-handler", inputs=Inputs)
    def program(ctx: Context, inputs: Inputs) -> Any:
        box = ctx.agent("box")
        answer = box.run(lines_in, "/nowhere")
        try:
            box.run(fails, "/gone")
        except RemoteError as exc:
            return [answer, exc.remote_type, exc.remote_message]
        return None

    world = World()
    world.on_call(handler)
    assert world.run(program, Inputs()).unwrap() == [
        {"agent": "box", "name": "lines_in", "args": ["/nowhere"]},
        "FileNotFoundError",
        "/gone",
    ]


def test_get_file_of_what_is_not_there_fails_like_the_machine() -> None:
    _, result = on_box(lambda box: box.get_file("/etc/nothing"))
    assert isinstance(result.error, ResourceFailed)
    assert "cannot read /etc/nothing: No such file or directory" in str(result.error)


def _refusal(attempt: Callable[[Agent], Any]) -> BaseException:
    def body(box: Agent) -> Any:
        attempt(box)

    world, result = on_box(body)
    assert world.calls == [], "refused calls reach no machine"
    assert world.files == {}
    assert result.error is not None
    return result.error


class _Thing:
    def method(self) -> int:
        return 1


def _closure() -> Callable[[], int]:
    captured = 3

    def inner() -> int:
        return captured

    return inner


@pytest.mark.parametrize(
    ("attempt", "error", "message"),
    [
        (lambda box: box.run(lambda: 1), TypeError, "a lambda's source cannot be sent on its own: define it with def"),
        (lambda box: box.run(_closure()), TypeError, "it uses captured from its enclosing function (a closure)"),
        (lambda box: box.run(len, "x"), TypeError, "len() is a builtin: call it from a function of your own"),
        (lambda box: box.run(_Thing().method), TypeError, "is a bound method, and its instance cannot travel"),
        (lambda box: box.run(functools.partial(fails, "/x")), TypeError, "a functools.partial is not"),
        (lambda box: box.run(_Thing), TypeError, "_Thing() is a class"),
        (lambda box: box.run(decorated), TypeError, "it is decorated, and its decorators would have to run"),
        (lambda box: box.run(asynchronous), TypeError, "asynchronous() is async"),
        (lambda box: box.run(generator), TypeError, "generator() is a generator function: return a list instead"),
        (lambda box: box.run(uses_the_module), TypeError, "it uses LIMIT from its module, which will not exist"),
        (lambda box: box.run(default_from_the_module), TypeError, "it uses LIMIT from its module"),
        (lambda box: box.run(fails), TypeError, "fails() cannot be called with these arguments: missing a required"),
        (lambda box: box.run(fails, "/x", reason="?"), TypeError, "got an unexpected keyword argument 'reason'"),
        (lambda box: box.run(fails, {1, 2}), TypeError, "args[0] of fails() is a set, which is not JSON-serializable"),
        (lambda box: box.run(fails, "/x", why=[b"x"]), TypeError, "kwargs['why'][0] of fails() is a bytes"),
        (lambda box: box.run(fails, {1: "x"}), TypeError, "args[0] of fails() has the key 1; JSON object keys are"),
        (lambda box: box.run(fails, float("nan")), ValueError, "args[0] of fails() is nan, which JSON cannot carry"),
        (lambda box: box.run(fails, "x" * (512 * 1024)), ValueError, "a call carries at most 524288"),
        (lambda box: box.run(fails, "/x", timeout=-1), ValueError, "timeout must not be negative"),
        (lambda box: box.run(fails, "/x", guarantee="twice"), ValueError, "guarantee must be"),
        (lambda box: box.put_file("relative", b""), ValueError, "put_file needs an absolute path"),
        (lambda box: box.put_file("/x", 42), TypeError, "put_file writes bytes or a str (encoded as UTF-8), not int"),
        (lambda box: box.put_file("/x", b"", mode=0o10000), ValueError, "mode is a permission mode from 0 to 0o7777"),
        (lambda box: box.put_file("/x", b"\0" * (512 * 1024 + 1)), ValueError, "put_file carries at most 524288"),
        (lambda box: box.get_file("/x", max_bytes=512 * 1024 + 1), ValueError, "get_file reads at most 524288"),
        (lambda box: box.get_file("x"), ValueError, "get_file needs an absolute path"),
    ],
)
def test_what_cannot_reach_the_machine_is_refused_before_anything_is_sent(
    attempt: Callable[[Agent], Any], error: type[Exception], message: str
) -> None:
    raised = _refusal(attempt)
    assert type(raised) is error
    assert message in str(raised)


def test_tuples_arrive_as_lists() -> None:
    call = remote.remote_call(fails, ((1, 2),), {"why": ("a",)})
    assert (call.name, call.args, call.kwargs) == ("fails", [[1, 2]], {"why": ["a"]})
    assert call.source.startswith('def fails(path: str, *, why: str = "no") -> None:\n')


class ArtifactInputs(BaseModel):
    pass


@pipeline("calls.artifact", inputs=ArtifactInputs)
def put_artifact_on_machine(ctx: Context, inputs: ArtifactInputs) -> None:
    box = ctx.agent("box")
    report = ctx.publish_artifact("report.txt", b"all green\n")
    written = box.put_file("/srv/report.txt", report, mode=0o600)
    assert written.sha256 == report.sha256


def test_put_file_takes_an_artifact() -> None:
    world = World()
    result = world.run(put_artifact_on_machine, ArtifactInputs())
    assert result.status == "succeeded", result.error_text
    assert world.files == {"box": {"/srv/report.txt": b"all green\n"}}
