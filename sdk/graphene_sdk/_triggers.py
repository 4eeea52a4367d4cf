"""Triggers: what starts a pipeline's runs besides a person or a parent run.

    @pipeline("deploy", inputs=DeployInputs, triggers=[
        upstream("build", on="succeeded", inputs=lambda up: {"image": up.outputs["image"]}),
        cron("0 3 * * *", timezone="Europe/Berlin", inputs={"env": "staging"}),
        webhook("push", secret="GITHUB_HOOK_SECRET", inputs=lambda event: {"ref": event["ref"]}),
    ])

Each becomes a trigger of the pipeline on the server when the code is activated (pushed,
synced from git, or installed on the workers); a trigger that vanished from the code is
deleted, a changed one replaced. ``spec()`` is what the server stores and compares; the
``inputs`` callables stay in the code and are called where the code is loaded.
"""

from __future__ import annotations

import inspect
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

Outcome = Literal["succeeded", "failed", "any"]
Missed = Literal["skip", "latest"]

TRIGGER_TYPES = ("upstream", "cron", "webhook")


@dataclass(frozen=True)
class UpstreamRun:
    """The run whose end fired an ``upstream`` trigger, as its ``inputs`` callable sees it."""

    id: str
    pipeline: str
    number: int
    status: str
    inputs: dict[str, Any]
    outputs: Any


def _name_ok(value: str) -> bool:
    return bool(value) and len(value) <= 100 and all(c.isalnum() or c in "-_." for c in value)


def _callable_name(fn: Callable[..., Any] | None) -> str | None:
    if fn is None:
        return None
    return f"{getattr(fn, '__module__', '?')}:{getattr(fn, '__qualname__', repr(fn))}"


def _check_callable(kind: str, fn: Any) -> None:
    if fn is None:
        return
    if not callable(fn):
        raise TypeError(f"{kind}(inputs=...) must be a function of one argument returning the run's inputs")
    try:
        inspect.signature(fn).bind(None)
    except TypeError:
        raise TypeError(f"{kind}(inputs=...): {fn!r} must accept exactly one argument") from None
    except ValueError:  # builtins without a signature: called as they are
        pass


@dataclass(frozen=True)
class Trigger(ABC):
    """Base of the three trigger types: a name unique in its pipeline and a ``spec()``."""

    name: str

    @property
    @abstractmethod
    def type(self) -> str: ...

    @abstractmethod
    def spec(self) -> dict[str, Any]: ...


@dataclass(frozen=True)
class Upstream(Trigger):
    """Start a run when a run of ``pipeline`` ends with ``on`` (``failed`` includes timed out;
    ``any`` includes cancelled). ``inputs(UpstreamRun) -> dict`` gives the new run's inputs."""

    pipeline: str = ""
    on: Outcome = "succeeded"
    inputs: Callable[[UpstreamRun], Mapping[str, Any]] | None = field(default=None, compare=False)

    @property
    def type(self) -> str:
        return "upstream"

    def spec(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "type": "upstream",
            "pipeline": self.pipeline,
            "on": self.on,
            "inputs": _callable_name(self.inputs),
        }


@dataclass(frozen=True)
class Cron(Trigger):
    """Start a run at each instant of ``schedule`` (five cron fields, or six with seconds last)
    in ``timezone``, with ``inputs``. ``missed``: what happens to instants that passed while
    the scheduler was down — ``skip`` them (the default) or fire the ``latest`` once."""

    schedule: str = ""
    timezone: str = "UTC"
    inputs: Mapping[str, Any] = field(default_factory=dict)
    missed: Missed = "skip"

    @property
    def type(self) -> str:
        return "cron"

    def spec(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "type": "cron",
            "schedule": self.schedule,
            "timezone": self.timezone,
            "inputs": dict(self.inputs),
            "missed": self.missed,
        }


@dataclass(frozen=True)
class Webhook(Trigger):
    """Start a run for each delivery to ``POST /hooks/{pipeline}/{name}`` signed with the value
    of the secret ``secret`` (GitHub's ``X-Hub-Signature-256``, or ``Authorization: Bearer``).
    The body arrives as the run's reserved ``event`` input (the input model declares it);
    ``inputs(event) -> dict`` gives the other inputs."""

    event: str = ""
    secret: str = ""
    inputs: Callable[[Any], Mapping[str, Any]] | None = field(default=None, compare=False)

    @property
    def type(self) -> str:
        return "webhook"

    def spec(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "type": "webhook",
            "event": self.event,
            "secret": self.secret,
            "inputs": _callable_name(self.inputs),
        }


def upstream(
    pipeline: str,
    *,
    on: Outcome = "succeeded",
    inputs: Callable[[UpstreamRun], Mapping[str, Any]] | None = None,
    name: str | None = None,
) -> Upstream:
    """A run starts when a run of ``pipeline`` (in the same namespace) ends with ``on``."""
    if not _name_ok(pipeline):
        raise ValueError(f"upstream({pipeline!r}): name a pipeline (letters, digits, '-', '_' and '.')")
    if on not in ("succeeded", "failed", "any"):
        raise ValueError(f"upstream({pipeline!r}, on={on!r}): on is 'succeeded', 'failed' or 'any'")
    _check_callable("upstream", inputs)
    return Upstream(name=name or f"after-{pipeline}", pipeline=pipeline, on=on, inputs=inputs)


def cron(
    schedule: str,
    *,
    timezone: str = "UTC",
    inputs: Mapping[str, Any] | None = None,
    missed: Missed = "skip",
    name: str | None = None,
) -> Cron:
    """A run starts at each instant of ``schedule``; the server checks the expression and the
    timezone when the code is delivered."""
    fields = schedule.split() if isinstance(schedule, str) else []
    if len(fields) not in (5, 6):
        raise ValueError(
            f"cron({schedule!r}): give five fields (minute hour day month weekday), "
            "or six with seconds last, e.g. '*/15 * * * *'"
        )
    if missed not in ("skip", "latest"):
        raise ValueError(f"cron({schedule!r}, missed={missed!r}): missed is 'skip' or 'latest'")
    if inputs is not None and not isinstance(inputs, Mapping):
        raise TypeError(f"cron({schedule!r}, inputs=...): a dict of the run's inputs")
    return Cron(
        name=name or "cron",
        schedule=" ".join(fields),
        timezone=timezone,
        inputs=dict(inputs or {}),
        missed=missed,
    )


def webhook(
    event: str,
    *,
    secret: str,
    inputs: Callable[[Any], Mapping[str, Any]] | None = None,
    name: str | None = None,
) -> Webhook:
    """A run starts for each signed delivery of ``event`` (GitHub's ``X-GitHub-Event``) to
    ``/hooks/{pipeline}/{name}`` (``name`` defaults to the event)."""
    if not _name_ok(event):
        raise ValueError(f"webhook({event!r}): name the event (letters, digits, '-', '_' and '.'), e.g. 'push'")
    if not secret or not all(c.isalnum() or c in "-_." for c in secret):
        raise ValueError(f"webhook({event!r}, secret=...): the name of a secret of the pipeline's namespace")
    _check_callable("webhook", inputs)
    return Webhook(name=name or event, event=event, secret=secret, inputs=inputs)


def triggers_check(pipeline_name: str, triggers: Sequence[Any]) -> tuple[Trigger, ...]:
    """The pipeline's triggers, refused unless each is a trigger and their names are unique."""
    seen: set[str] = set()
    for trigger in triggers:
        if not isinstance(trigger, Trigger):
            raise TypeError(
                f"pipeline {pipeline_name!r}: triggers are made with upstream(...), cron(...) or webhook(...), "
                f"not {trigger!r}"
            )
        if not _name_ok(trigger.name):
            raise ValueError(f"pipeline {pipeline_name!r}: trigger name {trigger.name!r}: use letters, digits, '-_.'")
        if trigger.name in seen:
            raise ValueError(f"pipeline {pipeline_name!r} has two triggers named {trigger.name!r}: give one a name=...")
        seen.add(trigger.name)
    return tuple(triggers)
