#!/usr/bin/env python3
"""Records without a pipeline: declare a small environment, hold it, then let Graphene tear it down.

It drives the records REST API directly (a pipeline does the same through ``graphene_sdk``;
see ``examples/pipeline_tour.py``), to show what the records layer promises on its own:

1. create a stand (a root record that owns everything below it);
2. declare a tree of resources under it::

       graphene.stand/demo
       └── test.sleep/network
           ├── test.sleep/db
           └── test.sleep/app
               └── file/app.conf

3. wait until every record is ``ready`` and print the tree while the stand holds it;
4. delete the stand (one call: Graphene deletes the subtree children first) and print the
   tree again, every record now a ``deleted`` tombstone;
5. check the outside world: the file and the test objects existed while held and are gone
   after the delete, and every child was gone before its owner's delete began.

Every claim it prints is checked against the server's answers and the disk; any mismatch is
reported and the exit status is 1. Standard library only, so it runs with any Python 3.11.

    GRAPHENE_TOKEN=... GRAPHENE_CA_FILE=.graphene/tls/ca.pem python examples/records_tour.py --url https://127.0.0.1:8000

``GRAPHENE_CA_FILE`` names the CA to trust for HTTPS (``graphene up`` prints where its local CA
is); without it, the system's trust store.

``examples/demo.py --example examples/records_tour.py`` runs it against a fresh embedded server.
"""

from __future__ import annotations

import argparse
import json
import os
import ssl
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

# Phases on the way to ready; anything else while waiting is a failure.
CONVERGING = {"pending", "creating"}
CONFIG = """\
# app.conf, written by Graphene's file kind and removed when its owner dies
listen = 127.0.0.1:8080
database = db.demo.internal:5432
log_level = info
"""


def log(message: str) -> None:
    print(f"tour: {message}", file=sys.stderr, flush=True)


class ApiError(Exception):
    pass


class Api:
    """A minimal JSON client for Graphene's REST API (token auth, no proxies: it is local). Over
    HTTPS it trusts the CA in ``GRAPHENE_CA_FILE`` only, else the system's trust store."""

    def __init__(self, base_url: str, token: str, timeout: float = 90.0) -> None:
        if not base_url.startswith(("http://", "https://")):
            raise ApiError(f"the server URL must start with http:// or https://, not {base_url!r}")
        self.base = base_url.rstrip("/") + "/api/v1"
        self.headers = {"Authorization": f"Token {token}", "Accept": "application/json"}
        self.timeout = timeout
        context = ssl.create_default_context(cafile=os.environ.get("GRAPHENE_CA_FILE") or None)
        self.opener = urllib.request.build_opener(
            urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=context)
        )

    def call(self, method: str, path: str, body: Any = None, expect: tuple[int, ...] = (200,)) -> tuple[int, Any]:
        data = None if body is None else json.dumps(body).encode()
        headers = dict(self.headers)
        if data is not None:
            headers["Content-Type"] = "application/json"
        # S310: the scheme is checked in __init__ (http or https only).
        request = urllib.request.Request(self.base + path, data=data, method=method, headers=headers)  # noqa: S310
        try:
            with self.opener.open(request, timeout=self.timeout) as response:
                status, raw = response.status, response.read()
        except urllib.error.HTTPError as exc:
            status, raw = exc.code, exc.read()
        except (urllib.error.URLError, OSError) as exc:
            raise ApiError(f"{method} {path}: {exc}") from None
        try:
            payload = json.loads(raw) if raw else None
        except ValueError:
            payload = raw.decode(errors="replace")[:200]
        if status not in expect:
            detail = payload.get("detail", payload) if isinstance(payload, dict) else payload
            raise ApiError(f"{method} {path}: HTTP {status}: {detail}")
        return status, payload

    def declare(self, kind: str, name: str, *, owner: str | None, spec: dict[str, Any]) -> dict[str, Any]:
        body: dict[str, Any] = {"kind": kind, "name": name, "spec": spec, "labels": {"example": "records-tour"}}
        if owner is not None:
            body["owner"] = owner
        _, record = self.call("POST", "/records/", body, expect=(201,))
        return dict(record)

    def get(self, record_id: str) -> dict[str, Any]:
        return dict(self.call("GET", f"/records/{record_id}/")[1])

    def tree(self, record_id: str) -> dict[str, Any]:
        return dict(self.call("GET", f"/records/{record_id}/tree/?depth=10")[1])

    def events(self, record_id: str) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        path: str | None = f"/records/{record_id}/events/?limit=1000"
        while path:
            page = self.call("GET", path)[1]
            out += page["results"]
            nxt = page.get("next")
            path = nxt[nxt.index("/records/") :] if nxt else None
        return out


def walk(node: dict[str, Any], parent: dict[str, Any] | None = None) -> Iterator[tuple[dict[str, Any], Any]]:
    """Every node of a tree answer with its parent node."""
    yield node, parent
    for child in node["children"]:
        yield from walk(child, node)


def render(tree: dict[str, Any]) -> str:
    """The tree as indented ``kind/name   phase`` lines."""
    rows: list[tuple[str, str]] = []

    def visit(node: dict[str, Any], prefix: str, branch: str) -> None:
        rows.append((f"{prefix}{branch}{node['kind']}/{node['name']}", node["phase"]))
        children = node["children"]
        below = prefix + ("" if not branch else ("    " if branch.startswith("└") else "│   "))
        for i, child in enumerate(children):
            visit(child, below, "└── " if i == len(children) - 1 else "├── ")

    visit(tree, "", "")
    width = max(len(label) for label, _ in rows) + 3
    return "\n".join(f"  {label.ljust(width)}{phase}" for label, phase in rows)


def objects_in(world: Path, record_id: str) -> list[Path]:
    """The test kinds' objects for a record: files in a folder named by its id (at any depth)."""
    return sorted(p for p in world.glob(f"**/{record_id}/*") if p.is_file())


def label(node: dict[str, Any]) -> str:
    return f"{node['kind']}/{node['name']}"


class Tour:
    def __init__(self, api: Api, args: argparse.Namespace) -> None:
        self.api = api
        self.args = args
        self.failures: list[str] = []

    def check(self, ok: bool, what: str) -> bool:
        if ok:
            log(f"ok: {what}")
        else:
            self.failures.append(what)
            log(f"FAIL: {what}")
        return ok

    def wait_ready(self, root_id: str, expected: int) -> dict[str, Any]:
        """Poll the tree until every record is ready; fail on a failed create or the deadline."""
        deadline = time.monotonic() + self.args.timeout
        last = ""
        while True:
            tree = self.api.tree(root_id)
            nodes = [node for node, _ in walk(tree)]
            phases = sorted(node["phase"] for node in nodes)
            summary = ", ".join(f"{phases.count(p)} {p}" for p in sorted(set(phases)))
            if summary != last:
                log(f"waiting for {len(nodes)} records: {summary}")
                last = summary
            if len(nodes) == expected and all(node["phase"] == "ready" for node in nodes):
                return tree
            stuck = [n for n in nodes if n["phase"] not in CONVERGING | {"ready"}]
            if stuck:
                for node in stuck:
                    error = self.api.get(node["id"]).get("last_error") or "(no error recorded)"
                    self.check(False, f"{label(node)} went to {node['phase']} instead of ready: {error}")
                return tree
            if time.monotonic() > deadline:
                self.check(False, f"records not ready after {self.args.timeout:.0f}s: {summary}")
                return tree
            time.sleep(0.1)

    def run(self) -> int:
        api = self.api
        started = time.monotonic()
        log(f"creating stand {self.args.stand!r}")
        stand = api.declare("graphene.stand", self.args.stand, owner=None, spec={})
        sid = stand["id"]
        # What the pipeline declares: (kind, name, owner name, spec).
        config_path = f"examples/{sid[:8]}/app.conf"
        plan: list[tuple[str, str, str, dict[str, Any]]] = [
            ("test.sleep", "network", self.args.stand, {"create_ms": 300, "delete_ms": 100}),
            ("test.sleep", "db", "network", {"create_ms": 500, "delete_ms": 200, "value": {"engine": "postgres"}}),
            ("test.sleep", "app", "network", {"create_ms": 250, "delete_ms": 100}),
            ("file", "app.conf", "app", {"path": config_path, "content": CONFIG, "mode": 0o640}),
        ]
        ids = {self.args.stand: sid}
        for kind, name, owner, spec in plan:
            record = api.declare(kind, name, owner=ids[owner], spec=spec)
            ids[name] = record["id"]
            # Declaring only commits the record (I1): the kind works after the answer.
            log(f"declared {kind}/{name} under {owner} -> {record['id']} ({record['phase']})")

        tree = self.wait_ready(sid, expected=len(plan) + 1)
        if self.failures:
            self.cleanup(sid)
            return 1
        log(f"all {len(plan) + 1} records ready after {time.monotonic() - started:.1f}s")
        print(f"\nResource tree while the stand holds it ({self.args.stand}):")
        print(render(tree), flush=True)

        # The tree has exactly the declared ownership.
        parents = {label(node): (label(parent) if parent else None) for node, parent in walk(tree)}
        by_name = {name: f"{kind}/{name}" for kind, name, _, _ in plan} | {self.args.stand: label(tree)}
        want = {f"{kind}/{name}": by_name[owner] for kind, name, owner, _ in plan} | {label(tree): None}
        self.check(parents == want, "the tree has exactly the declared owners")

        # The outside world exists while held.
        conf = api.get(ids["app.conf"])
        on_disk = Path(conf["outputs"].get("path", ""))
        file_root = Path(self.args.file_root).resolve() if self.args.file_root else None
        if file_root is not None:
            self.check(on_disk == file_root / config_path, f"the file kind wrote under the file root: {on_disk}")
        self.check(
            on_disk.is_file() and on_disk.read_text() == CONFIG,
            f"{on_disk} exists with the declared content",
        )
        if on_disk.is_file():
            self.check(on_disk.stat().st_mode & 0o777 == 0o640, f"{on_disk} has mode 0640")
        world = Path(self.args.test_world) if self.args.test_world else None
        for name in ("network", "db", "app"):
            obj = api.get(ids[name])["outputs"].get("object")
            if world is not None:
                found = [p for p in objects_in(world, ids[name]) if p.name == obj]
                self.check(bool(obj) and len(found) == 1, f"test.sleep/{name}'s object exists: {found[:1]}")
        self.check(api.get(ids["db"])["outputs"].get("value") == {"engine": "postgres"}, "db's outputs echo its spec")

        # One call deletes the whole environment; children go before their owners (I3).
        log(f"deleting stand {self.args.stand!r} and everything it owns")
        began = time.monotonic()
        status, deleted = api.call("DELETE", f"/records/{sid}/?wait=true&timeout=60", expect=(200, 202))
        self.check(
            status == 200 and deleted["phase"] == "deleted",
            f"the stand is deleted (HTTP {status}, phase {deleted['phase']}) after {time.monotonic() - began:.1f}s",
        )
        after = api.tree(sid)
        print(f"\nResource tree after the stand was deleted ({self.args.stand}):")
        print(render(after), flush=True)
        nodes = [node for node, _ in walk(after)]
        self.check(len(nodes) == len(plan) + 1, f"all {len(plan) + 1} records remain as tombstones")
        live = [f"{label(n)} is {n['phase']}" for n in nodes if n["phase"] != "deleted"]
        self.check(not live, "every record is deleted" + (f" (but {', '.join(live)})" if live else ""))
        self.check_cascade_order(after)

        # And the outside world is gone.
        self.check(not on_disk.exists(), f"{on_disk} was removed from disk")
        if world is not None:
            left = [name for name in ("network", "db", "app") if objects_in(world, ids[name])]
            self.check(not left, "the test.sleep objects are gone" + (f" (left: {left})" if left else ""))

        if self.failures:
            log(f"{len(self.failures)} check(s) failed:")
            for failure in self.failures:
                log(f"  - {failure}")
            return 1
        log(f"all checks passed in {time.monotonic() - started:.1f}s")
        return 0

    def check_cascade_order(self, tree: dict[str, Any]) -> None:
        """Each child reached ``deleted`` before its owner's delete began (``deleting``)."""

        def moment(record_id: str, to: str) -> datetime | None:
            for event in self.api.events(record_id):
                if event["type"] == "phase_changed" and (event.get("data") or {}).get("to") == to:
                    return datetime.fromisoformat(event["created_at"].replace("Z", "+00:00"))
            return None

        bad = []
        order: list[tuple[datetime, str]] = []
        for node, parent in walk(tree):
            gone = moment(node["id"], "deleted")
            if gone is not None:
                order.append((gone, label(node)))
            if parent is None:
                continue
            owner_began = moment(parent["id"], "deleting")
            if gone is None or owner_began is None or gone > owner_began:
                bad.append(f"{label(node)} deleted at {gone}, its owner {label(parent)} began at {owner_began}")
        self.check(not bad, "children were deleted before their owners" + (f": {'; '.join(bad)}" if bad else ""))
        log("deletion order: " + ", ".join(name for _, name in sorted(order)))

    def cleanup(self, sid: str) -> None:
        """After a failure, still try to delete what was created (and say if that failed too)."""
        try:
            status, _ = self.api.call("DELETE", f"/records/{sid}/?wait=true&timeout=30", expect=(200, 202))
            log(f"cleanup: delete of the stand answered HTTP {status}")
        except ApiError as exc:
            log(f"cleanup failed: {exc}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default=os.environ.get("GRAPHENE_URL", "https://127.0.0.1:8000"))
    parser.add_argument("--token", default=os.environ.get("GRAPHENE_TOKEN"), help="API token (or GRAPHENE_TOKEN)")
    parser.add_argument("--stand", default="demo", help="name of the stand to create (default: demo)")
    parser.add_argument("--timeout", type=float, default=60, help="seconds to wait for records to be ready")
    parser.add_argument("--file-root", help="the server's GRAPHENE_FILE_ROOT, to check where the file went")
    parser.add_argument("--test-world", help="the server's GRAPHENE_TEST_WORLD_DIR, to check the test objects")
    args = parser.parse_args(argv)
    if not args.token:
        parser.error("an API token is needed: --token or GRAPHENE_TOKEN")
    try:
        return Tour(Api(args.url, args.token), args).run()
    except ApiError as exc:
        log(f"FAIL: {exc}")
        return 1


if __name__ == "__main__":
    sys.exit(main())
