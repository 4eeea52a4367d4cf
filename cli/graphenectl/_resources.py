"""The nouns graphenectl reads: their REST paths, table columns and ``-o name`` form.

References on the command line are ``TYPE/ID`` (``record/<uuid>``, ``run/<uuid>``,
``pipeline/hello``, ``stand/hello``, ``agent/<uuid>``, ``kind/file``, ``revision/<digest prefix>``,
``trigger/<pipeline>/<name>``) or a bare id, which means a record.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from graphenectl._errors import UsageError
from graphenectl._output import Column, error_summary
from graphenectl._time import age, between, short_time, ttl


def _labels(item: dict[str, Any]) -> str:
    labels = item.get("labels") or {}
    return ",".join(f"{k}={v}" for k, v in labels.items()) or "-"


def _first_line(text: Any, limit: int = 80) -> str:
    line = str(text or "").strip().splitlines()[0] if str(text or "").strip() else ""
    return line if len(line) <= limit else line[: limit - 1] + "…"


def short_digest(digest: Any) -> str:
    """A revision's digest as people read it (its first 12 digits); ``-``: none (code
    installed on the workers)."""
    return str(digest)[:12] if digest else "-"


def _input_names(item: dict[str, Any]) -> str:
    props = (item.get("input_schema") or {}).get("properties") or {}
    return ",".join(props) or "-"


RECORD_COLUMNS = [
    Column("ID", lambda r: r["id"]),
    Column("KIND", lambda r: r["kind"]),
    Column("NAME", lambda r: r["name"]),
    Column("PHASE", lambda r: r["phase"], styled=True),
    Column("OWNER", lambda r: r.get("owner")),
    Column("TTL", lambda r: ttl(r.get("expires_at"))),
    Column("AGE", lambda r: age(r.get("created_at"))),
    Column("NAMESPACE", lambda r: r.get("namespace"), wide=True),
    Column("GEN", lambda r: f"{r.get('observed_generation')}/{r.get('generation')}", wide=True),
    Column("PROTECTED", lambda r: (r.get("protected_by") or "yes") if r.get("protected") else "-", wide=True),
    Column("LABELS", _labels, wide=True),
    Column("ERROR", lambda r: _first_line(error_summary(str(r.get("last_error") or ""))), wide=True),
]

RUN_COLUMNS = [
    Column("ID", lambda r: r["id"]),
    Column("PIPELINE", lambda r: r["pipeline"]),
    Column("#", lambda r: r.get("number")),
    Column("STATUS", lambda r: r["status"], styled=True),
    Column("DURATION", lambda r: between(r.get("started_at"), r.get("finished_at"))),
    Column("AGE", lambda r: age(r.get("created_at"))),
    Column("CAUSE", lambda r: _first_line(r.get("cause_text"), 60) or "-"),
    Column("WAITING ON", lambda r: ",".join(map(str, r.get("waiting_on") or [])) or "-", wide=True),
    Column("REVISION", lambda r: short_digest(r.get("revision")), wide=True),
    Column("RECORD", lambda r: r.get("record"), wide=True),
    Column("ATTEMPT", lambda r: r.get("attempt"), wide=True),
    Column("ERROR", lambda r: _first_line(error_summary(str(r.get("error") or ""))), wide=True),
]


def _concurrency(pipeline: dict[str, Any]) -> str:
    """``queue (at most 5 waiting)``: the policy, and the bound of its waiting line if any."""
    policy = str(pipeline.get("concurrency") or "-")
    bound = pipeline.get("max_pending")
    return f"{policy} (at most {bound} waiting)" if bound is not None else policy


PIPELINE_COLUMNS = [
    Column("NAME", lambda p: p["name"]),
    Column("CONCURRENCY", lambda p: _concurrency(p)),
    Column("TIMEOUT", lambda p: f"{p['timeout_seconds']}s" if p.get("timeout_seconds") else "-"),
    Column("INPUTS", _input_names),
    Column("REVISION", lambda p: short_digest(p.get("revision"))),
    Column("DESCRIPTION", lambda p: _first_line(p.get("description"), 60)),
    Column("SOURCE", lambda p: p.get("source"), wide=True),
]


def revision_origin(revision: dict[str, Any]) -> str:
    """Where a revision came from: ``push`` (a directory), or its git source at a commit."""
    if not revision.get("source"):
        return "push"
    commit = str(revision.get("commit") or "")
    return f"{revision['source']}@{commit[:12]}" if commit else str(revision["source"])


REVISION_COLUMNS = [
    Column("DIGEST", lambda r: short_digest(r.get("digest"))),
    Column("PIPELINES", lambda r: ",".join(r.get("pipelines") or []) or "-"),
    Column("SIZE", lambda r: human_size(r.get("size"))),
    Column("FROM", revision_origin),
    Column("BY", lambda r: r.get("created_by") or "-"),
    Column("AGE", lambda r: age(r.get("created_at"))),
    Column("NAMESPACE", lambda r: r.get("namespace"), wide=True),
    Column("ID", lambda r: r.get("id"), wide=True),
    Column("MODULES", lambda r: ",".join((r.get("manifest") or {}).get("modules") or []) or "-", wide=True),
]

STAND_COLUMNS = [
    Column("PIPELINE", lambda s: s["pipeline"]),
    Column("ID", lambda s: s["id"]),
    Column("HOLDINGS", lambda s: s.get("holdings")),
    Column("RECORDS", lambda s: s.get("records")),
    Column("NAMESPACE", lambda s: s.get("namespace"), wide=True),
]

HOLDING_COLUMNS = [
    Column("ID", lambda r: r["id"]),
    Column("KIND", lambda r: r["kind"]),
    Column("NAME", lambda r: r["name"]),
    Column("PHASE", lambda r: r["phase"], styled=True),
    Column("TTL", lambda r: ttl(r.get("expires_at"))),
    Column("SUBTREE", lambda r: r.get("subtree_records")),
    Column("AGE", lambda r: age(r.get("created_at"))),
    Column("FROM RUN", lambda r: r.get("created_by_run"), wide=True),
    Column("LABELS", _labels, wide=True),
]


def _facts(a: dict[str, Any]) -> str:
    facts = a.get("facts") or {}
    parts = [facts.get("hostname"), facts.get("os"), facts.get("arch")]
    return " ".join(str(p) for p in parts if p) or "-"


AGENT_COLUMNS = [
    Column("ID", lambda a: a["id"]),
    Column("NAME", lambda a: a["name"]),
    Column("PHASE", lambda a: a["phase"], styled=True),
    Column("CONNECTED", lambda a: "yes" if a.get("connected") else "no"),
    Column("SEEN", lambda a: age(a.get("last_seen_at")) if a.get("last_seen_at") else "-"),
    Column("MACHINE", _facts),
    Column("VERSION", lambda a: a.get("version") or "-", wide=True),
    Column("PEER", lambda a: a.get("peer") or "-", wide=True),
    Column("LABELS", _labels, wide=True),
    Column("CAPABILITIES", lambda a: ",".join(c["name"] for c in a.get("capabilities") or []) or "-", wide=True),
]


def human_size(size: Any) -> str:
    """1536 → ``1.5 KiB``; bytes below 1 KiB as they are."""
    if not isinstance(size, int):
        return "-"
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{size} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{size} B"


ARTIFACT_COLUMNS = [
    Column("ID", lambda a: a["id"]),
    Column("NAME", lambda a: a["name"]),
    Column("SIZE", lambda a: human_size(a.get("size"))),
    Column("PHASE", lambda a: a["phase"], styled=True),
    Column("PIPELINE", lambda a: a.get("pipeline") or "-"),
    Column("TTL", lambda a: ttl(a.get("expires_at"))),
    Column("AGE", lambda a: age(a.get("created_at"))),
    Column("SHA256", lambda a: a.get("sha256"), wide=True),
    Column("TYPE", lambda a: a.get("content_type"), wide=True),
    Column("RUN", lambda a: a.get("created_by_run") or "-", wide=True),
    Column("OWNER", lambda a: a.get("owner"), wide=True),
    Column("LABELS", _labels, wide=True),
]

KIND_COLUMNS = [
    Column("NAME", lambda k: k["name"]),
    Column("DRIFT CHECK", lambda k: f"{k['drift_interval_seconds']}s" if k.get("drift_interval_seconds") else "-"),
    Column("DESCRIPTION", lambda k: _first_line(k.get("description"), 70)),
    Column("SPEC FIELDS", lambda k: ",".join((k.get("spec_schema") or {}).get("properties") or {}) or "-", wide=True),
]

EVENT_COLUMNS = [
    Column("TIME", lambda e: e.get("created_at")),
    Column("TYPE", lambda e: e.get("type")),
    Column("REASON", lambda e: e.get("reason")),
    Column("MESSAGE", lambda e: e.get("message")),
    Column("ACTOR", lambda e: e.get("actor") or "-"),
    Column("RECORD", lambda e: e.get("record"), wide=True),
    Column("DATA", lambda e: e.get("data") or "-", wide=True),
]

JOURNAL_COLUMNS = [
    Column("SEQ", lambda j: j.get("seq")),
    Column("CALL", lambda j: j.get("call")),
    Column("STATUS", lambda j: j.get("status"), styled=True),
    Column("TOOK", lambda j: between(j.get("created_at"), j.get("completed_at")) if j.get("completed_at") else "-"),
    Column("ERROR", lambda j: _first_line(error_summary(str(j.get("error") or "")), 60) or "-"),
    Column("RESULT", lambda j: j.get("result"), wide=True),
]


def _paused(trigger: dict[str, Any]) -> str:
    if not trigger.get("paused"):
        return "no"
    return f"yes (by {trigger['paused_by']})" if trigger.get("paused_by") else "yes"


def _fired(trigger: dict[str, Any]) -> str:
    """A cron trigger's next instant (``next in 5h``); any trigger's last firing (``3m ago``)."""
    parts = []
    if trigger.get("paused") and trigger.get("type") == "cron":
        parts.append("next: paused")
    elif trigger.get("next_fire_at"):
        parts.append(f"next in {ttl(trigger['next_fire_at'])}")
    parts.append(f"last {age(trigger['last_fired_at'])} ago" if trigger.get("last_fired_at") else "never fired")
    return ", ".join(parts)


def trigger_ref(trigger: dict[str, Any]) -> str:
    """``trigger/PIPELINE/NAME``: what ``-o name`` prints and every trigger command takes."""
    return f"trigger/{trigger['pipeline']}/{trigger['name']}"


TRIGGER_COLUMNS = [
    Column("PIPELINE", lambda t: t["pipeline"]),
    Column("NAME", lambda t: t["name"]),
    Column("TYPE", lambda t: t["type"]),
    Column("SUMMARY", lambda t: _first_line(t.get("summary"), 70)),
    Column("PAUSED", _paused),
    Column("NEXT/LAST FIRED", _fired),
    Column("LAST RUN", lambda t: t.get("last_run") or "-"),
    Column("NAMESPACE", lambda t: t.get("namespace"), wide=True),
    Column("HOOK", lambda t: t.get("hook_path") or "-", wide=True),
    Column("ID", lambda t: t.get("id"), wide=True),
]

TRIGGER_EVENT_COLUMNS = [
    Column("TIME", lambda e: short_time(e.get("created_at"))),
    Column("REASON", lambda e: e.get("reason")),
    Column("MESSAGE", lambda e: _first_line(e.get("message"), 120) or "-"),
    Column("RUN", lambda e: e.get("run") or "-"),
    Column("BY", lambda e: e.get("actor") or "-"),
    Column("DATA", lambda e: e.get("data") or "-", wide=True),
]


@dataclass(frozen=True)
class Resource:
    """A noun of ``get``/``describe``: where it lives in the API and how it prints."""

    name: str  # singular, as in ``record/<id>``
    plural: str
    aliases: tuple[str, ...]
    path: str  # list path under /api/v1/
    columns: list[Column]
    key: str  # the field that names one item in URLs
    paginated: bool
    namespaced: bool = False  # its list takes ?namespace= and its items say theirs
    ref: Callable[[dict[str, Any]], str] | None = None  # its ``-o name`` form, when not TYPE/KEY

    def name_of(self, item: dict[str, Any]) -> str:
        return self.ref(item) if self.ref is not None else f"{self.name}/{item[self.key]}"

    def item_path(self, ident: str) -> str:
        return f"{self.path}/{ident}/"


RESOURCES = {
    r.name: r
    for r in [
        Resource("record", "records", ("rec", "recs", "r"), "records", RECORD_COLUMNS, "id", True, True),
        Resource("run", "runs", (), "runs", RUN_COLUMNS, "id", True, True),
        Resource("pipeline", "pipelines", ("pl", "pipe"), "pipelines", PIPELINE_COLUMNS, "name", True, True),
        Resource("stand", "stands", (), "stands", STAND_COLUMNS, "pipeline", False, True),
        Resource("agent", "agents", ("ag",), "agents", AGENT_COLUMNS, "id", True, True),
        Resource("kind", "kinds", (), "kinds", KIND_COLUMNS, "name", False),
        Resource("artifact", "artifacts", ("art", "arts"), "artifacts", ARTIFACT_COLUMNS, "id", True, True),
        Resource("orphan", "orphans", (), "orphans", EVENT_COLUMNS, "id", True),
        Resource("revision", "revisions", ("rev", "revs"), "revisions", REVISION_COLUMNS, "digest", True, True),
        Resource("trigger", "triggers", ("trig",), "triggers", TRIGGER_COLUMNS, "id", True, True, trigger_ref),
    ]
}
_BY_ALIAS = {alias: r for r in RESOURCES.values() for alias in (r.name, r.plural, *r.aliases)}


NAMESPACE_COLUMN = Column("NAMESPACE", lambda item: item.get("namespace"))


def namespace_columns(columns: list[Column], chosen: str | None) -> list[Column]:
    """``columns`` for a list in namespace ``chosen``; with none chosen (every namespace the
    caller may see) a NAMESPACE column comes first, as with ``kubectl get -A``."""
    if chosen is not None:
        return columns
    return [NAMESPACE_COLUMN, *(c for c in columns if c.header != "NAMESPACE")]


def resource(word: str) -> Resource:
    try:
        return _BY_ALIAS[word.lower()]
    except KeyError:
        known = ", ".join(r.plural for r in RESOURCES.values())
        raise UsageError(f"unknown resource type {word!r}; one of: {known}") from None


def complete_resource(incomplete: str) -> list[str]:
    return [r.plural for r in RESOURCES.values() if r.plural.startswith(incomplete)]


def split_ref(ref: str, *, default: str = "record") -> tuple[Resource, str]:
    """``run/<id>`` → (runs, id); a bare id → (``default``, id)."""
    if "/" in ref:
        word, _, ident = ref.partition("/")
        if not ident:
            raise UsageError(f"{ref!r} names no id; write it as TYPE/ID, e.g. record/<uuid> or run/<uuid>")
        return resource(word), ident
    return RESOURCES[default], ref


def revision_ref(ref: str) -> str:
    """A revision as the API names it (an id or a digest prefix), from ``REF`` or
    ``revision/REF`` (what ``-o name`` prints)."""
    kind, ident = split_ref(ref, default="revision")
    if kind.name != "revision":
        raise UsageError(f"{ref!r} is not a revision; pass a digest prefix (7+ digits), an id or revision/<digest>")
    return ident


NameOf = Callable[[dict[str, Any]], str]
