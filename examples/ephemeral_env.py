#!/usr/bin/env python3
"""Run the ``ephemeral_env`` example pipeline against the real Docker engine and check what it left.

1. prepare the inputs in the data directory: a root file system tar of a static busybox
   (``/bin/busybox`` and a symlink per applet; no registry is needed: the pipeline imports
   it) and a git repository with the code under test — a ``tests.sh`` and a README,
   committed — served as a ``file://`` URL;
2. start a run of ``ephemeral_env`` (examples/pipelines/ephemeral_env.py) over the REST API
   and, while it holds its environment, print its resource tree and the Docker objects
   labelled with its records::

       graphene.run/ephemeral_env#1
       ├── docker.image/busybox-1a2b3c4d
       │   └── docker.network/net
       │       └── docker.container/app
       ├── git.checkout/src
       ├── docker.container/database
       └── file/app-config

3. wait for the run to succeed; print its outputs and its log (the test job's output);
4. wait for the run's death to delete what it still owned and print that tree (tombstones);
   print what the pipeline's stand holds: the app, with the network and image it runs on;
5. ask Docker (``docker ps -a --filter label=graphene.record=...`` and the like for networks,
   volumes and images) what is left of the run: only the kept app, its network and image;
6. delete the stand's holding (``DELETE /api/v1/records/{id}/?wait=true``) and check that
   Docker has nothing left of the run — so the demo leaves nothing behind.

Every claim is checked against the server's answers, the disk and Docker; any mismatch is
reported and the exit status is 1 (2 when Docker, a static busybox or git is missing).
Progress goes to stderr, results to stdout. Standard library only.

    GRAPHENE_CA_FILE=.graphene/tls/ca.pem \
        python examples/ephemeral_env.py --url https://127.0.0.1:8000 --data-dir .graphene

The token is ``GRAPHENE_TOKEN``, else the one ``graphene up`` saved in the data directory.
The data directory (``--data-dir``, else ``GRAPHENE_DATA_DIR``, else ``.graphene``) must be
the server's, or at least on its machine: the server reads the tar and clones the repository
from there.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import struct
import subprocess
import sys
import tarfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pipeline_tour import TERMINAL, Tour
from records_tour import Api, ApiError, render, walk

PIPELINE = "ephemeral_env"
# What the run holds once its environment is up (the job comes and goes after them).
ENVIRONMENT = {
    ("docker.network", "net"),
    ("docker.container", "database"),
    ("docker.container", "app"),
    ("git.checkout", "src"),
    ("file", "app-config"),
}
KEEP_FOR_SECONDS = 3600
DOCKER_TIMEOUT = 60.0
BUSYBOX_CANDIDATES = ("/bin/busybox", "/usr/bin/busybox")
ROOTFS_DIRS = ("bin", "etc", "root", "tmp")
GIT_IDENTITY = ("-c", "user.name=Graphene Demo", "-c", "user.email=demo@graphene.invalid")

TESTS_SH = """\
#!/bin/sh
# The demo app's integration tests. The ephemeral_env pipeline runs this in a job container on
# the environment's network: $1 is the app's configuration; APP_HOST and DB_HOST (with
# APP_PORT, DB_PORT) name the containers; COMMIT is the commit under test.
set -eu
echo "config $1:"
sed 's/^/  /' "$1"
page=$(wget -q -O - "http://$APP_HOST:$APP_PORT/")
echo "app at $APP_HOST:$APP_PORT says: $page"
test "$page" = "app $COMMIT" || { echo "FAIL: the app serves another commit"; exit 1; }
rows=$(wget -q -O - "http://$DB_HOST:$DB_PORT/")
echo "database at $DB_HOST:$DB_PORT says: $rows"
grep -q "^database = $DB_HOST:$DB_PORT\\$" "$1" || { echo "FAIL: the config names another database"; exit 1; }
echo "all tests passed"
"""
README = """\
# demo-app

The code under test of Graphene's `ephemeral_env` example: `tests.sh` is its test suite.
"""


def log(message: str) -> None:
    print(f"ephemeral-env: {message}", file=sys.stderr, flush=True)


# --- prerequisites --------------------------------------------------------------------------


def is_static_elf(path: Path) -> bool:
    """An ELF executable without a program interpreter (PT_INTERP): it runs in an empty image."""
    try:
        with path.open("rb") as f:
            head = f.read(64)
            if len(head) < 64 or head[:4] != b"\x7fELF":
                return False
            order = "<" if head[5] == 1 else ">"
            if head[4] == 2:  # 64-bit
                (phoff,) = struct.unpack_from(order + "Q", head, 0x20)
                phentsize, phnum = struct.unpack_from(order + "HH", head, 0x36)
            else:
                (phoff,) = struct.unpack_from(order + "I", head, 0x1C)
                phentsize, phnum = struct.unpack_from(order + "HH", head, 0x2A)
            f.seek(phoff)
            for _ in range(phnum):
                entry = f.read(phentsize)
                if len(entry) < 4:
                    return False
                if struct.unpack_from(order + "I", entry)[0] == 3:  # PT_INTERP: dynamically linked
                    return False
    except OSError:
        return False
    return True


def find_busybox() -> Path | None:
    """A statically linked busybox on this machine (Debian: busybox-static), or None."""
    found = shutil.which("busybox")
    for candidate in ([found] if found else []) + list(BUSYBOX_CANDIDATES):
        path = Path(candidate).resolve()
        if path.is_file() and is_static_elf(path):
            return path
    return None


def prerequisites_problem(timeout: float = 10.0) -> str | None:
    """Why this example cannot run here (no Docker engine, static busybox or git), or None."""
    if shutil.which("docker") is None:
        return "the docker command is not installed"
    try:
        info = subprocess.run(
            ["docker", "info", "--format", "{{.ServerVersion}}"],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return f"`docker info` did not answer within {timeout:.0f}s"
    if info.returncode != 0 or not info.stdout.strip():
        return f"no Docker engine answers `docker info`: {(info.stderr.strip() or 'no output').splitlines()[-1]}"
    if find_busybox() is None:
        return "no statically linked busybox (install busybox-static): the image is made of it"
    if shutil.which("git") is None:
        return "git is not installed"
    return None


# --- inputs ---------------------------------------------------------------------------------


def build_rootfs(busybox: Path, path: Path) -> None:
    """A root file system tar: busybox, a symlink per applet, and the directories programs expect."""
    applets = subprocess.run(
        [str(busybox), "--list"], capture_output=True, text=True, check=True, timeout=30
    ).stdout.split()
    with tarfile.open(path, "w") as tar:
        for name in ROOTFS_DIRS:
            info = tarfile.TarInfo(name)
            info.type = tarfile.DIRTYPE
            info.mode = 0o1777 if name == "tmp" else 0o755
            tar.addfile(info)
        tar.add(busybox, arcname="bin/busybox")
        for applet in applets:
            if applet != "busybox" and "/" not in applet:
                link = tarfile.TarInfo(f"bin/{applet}")
                link.type = tarfile.SYMTYPE
                link.linkname = "busybox"
                tar.addfile(link)


def git(repo: Path, *args: str) -> str:
    # The machine's and the user's git configuration stay out (hooks, signing, templates).
    env = os.environ | {"GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull, "GIT_TERMINAL_PROMPT": "0"}
    done = subprocess.run(
        ["git", *GIT_IDENTITY, *args], cwd=repo, env=env, capture_output=True, text=True, timeout=60, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"git {' '.join(args)} failed: {done.stderr.strip()}")
    return done.stdout.strip()


def make_repository(repo: Path) -> str:
    """The code under test: a repository with tests.sh and a README, one commit on main."""
    repo.mkdir(parents=True)
    git(repo, "-c", "init.defaultBranch=main", "init", "-q")
    (repo / "tests.sh").write_text(TESTS_SH)
    (repo / "tests.sh").chmod(0o755)
    (repo / "README.md").write_text(README)
    git(repo, "add", "tests.sh", "README.md")
    git(repo, "-c", "commit.gpgsign=false", "commit", "-q", "--no-verify", "-m", "demo app and its tests")
    return git(repo, "rev-parse", "HEAD")


# --- Docker, by label -----------------------------------------------------------------------


def docker(*args: str) -> str:
    done = subprocess.run(["docker", *args], capture_output=True, text=True, timeout=DOCKER_TIMEOUT, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"docker {' '.join(args)} failed: {done.stderr.strip()}")
    return done.stdout


def docker_objects(record_ids: set[str]) -> list[tuple[str, str, str]]:
    """``(record id, "container"|"network"|"volume"|"image", description)`` for every Docker
    object labelled ``graphene.record=<one of record_ids>``."""
    found: list[tuple[str, str, str]] = []
    label = '{{.Label "graphene.record"}}'
    listings = {
        "container": ["ps", "-a", "--format", label + "\t{{.Names}} ({{.State}})"],
        "network": ["network", "ls", "--format", label + "\t{{.Name}}"],
        "volume": ["volume", "ls", "--format", label + "\t{{.Name}}"],
    }
    for what, command in listings.items():
        for line in docker(*command[:-2], "--filter", "label=graphene.record", *command[-2:]).splitlines():
            record, _, description = line.partition("\t")
            if record in record_ids:
                found.append((record, what, description))
    # `docker images` cannot print labels: ask per record.
    for record in sorted(record_ids):
        refs = docker("images", "--filter", f"label=graphene.record={record}", "--format", "{{.Repository}}:{{.Tag}}")
        found += [(record, "image", ref) for ref in refs.split()]
    return sorted(found, key=lambda item: (item[1], item[2]))


def describe(objects: list[tuple[str, str, str]], labels: dict[str, str]) -> str:
    if not objects:
        return "  (nothing)"
    return "\n".join(f"  {what:<10} {text:<48} record {labels.get(rid, rid)}" for rid, what, text in objects)


# --- the tour -------------------------------------------------------------------------------


def nodes(tree: dict[str, Any]) -> list[dict[str, Any]]:
    return [node for node, _ in walk(tree)]


class EphemeralTour(Tour):
    """pipeline_tour's waits and checks, with this example's own stages."""

    def __init__(self, api: Api, args: argparse.Namespace, work: Path) -> None:
        super().__init__(api, args)
        self.work = work
        self.commit = ""
        self.run_id: str | None = None
        self.holding: str | None = None

    def check(self, ok: bool, what: str) -> bool:
        log(f"{'ok' if ok else 'FAIL'}: {what}")
        if not ok:
            self.failures.append(what)
        return ok

    def tree(self, record_id: str) -> dict[str, Any]:
        """The record's tree. An answer without the record itself is retried: the tree view
        reads the record, then its subtree by its bounds, and an insert in between (the run
        declaring something) can move the bounds past it."""
        deadline = time.monotonic() + 10
        while True:
            tree: dict[str, Any] = self.api.tree(record_id)
            if "children" in tree:
                return tree
            if time.monotonic() > deadline:
                raise RuntimeError(f"GET /records/{record_id}/tree/ kept answering without the record itself")
            time.sleep(0.1)

    def deleted_tree(self, record_id: str) -> dict[str, Any] | None:
        """The record's tree once every record in it is a ``deleted`` tombstone, else None."""
        tree = self.tree(record_id)
        return tree if all(n["phase"] == "deleted" for n in nodes(tree)) else None

    def prepare(self) -> dict[str, str]:
        busybox = find_busybox()
        assert busybox is not None  # prerequisites_problem() said so
        shutil.rmtree(self.work, ignore_errors=True)
        self.work.mkdir(parents=True)
        rootfs = self.work / "busybox-rootfs.tar"
        build_rootfs(busybox, rootfs)
        log(f"built {rootfs} ({rootfs.stat().st_size // 1024} KiB) from {busybox}")
        repo = self.work / "demo-app"
        self.commit = make_repository(repo)
        log(f"made the repository under test: {repo} at {self.commit[:12]} (tests.sh, README.md)")
        return {"rootfs_tar": str(rootfs), "repository": repo.as_uri(), "ref": "main"}

    def main(self) -> int:
        inputs = self.prepare()
        log(f"starting a run of {PIPELINE!r} with {inputs}")
        _, run = self.api.call("POST", f"/pipelines/{PIPELINE}/runs/", {"inputs": inputs}, expect=(201,))
        self.run_id = run_id = run["id"]
        root_id = run["record"]
        record_ids: set[str] = {root_id}
        labels: dict[str, str] = {}

        def remember(tree: dict[str, Any]) -> None:
            for node in nodes(tree):
                record_ids.add(node["id"])
                labels[node["id"]] = f"{node['kind']}/{node['name']}"

        def held() -> dict[str, Any] | None:
            status = self.run_status(run_id)
            if status["status"] in TERMINAL:
                return {"ended": status}
            tree = self.tree(root_id)
            ready = {(n["kind"], n["name"]) for n in nodes(tree) if n["phase"] == "ready"}
            image_ready = any(kind == "docker.image" for kind, _ in ready)
            return tree if image_ready and ready >= ENVIRONMENT else None

        tree = self.wait("the environment to be ready while the run holds it", held, self.args.timeout)
        if tree and "ended" in tree:
            ended = tree["ended"]
            self.check(False, f"the run ended ({ended['status']}) before its environment was seen: {ended['error']}")
        if not tree or "ended" in tree:
            return 1
        remember(tree)
        print("\nWhile the run holds its environment:")
        print(render(tree))
        print("In Docker (objects labelled graphene.record=<one of these records>):")
        print(describe(docker_objects(record_ids), labels), flush=True)
        by_name = {(n["kind"], n["name"]): n for n in nodes(tree)}
        app_id = by_name[("docker.container", "app")]["id"]
        config_path = Path(self.api.get(by_name[("file", "app-config")]["id"])["outputs"]["path"])
        checkout = self.api.get(by_name[("git.checkout", "src")]["id"])["outputs"]
        self.check(config_path.is_file(), f"the config file exists while held: {config_path}")
        self.check(
            checkout["commit"] == self.commit, f"the checkout is at the commit under test ({checkout['commit']})"
        )

        final = self.wait(
            "the run to end", lambda: (s := self.run_status(run_id))["status"] in TERMINAL and s, self.args.timeout
        )
        if not final:
            return 1
        self.check(final["status"] == "succeeded", f"the run succeeded (status {final['status']}) {final['error']}")
        outputs = final["outputs"] or {}
        print(f"\nRun {run_id} {final['status']}; outputs:")
        for key, value in outputs.items():
            if key == "output":
                print(f"  output: {len(value)} lines, the job's stdout (in the run's log below)")
            else:
                print(f"  {key}: {value}")
        lines = self.api.call("GET", f"/records/{root_id}/logs/?descendants=false&limit=1000")[1]["results"]
        print("The run's log:")
        for line in lines:
            print(f"  {line['at'][11:23]} {line['severity']:<7} {line['message']}")
        self.check(outputs.get("exit_code") == 0, f"the test job exited with 0 ({outputs.get('exit_code')})")
        self.check(
            any(line["message"] == "tests: all tests passed" for line in lines),
            "the run's log has the job's output, ending in 'all tests passed'",
        )
        if final["status"] != "succeeded":
            return 1
        self.holding = outputs["kept_holding"]
        kept = outputs["kept_container"]

        tree = self.wait(
            "the run's death to delete what it still owned", lambda: self.deleted_tree(root_id), self.args.timeout
        )
        if not tree:
            return 1
        remember(tree)
        print("\nAfter the run ended (tombstones, kept with their history):")
        print(render(tree))

        stand = self.api.call("GET", f"/stands/{PIPELINE}/")[1]
        holding = next((h for h in stand["holdings"] if h["id"] == self.holding), None)
        if not self.check(holding is not None, f"the stand of {PIPELINE!r} holds {self.holding}"):
            return 1
        assert holding is not None
        kept_tree = self.tree(self.holding)
        remember(kept_tree)
        print(f"\nThe stand of {PIPELINE!r} holds (until {holding['expires_at']}):")
        print(render(kept_tree))
        left = (datetime.fromisoformat(holding["expires_at"]) - datetime.now(UTC)).total_seconds()
        self.check(0 < left <= KEEP_FOR_SECONDS, f"the holding expires in about an hour ({left / 60:.0f} min)")
        shape = [(n["kind"], n["name"], n["phase"]) for n in nodes(kept_tree)]
        self.check(
            shape[1:] == [("docker.network", "net", "ready"), ("docker.container", "app", "ready")]
            and shape[0][0] == "docker.image"
            and shape[0][2] == "ready",
            "the stand keeps the app with the network and image it runs on, all ready",
        )

        objects = docker_objects(record_ids)
        kept_ids = {n["id"] for n in nodes(kept_tree)}
        print("Left in Docker of the run's records:")
        print(describe(objects, labels), flush=True)
        self.check(
            {rid for rid, _, _ in objects} <= kept_ids,
            "Docker has nothing of the run but what the stand keeps (the database and job containers are gone)",
        )
        self.check(
            sorted(what for _, what, _ in objects) == ["container", "image", "network"],
            "what is kept is one container, its network and its image",
        )
        self.check((app_id, "container", f"{kept} (running)") in objects, f"the kept app container {kept} is running")
        self.check(not config_path.exists(), f"the config file is gone: {config_path}")
        self.check(not Path(checkout["path"]).exists(), f"the checkout is gone: {checkout['path']}")

        log(f"deleting the stand's holding {self.holding} (the app, then its network, then its image)")
        holding_id = self.holding
        code, _ = self.api.call("DELETE", f"/records/{holding_id}/?wait=true&timeout=120", expect=(200, 202))
        log(f"DELETE /records/{holding_id}/?wait=true answered HTTP {code}")
        deleted = self.wait(
            "the holding's records to be deleted",
            lambda: self.deleted_tree(holding_id),
            self.args.timeout,
        )
        self.holding = None
        if not deleted:
            return 1
        print("\nAfter deleting the stand's holding:")
        print(render(deleted))
        gone = self.wait(
            "Docker to have nothing left of the run", lambda: not docker_objects(record_ids), self.args.timeout
        )
        self.check(bool(gone), "Docker has nothing left of the run")
        print("Left in Docker of the run's records:")
        print(describe(docker_objects(record_ids), labels))
        print()
        if self.failures:
            log(f"{len(self.failures)} check(s) failed")
            return 1
        shutil.rmtree(self.work, ignore_errors=True)
        log("every check passed; nothing is left (records stay as tombstones, with their history)")
        return 0

    def clean_up(self) -> None:
        """After a failure, still end the run and delete the holding, and wait until they are
        gone: the server may be stopped right after this returns (demo.py does)."""
        try:
            if self.run_id is not None:
                run_id = self.run_id
                if self.run_status(run_id)["status"] not in TERMINAL:
                    log(f"cancelling run {run_id} (its death deletes what it owns)")
                    self.api.call("POST", f"/runs/{run_id}/cancel/", {}, expect=(200, 202, 409))
                if self.wait("the run to end", lambda: self.run_status(run_id)["status"] in TERMINAL, 60):
                    root_id = self.run_status(run_id)["record"]
                    self.wait("the run's records to be deleted", lambda: self.deleted_tree(root_id), self.args.timeout)
            if self.holding is not None:
                holding_id = self.holding
                log(f"deleting the stand's holding {holding_id}")
                self.api.call("DELETE", f"/records/{holding_id}/?wait=true&timeout=120", expect=(200, 202))
                self.wait("the holding to be deleted", lambda: self.deleted_tree(holding_id), self.args.timeout)
        except (ApiError, KeyError) as exc:
            log(f"clean-up failed too: {exc}")


def token_for(data_dir: Path) -> str:
    token = os.environ.get("GRAPHENE_TOKEN", "")
    if token:
        return token
    try:
        return str(json.loads((data_dir / "admin-credentials.json").read_text())["token"])
    except (OSError, ValueError, KeyError):
        return ""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", default=os.environ.get("GRAPHENE_SERVER", "https://127.0.0.1:8000"))
    parser.add_argument(
        "--data-dir",
        default=os.environ.get("GRAPHENE_DATA_DIR", ".graphene"),
        help="the server's data directory: the inputs are prepared there (default: GRAPHENE_DATA_DIR or .graphene)",
    )
    parser.add_argument("--timeout", type=float, default=180.0, help="seconds to wait for each stage")
    args, _ = parser.parse_known_args()  # demo.py passes every example the same options
    data_dir = Path(args.data_dir).resolve()
    token = token_for(data_dir)
    if not token:
        log(f"set GRAPHENE_TOKEN to an API token (graphene up saves one in {data_dir}/admin-credentials.json)")
        return 2
    problem = prerequisites_problem()
    if problem:
        log(f"cannot run: {problem}")
        return 2
    started = time.monotonic()
    tour = EphemeralTour(Api(args.url, token), args, data_dir / "examples" / PIPELINE)
    status = 1
    try:
        status = tour.main()
    except (ApiError, RuntimeError, subprocess.SubprocessError, OSError) as exc:
        log(f"error: {exc}")
    finally:
        if status != 0:
            tour.clean_up()
    log(f"{'done' if status == 0 else 'FAILED'} in {time.monotonic() - started:.1f}s")
    return status


if __name__ == "__main__":
    raise SystemExit(main())
