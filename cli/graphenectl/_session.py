"""Per-invocation state: the global options, and the client built from the resolved context."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from graphenectl import _config
from graphenectl._client import DEFAULT_TIMEOUT, Client
from graphenectl._errors import EXIT_NOT_FOUND, EXIT_USAGE, CliError, NotFoundError
from graphenectl._resources import RESOURCES, split_ref


@dataclass
class Session:
    context: str | None = None
    timeout: float = DEFAULT_TIMEOUT
    _client: Client | None = field(default=None, repr=False)

    def target(self) -> _config.Target:
        return _config.resolve(_config.load(), self.context)

    def client(self) -> Client:
        if self._client is None:
            target = self.target()
            self._client = Client(target.server, target.token, timeout=self.timeout, trust=target.trust)
        return self._client


session = Session()


def get_record(ref: str) -> dict[str, Any]:
    """The record a reference names: ``record/<id>``, ``run/<id>`` (its root record),
    ``stand/<pipeline>`` or a bare id (a record id, else a run id)."""
    client = session.client()
    kind, ident = split_ref(ref)
    if kind.name == "record":
        try:
            body: dict[str, Any] = client.get(f"records/{ident}/")
            return body
        except CliError as exc:
            if exc.exit_code != EXIT_NOT_FOUND or "/" in ref:
                raise
            try:  # a bare id may be a run's: people copy run ids from `get runs`
                run = client.get(f"runs/{ident}/")
            except CliError:
                raise exc from None
            return _run_record(run)
    if kind.name == "run":
        return _run_record(client.get(f"runs/{ident}/"))
    if kind.name == "stand":
        body = client.get(f"records/{stand_id(ident)}/")
        return body
    raise CliError(
        f"{ref!r} is not a record; use record/<id>, run/<id>, stand/<pipeline> or a record id", exit_code=EXIT_USAGE
    )


def record_id(ref: str, *, owner: bool = False) -> str:
    """The record id for ``ref`` (an owner, a target): a bare or ``record/`` id is taken as is
    (the server says if it does not exist); ``run/<id>`` and ``stand/<pipeline>`` are looked up.
    ``owner``: ``ref`` is to own something (``apply --owner``, ``transfer --to``), so a
    pipeline's stand that does not exist yet is made (see ``stand_id``)."""
    kind, ident = split_ref(ref)
    if kind is RESOURCES["record"]:
        return ident
    if kind.name == "stand":
        return stand_id(ident, make=owner)
    return str(get_record(ref)["id"])


def stand_id(pipeline: str, *, make: bool = False) -> str:
    """The id of the pipeline's stand. A stand is made when a run first hands it something, and
    reading one makes none; with ``make``, one that does not exist yet is made here, as
    ``graphenectl apply graphene.stand <pipeline>`` would (a 404 first if no such pipeline)."""
    client = session.client()
    stand = client.get(f"stands/{pipeline}/")
    if stand["id"] is None and make:
        try:
            made: dict[str, Any] = client.post("records/", {"kind": "graphene.stand", "name": pipeline})
            return str(made["id"])
        except CliError:
            stand = client.get(f"stands/{pipeline}/")  # made meanwhile (by a run, another command)?
            if stand["id"] is None:
                raise
    if stand["id"] is None:
        raise NotFoundError(
            f"the stand of {pipeline!r} does not exist yet: nothing has been handed to it",
            hint=f"a run makes it when it hands something over; `graphenectl transfer <id> --to stand/{pipeline}`",
        )
    return str(stand["id"])


def _run_record(run: dict[str, Any]) -> dict[str, Any]:
    data = run.get("run", run)
    if not data.get("record"):
        raise CliError(f"run {data['id']} has no record yet (status {data['status']}); try again in a moment")
    body: dict[str, Any] = session.client().get(f"records/{data['record']}/")
    return body
