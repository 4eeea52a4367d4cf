"""What a pipeline sees: ``Context``.

It delegates to a runtime: the Graphene engine when a worker executes a run (journaled,
replayable), or the in-memory runtime of ``graphene_sdk.testing``. Pipeline code is the same."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from graphene_sdk._artifacts import ArtifactRef, artifact_name_error
from graphene_sdk._handles import Agent, Attached, AttachedAgent, Need, Resource, T, _host_key, _needs, _seconds
from graphene_sdk._placeholder import Placeholder
from graphene_sdk._runtime import DriftPolicy, Guarantee, Runtime
from graphene_sdk._secrets import SecretRef, encode_secret_refs

if TYPE_CHECKING:
    from pydantic import BaseModel

    from graphene_sdk._pipeline import InputT, OutputT, Pipeline


# How long ``ctx.publish_artifact`` keeps an artifact on the stand unless told otherwise.
DEFAULT_ARTIFACT_LIFETIME = timedelta(days=7)


class Context:
    """The run's handle to Graphene: declarations, steps, timers and the run's log."""

    def __init__(self, runtime: Runtime) -> None:
        self._runtime = runtime

    @property
    def run_id(self) -> str:
        return self._runtime.run_id

    def log(self, message: str, *, level: str = "info") -> None:
        """Write a line to the run's log (replay does not write it again)."""
        self._runtime.log(str(message), level)

    def declare(
        self,
        kind: str,
        name: str,
        spec: Mapping[str, Any] | None = None,
        *,
        labels: Mapping[str, str] | None = None,
        parent: Resource | None = None,
        children: Sequence[Resource] = (),
        reconcile_every: timedelta | float | None = None,
        on_drift: DriftPolicy = "heal",
        protect: bool = False,
    ) -> Resource:
        """Declare a record of ``kind``; returns at once while it converges.

        It is owned by this run, or by ``parent`` (a record this run declared); records in
        ``children`` are given to the new record, which becomes their owner. Resource
        libraries (``graphene_sdk.libs``) are built on this call. A ``ctx.secret(...)`` in
        ``spec`` is stored as ``{"$secret": name}``: the record holds the name, never the value.

        Once ready, the object is observed every ``reconcile_every`` (default: its kind's
        interval); a difference from the spec is healed (re-converged, the default) or, with
        ``on_drift="report"``, only recorded (the record turns ``drifted``).

        ``protect=True`` protects the record: a deletion that reaches it (this run's end, its
        owner's deletion, a TTL, an explicit delete) stops there; it and what it owns stay until
        someone unprotects it (``graphenectl unprotect``), and then the deletion finishes.
        Declaring it again without ``protect`` leaves the protection as it is.
        """
        if on_drift not in ("heal", "report"):
            raise ValueError(f"on_drift must be 'heal' or 'report', not {on_drift!r}")
        every = _seconds(reconcile_every, "reconcile_every")
        drift: dict[str, Any] = {"on_drift": on_drift}
        if every is not None:
            drift["reconcile_every"] = every
        if parent is not None and not isinstance(parent, Resource):
            raise TypeError("parent must be a Resource declared by this run (an Attached handle cannot own)")
        if any(not isinstance(c, Resource) for c in children):
            raise TypeError("children must be Resources declared by this run (an Attached handle cannot be owned)")
        if not isinstance(protect, bool):
            raise TypeError(f"protect must be True or False, not {protect!r}")
        record_id = self._runtime.declare(
            kind,
            name,
            encode_secret_refs(dict(spec or {})),
            dict(labels or {}),
            parent.id if parent is not None else None,
            [c.id for c in children],
            drift,
            **({"protect": True} if protect else {}),  # only when asked: runtimes that predate it work
        )
        return Resource(self._runtime, record_id, kind, name)

    def agent(self, name: str, *, labels: Mapping[str, str] | None = None, needs: Sequence[Need] = ()) -> Agent:
        """Declare an agent record (a machine this run will act on) and return its handle.

        Install the agent with ``install_script()`` (cloud-init user-data) or ``install_env()``;
        it dials out to Graphene, nothing listens on the machine. The record is ready while
        the agent is connected and, with ``needs``, only once its machine publishes them
        (``ctx.publish_capability``): ``ready()`` waits for both. Commands are delivered as
        soon as it is connected, so a run can install what is needed and then publish it.
        """
        record_id = self._runtime.agent(name, dict(labels or {}), _needs(needs))
        return Agent(self._runtime, record_id, "agent", name)

    def agent_via_ssh(
        self,
        name: str,
        *,
        host: str,
        user: str,
        key: SecretRef,
        host_key: str,
        port: int = 22,
        labels: Mapping[str, str] | None = None,
    ) -> Agent:
        """Declare an agent record, install the agent on ``host`` over SSH, and return once it connected.

        ``key`` names the private key in Graphene's secret store (``ctx.secret("deploy-key")``);
        it is read on the server for the install and never enters the run's journal, events or
        logs. ``host_key`` pins the server's public host key (``"ssh-ed25519 AAAA..."``): there
        is no trust on first use, and a server presenting another key fails the call without
        anything being uploaded. The agent is started detached (a systemd unit where one can
        be installed, else a background process with a pid file) and the SSH session is
        closed: from then on the agent's own outbound connection is the only one.

        The install converges: a replay, a retry or a second call finds the agent running and
        installs nothing again. The run suspends until the agent has connected.
        """
        if not isinstance(key, SecretRef):
            raise TypeError("key must be ctx.secret('<name>'): the private key is stored in Graphene, never passed")
        if not isinstance(host, str) or not host.strip() or any(c.isspace() for c in host):
            raise ValueError(f"host must be a host name or address, got {host!r}")
        if not isinstance(user, str) or not user or any(c.isspace() or c in "@:/" for c in user):
            raise ValueError(f"user must be a login name, got {user!r}")
        if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
            raise ValueError(f"port must be an integer from 1 to 65535, got {port!r}")
        target = {"host": host, "port": port, "user": user, "key": key.name, "host_key": _host_key(host_key)}
        record_id = self._runtime.agent_via_ssh(name, dict(labels or {}), target)
        return Agent(self._runtime, record_id, "agent", name)

    def attach_agent(self, name: str, *, needs: Sequence[Need] = ()) -> AttachedAgent:
        """A machine that exists already (its agent record, by name or id), to run commands on.

        The run does not own it. Raises ``ResourceFailed`` if no live agent has that name (or
        several do: pass the id), or if its published capabilities do not meet ``needs``
        (the error says what it publishes instead). Journaled: a replay attaches the same one.
        """
        if not isinstance(name, str) or not name:
            raise ValueError("attach_agent takes an agent's name or id")
        found = self._runtime.attach_agent(name, _needs(needs))
        return AttachedAgent(self._runtime, str(found["record_id"]), "agent", str(found["name"]))

    def select_agents(
        self, *, labels: Mapping[str, str] | None = None, needs: Sequence[Need] = ()
    ) -> list[AttachedAgent]:
        """The live machines whose agent labels match ``labels`` and whose capabilities meet
        ``needs``, by name: a snapshot taken once (journaled: a replay gets the same list),
        possibly empty. The run does not own them."""
        labels = dict(labels or {})
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in labels.items()):
            raise TypeError("labels maps label names to string values")
        found = self._runtime.select_agents(labels, _needs(needs))
        return [AttachedAgent(self._runtime, str(a["record_id"]), "agent", str(a["name"])) for a in found]

    def publish_capability(
        self,
        agent: Agent | AttachedAgent,
        name: str,
        *,
        labels: Mapping[str, str] | None = None,
        version: str = "",
    ) -> None:
        """Say that ``agent``'s machine offers ``name`` (e.g. after installing it there), so that
        later runs find it with ``need(name, ...)``; publishing again replaces version and labels."""
        if not isinstance(agent, Agent | AttachedAgent):
            raise TypeError("publish_capability takes an agent handle (ctx.agent, ctx.attach_agent, ...)")
        if not isinstance(name, str) or not name or len(name) > 100:
            raise ValueError(f"a capability name has 1 to 100 characters, got {name!r}")
        if not isinstance(version, str):
            raise TypeError("version is a string, e.g. '24.0'")
        labels = dict(labels or {})
        if not all(isinstance(k, str) and k and isinstance(v, str) for k, v in labels.items()):
            raise TypeError("labels maps label names to string values")
        self._runtime.publish_capability(agent.id, f"{agent.kind}/{agent.name}", name, version, labels)

    def secret(self, name: str) -> SecretRef:
        """A reference to the secret ``name`` in Graphene's store (create it over the API first).

        Only the name is kept wherever the reference goes (specs, the journal, logs); the
        value is read on the server where it is used. Nothing is looked up here: a missing
        secret fails the call that uses it, naming it.
        """
        return SecretRef(name)

    def attach(self, record_id: str) -> Attached:
        """A read-only handle to an existing record (another run's, a stand's) by its id."""
        kind, name = self._runtime.attach(str(record_id))
        return Attached(self._runtime, str(record_id), kind, name)

    def to_stand(self, handle: Resource, *, keep_for: timedelta | None = None, replace: bool = False) -> None:
        """Give ``handle`` and its subtree to the pipeline's stand, where it outlives this run.

        ``keep_for`` sets its TTL on the stand (extend or release it later); without it the
        subtree stays until someone deletes it. The stand holds one live record of a kind and
        name: if an earlier run left one there, this raises ``ResourceFailed`` saying so,
        unless ``replace=True``, which hands this one over and deletes that one (children
        first) once this one is accepted.
        """
        if not isinstance(handle, Resource):
            raise TypeError("to_stand takes a Resource declared by this run")
        label = f"{handle.kind}/{handle.name}"
        self._runtime.to_stand(handle.id, label, _seconds(keep_for, "keep_for"), replace)

    def publish_artifact(
        self,
        name: str,
        data: bytes | str | Path,
        *,
        content_type: str | None = None,
        keep_for: timedelta | None = DEFAULT_ARTIFACT_LIFETIME,
        labels: Mapping[str, str] | None = None,
    ) -> ArtifactRef:
        """Store ``data`` in Graphene's blob store as the artifact ``name`` and return a reference.

        ``data`` is bytes, text (stored as UTF-8) or a ``pathlib.Path`` to a file on the worker
        (streamed, never read into memory whole). ``content_type`` defaults to a guess from the
        name (else ``application/octet-stream``). The bytes are stored once per content
        (deduplicated by sha256) and the call is journaled with the reference only: a replay
        after a crash returns the same artifact and stores nothing again.

        Lifetime: the artifact is handed to the pipeline's *stand* at once, with ``keep_for``
        as its TTL (7 days by default; ``None`` keeps it until someone deletes it). Artifacts
        are what a CI run leaves behind for people and later runs (a build, a report), so
        they must outlive the run that made them, whether it succeeded or failed; the stand is
        where Graphene keeps what outlives a run, and the TTL is what deletes it in the end.
        Extend or release it like any stand holding (``graphenectl stand extend``).

        Within one run a name holds one content: publishing the same name again with the same
        bytes returns the same artifact, with other bytes it raises ``ResourceFailed``.
        """
        error = artifact_name_error(name)
        if error is not None:
            raise ValueError(f"artifact name {error}")
        if isinstance(data, str):
            source: bytes | Path = data.encode()
        elif isinstance(data, bytes | bytearray | memoryview):
            source = bytes(data)
        elif isinstance(data, Path):
            source = data  # read by the runtime, and only if the call is not journaled yet
        else:
            raise TypeError(f"data is bytes, str or a pathlib.Path, not {type(data).__name__}")
        if content_type is not None and (not isinstance(content_type, str) or "/" not in content_type):
            raise ValueError(f"content_type is a media type such as 'text/plain', not {content_type!r}")
        seconds = _seconds(keep_for, "keep_for")
        if seconds == 0:
            raise ValueError("keep_for must be positive (None keeps the artifact until it is deleted)")
        result = self._runtime.publish_artifact(name, source, content_type, seconds, dict(labels or {}))
        return ArtifactRef.from_result(result, self._runtime.read_artifact)

    def attach_artifact(self, name_or_id: str, *, pipeline: str | Pipeline[Any, Any] | None = None) -> ArtifactRef:
        """An artifact published earlier: by record id, or the newest of that name held by the
        stand of ``pipeline`` (default: this run's pipeline, so this or an earlier run of it).

        Journaled: a replay returns the same artifact even if a newer one was published
        meanwhile. Raises ``ResourceFailed`` if there is none (or it was deleted).
        """
        if not isinstance(name_or_id, str) or not name_or_id:
            raise ValueError("attach_artifact takes an artifact's name or id")
        name = pipeline if isinstance(pipeline, str) or pipeline is None else pipeline.name
        result = self._runtime.attach_artifact(name_or_id, name)
        return ArtifactRef.from_result(result, self._runtime.read_artifact)

    def run(self, pipeline: Pipeline[InputT, OutputT], inputs: InputT) -> OutputT:
        """Run a child pipeline to its end and return its output; the child dies with this run."""
        return self.run_all(pipeline, [inputs], concurrency=1)[0]

    def run_all(
        self, pipeline: Pipeline[InputT, OutputT], inputs: Sequence[InputT], *, concurrency: int = 4
    ) -> list[OutputT]:
        """Run a child per input, at most ``concurrency`` at once; outputs in input order.

        Raises ``ChildRunFailed`` (after all have ended) if any child did not succeed.
        """
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        for item in inputs:
            if not isinstance(item, pipeline.inputs):
                raise TypeError(f"{pipeline.name} takes {pipeline.inputs.__name__}, not {type(item).__name__}")
        dumped = [item.model_dump(mode="json") for item in inputs]
        outputs = self._runtime.run_children(pipeline, dumped, concurrency)
        model: type[BaseModel] | None = pipeline.output
        # A plan's recording pass answers placeholders (``_placeholder``): passed on as they are.
        results: list[OutputT] = [
            model.model_validate(o) if model is not None and o is not None and not isinstance(o, Placeholder) else o  # type: ignore[misc]
            for o in outputs
        ]
        return results

    def step(
        self,
        name: str,
        fn: Callable[..., T],
        *args: Any,
        guarantee: Guarantee = "at_least_once",
        timeout: timedelta | float | None = None,
        retries: int = 0,
        **kwargs: Any,
    ) -> Any:
        """Run ``fn(*args, **kwargs)`` as a checkpointed step and return its result as JSON.

        The result is journaled as JSON and returned in that form, on the first execution
        as on every replay (a pydantic model comes back as a dict, a tuple as a list), so
        both paths see the same value.

        At-least-once steps run again after a crash mid-step; at-most-once steps raise
        ``OutcomeUnknown`` instead. A completed step is never run again: replay returns the
        journaled result. ``retries`` re-runs a failing step with backoff before it fails.
        """
        if guarantee not in ("at_least_once", "at_most_once"):
            raise ValueError("guarantee must be 'at_least_once' or 'at_most_once'")
        if retries < 0:
            raise ValueError("retries must not be negative")
        seconds = _seconds(timeout, "timeout")
        return self._runtime.step(name, fn, args, kwargs, guarantee, seconds, retries)

    def sleep(self, duration: timedelta | float) -> None:
        """A durable timer: the run suspends and a worker resumes it when the time has come."""
        seconds = _seconds(duration, "duration")
        assert seconds is not None
        self._runtime.sleep(seconds)
