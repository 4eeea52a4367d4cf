"""``@pipeline``: a typed, registered pipeline definition."""

from __future__ import annotations

import copy
import functools
import inspect
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Generic, Literal, TypeVar

from pydantic import BaseModel

from graphene_sdk._triggers import Trigger, triggers_check

if TYPE_CHECKING:
    from graphene_sdk._context import Context

InputT = TypeVar("InputT", bound=BaseModel)
OutputT = TypeVar("OutputT", bound="BaseModel | None")

Concurrency = Literal["parallel", "queue", "cancel_previous"]


@functools.cache
def _model_schema(model: type[BaseModel]) -> dict[str, Any]:
    return model.model_json_schema()


def _json_schema(model: type[BaseModel]) -> dict[str, Any]:
    """The model's JSON Schema, computed once per model (the server compares it on every start)."""
    return copy.deepcopy(_model_schema(model))


@dataclass(frozen=True)
class Pipeline(Generic[InputT, OutputT]):
    """A registered pipeline: its function, its input and output models and its policies."""

    name: str
    fn: Callable[[Context, InputT], OutputT]
    inputs: type[InputT]
    output: type[BaseModel] | None
    concurrency: Concurrency = "parallel"
    max_pending: int | None = None
    timeout: timedelta | None = None
    keep_on_failure: timedelta | None = None
    triggers: Sequence[Trigger] = field(default_factory=tuple)
    description: str = ""
    namespace: str = "default"

    @property
    def source(self) -> str:
        return f"{self.fn.__module__}:{self.fn.__qualname__}"

    def input_schema(self) -> dict[str, Any]:
        return _json_schema(self.inputs)

    def output_schema(self) -> dict[str, Any] | None:
        return _json_schema(self.output) if self.output is not None else None

    def __call__(self, ctx: Context, inputs: InputT) -> OutputT:
        return self.fn(ctx, inputs)


_REGISTRY: dict[str, Pipeline[Any, Any]] = {}
DEFAULT_NAMESPACE = "default"


def registered() -> dict[str, Pipeline[Any, Any]]:
    """Every pipeline defined by the modules imported so far, by name."""
    return dict(_REGISTRY)


class _Collector:
    def __init__(self, namespace: str) -> None:
        self.namespace = namespace
        self.pipelines: dict[str, Pipeline[Any, Any]] = {}


_collecting = threading.local()


@contextmanager
def collecting(namespace: str) -> Iterator[dict[str, Pipeline[Any, Any]]]:
    """Pipelines defined by this thread while the block runs go into the dict it yields, not
    into the process's registry: how a revision's modules are loaded beside other revisions
    of the same pipelines. A pipeline that names no namespace is in ``namespace`` (where the
    revision was delivered); one that names another is refused."""
    previous = getattr(_collecting, "current", None)
    collector = _Collector(namespace)
    _collecting.current = collector
    try:
        yield collector.pipelines
    finally:
        _collecting.current = previous


def _output_model(fn: Callable[..., Any]) -> type[BaseModel] | None:
    try:
        hints = inspect.get_annotations(fn, eval_str=True)
    except Exception:  # an unresolvable annotation means "no declared output model"
        return None
    ret = hints.get("return")
    if isinstance(ret, type) and issubclass(ret, BaseModel):
        return ret
    args = getattr(ret, "__args__", ())
    models = [a for a in args if isinstance(a, type) and issubclass(a, BaseModel)]
    return models[0] if len(models) == 1 else None


def pipeline(
    name: str,
    *,
    inputs: type[InputT],
    concurrency: Concurrency = "parallel",
    max_pending: int | None = None,
    timeout: timedelta | None = None,
    keep_on_failure: timedelta | None = None,
    triggers: Sequence[Trigger] = (),
    namespace: str | None = None,
) -> Callable[[Callable[[Context, InputT], OutputT]], Pipeline[InputT, OutputT]]:
    """Declare ``fn(ctx, inputs) -> Output | None`` as the pipeline ``name``.

    ``inputs`` is a pydantic model; its JSON Schema is what the API validates starts against.
    ``concurrency``: ``parallel`` (default), ``queue`` (one run at a time in arrival order;
    ``max_pending`` bounds the waiting line) or ``cancel_previous`` (a new run cancels the
    running one). ``timeout`` ends a run that takes longer. ``keep_on_failure`` hands what a
    failed run still owns to the pipeline's stand for that long, for debugging.
    ``namespace``: where the pipeline, its runs, its stand and everything they declare live
    (who may see and start it is decided by role bindings in that namespace). Without it: the
    namespace its revision is delivered to (``graphenectl pipeline push -n``), or ``default``
    for code installed on the workers.
    """
    if not name or not all(c.isalnum() or c in "-_." for c in name):
        raise ValueError(f"pipeline name {name!r}: use letters, digits, '-', '_' and '.'")
    if not (isinstance(inputs, type) and issubclass(inputs, BaseModel)):
        raise TypeError(f"pipeline {name!r}: inputs must be a pydantic BaseModel subclass")
    if concurrency not in ("parallel", "queue", "cancel_previous"):
        raise ValueError(f"pipeline {name!r}: concurrency must be parallel, queue or cancel_previous")
    if namespace is not None and (
        not namespace or len(namespace) > 63 or not all(c.isalnum() or c == "-" for c in namespace)
    ):
        raise ValueError(f"pipeline {name!r}: namespace {namespace!r}: use letters, digits and '-' (at most 63)")
    if max_pending is not None and (concurrency != "queue" or max_pending < 0):
        raise ValueError(f"pipeline {name!r}: max_pending is a non-negative bound for concurrency='queue'")
    checked_triggers = triggers_check(name, triggers)

    def register(fn: Callable[[Context, InputT], OutputT]) -> Pipeline[InputT, OutputT]:
        collector: _Collector | None = getattr(_collecting, "current", None)
        registry = _REGISTRY if collector is None else collector.pipelines
        where = DEFAULT_NAMESPACE if collector is None else collector.namespace
        if collector is not None and namespace is not None and namespace != where:
            raise ValueError(
                f"pipeline {name!r} names namespace {namespace!r} but is delivered to namespace {where!r}: "
                f"push it with -n {namespace}, or drop namespace= to take the namespace it is pushed to"
            )
        existing = registry.get(name)
        definition: Pipeline[InputT, OutputT] = Pipeline(
            name=name,
            fn=fn,
            inputs=inputs,
            output=_output_model(fn),
            concurrency=concurrency,
            max_pending=max_pending,
            timeout=timeout,
            keep_on_failure=keep_on_failure,
            triggers=checked_triggers,
            description=inspect.getdoc(fn) or "",
            namespace=namespace or where,
        )
        if existing is not None and existing.source != definition.source:
            raise ValueError(f"pipeline {name!r} is defined twice: {existing.source} and {definition.source}")
        registry[name] = definition
        return definition

    return register
