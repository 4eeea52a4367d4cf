"""How a kind acts on an agent's machine: the machine-call interface.

A kind whose object lives on a machine that only an agent reaches (``agent`` in its spec)
does not talk to the agent, its commands or their rows: it hands a self-contained function
and its JSON arguments (a ``Call``) to ``machines()`` and gets back the function's value or
one of the kinds' own errors. Graphene's agents app implements ``Machines``
(``apps/agents/machine.py``) and installs it when Django starts (``AgentsConfig.ready``), so
a kind written outside this repository imports nothing but ``kinds`` to run on a machine,
and nothing here imports Graphene's apps.

Two ways to run a function there, one for each way a kind waits:

* ``run``: one operation of a record (its create, observation or deletion) as a durable
  command. The worker waits a moment (``wait``) for the result; otherwise ``NotYet``, and the
  record's convergence or deletion is called again when the command ends (or after a
  while): the call then takes the result, once. A command sent for an earlier generation of
  the spec never answers for a later one (``op`` is keyed by the generation, except for a
  deletion). ``observe`` is ``run`` for an observation: ``NotYet`` at once while the agent
  is not connected.
* ``request``: one call waited for in place, by the very worker that makes it (the docker
  kinds send each HTTP request to the machine's engine this way, many per operation). It is
  abandoned if the agent leaves meanwhile or the timeout passes; it never wakes the record.
  Nothing outlives the wait, so an implementation need not store it: Graphene's agents app
  sends an ``in_process`` one over the agent's connection without a command row.

What the machine being away means, in both: a create waits (``NotYet``) while the agent is
only away, fails with ``KindError`` once it is lost (its record turned ``drifted`` after the
grace period) and with ``PermanentError`` once its record is deleted; an observation waits;
a deletion waits too, but never forever: once the agent has been away
``GRAPHENE_AGENT_LOST_DELETE_DEADLINE_SECONDS`` past the deletion request (or at once if
the agent record is gone) it raises ``Abandoned``, and the kind records what may be left on
the machine with ``abandon`` (the record is deleted anyway).

The function reports whether retrying can help by the type of exception it raises there:
``PERMANENT_ERROR_TYPES`` fail the record (``PermanentError``), any other is a ``KindError``
(retried with backoff). A ``request``'s failure is always a ``KindError``.
"""

from __future__ import annotations

import inspect
import textwrap
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from typing import TYPE_CHECKING, Any, Literal, Protocol

if TYPE_CHECKING:
    from apps.records.models import Record

# What a kind method is doing when it reaches the machine: it decides what an absent agent means.
Purpose = Literal["create", "observe", "delete"]

# How long ``run`` waits for a command's result before it lets go (``NotYet``).
WAIT_SECONDS = 2.0

# The exception types (by name, as the machine reports them) that retrying cannot fix.
PERMANENT_ERROR_TYPES = frozenset({"FileExistsError", "ValueError", "IsADirectoryError", "NotADirectoryError"})


class Abandoned(Exception):
    """The machine is gone for good: the object on it cannot be reached any more."""


class MachinesNotInstalled(RuntimeError):
    """No implementation of ``Machines`` is installed in this process."""


@cache
def _source(fn: Callable[..., Any]) -> str:
    return textwrap.dedent(inspect.getsource(fn))


@dataclass(frozen=True)
class Call:
    """``fn(*args, **kwargs)`` on a machine.

    ``fn`` is self-contained: its source is what travels, so it imports what it needs inside
    its body (the standard library: the agent has nothing else) and calls nothing of its
    module. ``args`` and ``kwargs`` are JSON, and so is what it returns.
    ``sealed``: the arguments carry a secret's value, so the command is stored encrypted (I7).
    ``in_process``: ``fn`` is quick and bounded by its own timeouts, so the agent may call it
    in a thread of its own process instead of a fresh interpreter (about 100 ms less a call),
    and a ``request`` of it may travel as a live call (no command row).
    """

    fn: Callable[..., Any]
    args: Sequence[Any] = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    sealed: bool = False
    in_process: bool = False

    def payload(self) -> dict[str, Any]:
        """The ``call`` command's payload: the function's source and name, its arguments."""
        return {
            "source": _source(self.fn),
            "name": self.fn.__name__,
            "args": list(self.args),
            "kwargs": dict(self.kwargs),
        }


class Machines(Protocol):
    """Running functions on agents' machines for records (see the module's docstring).

    ``agent_id`` is the agent record's id, as a kind's spec holds it; one that is not a UUID
    is a ``PermanentError``.
    """

    def run(
        self, record: Record, agent_id: str, op: str, call: Call, *, deleting: bool = False, wait: float = WAIT_SECONDS
    ) -> Any:
        """``call`` on the machine for ``record``'s operation ``op`` (``write``, ``remove``...):
        its value; ``NotYet`` while the command is under way; ``Abandoned`` (``deleting``
        only) once the machine is gone for good."""
        ...

    def observe(self, record: Record, agent_id: str, call: Call) -> Any:
        """``call`` on the machine for ``record``'s observation: ``NotYet`` (look again next
        interval, no error) while the agent is not connected, since its own record says so."""
        ...

    def request(self, record: Record, agent_id: str, op: str, call: Call, *, purpose: Purpose, timeout: float) -> Any:
        """``call`` on the machine now, waited for in place: its value. ``timeout`` bounds the
        function (it bounds itself; the machine stops it a little later, and the wait here
        gives up later still); ``op`` names it in messages and on its commands (``sync:<op>``).
        The agent not connected, or leaving meanwhile: as ``purpose`` says (module docstring)."""
        ...

    def abandon(self, record: Record, error: Abandoned, *, left: str) -> None:
        """Record that ``record``'s object on the machine was given up on (``left``: what may
        be left there, e.g. ``the file /etc/app.conf``); the record is deleted anyway."""
        ...


_installed: Machines | None = None


def install(impl: Machines | None) -> Machines | None:
    """Make ``impl`` what ``machines()`` returns in this process; returns the one it replaces."""
    global _installed
    previous, _installed = _installed, impl
    return previous


def machines() -> Machines:
    """The installed ``Machines``."""
    if _installed is None:
        raise MachinesNotInstalled(
            "no machine-call implementation is installed, so no kind can reach an agent's machine: Graphene's "
            "agents app installs one when Django starts (put apps.agents in INSTALLED_APPS and call django.setup()); "
            "outside Graphene, call kinds.machine.install(...) with your own first"
        )
    return _installed


__all__ = [
    "PERMANENT_ERROR_TYPES",
    "WAIT_SECONDS",
    "Abandoned",
    "Call",
    "Machines",
    "MachinesNotInstalled",
    "Purpose",
    "install",
    "machines",
]
