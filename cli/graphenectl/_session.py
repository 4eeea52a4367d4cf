"""Per-invocation state: the global options, and the client built from the resolved context.

The namespace a command works in comes from ``-n``/``--namespace`` (the command's own, else
the one before the command), else ``GRAPHENE_NAMESPACE``, else the context's; with none
chosen (or ``-A``), lists show every namespace the caller may see and creations go to
``default``, the server's own default."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from graphenectl import _config
from graphenectl._client import DEFAULT_TIMEOUT, Client
from graphenectl._errors import EXIT_NOT_FOUND, EXIT_USAGE, CliError, NotFoundError, UsageError
from graphenectl._resources import RESOURCES, split_ref

DEFAULT_NAMESPACE = "default"  # where the server puts what names no namespace


@dataclass
class Session:
    context: str | None = None
    timeout: float = DEFAULT_TIMEOUT
    namespace: str | None = None  # -n as given (checked), the command's over the global one
    all_namespaces: bool = False  # -A: lists show every namespace whatever was chosen
    _client: Client | None = field(default=None, repr=False)
    _target: _config.Target | None = field(default=None, repr=False)

    def choose(self, *, namespace: str | None, all_namespaces: bool = False) -> None:
        """Take ``-n``/``-A`` (the global ones, then a command's own, which win)."""
        if namespace is not None and all_namespaces:
            raise UsageError("-n/--namespace and -A/--all-namespaces exclude each other; give one")
        if namespace is not None:
            self.namespace, self.all_namespaces = _config.check_namespace(namespace), False
        elif all_namespaces:
            self.namespace, self.all_namespaces = None, True
        self._target = None

    def target(self) -> _config.Target:
        if self._target is None:
            self._target = _config.resolve(_config.load(), self.context, namespace=self.namespace)
        return self._target

    def client(self) -> Client:
        if self._client is None:
            target = self.target()
            self._client = Client(target.server, target.token, timeout=self.timeout, trust=target.trust)
        return self._client

    def list_namespace(self) -> str | None:
        """The namespace lists narrow to (``?namespace=``); ``None``: every namespace the caller
        may see (``-A``, ``-n '*'``, or none chosen), and tables gain a NAMESPACE column."""
        if self.all_namespaces:
            return None
        return self.target().namespace

    def create_namespace(self) -> str:
        """The one namespace a command acts in (a new stand, agent or secret goes there): the
        one chosen, else ``default``."""
        if self.namespace == _config.EVERY_NAMESPACE:
            raise UsageError("-n '*' means every namespace; this command acts in one: give its name")
        return self.target().namespace or DEFAULT_NAMESPACE


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
        # In the pipeline's namespace (its code names it), where its runs' stand is made too.
        namespace = client.get(f"pipelines/{pipeline}/").get("namespace") or DEFAULT_NAMESPACE
        try:
            made: dict[str, Any] = client.post(
                "records/", {"kind": "graphene.stand", "name": pipeline, "namespace": namespace}
            )
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


def trigger_find(ref: str) -> dict[str, Any]:
    """The trigger ``ref`` names: ``PIPELINE/NAME`` or ``trigger/PIPELINE/NAME`` (what ``-o
    name`` prints). Pipeline names are unique across namespaces, so no namespace is needed."""
    text = ref.removeprefix("trigger/").removeprefix("triggers/")
    pipeline, _, name = text.rpartition("/")
    if not pipeline or not name:
        raise UsageError(
            f"{ref!r} names no trigger: write it as PIPELINE/NAME, e.g. build/nightly",
            hint="graphenectl trigger list shows them",
        )
    client = session.client()
    found, _ = client.list("triggers/", {"pipeline": pipeline, "name": name}, limit=1)
    if found:
        return found[0]
    others, more = client.list("triggers/", {"pipeline": pipeline}, limit=20)
    if others:
        names = ", ".join(t["name"] for t in others) + (", ..." if more else "")
        raise NotFoundError(
            f"pipeline {pipeline!r} has no trigger {name!r}; its triggers: {names}",
            hint=f"graphenectl trigger list --pipeline {pipeline}",
        )
    raise NotFoundError(
        f"no trigger {name!r} of pipeline {pipeline!r}: the pipeline has no triggers you may see "
        "(its code declares them; they exist once a revision of it is active)",
        hint="graphenectl trigger list -A",
    )
