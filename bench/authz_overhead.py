"""Benchmark: what access checks add to an API request.

Builds an installation of 50 namespaces (made with ``rbac.namespace_create``), each holding a
stand root with 19 records (COPY); 10 of them also hold 60 runs each, every run the root of a
5-record tree (3,000 more records). Each tree gets a creation time of its own in the last 30
days, so that the namespaces interleave in newest-first lists as they do in an installation
made over weeks. Role bindings (``rbac.role_bind``), 256 in all:

* ``one``: a developer in ``ns-00`` — one binding;
* ``many``: 200 bindings in a handful of namespaces (``ns-00`` … ``ns-04``): the four built-in
  roles and 36 custom ones (each with rules of its own, so no two bindings read alike) in each
  of the five, 80 bound to the user directly and 120 through three groups it belongs to;
* 55 bindings of other users and a group (developers of the other namespaces, an ops group),
  which the lookups must pass over;
* ``super``: a superuser, whom the access module lets through without reading bindings.

Then requests, through the REST API in this process (Django's test client with a token:
routing, token authentication, the permission class, the selectors' narrowing, the query,
serialization — no network), as each of the three users:

* ``records``: ``GET /api/v1/records/?limit=50``;
* ``runs``: ``GET /api/v1/runs/?limit=50``;
* ``record``: ``GET /api/v1/records/{id}/``, a random record of ``ns-00`` each round (the same
  for the three users).

Every answer is checked: 50 rows (each user sees at least 50 of each), only rows of namespaces
the user may read, the record asked for. The three users take turns within each round (the
order rotating from round to round) so that drift in the machine's load hits them alike;
``--warmup`` rounds, then ``--reps`` timed ones. Queries are counted once per endpoint and
user with ``CaptureQueriesContext``. Beside the wall clock, each request is charged the CPU it
cost this process (``time.process_time``) and its PostgreSQL backend (``/proc/<pid>/schedstat``):
on a shared 2-core machine the wall clock's p95 follows the other work running, the CPU much
less.

    .venv/bin/python bench/authz_overhead.py [--reps 300] [--warmup 30]

Prints a table (p50/p95 and queries per endpoint and user), then the last line:
``added_p95_ms`` (the largest p95 of a bound user minus the superuser's p95 of the same
endpoint; goal under 1), ``added_p50_ms`` (the same for the median), ``added_cpu_ms`` (the
same for the median CPU per request), ``queries_per_request_1``
and ``queries_per_request_200`` (the most queries any endpoint made for the user with 1 and
with 200 bindings), ``queries_per_request`` (the bound user's count; goal: the same with 1 and
with 200 bindings — the script exits 1 if they differ on any endpoint), ``added_queries``
(bound user minus superuser) and ``load_1m_before``.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import (
    analyze,
    bench_environment,
    copy_trees,
    figures,
    load_1m,
    log,
    median,
    next_tree_id,
    process_run_ns,
    tree_nodes,
)
from bench._runs_common import percentile

NAMESPACES = [f"ns-{i:02d}" for i in range(50)]
STAND_FANOUT = (19,)  # a stand root and 19 records: 20 records a namespace
RUN_NAMESPACES = NAMESPACES[:10]
RUNS_PER_NAMESPACE = 60
RUN_FANOUT = (4,)  # a run's root and 4 records
MANY_NAMESPACES = NAMESPACES[:5]
CUSTOM_ROLES = 36  # + 4 built-in = 40 roles, in each of 5 namespaces: 200 bindings
DIRECT_ROLES = 16  # of the 40 roles, bound to the user directly; the rest through 3 groups
GROUPS = 3
PAGE = 50
USERS = ("super", "one", "many")


def custom_rules(k: int) -> list[dict[str, list[str]]]:
    """Rules of custom role ``k``: reads of records and runs plus one verb on one more
    resource, no two roles alike (the bindings' rows differ, nothing collapses them)."""
    extra_verbs = ("create", "update", "delete", "start", "cancel", "resume", "exec", "open_terminal", "watch")
    extra_resources = ("pipelines", "stands", "agents", "artifacts")
    return [
        {"verbs": ["get", "list"], "resources": ["records", "runs"]},
        {"verbs": [extra_verbs[k % 9]], "resources": [extra_resources[k // 9]]},
    ]


def spread_in_time() -> None:
    """Give each tree a creation time of its own in the last 30 days (its records a second
    apart, in tree order; a run the time of its root), as an installation made over weeks has:
    namespaces interleave in the newest-first lists instead of each being one block of rows."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT setseed(0.17)")
        cursor.execute(
            "UPDATE records_record r SET created_at = t.base + r.lft * interval '1 second', "
            "updated_at = t.base + r.lft * interval '1 second' "
            "FROM (SELECT tree_id, now() - random() * interval '30 days' AS base "
            "      FROM records_record WHERE parent_id IS NULL ORDER BY tree_id) t "
            "WHERE r.tree_id = t.tree_id"
        )
        cursor.execute(
            "UPDATE pipelines_run run SET created_at = r.created_at, started_at = r.created_at, "
            "finished_at = r.created_at + interval '1 minute', updated_at = r.created_at + interval '1 minute' "
            "FROM records_record r WHERE r.id = run.record_id"
        )


def build() -> dict[str, Any]:
    """The namespaces, records, runs, roles, users and bindings. Returns what requests pick from."""
    from django.contrib.auth import get_user_model
    from django.contrib.auth.models import Group
    from django.db.models import Q

    from apps.accounts.services import access_token_issue
    from apps.core import rbac
    from apps.core.access import BUILTIN_ROLES
    from apps.core.models import RoleBinding
    from apps.pipelines.models import Pipeline, Run
    from apps.records.models import Record

    for name in NAMESPACES:
        rbac.namespace_create(name=name, actor=None)
    tree_id = next_tree_id()
    for ns in NAMESPACES:
        copy_trees(
            [(tree_id, tree_nodes(STAND_FANOUT))],
            root_kind="graphene.stand",
            child_kind="test.sleep",
            child_spec={},
            phase="ready",
            name_prefix=f"stand-{ns}",
            namespace=ns,
        )
        tree_id += 1
    for ns in RUN_NAMESPACES:
        trees = [(tree_id + i, tree_nodes(RUN_FANOUT)) for i in range(RUNS_PER_NAMESPACE)]
        tree_id += RUNS_PER_NAMESPACE
        copy_trees(
            trees,
            root_kind="graphene.run",
            child_kind="test.sleep",
            child_spec={},
            phase="ready",
            name_prefix=f"run-{ns}",
            namespace=ns,
        )
        # Pipelines that are no longer loaded keep their runs' history: no code needed here.
        pipeline = Pipeline.objects.create(name=f"{ns}.build", namespace=ns, source="bench:build", is_loaded=False)
        Run.objects.bulk_create(
            Run(
                id=nodes[0].id,
                pipeline=pipeline,
                number=n + 1,
                record_id=nodes[0].id,
                status="succeeded",
                namespace=ns,
                inputs={"branch": "main"},
                outputs={"ok": True},
                attempt=1,
            )
            for n, (_tree, nodes) in enumerate(trees)
        )

    spread_in_time()

    users = get_user_model().objects
    superuser = users.create_superuser("super", password=None)
    one = users.create_user("one", password=None)
    many = users.create_user("many", password=None)
    rbac.role_bind(role="developer", namespace="ns-00", user="one", actor=None)

    roles = list(BUILTIN_ROLES)
    for k in range(CUSTOM_ROLES):
        roles.append(rbac.role_create(name=f"team-{k:02d}", rules=custom_rules(k), actor=None).name)
    groups = [Group.objects.create(name=f"crew-{g}") for g in range(GROUPS)]
    many.groups.add(*groups)
    per_group = (len(roles) - DIRECT_ROLES) // GROUPS
    for index, role in enumerate(roles):
        group = None if index < DIRECT_ROLES else groups[min((index - DIRECT_ROLES) // per_group, GROUPS - 1)].name
        for ns in MANY_NAMESPACES:
            rbac.role_bind(role=role, namespace=ns, user=None if group else "many", group=group, actor=None)
    # Bindings of others, which the user's lookup must pass over.
    for ns in NAMESPACES[5:]:
        users.create_user(f"dev-{ns}", password=None)
        rbac.role_bind(role="developer", namespace=ns, user=f"dev-{ns}", actor=None)
    Group.objects.create(name="ops")
    for ns in NAMESPACES[40:]:
        rbac.role_bind(role="admin", namespace=ns, group="ops", actor=None)

    def bindings_of(user: Any) -> int:
        return RoleBinding.objects.filter(Q(user=user) | Q(group__user=user)).distinct().count()

    counts = {"one": bindings_of(one), "many": bindings_of(many)}
    if counts != {"one": 1, "many": 200}:
        raise AssertionError(f"bindings built wrong: {counts}")
    analyze("records_record", "pipelines_run", "core_rolebinding", "auth_user_groups")
    record_ids = list(
        Record.objects.filter(namespace="ns-00", kind="test.sleep", parent__kind="graphene.stand").values_list(
            "pk", flat=True
        )
    )
    return {
        "tokens": {
            name: access_token_issue(user=user).key for name, user in zip(USERS, (superuser, one, many), strict=True)
        },
        "allowed": {"super": None, "one": {"ns-00"}, "many": set(MANY_NAMESPACES)},
        "record_ids": record_ids,
        "records": Record.objects.count(),
        "runs": Run.objects.count(),
        "bindings": RoleBinding.objects.count(),
    }


@dataclass
class Endpoint:
    name: str
    url: Callable[[Any], str]  # from the round's record id
    check: Callable[[str, Any, Any], None]  # (user, body, record id)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=int, default=300)
    parser.add_argument("--warmup", type=int, default=30)
    args = parser.parse_args()

    with bench_environment("authz_overhead", redis_db=12):
        from django.db import connection
        from django.test import Client
        from django.test.utils import CaptureQueriesContext

        began = time.monotonic()
        made = build()
        log(
            f"built {len(NAMESPACES)} namespaces, {made['records']} records, {made['runs']} runs, "
            f"{made['bindings']} role bindings in {time.monotonic() - began:.1f}s"
        )
        client = Client()
        headers = {user: {"Authorization": f"Token {key}", "Host": "localhost"} for user, key in made["tokens"].items()}

        def check_page(user: str, body: Any, _record_id: Any) -> None:
            rows = body["results"]
            allowed = made["allowed"][user]
            if len(rows) != PAGE:
                raise AssertionError(f"{user} got {len(rows)} rows, not {PAGE}")
            if allowed is not None and {r["namespace"] for r in rows} - allowed:
                raise AssertionError(f"{user} saw rows of {sorted({r['namespace'] for r in rows} - allowed)}")

        def check_record(user: str, body: Any, record_id: Any) -> None:
            if body["id"] != str(record_id) or body["namespace"] != "ns-00":
                raise AssertionError(f"{user} asked for record {record_id}, got {body.get('id')}")

        endpoints = [
            Endpoint("records", lambda _rid: f"/api/v1/records/?limit={PAGE}", check_page),
            Endpoint("runs", lambda _rid: f"/api/v1/runs/?limit={PAGE}", check_page),
            Endpoint("record", lambda rid: f"/api/v1/records/{rid}/", check_record),
        ]

        def request(endpoint: Endpoint, user: str, record_id: Any) -> tuple[float, float]:
            """One request: (wall ms, CPU ms of this process and its PostgreSQL backend)."""
            url = endpoint.url(record_id)
            connection.ensure_connection()
            backend = connection.connection.info.backend_pid
            db_before, cpu_before = process_run_ns(backend), time.process_time()
            start = time.perf_counter()
            response = client.get(url, headers=headers[user])
            elapsed = (time.perf_counter() - start) * 1000
            cpu = (time.process_time() - cpu_before) * 1000 + (process_run_ns(backend) - db_before) / 1e6
            if connection.connection.info.backend_pid != backend:
                raise AssertionError("the request changed database connections: its CPU cannot be charged")
            if response.status_code != 200:
                raise AssertionError(f"{user}: {url} answered {response.status_code}: {response.content[:300]!r}")
            endpoint.check(user, response.json(), record_id)
            return elapsed, cpu

        rng = random.Random(17)
        times: dict[tuple[str, str], list[float]] = {(e.name, u): [] for e in endpoints for u in USERS}
        cpus: dict[tuple[str, str], list[float]] = {(e.name, u): [] for e in endpoints for u in USERS}
        load = load_1m()
        for rnd in range(args.warmup + args.reps):
            record_id = rng.choice(made["record_ids"])
            shift = rnd % len(USERS)
            order = USERS[shift:] + USERS[:shift]
            for endpoint in endpoints:
                for user in order:
                    ms, cpu = request(endpoint, user, record_id)
                    if rnd >= args.warmup:
                        times[(endpoint.name, user)].append(ms)
                        cpus[(endpoint.name, user)].append(cpu)
            if rnd == args.warmup - 1:
                log(f"warmed up ({args.warmup} rounds); timing {args.reps} rounds")

        queries: dict[tuple[str, str], int] = {}
        for endpoint in endpoints:
            for user in USERS:
                with CaptureQueriesContext(connection) as captured:
                    request(endpoint, user, made["record_ids"][0])
                queries[(endpoint.name, user)] = len(captured)

    print(
        f"{'endpoint':<10}{'user':<7}{'bindings':>9}{'p50 ms':>9}{'p95 ms':>9}{'+p50':>8}{'+p95':>8}"
        f"{'cpu ms':>8}{'+cpu':>8}{'queries':>9}"
    )
    bindings = {"super": "-", "one": "1", "many": "200"}
    added_p95: dict[tuple[str, str], float] = {}
    added_p50: dict[tuple[str, str], float] = {}
    added_cpu: dict[tuple[str, str], float] = {}
    for endpoint in endpoints:
        base50 = percentile(times[(endpoint.name, "super")], 50)
        base95 = percentile(times[(endpoint.name, "super")], 95)
        base_cpu = median(cpus[(endpoint.name, "super")])
        for user in USERS:
            key = (endpoint.name, user)
            p50, p95, cpu = percentile(times[key], 50), percentile(times[key], 95), median(cpus[key])
            plus50 = plus95 = plus_cpu = ""
            if user != "super":
                added_p50[key], added_p95[key], added_cpu[key] = p50 - base50, p95 - base95, cpu - base_cpu
                plus50, plus95, plus_cpu = f"{p50 - base50:+.2f}", f"{p95 - base95:+.2f}", f"{cpu - base_cpu:+.2f}"
            print(
                f"{endpoint.name:<10}{user:<7}{bindings[user]:>9}{p50:>9.2f}{p95:>9.2f}{plus50:>8}{plus95:>8}"
                f"{cpu:>8.2f}{plus_cpu:>8}{queries[key]:>9}"
            )
    differ = [e.name for e in endpoints if queries[(e.name, "one")] != queries[(e.name, "many")]]
    if differ:
        print(f"query counts differ between 1 and 200 bindings on: {', '.join(differ)}")
    worst = max(added_p95, key=lambda k: added_p95[k])
    print(f"largest added p95: {worst[0]} as {worst[1]}; {args.reps} rounds after {args.warmup} warm-up rounds")
    q1 = max(queries[(e.name, "one")] for e in endpoints)
    q200 = max(queries[(e.name, "many")] for e in endpoints)
    figures(
        {
            "added_p95_ms": added_p95[worst],
            "added_p50_ms": max(added_p50.values()),
            "added_cpu_ms": max(added_cpu.values()),
            "queries_per_request_1": q1,
            "queries_per_request_200": q200,
            "queries_per_request": q200 if differ else q1,
            "added_queries": max(queries[(e.name, "many")] - queries[(e.name, "super")] for e in endpoints),
            "namespaces": len(NAMESPACES),
            "bindings": made["bindings"],
            "load_1m_before": load,
        }
    )
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
