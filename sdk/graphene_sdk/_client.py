"""A typed client for Graphene's REST API (standard library only), configured like graphenectl.

client = Client()                                        # graphenectl's current context
run = client.start(integration, Inputs(branch="main"))   # checked by mypy
for line in client.logs.follow(run.get().record):        # live, ends with the run
    print(line.message)
report = run.result()                                    # the pipeline's output model
"""

from __future__ import annotations

import dataclasses
import logging
import os
import urllib.parse
from collections.abc import Generator, Mapping
from typing import Any, Generic, TypeVar

from pydantic import BaseModel

from graphene_sdk import config, tls
from graphene_sdk._errors import ClientError
from graphene_sdk._http import Transport
from graphene_sdk._models import RunEvent, RunInfo
from graphene_sdk._pipeline import InputT, OutputT, Pipeline
from graphene_sdk._resources import Artifacts, Logs, Records, Runs, Stands
from graphene_sdk._retry import IDEMPOTENCY_HEADER, new_idempotency_key, retrying

R = TypeVar("R")

logger = logging.getLogger("graphene_sdk")


class Client:
    """Graphene from Python: start runs with typed inputs, and read what graphenectl reads.

    ``Client()`` connects as graphenectl does: the current context of its config file
    (``$XDG_CONFIG_HOME/graphene/config.yaml``), or the one named by ``context=`` or
    ``GRAPHENE_CONTEXT``, with ``GRAPHENE_SERVER`` and ``GRAPHENE_TOKEN`` overriding it; a
    ``server`` or ``token`` passed here wins over both (``graphene_sdk.config``). Nothing
    is configured: ``ConfigError``. ``target`` says what was chosen and from where.

    TLS (``graphene_sdk.tls``): an ``https://`` server's certificate is verified against the
    CA pinned for it — ``ca_file`` (a PEM file), ``ca_fingerprint`` (the CA is fetched from the
    server and kept only if its SHA-256 fingerprint is this one), ``GRAPHENE_CA_FILE``, or what
    ``graphenectl login`` saved for that server — else against the system's trust store; a
    certificate they do not vouch for fails every request (``ClientError``, code
    ``untrusted_certificate``) before anything is sent. A plain ``http://`` server needs
    ``insecure=True`` (or ``GRAPHENE_INSECURE=1``, or a context saved with ``--insecure``) and
    logs a warning.

    ``namespace`` is where listings look (``records``, ``runs``, ``artifacts``): the one passed
    here, else ``GRAPHENE_NAMESPACE``, else the context's (``graphenectl ctx set-namespace``);
    none (or ``"*"``) is every namespace the caller may see. Each listing takes its own
    ``namespace=`` too. Runs start in their pipeline's namespace, which its code names.

    The nouns: ``records``, ``logs``, ``runs``, ``stands``, ``artifacts``. A refused or failed
    request raises ``ClientError`` with the server's ``code``, ``detail`` and ``fields``.
    """

    def __init__(
        self,
        server: str | None = None,
        *,
        token: str | None = None,
        context: str | None = None,
        namespace: str | None = None,
        timeout: float = 30.0,
        ca_file: str | os.PathLike[str] | None = None,
        ca_fingerprint: str | None = None,
        insecure: bool = False,
    ) -> None:
        if ca_file is not None and ca_fingerprint is not None:
            raise ValueError("pass ca_file or ca_fingerprint, not both")
        given: tls.Trust | None = None
        if ca_file is not None:
            given = tls.Trust(ca_pem=config.ca_file_read(ca_file), source=f"ca_file={os.fspath(ca_file)}")
        elif insecure:
            given = tls.Trust(source="insecure=True", insecure=True)
        self.target = config.find_target(server=server, token=token, context=context, trust=given, namespace=namespace)
        if ca_fingerprint is not None:
            pem = tls.ca_fetch(self.target.server, ca_fingerprint, timeout=timeout)
            self.target = dataclasses.replace(
                self.target, trust=tls.Trust(ca_pem=pem, source=f"ca_fingerprint={tls.fingerprint(pem)}")
            )
        if self.target.trust.insecure:
            logger.warning(
                "graphene_sdk: plain HTTP to %s (%s): the token and all data cross the network unencrypted",
                self.target.server,
                self.target.trust.source,
            )
        self.timeout = timeout
        self._transport = Transport(self.target.server, self.target.token, timeout=timeout, trust=self.target.trust)
        self.records = Records(self._transport, namespace=self.namespace)
        self.logs = Logs(self._transport)
        self.runs = Runs(self._transport, namespace=self.namespace)
        self.stands = Stands(self._transport)
        self.artifacts = Artifacts(self._transport, namespace=self.namespace)

    def __repr__(self) -> str:
        return f"Client({self.server!r}, context={self.target.context!r}, namespace={self.namespace!r})"

    @property
    def server(self) -> str:
        return self.target.server

    @property
    def namespace(self) -> str | None:
        """The namespace listings narrow to (``None``: every namespace the caller may see)."""
        return self.target.namespace

    @property
    def token(self) -> str:
        return self.target.token

    def whoami(self) -> dict[str, Any]:
        """Who the token belongs to (``username``, ``is_staff``) and the server's version."""
        body: dict[str, Any] = self._transport.get("whoami/")
        return body

    def record_id(self, ref: str) -> str:
        """The record id graphenectl's reference names: a record id (or ``record/<id>``),
        ``run/<id>`` (the run's root record) or ``stand/<pipeline>`` (made if need be)."""
        kind, _, ident = ref.partition("/")
        if not ident:
            return ref
        if kind == "record":
            return ident
        if kind == "run":
            record = self.runs.get(ident).record
            if record is None:
                raise ClientError(f"run {ident} has no record yet; try again in a moment", status=409, code="conflict")
            return record
        if kind == "stand":
            return self.stands.ensure(ident)
        raise ValueError(f"{ref!r} is not a record reference: use <id>, record/<id>, run/<id> or stand/<pipeline>")

    # --- runs: start with typed inputs, and the shortcuts of ``runs`` -------------------------

    def start(
        self, pipeline: Pipeline[InputT, OutputT], inputs: InputT, *, idempotency_key: str | None = None
    ) -> RunHandle[OutputT]:
        """Start a run of ``pipeline`` with typed ``inputs``; the server validates them again
        (``ClientError`` 400 with per-field messages).

        Safe to retry: the start carries an idempotency key (``idempotency_key``, e.g. a CI
        build id so that a re-run job never starts twice; a fresh one per call otherwise), and
        connection errors, timeouts and 5xx answers are retried with backoff under that key:
        a start the server made but whose answer was lost is answered again, never repeated.
        """
        if not isinstance(inputs, pipeline.inputs):
            raise TypeError(f"{pipeline.name} takes {pipeline.inputs.__name__}, not {type(inputs).__name__}")
        data = self._start(pipeline.name, inputs.model_dump(mode="json"), idempotency_key)
        return RunHandle(self, str(data["id"]), pipeline.output)

    def start_by_name(self, name: str, inputs: dict[str, Any], *, idempotency_key: str | None = None) -> RunHandle[Any]:
        """Start a run of the pipeline called ``name`` with inputs as JSON values (retried as
        ``start`` is)."""
        data = self._start(name, inputs, idempotency_key)
        return RunHandle(self, str(data["id"]), None)

    def _start(self, name: str, inputs: Any, idempotency_key: str | None) -> Any:
        key = idempotency_key or new_idempotency_key()
        path = f"pipelines/{urllib.parse.quote(name)}/runs/"
        return retrying(
            lambda: self._transport.request(
                "POST", path, body={"inputs": inputs}, extra_headers={IDEMPOTENCY_HEADER: key}
            ),
            retryable=_retryable,
        )

    def plan(
        self,
        pipeline: Pipeline[Any, Any] | str,
        inputs: BaseModel | Mapping[str, Any] | None = None,
        *,
        revision: str | None = None,
    ) -> dict[str, Any]:
        """What a run of ``pipeline`` (a ``Pipeline`` or its name) with ``inputs`` would do,
        without doing it: ``POST /api/v1/pipelines/{name}/plan/`` (docs/pipelines.md, "Plans").

        The answer is the API's JSON: ``entries`` (the calls the run would make, in order, with
        placeholders such as ``<docker.container db: outputs.address>`` where it would read a
        value from outside), ``tree`` (the records it would own), ``complete`` and ``stopped``.
        ``revision``: plan that revision (id or digest prefix) instead of the active one.
        ``ClientError`` 400 for inputs that do not match the schema, 422 when the code raises.
        """
        name = pipeline if isinstance(pipeline, str) else pipeline.name
        if isinstance(inputs, BaseModel):
            if not isinstance(pipeline, str) and not isinstance(inputs, pipeline.inputs):
                raise TypeError(f"{name} takes {pipeline.inputs.__name__}, not {type(inputs).__name__}")
            document: Any = inputs.model_dump(mode="json")
        else:
            document = dict(inputs or {})
        body: dict[str, Any] = {"inputs": document}
        if revision is not None:
            body["revision"] = revision
        path = f"pipelines/{urllib.parse.quote(name)}/plan/"
        # A plan changes nothing: safe to send again after a connection error or a 5xx.
        answer: dict[str, Any] = retrying(
            lambda: self._transport.request("POST", path, body=body), retryable=_retryable
        )
        return answer

    def get(self, run_id: str) -> RunInfo:
        """``runs.get``: the run with its journal."""
        return self.runs.get(run_id)

    def cancel(self, run_id: str) -> RunInfo:
        """``runs.cancel``."""
        return self.runs.cancel(run_id)

    def resume(self, run_id: str) -> RunInfo:
        """``runs.resume``."""
        return self.runs.resume(run_id)

    def watch(
        self, run_id: str, *, interval: float = 0.5, timeout: float | None = None
    ) -> Generator[RunEvent, None, None]:
        """``runs.watch``: the run's status moves, until the one that ends it."""
        return self.runs.watch(run_id, interval=interval, timeout=timeout)

    def wait(self, run_id: str, *, timeout: float = 600.0) -> RunInfo:
        """``runs.wait``: poll until the run ends (or raise ``TimeoutError``)."""
        return self.runs.wait(run_id, timeout=timeout)


class RunHandle(Generic[R]):
    """A started run; ``result()`` returns the pipeline's output model."""

    def __init__(self, client: Client, run_id: str, output: type[BaseModel] | None) -> None:
        self.client = client
        self.id = run_id
        self._output = output

    def __repr__(self) -> str:
        return f"RunHandle({self.id})"

    def get(self) -> RunInfo:
        return self.client.runs.get(self.id)

    def wait(self, *, timeout: float = 600.0) -> RunInfo:
        return self.client.runs.wait(self.id, timeout=timeout)

    def watch(self, *, interval: float = 0.5, timeout: float | None = None) -> Generator[RunEvent, None, None]:
        return self.client.runs.watch(self.id, interval=interval, timeout=timeout)

    def cancel(self) -> RunInfo:
        return self.client.runs.cancel(self.id)

    def resume(self) -> RunInfo:
        return self.client.runs.resume(self.id)

    def result(self, *, timeout: float = 600.0) -> R:
        """Wait for the run; its output (typed) if it succeeded, else ``ClientError``."""
        info = self.wait(timeout=timeout)
        if info.status != "succeeded":
            raise ClientError(f"run {self.id} {info.status}: {info.error}", status=200, code=info.status)
        if self._output is None:
            outputs: R = info.outputs
            return outputs
        return self._output.model_validate(info.outputs)  # type: ignore[return-value]


def _retryable(exc: Exception) -> bool:
    """Worth another try with the same key: the server was not reached, did not answer in
    time, or failed (5xx); a 4xx says the request itself is wrong."""
    return isinstance(exc, ClientError) and (exc.status == 0 or exc.status >= 500)
