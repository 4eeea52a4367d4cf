"""Records: the list (the trees, newest roots first, or the records a filter finds) and a
record's inspector with its five views as tabs (state, events, logs, metrics, traces); delete
its subtree, extend or release its TTL, protect or unprotect it, hand it to a stand. ``RecordAdmin`` serves these pages
in place of the stock admin's change list and change form."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import yaml
from django.contrib import messages
from django.contrib.admin import AdminSite
from django.core.paginator import Page, Paginator
from django.db.models import Prefetch
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseNotAllowed, HttpResponseRedirect
from django.urls import reverse
from django.utils import timezone

from apps.core import access
from apps.core.errors import GrapheneError, NotFound
from apps.observability import selectors as observability
from apps.pipelines import selectors as pipelines
from apps.pipelines import services as pipeline_services
from apps.records import selectors, services
from apps.records.choices import Phase
from apps.records.models import Record
from apps.studio.views.charts import line_chart
from apps.studio.views.common import EXTEND_CHOICES, extend_or_release, render, waterfall
from kinds import registry

ROOTS_PER_PAGE = 20
# Below each root the list shows this many records in tree order, then how many more there are.
PER_TREE = 15
ROWS_PER_PAGE = 50
EVENTS_SHOWN = 100
CHILDREN_SHOWN = 200
DELETE_PREVIEW = 200
TABS = [("state", "State"), ("events", "Events"), ("logs", "Logs"), ("metrics", "Metrics"), ("traces", "Traces")]
METRIC_WINDOWS = ["15m", "1h", "6h", "1d", "7d"]
# What a hand-over to a stand keeps the records for (empty: the TTL they have).
KEEP_FOR = [("", "as it is"), ("1h", "1 hour"), ("1d", "1 day"), ("7d", "7 days")]


# --- the list ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Tree:
    """A root and the first records below it in tree order; ``more`` were left out."""

    root: Record
    rows: list[Record]
    more: int


def _param(request: HttpRequest, name: str) -> str:
    """A filter's value, also under the stock change list's name (``phase__exact``), which
    older links carry."""
    return (request.GET.get(name) or request.GET.get(f"{name}__exact") or "").strip()


def record_list(request: HttpRequest, *, site: AdminSite) -> HttpResponse:
    kind, namespace, owner = _param(request, "kind"), _param(request, "namespace"), _param(request, "owner")
    phases = [p for p in request.GET.getlist("phase") + request.GET.getlist("phase__exact") if p]
    label_text = ",".join(v for v in request.GET.getlist("label") if v)
    include_deleted = request.GET.get("deleted") == "1"
    filtered = bool(kind or phases or label_text or owner)
    problems: list[str] = []
    trees: list[Tree] = []
    page: Page[Record] | None = None
    owner_record = None
    try:
        if owner:
            owner_record = selectors.record_get(user=request.user, record_id=owner)
        if filtered:
            found = selectors.record_list(
                user=request.user,
                kind=kind or None,
                phases=phases,
                owner=owner_record.pk if owner_record else None,
                labels=selectors.parse_label_selector([label_text] if label_text else []),
                include_deleted=include_deleted,
            )
            if namespace:
                found = found.filter(namespace=namespace)
            # The owners come in a query of their own, for the page's rows only: joined, they
            # would be read for every match before the sort picks the page.
            owners = Prefetch("parent", queryset=Record.objects.only("id", "kind", "name"))
            rows = found.defer(*selectors.LIST_DEFERRED).prefetch_related(owners).order_by("-created_at", "-pk")
            page = Paginator(rows, ROWS_PER_PAGE).get_page(request.GET.get("page"))
        else:
            roots = selectors.record_roots(user=request.user, namespace=namespace, include_deleted=include_deleted)
            page = Paginator(roots, ROOTS_PER_PAGE).get_page(request.GET.get("page"))
            trees = _trees(list(page.object_list), include_deleted=include_deleted)
    except GrapheneError as exc:
        problems.append(exc.detail)
    query = request.GET.copy()
    query.pop("page", None)
    context = {
        "page": page,
        "trees": trees,
        "filtered": filtered,
        "problems": problems,
        "phases": Phase.choices,
        "chosen": phases,
        "kind": kind,
        "kinds": sorted(registry()),
        "namespace": namespace,
        "label": label_text,
        "owner": owner,
        "owner_record": owner_record,
        "include_deleted": include_deleted,
        "query": query.urlencode(),
    }
    return render(request, site, "studio/records.html", context, title="Records", fragment="studio/_records_table.html")


def _trees(roots: list[Record], *, include_deleted: bool) -> list[Tree]:
    below: dict[int, list[Record]] = {}
    for row in selectors.record_tree_rows(roots=roots, per_tree=PER_TREE, include_deleted=include_deleted):
        below.setdefault(row.tree_id, []).append(row)
    trees = []
    for root in roots:
        rows = below.get(root.tree_id, [])
        total = rows[0].below if rows else 0  # the window annotation (record_tree_rows)
        trees.append(Tree(root=root, rows=rows, more=total - len(rows)))
    return trees


# --- the inspector ----------------------------------------------------------------------------


def _record(request: HttpRequest, record_id: Any) -> Record:
    """The record, through the check the API makes (``record_get``: 404 when not visible)."""
    try:
        return selectors.record_get(user=request.user, record_id=record_id)
    except NotFound:
        raise Http404(f"no record {record_id}") from None


def _yaml(value: Any) -> str:
    return yaml.safe_dump(value, sort_keys=False, allow_unicode=True, default_flow_style=False).rstrip()


def _run_of(record: Record | None) -> str | None:
    """The id of the run whose root ``record`` is (a resumed run's newer root names it)."""
    if record is None or record.kind != "graphene.run":
        return None
    named = record.spec.get("run") if isinstance(record.spec, dict) else None
    return str(named or record.pk)


def record_detail(request: HttpRequest, *, site: AdminSite, record_id: Any) -> HttpResponse:
    record = _record(request, record_id)
    tab = request.GET.get("tab") or "state"
    if tab not in dict(TABS):
        raise Http404(f"no tab {tab!r}; the tabs are {', '.join(name for name, _ in TABS)}")
    chain = selectors.record_owner_chain(record=record)
    root = chain[0] if chain else record
    live = record.phase != Phase.DELETED and record.deletion_requested_at is None
    context: dict[str, Any] = {
        "record": record,
        "chain": chain,
        "tab": tab,
        "tabs": TABS,
        "run_id": _run_of(root),
        "live": live,
        "extend_choices": [label for label, _ in EXTEND_CHOICES],
        "may_hand_over": live and not record.is_root,
        "is_agent": record.kind == "agent",
        "blocked_by": selectors.record_deletion_blockers(record=record),
        "can_open_terminal": access.may(request.user, "open_terminal", "agents", record.namespace),
    }
    if context["may_hand_over"]:
        pipeline_services.pipelines_sync_all()  # installed and GRAPHENE_PIPELINE_DIRS' ones have rows
        context["pipelines"] = list(pipelines.pipeline_list(user=request.user).values_list("name", flat=True))
        context["pipeline"] = root.name.partition("#")[0] if root.kind == "graphene.run" else ""
        context["keep_for"] = KEEP_FOR
    fragment = request.GET.get("fragment", "")
    if fragment != "head":  # the header's refresh needs nothing of the tab's
        context |= _TAB_CONTEXT[tab](request, record)
    here = request.GET.copy()
    here.pop("fragment", None)
    here["tab"] = tab
    context |= {"here": here.urlencode(), "tab_template": f"studio/_record_{tab}.html", **_LIVE[tab]}
    if tab == "events" and request.GET.get("before"):
        context["refresh"] = ""  # an older page of events stays as it is
    template = {"head": "studio/_record_head.html", "tab": context["tab_template"]}.get(fragment)
    return render(request, site, "studio/record.html", context, title=str(record), fragment=template)


def _state(request: HttpRequest, record: Record) -> dict[str, Any]:
    counts = selectors.record_children_counts(record=record)
    children = selectors.record_children(record=record, limit=CHILDREN_SHOWN)
    deleted = counts.get(Phase.DELETED, 0)
    made_by = (
        Record.objects.filter(pk=record.created_by_run_id).only("kind", "name", "spec").first()
        if record.created_by_run_id and record.created_by_run_id != record.pk
        else None
    )
    return {
        "spec_yaml": _yaml(record.spec),
        "outputs_yaml": _yaml(record.outputs),
        "labels": sorted((record.labels or {}).items()),
        "conditions": [c for c in record.conditions or [] if isinstance(c, dict)],
        "children": children,
        "children_counts": sorted(counts.items()),
        "children_total": sum(counts.values()),
        "children_deleted": deleted,
        "children_more": sum(counts.values()) - deleted - len(children),
        "made_by": made_by,
        "made_by_run": _run_of(made_by),
    }


def _events(request: HttpRequest, record: Record) -> dict[str, Any]:
    events = selectors.record_events(record=record).order_by("-id")
    before = request.GET.get("before") or ""
    if before.isdigit():
        events = events.filter(id__lt=int(before))
    shown = list(events[: EVENTS_SHOWN + 1])
    return {
        "events": shown[:EVENTS_SHOWN],
        "older": shown[EVENTS_SHOWN - 1].pk if len(shown) > EVENTS_SHOWN else None,
        "before": before,
    }


def _logs(request: HttpRequest, record: Record) -> dict[str, Any]:
    return {}  # the page's script follows ws/records/<id>/logs/


def _metrics(request: HttpRequest, record: Record) -> dict[str, Any]:
    window = request.GET.get("window") or "1h"
    try:
        query = observability.series_query(name=None, window=window, step=None, end=None, now=timezone.now())
    except GrapheneError as exc:
        return {"windows": METRIC_WINDOWS, "window": window, "charts": [], "metric_problem": exc.detail}
    body = observability.metric_series(record=record, query=query)
    return {
        "windows": METRIC_WINDOWS,
        "window": window,
        "charts": [line_chart(s, start=query.start, end=query.end) for s in body["series"]],
        "names": body["names"],
        "step_seconds": query.step,
        "start": query.start,
        "end": query.end,
        "truncated": body["truncated"],
    }


def _traces(request: HttpRequest, record: Record) -> dict[str, Any]:
    trace = observability.record_spans(record=record)
    bars = waterfall(trace["root"]) if trace["span_count"] > 1 else []
    return {
        "bars": bars,
        "span_count": trace["span_count"] - 1,
        "errors": trace["errors"],
        "spans_truncated": trace["truncated"],
    }


_TAB_CONTEXT = {"state": _state, "events": _events, "logs": _logs, "metrics": _metrics, "traces": _traces}
# How each tab stays current: on the records' hints, on a timer (metrics are written in batches
# that send no hint), or by its own socket (the log).
_LIVE: dict[str, dict[str, str]] = {
    "state": {"refresh": "studio-refresh", "live_topic": "records"},
    "events": {"refresh": "studio-refresh", "live_topic": "records"},
    "logs": {"refresh": "", "live_topic": ""},
    "metrics": {"refresh": "every 30s", "live_topic": ""},
    "traces": {"refresh": "studio-refresh", "live_topic": "records"},
}


# --- actions ----------------------------------------------------------------------------------


def _back(site: AdminSite, record: Record) -> HttpResponseRedirect:
    return HttpResponseRedirect(reverse("admin:records_record_change", args=[record.pk], current_app=site.name))


def record_delete(request: HttpRequest, *, site: AdminSite, record_id: Any) -> HttpResponse:
    """A confirmation page listing what goes (GET), then the service the API's DELETE calls (POST)."""
    record = _record(request, record_id)
    if request.method == "POST":
        try:
            record = services.record_delete_request(record=record, actor=request.user)
        except GrapheneError as exc:
            messages.error(request, f"Delete: {exc.detail}")
        else:
            messages.success(request, f"Deleting: {record} and its subtree go, children first.")
        return _back(site, record)
    counts = selectors.record_subtree_kind_counts(record=record)
    context = {
        "record": record,
        "counts": sorted(counts.items()),
        "total": sum(counts.values()),
        "preview": [
            (item, item.level - record.level)
            for item in selectors.record_subtree_live(record=record, limit=DELETE_PREVIEW)
        ],
        "root_run": _run_of(record),
        "protected": selectors.record_subtree_protected(record=record),
    }
    return render(request, site, "studio/record_delete.html", context, title=f"Delete {record}?")


def record_act(request: HttpRequest, *, site: AdminSite, record_id: Any) -> HttpResponse:
    """Extend or release the TTL, protect or unprotect the record, or hand it to a stand: the
    services the API's ``records/{id}/extend|release|protect|unprotect|transfer`` call, after
    the same check."""
    if request.method != "POST":
        return HttpResponseNotAllowed(["POST"])
    record = _record(request, record_id)
    what = request.POST.get("do", "")
    try:
        if what == "stand":
            record = _hand_over(request, record)
        elif what in ("protect", "unprotect"):
            record = _protection(request, record, what)
        else:
            record = extend_or_release(request, record, what)
    except GrapheneError as exc:
        messages.error(request, exc.detail)
    return _back(site, record)


def _protection(request: HttpRequest, record: Record, what: str) -> Record:
    """Protect or unprotect the record (``graphenectl protect|unprotect``); the outcome is the
    page's message."""
    if what == "protect":
        record = services.record_protect(record=record, actor=request.user)
        messages.success(request, f"Protected: a deletion that reaches {record} stops there until it is unprotected.")
        return record
    record = services.record_unprotect(record=record, actor=request.user)
    if record.deletion_requested_at is not None:
        messages.success(request, f"Unprotected: the deletion that waited on {record} goes on, children first.")
    else:
        messages.success(request, f"Unprotected: {record} is deleted with its owner, like any record.")
    return record


def _hand_over(request: HttpRequest, record: Record) -> Record:
    """Give the record (and its subtree) to a pipeline's stand, made if it has none yet (as
    ``graphenectl transfer --to stand/<pipeline>`` does)."""
    definition = pipeline_services.definition_get(request.POST.get("pipeline", ""), user=request.user)
    name = definition.name
    keep = dict(EXTEND_CHOICES).get(request.POST.get("keep_for", ""))
    stand = pipelines.stand_find(user=request.user, pipeline=name) or pipeline_services.stand_get(
        name, namespace=definition.namespace
    )
    moved = services.record_transfer(
        record=record,
        new_owner=stand,
        expires_at=timezone.now() + keep if keep else None,
        actor=request.user,
    )
    kept = f" until {moved.expires_at:%Y-%m-%d %H:%M} UTC" if moved.expires_at else ""
    messages.success(request, f"Handed over: {moved} is on the stand of {name}{kept}.")
    return moved
