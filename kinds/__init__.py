"""The kind interface and the registry of kinds.

A kind teaches Graphene one sort of external object. It is a class registered under a name
in the ``graphene.kinds`` entry point group. Every method receives the record (read it, do
not write it: the services own every write) and must be safe to call again after a crash:

* ``create`` is adopt-or-create: it first looks for an object carrying the record's id as a
  marker (label, annotation, extended attribute) and adopts it; only if none exists does it
  create one, carrying the marker (invariant I4). It returns the observed outputs.
* ``delete`` is idempotent; "not found" is success.
* ``observe`` returns what exists now (``None``: the object is gone); ``diff`` compares it
  with the spec (``[]``: as specified). The drift scheduler calls both every
  ``drift_interval`` on ready records; on a difference it heals (re-runs ``create``, which
  must bring an existing object back to its spec) or reports, as the declaration says.
* Work that goes on elsewhere (a command on an agent's machine) raises ``NotYet`` from
  ``create``, ``delete`` or ``observe``: the call is repeated later, without counting an attempt.
  A ``create`` that waits on something a user should know about (an agent to connect)
  raises ``Waiting``: the same, plus one ``Waiting`` note in the record's history.
* An object on an agent's machine (``agent`` in the spec) is reached through
  ``kinds.machine.machines()`` only: a self-contained function and its JSON arguments run
  there for the record's operation, and the answer comes back in the kinds' own terms
  (a value, ``NotYet``, ``KindError``, ``PermanentError``, ``Abandoned``). A kind imports
  no app's models and not the agents app (``kinds/file.py`` is the worked example).
* Kinds named ``test.*`` are test kinds, loaded only with the ``GRAPHENE_TEST_KINDS`` setting.
* ``sweep`` lists external objects carrying a Graphene marker, for the orphan sweeper;
  ``delete_external`` removes one of them by its external id.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from importlib.metadata import entry_points
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    from apps.records.models import Record

ENTRY_POINT_GROUP = "graphene.kinds"


# A spec value that may be a secret reference (``ctx.secret(name)`` in the SDK, stored as
# ``{"$secret": name}``; the kind reads the value at the point of use, I7), in JSON Schema.
SECRET_REF_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"$secret": {"type": "string", "minLength": 1}},
    "required": ["$secret"],
    "additionalProperties": False,
}


def string_or_secret(description: str) -> dict[str, Any]:
    """The schema of a string spec field that also takes a secret reference."""
    return {"oneOf": [{"type": "string"}, SECRET_REF_SCHEMA], "description": description}


# A spec value that may name an artifact (an ``ArtifactRef`` in the SDK, stored as
# ``{"$artifact": "<record id>"}``); ``apps.artifacts.services.content_resolve`` reads its bytes.
ARTIFACT_REF_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"$artifact": {"type": "string", "format": "uuid", "minLength": 1}},
    "required": ["$artifact"],
    "additionalProperties": False,
}


def content_ref(description: str) -> dict[str, Any]:
    """The schema of a content field: text, a secret reference or an artifact reference.

    Kinds read such a field with ``apps.artifacts.services.content_resolve`` (bytes) and
    ``content_digest`` (``"sha256:<hex>"``, without reading an artifact's blob).
    """
    return {"oneOf": [{"type": "string"}, SECRET_REF_SCHEMA, ARTIFACT_REF_SCHEMA], "description": description}


class KindError(Exception):
    """A kind operation failed and may succeed if retried (network, busy, timeout)."""


class PermanentError(KindError):
    """A kind operation failed in a way retrying cannot fix (bad spec, name taken by a stranger)."""


class NotYet(KindError):
    """The operation is under way elsewhere (a command on an agent's machine): call again later.

    Not a failure: it counts no attempt and writes no error event. The records app calls the
    operation again after ``retry_in`` seconds, or sooner when what it waits on wakes it.
    """

    def __init__(self, message: str, *, retry_in: float = 5.0) -> None:
        super().__init__(message)
        self.retry_in = retry_in


class Waiting(NotYet):
    """Nothing is wrong yet: the object waits on something outside Graphene's hands (an agent
    that has not dialled in). As ``NotYet`` it counts no attempt, so the wait has no bound of
    its own (the owner's lifetime, a run's deadline or a deletion ends it); unlike it, the
    record's history says what it waits on, once, as a ``note`` event with reason ``Waiting``.
    """


@dataclass(frozen=True)
class Drift:
    field: str
    desired: Any
    actual: Any


@dataclass(frozen=True)
class Observed:
    outputs: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Marked:
    """An external object carrying a Graphene marker, as listed by ``sweep``."""

    external_id: str
    record_id: str


class Kind:
    """Base class of every kind. Subclasses set ``name``, ``description``, ``spec_schema``."""

    name: ClassVar[str] = ""
    description: ClassVar[str] = ""
    spec_schema: ClassVar[Mapping[str, Any]] = {"type": "object"}
    # How often the drift scheduler observes a ready record of this kind (a declaration may
    # override it with ``reconcile_every``); None: never (nothing outside can drift).
    drift_interval: ClassVar[timedelta | None] = timedelta(minutes=5)
    # The spec fields that say where the object lives (a path, an agent's machine). A
    # re-declaration that changes one moves the object: the records service removes it from
    # the old place (``delete`` on the record with its old spec) before ``create`` makes it
    # at the new one, so nothing is left behind.
    placement: ClassVar[tuple[str, ...]] = ()

    def create(self, record: Record) -> dict[str, Any]:
        raise PermanentError(f"kind {self.name} cannot create objects")

    def observe(self, record: Record) -> Observed | None:
        return Observed(outputs=dict(record.outputs))

    def diff(self, record: Record, observed: Observed) -> list[Drift]:
        return []

    def delete(self, record: Record) -> None:
        """Remove the object; succeed if it is already gone."""

    def sweep(self) -> Iterable[Marked]:
        return ()

    def delete_external(self, external_id: str) -> None:
        """Remove an orphaned object found by ``sweep``."""


class UnknownKind(LookupError):
    pass


# Kinds named under this prefix exist to exercise the machinery (``kinds/testing.py``): they
# are loaded only where ``GRAPHENE_TEST_KINDS`` is on (tests, development, the demo).
TEST_KIND_PREFIX = "test."

_lock = threading.Lock()
_registry: dict[str, Kind] | None = None


def load(*, test_kinds: bool) -> dict[str, Kind]:
    """Every kind installed under the entry point group, by name; ``test.*`` kinds only with
    ``test_kinds`` (otherwise their modules are not even imported)."""
    found: dict[str, Kind] = {}
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if ep.name.startswith(TEST_KIND_PREFIX) and not test_kinds:
            continue
        cls = ep.load()
        if not (isinstance(cls, type) and issubclass(cls, Kind)):
            raise TypeError(f"entry point {ep.name} = {ep.value} is not a graphene Kind")
        if cls.name != ep.name:
            raise TypeError(f"entry point {ep.name} = {ep.value} loads a kind named {cls.name!r}")
        found[ep.name] = cls()
    return found


def registry() -> dict[str, Kind]:
    """All installed kinds by name, loaded once per process (test kinds as the
    ``GRAPHENE_TEST_KINDS`` setting says)."""
    global _registry
    if _registry is None:
        with _lock:
            if _registry is None:
                from django.conf import settings

                _registry = load(test_kinds=settings.GRAPHENE_TEST_KINDS)
    return _registry


def get_kind(name: str) -> Kind:
    try:
        return registry()[name]
    except KeyError:
        known = ", ".join(sorted(registry()))
        hint = " (test kinds are loaded only with GRAPHENE_TEST_KINDS on)" if name.startswith(TEST_KIND_PREFIX) else ""
        raise UnknownKind(f"unknown kind {name!r}{hint}; installed kinds: {known}") from None


__all__ = [
    "ARTIFACT_REF_SCHEMA",
    "ENTRY_POINT_GROUP",
    "SECRET_REF_SCHEMA",
    "TEST_KIND_PREFIX",
    "Drift",
    "Kind",
    "KindError",
    "Marked",
    "NotYet",
    "Observed",
    "PermanentError",
    "UnknownKind",
    "Waiting",
    "content_ref",
    "get_kind",
    "load",
    "registry",
    "string_or_secret",
]
