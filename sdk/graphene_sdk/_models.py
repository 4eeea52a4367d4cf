"""What the ``Client`` returns: frozen dataclasses built from the REST API's answers.

Times are timezone-aware ``datetime``\\s, ids are strings. Each keeps the answer it was built
from in ``raw``, for fields a newer server adds.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

TERMINAL = frozenset({"succeeded", "failed", "cancelled", "timed_out"})


def _time(value: Any) -> datetime | None:
    if not value:
        return None
    return datetime.fromisoformat(str(value))


def _str_or_none(value: Any) -> str | None:
    return None if value is None else str(value)


def _dict(value: Any) -> dict[str, Any]:
    return dict(value) if isinstance(value, dict) else {}


@dataclass(frozen=True)
class OwnerRef:
    """A record in an owner chain: its id, kind and name."""

    id: str
    kind: str
    name: str


@dataclass(frozen=True)
class RecordInfo:
    """A record: what was declared (``spec``), what was observed (``outputs``), its phase, its
    one owner and its lifetime. ``owner_chain`` (nearest owner first) and ``children`` (counts
    by kind, and ``total``) are filled by ``records.get``, empty in listings."""

    id: str
    kind: str
    name: str
    namespace: str
    owner: str | None
    phase: str
    spec: dict[str, Any]
    outputs: dict[str, Any]
    labels: dict[str, str]
    expires_at: datetime | None
    generation: int
    observed_generation: int
    last_error: str
    created_by_run: str | None
    created_at: datetime | None
    updated_at: datetime | None
    owner_chain: tuple[OwnerRef, ...] = ()
    children: dict[str, int] = field(default_factory=dict)
    # Protected: a deletion stops here until it is unprotected; by whom (``user:alice``).
    protected: bool = False
    protected_by: str = ""
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_api(cls, data: dict[str, Any]) -> RecordInfo:
        return cls(
            id=str(data["id"]),
            kind=str(data["kind"]),
            name=str(data["name"]),
            namespace=str(data.get("namespace") or "default"),
            owner=_str_or_none(data.get("owner")),
            phase=str(data["phase"]),
            spec=_dict(data.get("spec")),
            outputs=_dict(data.get("outputs")),
            labels={str(k): str(v) for k, v in _dict(data.get("labels")).items()},
            expires_at=_time(data.get("expires_at")),
            generation=int(data.get("generation") or 0),
            observed_generation=int(data.get("observed_generation") or 0),
            last_error=str(data.get("last_error") or ""),
            created_by_run=_str_or_none(data.get("created_by_run")),
            created_at=_time(data.get("created_at")),
            updated_at=_time(data.get("updated_at")),
            owner_chain=tuple(
                OwnerRef(id=str(o["id"]), kind=str(o["kind"]), name=str(o["name"]))
                for o in data.get("owner_chain") or []
            ),
            children={str(k): int(v) for k, v in _dict(data.get("children")).items()},
            protected=bool(data.get("protected")),
            protected_by=str(data.get("protected_by") or ""),
            raw=data,
        )

    @property
    def ref(self) -> str:
        """``kind/name``, as graphenectl shows a record."""
        return f"{self.kind}/{self.name}"


@dataclass(frozen=True)
class TreeNode:
    """A record in a subtree: ``children`` are the records it owns, ``truncated`` says that
    deeper ones exist beyond the depth asked for."""

    id: str
    kind: str
    name: str
    phase: str
    expires_at: datetime | None
    children: tuple[TreeNode, ...]
    truncated: bool

    @classmethod
    def from_api(cls, data: dict[str, Any]) -> TreeNode:
        return cls(
            id=str(data["id"]),
            kind=str(data["kind"]),
            name=str(data["name"]),
            phase=str(data["phase"]),
            expires_at=_time(data.get("expires_at")),
            children=tuple(cls.from_api(c) for c in data.get("children") or []),
            truncated=bool(data.get("truncated")),
        )

    def walk(self) -> list[TreeNode]:
        """This node and every node below it, parents before their children."""
        nodes = [self]
        for child in self.children:
            nodes.extend(child.walk())
        return nodes


@dataclass(frozen=True)
class RecordEvent:
    """One entry of a record's history: a phase change, an error, a transfer, a TTL change."""

    id: int
    record: str
    type: str
    reason: str
    message: str
    data: dict[str, Any]
    actor: str | None
    created_at: datetime | None

    @classmethod
    def from_api(cls, data: dict[str, Any]) -> RecordEvent:
        return cls(
            id=int(data["id"]),
            record=str(data["record"]),
            type=str(data.get("type") or ""),
            reason=str(data.get("reason") or ""),
            message=str(data.get("message") or ""),
            data=_dict(data.get("data")),
            actor=_str_or_none(data.get("actor")),
            created_at=_time(data.get("created_at")),
        )


@dataclass(frozen=True)
class LogLine:
    """One log line of a record (or of a record it owns: ``record``/``record_name`` say whose)."""

    id: int
    record: str
    record_name: str
    at: datetime | None
    stream: str
    severity: str
    source: str
    message: str

    @classmethod
    def from_api(cls, data: dict[str, Any]) -> LogLine:
        return cls(
            id=int(data["id"]),
            record=str(data["record"]),
            record_name=str(data.get("record_name") or ""),
            at=_time(data.get("at")),
            stream=str(data.get("stream") or ""),
            severity=str(data.get("severity") or "info"),
            source=str(data.get("source") or ""),
            message=str(data.get("message") or ""),
        )


@dataclass(frozen=True)
class JournalEntry:
    """One journaled SDK call of a run: its sequence number, what it was, how it ended."""

    seq: int
    call: str
    status: str
    result: Any
    error: Any
    created_at: datetime | None
    completed_at: datetime | None

    @classmethod
    def from_api(cls, data: dict[str, Any]) -> JournalEntry:
        return cls(
            seq=int(data["seq"]),
            call=str(data["call"]),
            status=str(data["status"]),
            result=data.get("result"),
            error=data.get("error"),
            created_at=_time(data.get("created_at")),
            completed_at=_time(data.get("completed_at")),
        )


@dataclass(frozen=True)
class RunInfo:
    """A run as the server reports it. ``record`` is the root record of what it owns (its log
    and tree hang there); ``parent`` is the run that started it (``ctx.run``), if any.
    ``journal`` is filled by ``runs.get`` (at most the first 1000 calls,
    ``journal_truncated`` says if there are more), empty otherwise. ``namespace`` is its
    pipeline's. ``revision`` is the digest of the pipeline code it runs and replays (None: the
    code installed on the workers). ``cause`` says why it started (``{"type": "user"|"parent"|
    "upstream"|"cron"|"webhook", ...}``), ``cause_text`` in one line."""

    id: str
    pipeline: str
    status: str
    inputs: dict[str, Any]
    outputs: Any
    error: str
    raw: dict[str, Any] = field(repr=False, compare=False)
    number: int = 0
    record: str | None = None
    attempt: int = 0
    waiting_on: tuple[str, ...] = ()
    wake_at: datetime | None = None
    deadline_at: datetime | None = None
    created_at: datetime | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None
    journal: tuple[JournalEntry, ...] = ()
    journal_truncated: bool = False
    parent: str | None = None
    namespace: str = "default"
    revision: str | None = None
    cause: dict[str, Any] = field(default_factory=dict)
    cause_text: str = ""

    @classmethod
    def from_api(cls, data: dict[str, Any]) -> RunInfo:
        # GET /runs/{id}/ may nest the run under "run" next to its journal.
        run = data["run"] if isinstance(data.get("run"), dict) else data
        return cls(
            id=str(run["id"]),
            pipeline=str(run["pipeline"]),
            status=str(run["status"]),
            inputs=_dict(run.get("inputs")),
            outputs=run.get("outputs"),
            error=str(run.get("error") or ""),
            raw=data,
            number=int(run.get("number") or 0),
            record=_str_or_none(run.get("record")),
            attempt=int(run.get("attempt") or 0),
            waiting_on=tuple(str(w) for w in run.get("waiting_on") or []),
            wake_at=_time(run.get("wake_at")),
            deadline_at=_time(run.get("deadline_at")),
            created_at=_time(run.get("created_at")),
            started_at=_time(run.get("started_at")),
            finished_at=_time(run.get("finished_at")),
            journal=tuple(JournalEntry.from_api(e) for e in data.get("journal") or []),
            journal_truncated=bool(data.get("journal_truncated")),
            parent=_str_or_none(run.get("parent")),
            namespace=str(run.get("namespace") or "default"),
            revision=_str_or_none(run.get("revision")),
            cause=_dict(run.get("cause")),
            cause_text=str(run.get("cause_text") or ""),
        )

    @property
    def done(self) -> bool:
        """The run has ended: succeeded, failed, cancelled or timed out."""
        return self.status in TERMINAL


@dataclass(frozen=True)
class RunEvent:
    """A move of a run's status: from, to, why (``reason``, ``message``) and who made it
    (``actor``; None: Graphene itself)."""

    id: int
    from_status: str
    to_status: str
    reason: str
    message: str
    data: dict[str, Any]
    actor: str | None
    created_at: datetime | None

    @classmethod
    def from_api(cls, data: dict[str, Any]) -> RunEvent:
        return cls(
            id=int(data["id"]),
            from_status=str(data.get("from_status") or ""),
            to_status=str(data["to_status"]),
            reason=str(data.get("reason") or ""),
            message=str(data.get("message") or ""),
            data=_dict(data.get("data")),
            actor=_str_or_none(data.get("actor")),
            created_at=_time(data.get("created_at")),
        )

    @property
    def is_final(self) -> bool:
        """This move ended the run."""
        return self.to_status in TERMINAL


@dataclass(frozen=True)
class StandSummary:
    """A pipeline's stand in ``stands.list()``: how many subtrees it holds, how many records."""

    pipeline: str
    id: str
    holdings: int
    records: int

    @classmethod
    def from_api(cls, data: dict[str, Any]) -> StandSummary:
        return cls(
            pipeline=str(data["pipeline"]),
            id=str(data["id"]),
            holdings=int(data.get("holdings") or 0),
            records=int(data.get("records") or 0),
        )


@dataclass(frozen=True)
class StandHolding:
    """A subtree a stand holds: its root record and how many records the subtree has."""

    record: RecordInfo
    subtree_records: int


@dataclass(frozen=True)
class StandInfo:
    """What a pipeline's stand holds. ``id`` is None until a run first hands it something."""

    pipeline: str
    id: str | None
    holdings: tuple[StandHolding, ...]

    @classmethod
    def from_api(cls, pipeline: str, data: Any) -> StandInfo:
        if isinstance(data, list):  # the holdings alone
            data = {"pipeline": pipeline, "id": None, "holdings": data}
        return cls(
            pipeline=str(data.get("pipeline") or pipeline),
            id=_str_or_none(data.get("id")),
            holdings=tuple(
                StandHolding(RecordInfo.from_api(h), int(h.get("subtree_records") or 1))
                for h in data.get("holdings") or []
            ),
        )


@dataclass(frozen=True)
class ArtifactInfo:
    """An artifact's metadata: its name, digest and size, who holds it, which run published it."""

    id: str
    name: str
    sha256: str
    size: int
    content_type: str
    phase: str
    owner: str | None
    created_by_run: str | None
    pipeline: str | None
    labels: dict[str, str]
    expires_at: datetime | None
    created_at: datetime | None
    content_url: str
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)
    namespace: str = "default"

    @classmethod
    def from_api(cls, data: dict[str, Any]) -> ArtifactInfo:
        return cls(
            id=str(data["id"]),
            name=str(data["name"]),
            sha256=str(data["sha256"]),
            size=int(data.get("size") or 0),
            content_type=str(data.get("content_type") or "application/octet-stream"),
            phase=str(data.get("phase") or ""),
            owner=_str_or_none(data.get("owner")),
            created_by_run=_str_or_none(data.get("created_by_run")),
            pipeline=_str_or_none(data.get("pipeline")),
            labels={str(k): str(v) for k, v in _dict(data.get("labels")).items()},
            expires_at=_time(data.get("expires_at")),
            created_at=_time(data.get("created_at")),
            content_url=str(data.get("content_url") or ""),
            raw=data,
            namespace=str(data.get("namespace") or "default"),
        )
