#!/usr/bin/env python3
"""Run the ``environment`` example pipeline end to end and show what it owned, and when.

1. start a run of ``environment`` (examples/pipelines/environment.py) over the REST API;
2. while the run holds its environment (its records are ready and its tests step runs),
   print the run's resource tree::

       graphene.run/environment#1
       ├── test.sleep/network
       │   ├── test.sleep/db
       │   ├── test.sleep/app-0
       │   └── test.sleep/app-1
       └── file/app-config

3. wait for the run to succeed and print its output and journal;
4. wait for the run's death to delete everything it owned (children first) and print the
   tree again, every record a ``deleted`` tombstone;
5. check the outside world: the config file existed while held and is gone now.

Every claim is checked against the server's answers and the disk; any mismatch is reported
and the exit status is 1. Standard library only.

    GRAPHENE_TOKEN=... GRAPHENE_CA_FILE=.graphene/tls/ca.pem \
        python examples/pipeline_tour.py --url https://127.0.0.1:8000 --data-dir .graphene
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

from records_tour import Api, ApiError, render, walk

TERMINAL = {"succeeded", "failed", "cancelled", "timed_out"}


def log(message: str) -> None:
    print(f"pipeline-tour: {message}", file=sys.stderr, flush=True)


class Tour:
    def __init__(self, api: Api, args: argparse.Namespace) -> None:
        self.api = api
        self.args = args
        self.failures: list[str] = []

    def check(self, ok: bool, what: str) -> bool:
        log(f"{'ok' if ok else 'FAIL'}: {what}")
        if not ok:
            self.failures.append(what)
        return ok

    def run_status(self, run_id: str) -> dict[str, Any]:
        return dict(self.api.call("GET", f"/runs/{run_id}/")[1])

    def wait(self, what: str, condition: Any, timeout: float) -> Any:
        deadline = time.monotonic() + timeout
        while True:
            value = condition()
            if value:
                return value
            if time.monotonic() > deadline:
                self.check(False, f"{what} within {timeout:.0f}s")
                return None
            time.sleep(0.1)

    def main(self) -> int:
        inputs = {"branch": "demo", "replicas": 2, "boot_ms": 600, "test_seconds": 2.0}
        log(f"starting a run of 'environment' with {inputs}")
        _, run = self.api.call("POST", "/pipelines/environment/runs/", {"inputs": inputs}, expect=(201,))
        run_id, root_id = run["id"], run["record"]

        def held() -> dict[str, Any] | None:
            status = self.run_status(run_id)
            if status["status"] in TERMINAL:
                self.check(
                    False, f"the run ended ({status['status']}) before its environment was seen: {status['error']}"
                )
                return {"ended": True}  # truthy: stop waiting, there is nothing more to see
            tree: dict[str, Any] = self.api.tree(root_id)
            nodes = [n for n, _ in walk(tree) if n["kind"] != "graphene.run"]
            if len(nodes) == 5 and all(n["phase"] == "ready" for n in nodes):
                return tree
            return None

        tree = self.wait("the environment to be ready while the run holds it", held, self.args.timeout)
        if not tree or tree.get("ended"):
            return 1
        print("\nWhile the run holds its environment:")
        print(render(tree), flush=True)
        config = next(n for n, _ in walk(tree) if n["kind"] == "file")
        config_path = Path(self.api.get(config["id"])["outputs"]["path"])
        self.check(config_path.is_file(), f"the config file exists while held: {config_path}")

        final = self.wait(
            "the run to end", lambda: (s := self.run_status(run_id))["status"] in TERMINAL and s, self.args.timeout
        )
        if not final:
            return 1
        self.check(final["status"] == "succeeded", f"the run succeeded (status {final['status']}) {final['error']}")
        print(f"\nRun {run_id} {final['status']}; output:")
        for key, value in (final["outputs"] or {}).items():
            print(f"  {key}: {value}")
        print("Journal (replayed, never redone, after a crash):")
        for entry in final["journal"]:
            print(f"  #{entry['seq']:<3} {entry['call'][:64]:<64} {entry['status']}")

        def cleaned() -> dict[str, Any] | None:
            tree: dict[str, Any] = self.api.tree(root_id)
            return tree if all(n["phase"] == "deleted" for n, _ in walk(tree)) else None

        tree = self.wait("the run's death to delete everything it owned", cleaned, self.args.timeout)
        if not tree:
            return 1
        print("\nAfter the run ended (tombstones, kept with their history):")
        print(render(tree), flush=True)
        order_ok = True
        for node, parent in walk(tree):
            if parent is not None:
                child_done = self.api.get(node["id"])["deleted_at"]
                parent_done = self.api.get(parent["id"])["deleted_at"]
                order_ok &= bool(child_done and parent_done and child_done <= parent_done)
        self.check(order_ok, "every record was deleted before its owner")
        self.check(not config_path.exists(), f"the config file is gone: {config_path}")
        print()
        if self.failures:
            log(f"{len(self.failures)} check(s) failed")
            return 1
        log("every check passed")
        return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", default=os.environ.get("GRAPHENE_SERVER", "https://127.0.0.1:8000"))
    parser.add_argument("--timeout", type=float, default=90.0, help="seconds to wait for each stage")
    args, _ = parser.parse_known_args()
    token = os.environ.get("GRAPHENE_TOKEN", "")
    if not token:
        log("set GRAPHENE_TOKEN to an API token (graphene up prints one on first start)")
        return 2
    try:
        return Tour(Api(args.url, token), args).main()
    except ApiError as exc:
        log(f"error: {exc}")
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
