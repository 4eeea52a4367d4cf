"""Generated hostile input at every door (hypothesis, fixed seed, bounded examples).

Every write endpoint of the URLconf (``DOORS``) gets requests that are well formed but for one
hostile part: a NUL character or a lone surrogate somewhere in the body (a value or a key, at
any depth), a document nested too deep, a number beyond JSON's range or with 5,000 digits, a
body that is not JSON at all, a value of the wrong type where the type is strict, a malformed
id in the path, a query parameter PostgreSQL cannot store. Against the real server (daphne, the
middleware, Django, DRF), each answer must be a 4xx, never a 5xx, in the API's JSON error
shape; and nothing may change: the counts of runs, records, events, run events, journal entries,
commands, secrets, log lines, service accounts and tokens (and of revoked tokens and deleted
accounts), and the newest change of a record, run or secret, are the same after every request as
before it.

graphenectl's input parsing gets the same treatment in-process: hostile ``--input`` pairs and
``--inputs`` documents never raise anything but its usage error, and what it accepts the server
accepts (and the other way round): one set of rules.
"""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from django.db import connection
from graphene_sdk import validation as rules
from graphenectl._cmd_run import check_inputs
from graphenectl._errors import UsageError
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from psycopg import sql

from apps.accounts import services as accounts
from apps.accounts.models import AccessToken, ServiceAccount
from apps.agents import services as agents
from apps.agents.models import AgentCommand
from apps.api.params import MAX_SECONDS
from apps.core import rbac
from apps.core.errors import ValidationFailed
from apps.core.models import Namespace, Role, RoleBinding
from apps.observability.models import LogLine
from apps.pipelines import services as pipelines
from apps.pipelines.delivery import revisions, sources
from apps.pipelines.models import JournalEntry, Pipeline, PipelineEvent, Revision, Run, RunEvent, Trigger, TriggerEvent
from apps.pipelines.services import triggers
from apps.records import services as records
from apps.records.models import Event, Record
from apps.secrets import services as secrets
from apps.secrets.models import Secret
from tests.factories import api_token
from tests.harness.net import opener
from tests.harness.processes import purge_queue
from tests.harness.web import WebServer

# Bounded and reproducible: the same examples on every run (derandomize), no example database.
DOOR_EXAMPLES = 10  # for each door
DOORS_SETTINGS = settings(
    max_examples=DOOR_EXAMPLES,
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large],
)

# --- hostile values ------------------------------------------------------------------------------

# Text as clients send it, control characters included (but no NUL: that is a poison, below).
ordinary_text = st.text(st.characters(min_codepoint=1, max_codepoint=0x2FFF, exclude_categories=["Cs"]), max_size=12)
json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | ordinary_text
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(ordinary_text, inner, max_size=3),
    max_leaves=8,
)
# What PostgreSQL cannot store as text: a NUL, or half of a UTF-16 pair on its own.
poison_chars = st.just("\x00") | st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF)
poisons = st.builds(lambda a, bad, b: a + bad + b, ordinary_text, poison_chars, ordinary_text)
# In a URL only a NUL survives: Django decodes what is not UTF-8 (a surrogate's bytes) as U+FFFD.
nul_poisons = st.builds(lambda a, b: a + "\x00" + b, ordinary_text, ordinary_text)


@st.composite
def poisoned(draw: st.DrawFn) -> Any:
    """A JSON value with a poisoned string somewhere inside it: as a value or as a key, at any depth."""
    poison = draw(poisons)
    value: Any = {poison: draw(json_values)} if draw(st.booleans()) else poison
    for _ in range(draw(st.integers(0, 3))):
        siblings = draw(st.lists(json_values, max_size=2))
        if draw(st.booleans()):
            at = draw(st.integers(0, len(siblings)))
            value = [*siblings[:at], value, *siblings[at:]]
        else:
            value = {**{f"k{i}": s for i, s in enumerate(siblings)}, draw(ordinary_text): value}
    return value


def _nested(depth: int, kinds: list[bool]) -> str:
    opened = "".join('{"a": ' if kinds[i % len(kinds)] else "[" for i in range(depth))
    closed = "".join("}" if kinds[i % len(kinds)] else "]" for i in reversed(range(depth)))
    return opened + "1" + closed


# Raw JSON text put where a value goes: too deep, beyond JSON's numbers, or not JSON at all.
raw_values = (
    st.builds(_nested, st.integers(65, 20_000), st.lists(st.booleans(), min_size=1, max_size=4))
    | st.sampled_from(["1e400", "-1e999", "NaN", "Infinity", "-Infinity", "9" * 5000, "-" + "1" * 4500])
    | st.sampled_from(['"a\x00b"', '"tab\there"', "'single'", "undefined", "[1,]", '{"a" 1}', "0x10", "01"])
)


@st.composite
def broken_bodies(draw: st.DrawFn) -> bytes:
    """A body that is not a JSON document: truncated, not UTF-8, or not JSON at all."""
    text = json.dumps(draw(json_values | poisoned()))
    choice = draw(st.integers(0, 3))
    if choice == 0:
        return text.encode()[: max(1, len(text) // 2)] + b"\xff"
    if choice == 1:
        return b'{"value": "' + draw(st.binary(min_size=1, max_size=8)).replace(b'"', b"") + b'\xc3"}'
    if choice == 2:
        return ("{" + text).encode()
    body = draw(st.binary(min_size=1, max_size=40))
    try:
        json.loads(body)
    except ValueError:
        return body
    return b"{" + body  # it happened to be JSON


def not_uuid(text: str) -> bool:
    try:
        uuid.UUID(text)
    except ValueError:
        return True
    return False


bad_ids = st.text(max_size=40).filter(lambda t: t.strip() != "" and not_uuid(t))
wrong_strict_ints = (
    st.booleans()
    | st.none()
    | st.text(max_size=6)
    | st.floats()
    | st.lists(st.integers(), max_size=2)
    | st.dictionaries(ordinary_text, st.integers(), max_size=2)
)
# Refused where a duration in seconds goes (1..MAX_SECONDS, a JSON integer): out of range,
# huge, a float (even 60.0), a bool, a string (even "60"), null, a list.
bad_seconds = (
    st.integers(max_value=0)
    | st.integers(min_value=MAX_SECONDS + 1)
    | st.floats()
    | st.booleans()
    | st.none()
    | st.text(max_size=6)
    | st.lists(st.integers(), max_size=2)
)


def accepted_int(text: str, lo: int, hi: int) -> bool:
    """Whether a query parameter's text is an integer the API takes (empty: the default)."""
    text = text.strip()
    if text == "" or not re.fullmatch("-?[0-9]+", text):
        return text == ""
    return lo <= int(text) <= hi


not_strings = st.integers() | st.booleans() | st.none() | st.floats(allow_nan=False) | st.lists(st.text(), max_size=2)
# Not a DNS label (a service account's or a namespace's name): empty, upper case, a dot, too long.
bad_names = st.text(max_size=70).filter(lambda t: not rules.DNS_LABEL.fullmatch(t))
# Refused as a token's lifetime (1 second to GRAPHENE_TOKEN_MAX_TTL_DAYS, a JSON integer).
bad_lifetimes = (
    st.integers(max_value=0)
    | st.integers(min_value=365 * 86400 + 1)
    | st.floats()
    | st.booleans()
    | st.none()
    | st.text(max_size=6)
    | st.lists(st.integers(), max_size=2)
)
# What a boolean query parameter takes (apps/api/params.py): anything else is refused.
BOOL_WORDS = {"true", "false", "1", "0", "yes", "no"}
long_comments = st.text(st.characters(categories=["L"]), min_size=201, max_size=260)
# A git source's settings that are refused: no scheme, an empty ref or one that reads as an
# option, a sub-directory that climbs out; anything but true or false where a flag goes.
bad_urls = st.text(max_size=20).filter(lambda t: "://" not in t)
bad_refs = st.just("") | st.text(max_size=8).map(lambda t: "-" + t)
bad_subdirectories = st.text(max_size=8).map(lambda t: "../" + t)
not_booleans = st.none() | st.integers() | st.text(max_size=6) | st.lists(st.booleans(), max_size=2)


# --- the doors -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Door:
    """A write endpoint: a request it would carry out, and where hostile parts may go."""

    name: str
    method: str
    path: str  # placeholders of the world (``{run}``, ``{record}``, ``{sa_token}``...) filled in
    body: dict[str, Any] | None  # a body it would accept (None: it takes none)
    strict: dict[str, st.SearchStrategy[Any]] = field(default_factory=dict)  # field path → refused values
    path_ids: tuple[str, ...] = ()  # placeholders a malformed id may replace
    query: dict[str, str] = field(default_factory=dict)  # query parameters it would accept
    strict_query: dict[str, st.SearchStrategy[str]] = field(default_factory=dict)
    raw_upload: bool = False  # its body is data (an artifact): only the query can be hostile


DOORS = [
    Door(
        "run start",
        "POST",
        "/api/v1/pipelines/sample.tree/runs/",
        {"inputs": {"branches": 2, "leaves": 1}},
        strict={
            "inputs.branches": wrong_strict_ints | st.integers().filter(lambda n: not 1 <= n <= 10),
            "inputs.leaves": wrong_strict_ints | st.integers(min_value=11),
            "inputs.brnaches": json_values,  # an input the pipeline does not declare
            "inptus": json_values,  # a field a start does not take
            "inputs": st.lists(json_values, max_size=2) | json_scalars,
        },
    ),
    Door(
        "record apply",
        "POST",
        "/api/v1/records/",
        {"kind": "test.sleep", "name": "applied", "owner": "{stand}", "spec": {}, "labels": {"a": "b"}},
        strict={
            "owner": bad_ids | st.none() | st.integers() | st.lists(st.just("{stand}"), min_size=1, max_size=2),
            "ttl_seconds": bad_seconds.filter(lambda v: v is not None),
            "expires_at": st.text(max_size=10).filter(lambda t: not t[:1].isdigit()),
            "name": st.just("") | st.text(st.characters(categories=["L"]), min_size=254, max_size=300),
            "spec": st.lists(json_values, max_size=2) | json_scalars.filter(lambda v: v is not None),
            "labels": st.dictionaries(ordinary_text, st.integers() | st.booleans(), min_size=1, max_size=2),
        },
    ),
    Door(
        "record transfer",
        "POST",
        "/api/v1/records/{record}/transfer/",
        {"to": "{stand}"},
        strict={"to": bad_ids | st.integers() | st.none(), "ttl_seconds": bad_seconds.filter(lambda v: v is not None)},
        path_ids=("record",),
    ),
    Door(
        "record extend",
        "POST",
        "/api/v1/records/{record}/extend/",
        {"by_seconds": 60},
        strict={"by_seconds": bad_seconds},
        path_ids=("record",),
    ),
    Door("record release", "POST", "/api/v1/records/{record}/release/", None, path_ids=("record",)),
    Door("record protect", "POST", "/api/v1/records/{record}/protect/", None, path_ids=("record",)),
    Door("record unprotect", "POST", "/api/v1/records/{record}/unprotect/", None, path_ids=("record",)),
    Door(
        "record delete",
        "DELETE",
        "/api/v1/records/{record}/",
        None,
        path_ids=("record",),
        query={"wait": "true", "timeout": "5"},
        strict_query={"timeout": st.text(max_size=8).filter(lambda t: not accepted_int(t, 1, 300))},
    ),
    Door(
        "pipeline plan",
        "POST",
        "/api/v1/pipelines/sample.tree/plan/",
        {"inputs": {"branches": 2, "leaves": 1}},
        strict={
            "inputs.branches": wrong_strict_ints | st.integers().filter(lambda n: not 1 <= n <= 10),
            "inputs.brnaches": json_values,
            "inputs": st.lists(json_values, max_size=2) | json_scalars,
            "revision": st.just("") | st.text(st.characters(categories=["L"]), min_size=81, max_size=90),
            "pla": json_values,  # a field a plan does not take
        },
    ),
    Door("trigger pause", "POST", "/api/v1/triggers/{trigger}/pause/", None, path_ids=("trigger",)),
    Door("trigger resume", "POST", "/api/v1/triggers/{trigger}/resume/", None, path_ids=("trigger",)),
    Door("run cancel", "POST", "/api/v1/runs/{run}/cancel/", None, path_ids=("run",)),
    Door("run resume", "POST", "/api/v1/runs/{run}/resume/", None, path_ids=("run",)),
    Door(
        "stand extend",
        "POST",
        "/api/v1/stands/sample.tree/extend/",
        {"record": "{holding}", "by_seconds": 60},
        strict={"record": bad_ids | st.integers() | st.none(), "by_seconds": bad_seconds},
    ),
    Door(
        "stand release",
        "POST",
        "/api/v1/stands/sample.tree/release/",
        {"record": "{holding}"},
        strict={"record": bad_ids | st.integers() | st.none()},
    ),
    Door(
        "secret create",
        "POST",
        "/api/v1/secrets/",
        {"name": "doors-new", "value": "v"},
        strict={"name": not_strings, "value": not_strings, "vaule": st.text()},
    ),
    Door("secret replace", "PUT", "/api/v1/secrets/doors/", {"value": "v2"}, strict={"value": not_strings}),
    Door("secret delete", "DELETE", "/api/v1/secrets/doors/", None),
    Door(
        "source apply",
        "POST",
        "/api/v1/sources/",
        {
            "name": "doors-new",
            "url": "git://127.0.0.1:9/new.git",
            "ref": "main",
            "subdirectory": "ci",
            "activate": True,
        },
        strict={
            "name": not_strings | bad_names,
            "url": not_strings | bad_urls,
            "ref": not_strings | bad_refs,
            "subdirectory": not_strings | bad_subdirectories,
            "credential": not_strings | st.just("no-such-secret"),
            "activate": not_booleans,
            "subdir": json_values,
        },
    ),
    Door(
        "source replace",
        "PUT",
        "/api/v1/sources/doors-src/",
        {"url": "git://127.0.0.1:9/doors.git", "ref": "v2"},
        strict={"url": not_strings | bad_urls, "ref": not_strings | bad_refs, "activate": not_booleans},
    ),
    Door(
        "source change",
        "PATCH",
        "/api/v1/sources/doors-src/",
        {"ref": "v3"},
        strict={"ref": not_strings | bad_refs, "subdirectory": bad_subdirectories, "nmae": json_values},
    ),
    Door("source delete", "DELETE", "/api/v1/sources/doors-src/", None),
    # Its repository is never reached: every request here is refused before (nothing listens there).
    Door("source sync", "POST", "/api/v1/sources/doors-src/sync/", None),
    Door(
        "agent create",
        "POST",
        "/api/v1/agents/",
        {"name": "doors-new", "labels": {"a": "b"}, "owner": "{other}"},
        strict={
            "name": st.just("") | st.text(st.characters(categories=["L"]), min_size=254, max_size=300),
            "labels": st.lists(st.text(), max_size=2) | st.dictionaries(st.text(), st.lists(st.text()), min_size=1),
            "owner": bad_ids.filter(lambda t: t.strip() == t),
            "nmae": json_values,
        },
    ),
    Door(
        "agent exec",
        "POST",
        "/api/v1/agents/{agent}/exec/",
        {"argv": ["true"], "timeout": 5},
        strict={
            "argv": st.just([]) | st.text() | st.integers() | st.lists(st.integers(), min_size=1, max_size=2),
            "timout": json_values,
        },
        path_ids=("agent",),
    ),
    Door(
        "agent command cancel",
        "POST",
        "/api/v1/agents/{agent}/commands/{command}/cancel/",
        None,
        path_ids=("agent", "command"),
    ),
    Door(
        "artifact upload",
        "POST",
        "/api/v1/artifacts/",
        None,
        query={"name": "dist/app.tar.gz", "owner": "{stand}", "ttl_seconds": "60", "label": "a=b"},
        strict_query={
            "owner": bad_ids,
            "ttl_seconds": st.text(max_size=8).filter(lambda t: not accepted_int(t, 1, MAX_SECONDS)),
            # a label selector part without a key: k, =v
            "label": st.text(max_size=8).filter(
                lambda t: any(p and ("=" not in p or p.startswith("=")) for p in t.split(","))
            ),
        },
        raw_upload=True,
    ),
    Door("orphan sweep", "POST", "/api/v1/orphans/sweep/", None, query={"dry_run": "false"}),
    Door(
        "revision push",
        "POST",
        "/api/v1/revisions/",
        None,
        query={"namespace": "default", "activate": "false"},
        strict_query={"activate": st.text(max_size=6).filter(lambda t: t.lower() not in BOOL_WORDS)},
        raw_upload=True,
    ),
    Door(
        "pipeline activate",
        "POST",
        "/api/v1/pipelines/doors.delivered/activate/",
        {"revision": "{revision}"},
        strict={
            "revision": st.just("") | st.none() | st.text(st.characters(categories=["L"]), min_size=81, max_size=90),
            "revison": json_values,  # a field activation does not take
        },
    ),
    Door(
        "namespace create",
        "POST",
        "/api/v1/namespaces/",
        {"name": "doors-new", "description": "d"},
        strict={"name": not_strings | st.text(min_size=64, max_size=80), "nmae": json_values},
    ),
    Door("namespace delete", "DELETE", "/api/v1/namespaces/doors-empty/", None),
    Door(
        "role create",
        "POST",
        "/api/v1/roles/",
        {"name": "doors-role", "rules": [{"verbs": ["get"], "resources": ["runs"]}]},
        strict={
            "name": not_strings,
            "rules": st.just([]) | json_scalars | st.lists(json_scalars, min_size=1, max_size=2),
            "rules.0.verbs": st.just([]) | st.just(["fly"]) | json_scalars,
            "rules.0.resources": st.just(["planets"]) | json_scalars,
        },
    ),
    Door("role delete", "DELETE", "/api/v1/roles/doors-custom/", None),
    Door(
        "role binding create",
        "POST",
        "/api/v1/rolebindings/",
        {"role": "viewer", "namespace": "doors-empty", "user": "doors"},
        strict={"role": not_strings, "namespace": not_strings, "user": st.integers() | st.lists(st.text(), max_size=2)},
    ),
    Door("role binding delete", "DELETE", "/api/v1/rolebindings/{binding}/", None),
    Door(
        "service account create",
        "POST",
        "/api/v1/accounts/",
        {"name": "doors-new", "description": "d"},
        strict={
            "name": not_strings | bad_names,
            "description": not_strings | st.text(st.characters(categories=["L"]), min_size=501, max_size=600),
            "nmae": json_values,
        },
        query={"namespace": "doors"},
        strict_query={"namespace": bad_names},
    ),
    Door(
        "service account delete",
        "DELETE",
        "/api/v1/accounts/doors-sa/",
        None,
        query={"namespace": "doors"},
        strict_query={"namespace": bad_names},
    ),
    Door(
        "service account token create",
        "POST",
        "/api/v1/accounts/doors-sa/tokens/",
        {"expires_in_seconds": 3600, "comment": "c"},
        strict={"expires_in_seconds": bad_lifetimes, "comment": not_strings | long_comments, "expires_in": json_values},
        query={"namespace": "doors"},
        strict_query={"namespace": bad_names},
    ),
    Door(
        "service account tokens revoke",
        "DELETE",
        "/api/v1/accounts/doors-sa/tokens/",
        None,
        query={"namespace": "doors"},
        strict_query={"namespace": bad_names},
    ),
    Door(
        "service account token revoke",
        "DELETE",
        "/api/v1/accounts/doors-sa/tokens/{sa_token}/",
        None,
        path_ids=("sa_token",),
        query={"namespace": "doors"},
        strict_query={"namespace": bad_names},
    ),
    Door(
        "own token create",
        "POST",
        "/api/v1/tokens/",
        {"expires_in_seconds": 3600, "comment": "c"},
        strict={"expires_in_seconds": bad_lifetimes, "comment": not_strings | long_comments, "coment": json_values},
    ),
    Door("own token revoke", "DELETE", "/api/v1/tokens/{own_token}/", None, path_ids=("own_token",)),
]


@dataclass(frozen=True)
class Hostile:
    """One request: the door's own but for one hostile part."""

    path: str
    body: bytes | None
    content_type: str
    what: str  # for the failure message


def _fill(text: str, ids: dict[str, str]) -> str:
    for key, value in ids.items():
        text = text.replace("{" + key + "}", value)
    return text


def _with(body: Any, dotted: str, value: Any) -> Any:
    """``body`` with ``value`` at the dotted path (objects made on the way)."""
    body = json.loads(json.dumps(body))
    node = body
    *parents, last = dotted.split(".")
    for part in parents:
        node = node.setdefault(part, {})
    node[last] = value
    return body


MARK = "__HOSTILE__"


@st.composite
def hostile_requests(draw: st.DrawFn, door: Door, ids: dict[str, str]) -> Hostile:
    path = door.path
    query = dict(door.query)
    base = json.loads(_fill(json.dumps(door.body), ids)) if door.body is not None else None
    body: bytes | None = None if base is None else json.dumps(base).encode()
    kinds = ["query"]
    if door.path_ids:
        kinds.append("id")
    if door.strict_query:
        kinds.append("strict query")
    if not door.raw_upload:
        kinds += ["broken body", "poisoned body"]
        if base is not None:
            kinds += ["poisoned field", "raw field"]
        if door.strict:
            kinds += ["strict field"] * 2
    kind = draw(st.sampled_from(kinds))
    if kind == "id":
        placeholder = draw(st.sampled_from(door.path_ids))
        path = path.replace("{" + placeholder + "}", urllib.parse.quote(draw(bad_ids), safe=""))
    elif kind == "query":
        name, value = draw(st.sampled_from([(nul_poisons, ordinary_text), (ordinary_text, nul_poisons)]))
        query[draw(name)] = draw(value)
    elif kind == "strict query":
        key = draw(st.sampled_from(sorted(door.strict_query)))
        query[key] = draw(door.strict_query[key])
    elif kind == "broken body":
        body = draw(broken_bodies())
    elif kind == "poisoned body":
        body = json.dumps(draw(poisoned())).encode()  # escapes as clients write them: \u0000, \ud800
    elif kind == "poisoned field":
        target = draw(st.sampled_from([*_paths(base), f"{draw(st.sampled_from(['', *_objects(base)]))}extra"]))
        body = json.dumps(_with(base, target.lstrip("."), draw(poisoned()))).encode()
    elif kind == "raw field":
        target = draw(st.sampled_from(_paths(base)))
        text = json.dumps(_with(base, target, MARK)).replace(json.dumps(MARK), draw(raw_values), 1)
        body = text.encode("utf-8", "surrogatepass")
    else:  # strict field
        target = draw(st.sampled_from(sorted(door.strict)))
        value = draw(door.strict[target])
        body = json.dumps(_with(base or {}, target, json.loads(_fill(json.dumps(value), ids)))).encode()
    for key, value in list(query.items()):
        query[key] = _fill(value, ids)
    if door.raw_upload:
        body = b"the artifact's bytes"
    qs = urllib.parse.urlencode(query, errors="surrogatepass") if query else ""
    full = _fill(path, ids) + (f"?{qs}" if qs else "")
    ctype = "application/octet-stream" if door.raw_upload else "application/json"
    return Hostile(full, body, ctype, f"{kind}: {full} {body[:200] if body else b''!r}")


def _paths(base: Any, prefix: str = "") -> list[str]:
    """Every dotted path of an object's members (where a value may be replaced)."""
    out: list[str] = []
    if isinstance(base, dict):
        for key, value in base.items():
            out.append(f"{prefix}{key}")
            out.extend(_paths(value, f"{prefix}{key}."))
    return out or ["value"]


def _objects(base: Any, prefix: str = "") -> list[str]:
    out: list[str] = []
    if isinstance(base, dict):
        for key, value in base.items():
            if isinstance(value, dict):
                out.append(f"{prefix}{key}.")
                out.extend(_objects(value, f"{prefix}{key}."))
    return out


# --- the world the doors act on ----------------------------------------------------------------------


WATCHED = (
    Run,
    Record,
    Event,
    RunEvent,
    TriggerEvent,
    JournalEntry,
    AgentCommand,
    Secret,
    LogLine,
    Namespace,
    Role,
    RoleBinding,
    ServiceAccount,
    AccessToken,
    Revision,
    PipelineEvent,
)
CHANGING = (Record, Run, Secret, Pipeline, Trigger)
# Changes that add no row: a revoked token, a deleted (disabled) service account.
STATES = {
    "AccessToken revoked": "SELECT count(*) FROM accounts_accesstoken WHERE revoked_at IS NOT NULL",
    "ServiceAccount disabled": "SELECT count(*) FROM accounts_serviceaccount WHERE disabled_at IS NOT NULL",
}


def _snapshot_query() -> sql.Composed:
    """One query (a round trip per example, not twelve), composed from the models' tables."""
    parts = [sql.SQL("(SELECT count(*) FROM {})").format(sql.Identifier(m._meta.db_table)) for m in WATCHED]
    parts += [sql.SQL("(SELECT max(updated_at) FROM {})").format(sql.Identifier(m._meta.db_table)) for m in CHANGING]
    parts += [sql.SQL("({})").format(sql.SQL(query)) for query in STATES.values()]
    parts.append(
        sql.SQL("(SELECT string_agg(phase || ':' || n, ',' ORDER BY phase) FROM ({}) p)").format(
            sql.SQL("SELECT phase, count(*) AS n FROM {} GROUP BY phase").format(sql.Identifier(Record._meta.db_table))
        )
    )
    return sql.SQL("SELECT {}").format(sql.SQL(", ").join(parts))


def snapshot() -> dict[str, Any]:
    """What a refused request must leave as it was: how many runs, records, events, run events,
    journal entries, commands, secrets, log lines, service accounts and API tokens there are,
    when a record, a run and a secret last changed, how many tokens are revoked and accounts
    deleted, and how many records are in each phase."""
    with connection.cursor() as cursor:
        cursor.execute(_snapshot_query())
        row = cursor.fetchone()
    names = [m.__name__ for m in WATCHED] + [f"{m.__name__} changed" for m in CHANGING] + [*STATES, "Record phases"]
    return dict(zip(names, row, strict=True))


@pytest.fixture
def world(web: WebServer, django_user_model: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """A token, and one of each thing the doors act on (committed: the server sees them)."""
    user = django_user_model.objects.create_superuser(username="doors", password="pw")
    stand = pipelines.stand_get("sample.tree")
    other = records.record_create_root(kind="graphene.stand", name="doors-other")
    holding = records.record_declare(kind="test.sleep", name="held", owner=stand, spec={})
    record = records.record_declare(kind="test.sleep", name="target", owner=other, spec={})
    run = pipelines.run_start(pipeline_name="sample.tree", inputs={})
    agent = agents.agent_declare(owner=other, name="doors-box").record
    command = agents.command_submit(agent=agent, kind="exec", payload={"argv": ["true"]})
    secrets.secret_create(name="doors", value="v")
    sources.source_apply(
        namespace="default", name="doors-src", url="git://127.0.0.1:9/doors.git", ref="main", actor=None
    )
    rbac.namespace_create(name="doors-empty", actor=None)
    rbac.role_create(name="doors-custom", rules=[{"verbs": ["get"], "resources": ["runs"]}], actor=None)
    binding, _ = rbac.role_bind(role="viewer", namespace="doors-empty", user="doors", actor=None)
    rbac.namespace_create(name="doors", actor=None)
    account = accounts.service_account_create(name="doors-sa", namespace="doors")
    sa_token = accounts.service_account_token_issue(account=account).token
    own_token = accounts.access_token_issue(user=user, comment="a door revokes this one, if any").token
    code = tmp_path_factory.mktemp("doors-code")
    (code / "delivered.py").write_text(
        "from pydantic import BaseModel\nfrom graphene_sdk import pipeline\n\n\nclass In(BaseModel):\n    pass\n\n\n"
        "@pipeline('doors.delivered', inputs=In)\ndef delivered(ctx, inputs):\n    return None\n"
    )
    revision = revisions.revision_materialize(tree=code, namespace="default", activate=True).revision
    nightly = {"name": "nightly", "type": "cron", "schedule": "0 3 * * *", "timezone": "UTC", "inputs": {}}
    PipelineEvent.objects.bulk_create(
        triggers.triggers_reconcile(Pipeline.objects.get(name="doors.delivered"), [nightly])
    )
    yield {
        "trigger": str(Trigger.objects.get(pipeline__name="doors.delivered").pk),
        "revision": str(revision.pk),
        "binding": str(binding.pk),
        "token": api_token(user),
        "sa_token": str(sa_token.pk),
        "own_token": str(own_token.pk),
        "stand": str(stand.pk),
        "other": str(other.pk),
        "holding": str(holding.pk),
        "record": str(record.pk),
        "run": str(run.pk),
        "agent": str(agent.pk),
        "command": str(command.pk),
    }
    purge_queue()  # the convergences and the run it enqueued: no worker took them


def send(web: WebServer, token: str, method: str, hostile: Hostile) -> tuple[int, str, bytes]:
    headers = {"Authorization": f"Token {token}", "Content-Type": hostile.content_type}
    request = urllib.request.Request(f"{web.url}{hostile.path}", data=hostile.body, method=method, headers=headers)  # noqa: S310
    try:
        with opener.open(request, timeout=60) as response:
            return response.status, response.headers.get("Content-Type", ""), response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers.get("Content-Type", ""), exc.read()


def assert_error_shape(status: int, content_type: str, raw: bytes, what: str) -> None:
    assert 400 <= status < 500, f"{status} for {what}: {raw[:500]!r}"
    assert content_type == "application/json", f"{content_type} for {what}: {raw[:300]!r}"
    body = json.loads(raw)
    assert set(body) == {"error", "detail", "fields"}, body
    assert isinstance(body["error"], str), body
    assert isinstance(body["detail"], str), body
    assert body["detail"], body
    assert isinstance(body["fields"], dict), body
    for path, messages in body["fields"].items():
        assert isinstance(path, str), body
        assert isinstance(messages, list), body
        assert all(isinstance(m, str) for m in messages), body


def try_door(door: Door, world: dict[str, str], web: WebServer, initial: dict[str, Any]) -> None:
    """``DOOR_EXAMPLES`` hostile requests at one door, each refused in the shape, changing nothing."""

    @DOORS_SETTINGS
    @given(hostile=hostile_requests(door, world))
    def attempt(hostile: Hostile) -> None:
        status, content_type, raw = send(web, world["token"], door.method, hostile)
        assert_error_shape(status, content_type, raw, f"{door.name}, {hostile.what}")
        assert snapshot() == initial, f"{door.name}, {hostile.what} changed something: {raw[:300]!r}"

    attempt()


@pytest.mark.django_db(transaction=True)
def test_hostile_input_at_every_door_is_a_4xx_in_the_error_shape_and_changes_nothing(
    world: dict[str, str], web: WebServer
) -> None:
    initial = snapshot()
    for door in DOORS:  # each door its own examples: a door added to DOORS gets as many
        try_door(door, world, web, initial)


def test_the_doors_are_every_write_endpoint_of_the_urlconf() -> None:
    """A write endpoint added to the API joins ``DOORS`` (or this list says why not)."""
    from django.urls import URLPattern, URLResolver, get_resolver

    def walk(patterns: list[Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
        for p in patterns:
            if isinstance(p, URLResolver):
                yield from walk(p.url_patterns, prefix + str(p.pattern))
            elif isinstance(p, URLPattern):
                yield prefix + str(p.pattern), p.callback

    writes: set[tuple[str, str]] = set()
    for route, callback in walk(get_resolver().url_patterns):
        actions = getattr(callback, "actions", None) or {}
        for method, action in actions.items():
            if method in ("post", "put", "patch", "delete") and route.startswith("api/"):
                writes.add((method.upper(), f"{callback.cls.__name__}.{action}"))
    covered = {
        ("POST", "PipelineViewSet.start"),
        ("POST", "PipelineViewSet.plan"),
        ("POST", "TriggerViewSet.pause"),
        ("POST", "TriggerViewSet.resume"),
        ("POST", "RecordViewSet.create"),
        ("POST", "RecordViewSet.transfer"),
        ("POST", "RecordViewSet.extend"),
        ("POST", "RecordViewSet.release"),
        ("POST", "RecordViewSet.protect"),
        ("POST", "RecordViewSet.unprotect"),
        ("DELETE", "RecordViewSet.destroy"),
        ("POST", "RunViewSet.cancel"),
        ("POST", "RunViewSet.resume"),
        ("POST", "StandViewSet.extend"),
        ("POST", "StandViewSet.release"),
        ("POST", "SecretViewSet.create"),
        ("PUT", "SecretViewSet.update"),
        ("DELETE", "SecretViewSet.destroy"),
        ("POST", "SourceViewSet.create"),
        ("PUT", "SourceViewSet.update"),
        ("PATCH", "SourceViewSet.partial_update"),
        ("DELETE", "SourceViewSet.destroy"),
        ("POST", "SourceViewSet.sync"),
        ("POST", "AgentViewSet.create"),
        ("POST", "AgentViewSet.exec"),
        ("POST", "AgentViewSet.cancel"),
        ("POST", "ArtifactViewSet.create"),
        ("POST", "OrphanViewSet.sweep"),
        ("POST", "RevisionViewSet.create"),
        ("POST", "PipelineViewSet.activate"),
        ("POST", "NamespaceViewSet.create"),
        ("DELETE", "NamespaceViewSet.destroy"),
        ("POST", "RoleViewSet.create"),
        ("DELETE", "RoleViewSet.destroy"),
        ("POST", "BindingViewSet.create"),
        ("DELETE", "BindingViewSet.destroy"),
        ("POST", "ServiceAccountViewSet.create"),
        ("DELETE", "ServiceAccountViewSet.destroy"),
        ("POST", "ServiceAccountViewSet.tokens_create"),
        ("DELETE", "ServiceAccountViewSet.tokens_revoke_all"),
        ("DELETE", "ServiceAccountViewSet.revoke_token"),
        ("POST", "OwnTokenViewSet.create"),
        ("DELETE", "OwnTokenViewSet.destroy"),
    }
    assert writes == covered
    assert len(DOORS) == len(covered)


# --- graphenectl's input parsing: the same rules as the server ---------------------------------------

SCHEMAS = ["sample.tree", "sample.step", "hello"]
near_values = (
    json_scalars
    | st.integers(-3, 12)
    | st.sampled_from(["at_least_once", "at_most_once", "1", "true", "", "Ada", "2.5"])
    | st.lists(json_scalars, max_size=2)
    | st.dictionaries(ordinary_text, json_scalars, max_size=2)
)


@st.composite
def documents(draw: st.DrawFn, schema: dict[str, Any]) -> dict[str, Any]:
    """Inputs near a schema's: some of its fields with values of every type, sometimes an
    undeclared one, sometimes a poisoned one."""
    names = sorted(schema.get("properties") or {})
    document = {name: draw(near_values) for name in draw(st.lists(st.sampled_from(names), unique=True, max_size=3))}
    extra = draw(st.integers(0, 9))
    if extra == 0:
        document[draw(ordinary_text)] = draw(near_values)
    elif extra == 1:
        document[draw(st.sampled_from(names))] = draw(poisoned())
    return document


def _server_accepts(name: str, document: Any) -> bool:
    try:
        pipelines.inputs_validate(pipelines.definition_get(name), document)
    except ValidationFailed:
        return False
    return True


@pytest.mark.django_db  # "hello" is an example: delivered as a revision (GRAPHENE_PIPELINE_DIRS)
@pytest.mark.parametrize("name", SCHEMAS)
@settings(max_examples=120, derandomize=True, database=None, deadline=None)
@given(data=st.data())
def test_graphenectl_accepts_exactly_what_the_server_accepts(name: str, data: st.DataObject) -> None:
    """``--inputs`` documents: graphenectl's verdict (the pipeline's JSON Schema, through the
    SDK's rules) is the server's (the pipeline's model, strict), for every generated document."""
    definition = pipelines.definition_get(name)
    schema = definition.input_schema()
    pipeline = {"name": name, "input_schema": schema}
    document = data.draw(documents(schema))
    server = _server_accepts(name, document)
    refusal: dict[str, Any] | None = None
    try:
        check_inputs(pipeline, document, [])
    except UsageError as exc:
        refusal = dict(exc.fields)
    assert (refusal is None) == server, f"graphenectl: {refusal}, the server accepts: {server}, for {document!r}"


pairs = st.builds(
    lambda key, value: f"{key}={value}",
    st.sampled_from(["branches", "leaves", "name", "pause_seconds", "seconds", "catch_unknown", "guarantee"])
    | ordinary_text
    | poisons,
    ordinary_text | poisons | st.sampled_from(["1", "true", "1e400", "nan", "-inf", "1_0", "٣", "9" * 5000, "[1]"]),
)


@pytest.mark.django_db  # "hello" is an example: delivered as a revision (GRAPHENE_PIPELINE_DIRS)
@pytest.mark.parametrize("name", SCHEMAS)
@settings(max_examples=120, derandomize=True, database=None, deadline=None)
@given(given_pairs=st.lists(pairs | ordinary_text, min_size=1, max_size=3))
def test_graphenectl_input_pairs_are_refused_with_a_usage_error_or_accepted_by_the_server(
    name: str, given_pairs: list[str]
) -> None:
    """Hostile ``--input NAME=VALUE`` arguments (an argument that is not UTF-8 arrives as lone
    surrogates): a usage error naming the input, never another exception, and never inputs the
    server would refuse."""
    definition = pipelines.definition_get(name)
    pipeline = {"name": name, "input_schema": definition.input_schema()}
    try:
        inputs = check_inputs(pipeline, {}, given_pairs)
    except UsageError as exc:
        refused = exc
    else:
        assert _server_accepts(name, inputs), f"graphenectl sent what the server refuses: {given_pairs!r} → {inputs!r}"
        return
    assert refused.fields, refused.message


@settings(max_examples=200, derandomize=True, database=None, deadline=None)
@given(value=json_values | poisoned())
def test_the_rules_never_fail_on_any_value(value: Any) -> None:
    """The SDK's checks answer for any JSON value (and any depth) with problems, never an error."""
    problems = rules.json_problems(value, max_depth=3)
    assert isinstance(problems, dict)
    try:
        text = json.dumps(value)
    except ValueError:
        return
    deep = rules.text_too_deep(text, 3)
    assert deep == any("nested deeper" in m for ms in rules.json_problems(value, max_depth=3).values() for m in ms)
