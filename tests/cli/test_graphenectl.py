"""graphenectl against a live embedded server: the commands, their -o formats and exit codes.

Each test drives the real console script in a subprocess and checks what a user or a script
relies on: stdout carries data (JSON that matches the REST API), stderr carries hints and
errors, and the exit code says what happened (0 ok, 1 failure, 2 usage, 3 not found, 4 run failed).
"""

from __future__ import annotations

import json
import re
import stat
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml

from apps.core.tls import fingerprint, tls_local_ensure
from tests.conftest import interrupt, read_lines_until
from tests.harness.embedded import Ctl, Server
from tests.harness.net import free_port

pytestmark = [pytest.mark.system, pytest.mark.xdist_group("graphene-up")]  # one embedded server: they share it

MISSING = "00000000-0000-0000-0000-000000000000"


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def wait_ready(server: Server, record_id: str, timeout: float = 20) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        record: dict[str, Any] = server.get(f"records/{record_id}/")
        if record["phase"] == "ready":
            return record
        assert time.monotonic() < deadline, f"record {record_id} not ready: {record['phase']}"
        time.sleep(0.1)


def stand(ctl: Ctl, name: str | None = None) -> str:
    """A fresh stand root to hang test records on; returns its id (from ``-o name``)."""
    out = ctl.ok("apply", "graphene.stand", name or unique("cli")).out.strip()
    assert out.startswith("record/")
    return out.removeprefix("record/")


# --- session ---------------------------------------------------------------------------------


def test_login_saves_a_private_context_and_whoami_uses_it(server: Server, tmp_path: Path) -> None:
    ctl = Ctl(tmp_path / "config")
    result = ctl("whoami")
    assert result.code == 1
    assert "graphenectl login --server URL --token-stdin" in result.err

    ca = str(server.ca_file)
    ctl.ok(
        "login",
        "--server",
        server.url + "/api/v1/",
        "--ca-file",
        ca,
        "--token-stdin",
        "--name",
        "local",
        stdin=server.token,
    )
    config = tmp_path / "config" / "graphene" / "config.yaml"
    assert stat.S_IMODE(config.stat().st_mode) == 0o600
    saved = yaml.safe_load(config.read_text())
    assert saved["current-context"] == "local"
    assert saved["contexts"][0]["server"] == server.url

    assert ctl.ok("whoami", "-o", "json").json() == server.get("whoami/")
    table = ctl.ok("whoami").out
    assert "admin" in table
    assert server.url in table
    assert "local" in table

    contexts = ctl.ok("ctx", "list", "-o", "json").json()
    assert contexts == [{"name": "local", "server": server.url, "user": "admin", "namespace": None, "current": True}]
    assert server.token not in ctl.ok("ctx", "show").out, "no output may carry the token"
    assert server.token not in ctl.ok("ctx", "show", "-o", "yaml").out

    # A second context; `ctx use` switches, and GRAPHENE_SERVER/GRAPHENE_TOKEN override a context.
    dead = f"https://127.0.0.1:{free_port()}"
    ctl.ok("login", "--server", server.url, "--ca-file", ca, "--token-stdin", "--name", "second", stdin=server.token)
    assert ctl.ok("ctx", "show", "-o", "json").json()["name"] == "second"
    ctl.ok("ctx", "use", "local")
    assert [c["name"] for c in ctl.ok("ctx", "list", "-o", "json").json() if c["current"]] == ["local"]
    down = ctl("whoami", env={"GRAPHENE_SERVER": dead})
    assert down.code == 1
    assert dead in down.err
    assert ctl("ctx", "use", "nope").code == 2

    bare = Ctl(tmp_path / "empty", GRAPHENE_CA_FILE=ca)
    assert (
        bare.ok("whoami", "-o", "json", env={"GRAPHENE_SERVER": server.url, "GRAPHENE_TOKEN": server.token}).json()[
            "username"
        ]
        == "admin"
    )


def test_login_with_a_refused_token_saves_nothing(server: Server, tmp_path: Path) -> None:
    ctl = Ctl(tmp_path / "config", GRAPHENE_CA_FILE=str(server.ca_file))
    result = ctl(
        "login", "--server", server.url, "--ca-file", str(server.ca_file), "--token-stdin", stdin="not-a-token\n"
    )
    assert result.code == 1
    assert "refused this token; nothing was saved" in result.err
    assert not (tmp_path / "config" / "graphene" / "config.yaml").exists()

    refused = ctl("get", "runs", env={"GRAPHENE_SERVER": server.url, "GRAPHENE_TOKEN": "revoked"})
    assert refused.code == 1
    assert "refused the token" in refused.err
    assert "graphenectl login" in refused.err


def test_an_unreachable_server_is_one_line_naming_the_url_and_login(ctl: Ctl) -> None:
    dead = f"https://127.0.0.1:{free_port()}"
    result = ctl("get", "records", env={"GRAPHENE_SERVER": dead})
    assert result.code == 1
    assert result.out == ""
    lines = result.err.strip().splitlines()
    assert len(lines) == 1, result.err
    assert dead in lines[0]
    assert "connection refused" in lines[0]
    assert "graphenectl login" in lines[0]


# --- TLS -------------------------------------------------------------------------------------


def test_login_pins_the_ca_by_the_fingerprint_graphene_up_printed(server: Server, tmp_path: Path) -> None:
    printed = re.search(r"CA fingerprint \(SHA-256\) ([0-9A-F:]{95})", server.output())
    assert printed, server.output()
    assert printed.group(1) == fingerprint(server.ca_file.read_text())
    ctl = Ctl(tmp_path / "config")
    # As a person would paste it: lower case, without the colons, after a prefix.
    typed = "sha256:" + printed.group(1).replace(":", "").lower()
    login = ctl.ok("login", "--server", server.url, "--ca-fingerprint", typed, "--token-stdin", stdin=server.token)
    assert f"pinned the server's CA {printed.group(1)}" in login.err
    saved = yaml.safe_load((tmp_path / "config" / "graphene" / "config.yaml").read_text())
    assert saved["contexts"][0]["ca"] == server.ca_file.read_text()
    assert ctl.ok("whoami", "-o", "json").json()["username"] == "admin"
    assert printed.group(1) in ctl.ok("ctx", "show", "-o", "json").json()["tls"]


def test_login_refuses_a_server_its_pin_does_not_vouch_for_and_saves_nothing(server: Server, tmp_path: Path) -> None:
    config = tmp_path / "config" / "graphene" / "config.yaml"
    ctl = Ctl(tmp_path / "config")
    other = tls_local_ensure(directory=tmp_path / "other-ca", hostnames=["127.0.0.1"])  # another installation's

    unpinned = ctl("login", "--server", server.url, "--token-stdin", stdin=server.token)
    assert unpinned.code == 1
    assert "not trusted by this system" in unpinned.err
    assert "--ca-file" in unpinned.err
    assert "--ca-fingerprint" in unpinned.err
    mismatched = ctl(
        "login", "--server", server.url, "--ca-file", str(other.ca_path), "--token-stdin", stdin=server.token
    )
    assert mismatched.code == 1
    assert f"pinned CA ({other.ca_fingerprint}" in mismatched.err
    wrong = ctl("login", "--server", server.url, "--ca-fingerprint", other.ca_fingerprint, "--token-stdin", stdin="x")
    assert wrong.code == 1
    assert f"not {other.ca_fingerprint}" in wrong.err
    assert not config.exists()

    # Plain HTTP only when asked for; --insecure says what it costs and is no way around a certificate.
    plain = f"http://127.0.0.1:{free_port()}"
    refused = ctl("login", "--server", plain, "--token-stdin", stdin=server.token)
    assert refused.code == 2
    assert "--insecure" in refused.err
    accepted = ctl("login", "--server", plain, "--insecure", "--token-stdin", stdin=server.token)
    assert "WARNING" in accepted.err
    assert "unencrypted" in accepted.err
    assert accepted.code == 1
    assert "connection refused" in accepted.err
    assert ctl("login", "--server", server.url, "--insecure", "--token-stdin", stdin=server.token).code == 2
    assert not config.exists()

    # Later calls verify against the pinned CA too: a context pinned to another CA is refused.
    pinned = Ctl(tmp_path / "pinned")
    pinned.ok("login", "--server", server.url, "--ca-file", str(server.ca_file), "--token-stdin", stdin=server.token)
    saved = yaml.safe_load((tmp_path / "pinned" / "graphene" / "config.yaml").read_text())
    saved["contexts"][0]["ca"] = other.ca_path.read_text()
    (tmp_path / "pinned" / "graphene" / "config.yaml").write_text(yaml.safe_dump(saved))
    later = pinned("get", "records")
    assert later.code == 1
    assert f"pinned CA ({other.ca_fingerprint}, from context" in later.err


# --- reading ---------------------------------------------------------------------------------


def test_get_describe_tree_and_events_match_the_api(server: Server, ctl: Ctl, tmp_path: Path) -> None:
    root = stand(ctl)
    spec = tmp_path / "spec.yaml"
    spec.write_text("create_ms: 50\nvalue: from-a-file\n")
    parent = ctl.ok("apply", "test.sleep", "net", "--owner", root, "-f", str(spec), "-l", "suite=cli").out.strip()
    parent_id = parent.removeprefix("record/")
    applied = ctl.ok(
        "apply",
        "test.sleep",
        "box",
        "--owner",
        parent_id,
        "--spec",
        "-",
        "--label",
        "suite=cli",
        "--ttl",
        "4h",
        "-o",
        "json",
        stdin='{"create_ms": 50}',
    ).json()
    assert applied["spec"] == {"create_ms": 50}
    assert applied["labels"] == {"suite": "cli"}
    assert applied["expires_at"] is not None
    assert server.get(f"records/{parent_id}/")["spec"] == {"create_ms": 50, "value": "from-a-file"}
    wait_ready(server, parent_id)
    wait_ready(server, applied["id"])

    # Applying the same declaration again changes nothing and still exits 0.
    again = ctl.ok("apply", "test.sleep", "net", "--owner", root, "-f", str(spec), "-l", "suite=cli")
    assert again.out.strip() == parent
    assert "unchanged" in again.err

    # get ID -o json is the API's object; -o yaml the same data; -o name the reference.
    one = ctl.ok("get", "records", applied["id"], "-o", "json").json()
    assert one == server.get(f"records/{applied['id']}/")
    assert yaml.safe_load(ctl.ok("get", "record", applied["id"], "-o", "yaml").out) == one
    assert ctl.ok("get", "records", applied["id"], "-o", "name").out == f"record/{applied['id']}\n"

    # Listing by owner: the rows are the API's, newest first.
    listed = ctl.ok("get", "records", "--owner", root, "-o", "json").json()
    api = server.get(f"records/?owner={root}")["results"]
    assert listed == api
    assert [r["name"] for r in listed] == ["net"]
    table = ctl.ok("get", "records", "--owner", parent_id).out.splitlines()
    assert table[0].split()[:5] == ["NAMESPACE", "ID", "KIND", "NAME", "PHASE"]  # no namespace chosen: all
    assert applied["id"] in table[1]
    assert "box" in table[1]
    assert "ready" in table[1]
    assert re.search(r"\b3h5\dm\b", table[1]), table[1]  # 4h, less the minutes the test took
    wide = ctl.ok("get", "records", "--owner", parent_id, "-o", "wide").out
    assert "LABELS" in wide
    assert "suite=cli" in wide
    by_kind = ctl.ok("get", "records", "--kind", "test.sleep", "--phase", "ready", "-o", "json").json()
    assert {parent_id, applied["id"]} <= {r["id"] for r in by_kind}

    # Label selection (the embedded server is SQLite: key lookups instead of JSON containment).
    labelled = ctl("get", "records", "-l", "suite=cli", "-o", "json")
    assert labelled.code == 0, labelled.err
    assert {parent_id, applied["id"]} <= {r["id"] for r in labelled.json()}

    # describe: everything about the record, and -o json is the API's object.
    described = ctl.ok("describe", f"record/{applied['id']}").out
    for text in ("Name:", "box", "Owner chain:", "graphene.stand/", "test.sleep/net", "TTL:", "Events"):
        assert text in described, described
    assert ctl.ok("describe", "record", applied["id"], "-o", "json").json() == server.get(f"records/{applied['id']}/")

    # tree: the subtree with phases and TTLs.
    tree_json = ctl.ok("tree", root, "-o", "json").json()
    assert tree_json == server.get(f"records/{root}/tree/?depth=3")
    tree_text = ctl.ok("tree", root).out
    assert "graphene.stand/" in tree_text
    assert "test.sleep/net" in tree_text
    assert "test.sleep/box" in tree_text
    assert "ready" in tree_text
    assert re.search(r"ttl 3h5\dm\b", tree_text), tree_text
    assert ctl.ok("tree", root, "-o", "name").out.split() == [
        f"record/{root}",
        parent,
        f"record/{applied['id']}",
    ]
    assert "test.sleep/box" not in ctl.ok("tree", root, "--depth", "1").out

    # events: the record's history, oldest first, as the API pages it.
    events = ctl.ok("events", applied["id"], "-o", "json").json()
    assert events == server.get(f"records/{applied['id']}/events/?limit=1000")["results"]
    assert [e["type"] for e in events][:1] == ["declared"]
    assert "phase_changed" in ctl.ok("events", applied["id"]).out


def test_get_and_describe_agents(server: Server, ctl: Ctl) -> None:
    root = stand(ctl)
    name = unique("machine")
    status, body = server.api(
        "POST", "records/", {"kind": "agent", "name": name, "owner": root, "labels": {"team": name}}
    )
    assert status == 201, body

    def stable(listed: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
        # The record converges meanwhile (phase, conditions, updated_at move): compare the rest.
        return [(a["id"], a["name"], a["owner"], a["labels"], a["created_at"]) for a in listed]

    agents = ctl.ok("get", "agents", "-o", "json").json()
    assert stable(agents) == stable(server.get("agents/?limit=1000")["results"])
    mine = ctl.ok("get", "agents", "-l", f"team={name}", "-o", "json").json()
    assert [a["id"] for a in mine] == [body["id"]]
    assert mine[0]["connected"] is False
    assert name in ctl.ok("get", "agents").out
    described = ctl.ok("describe", f"agent/{body['id']}").out
    assert "Connected:" in described
    assert name in described
    assert ctl.ok("get", "agent", body["id"], "-o", "json").json() == server.get(f"agents/{body['id']}/")
    refused = ctl("get", "agents", "--phase", "ready")
    assert refused.code == 2
    assert "filter records" in refused.err


def test_get_lists_pipelines_kinds_and_stands(server: Server, ctl: Ctl) -> None:
    assert ctl.ok("get", "pipelines", "-o", "json").json() == server.get("pipelines/")["results"]  # paged
    names = ctl.ok("get", "pipelines", "-o", "name").out.split()
    assert {"pipeline/hello", "pipeline/environment", "pipeline/release"} <= set(names)
    assert "name,pause_seconds" in ctl.ok("get", "pipelines").out
    assert ctl.ok("get", "pipeline", "hello", "-o", "json").json() == server.get("pipelines/hello/")
    described = ctl.ok("describe", "pipeline/hello").out
    assert "pause_seconds" in described
    assert "who to greet" in described

    assert ctl.ok("get", "kinds", "-o", "json").json() == server.get("kinds/")
    assert "test.sleep" in ctl.ok("get", "kinds").out
    assert "create_ms" in ctl.ok("describe", "kind/test.sleep").out

    holdings = ctl.ok("get", "stands", "hello", "-o", "json").json()
    assert holdings == server.get("stands/hello/")
    assert ctl.ok("get", "stands", "-o", "json").json() == server.get("stands/")


def test_logs_of_a_run_filter_and_follow(server: Server, ctl: Ctl) -> None:
    run = ctl.ok("run", "start", "hello", "-i", "name=Logs", "-i", "pause_seconds=0", "-o", "json").json()
    assert ctl("run", "result", run["id"], "--wait", "--interval", "0.3").code == 0
    run = server.get(f"runs/{run['id']}/")
    lines = ctl.ok("logs", f"run/{run['id']}").out
    assert "Hello, Logs!" in lines
    assert "running on" in lines
    as_json = ctl.ok("logs", f"run/{run['id']}", "-o", "json", "--grep", "hello").json()
    assert as_json == server.get(f"records/{run['record']}/logs/?grep=hello&limit=1000")["results"]
    assert as_json
    assert all("hello" in line["message"].lower() for line in as_json)
    assert ctl.ok("logs", run["id"], "--severity", "error", "-o", "json").json() == []
    assert ctl.ok("logs", run["id"], "--since", "10m", "-o", "json").json()
    assert ctl.ok("logs", run["id"], "--until", "2000-01-01T00:00:00Z", "-o", "json").json() == []
    assert ctl("logs", run["id"], "--since", "yesterday").code == 2
    everything = server.get(f"records/{run['record']}/logs/?limit=1000")["results"]
    assert ctl.ok("logs", run["id"], "--tail", "2", "-o", "json").json() == everything[-2:]
    assert ctl("logs", run["id"], "--tail", "0").code == 2

    follower = ctl.popen("logs", run["id"], "-f", "-o", "json", "--interval", "0.2")
    try:
        seen = read_lines_until(follower, lambda line: "Hello, Logs!" in line, timeout=15)
        assert all(json.loads(line)["record"] for line in seen)
    finally:
        assert interrupt(follower) == 0


def test_watching_prints_changes_until_ctrl_c(server: Server, ctl: Ctl) -> None:
    root = stand(ctl)
    watcher = ctl.popen("get", "records", "--owner", root, "-w", "-o", "json", "--interval", "0.2")
    events = None
    try:
        time.sleep(0.5)
        child = ctl.ok("apply", "test.sleep", "watched", "--owner", root, "--spec", "-", stdin="create_ms: 300")
        child_id = child.out.strip().removeprefix("record/")
        events = ctl.popen("events", child_id, "-f", "-o", "json", "--interval", "0.2")
        seen = read_lines_until(watcher, lambda line: json.loads(line)["phase"] == "ready", timeout=20)
        assert all(json.loads(line)["name"] == "watched" for line in seen)
        history = read_lines_until(events, lambda line: json.loads(line)["data"].get("to") == "ready", timeout=20)
        assert json.loads(history[0])["type"] == "declared"
    finally:
        assert interrupt(watcher) == 0
        if events is not None:
            assert interrupt(events) == 0


# --- changing records ------------------------------------------------------------------------


def test_transfer_extend_release_and_the_stand(server: Server, ctl: Ctl) -> None:
    first, second = stand(ctl), stand(ctl)
    rid = ctl.ok("apply", "test.sleep", "moved", "--owner", first).out.strip().removeprefix("record/")
    wait_ready(server, rid)  # settled: the two reads below must not straddle its convergence

    moved = ctl.ok("transfer", rid, "--to", second, "--from", first, "--keep-for", "1h", "-o", "json").json()
    assert moved["owner"] == second
    assert moved == server.get(f"records/{rid}/")
    before = moved["expires_at"]
    assert before is not None

    extended = ctl.ok("extend", rid, "--by", "2h", "-o", "json").json()
    assert extended["expires_at"] > before
    assert ctl.ok("get", "records", rid).out.split()[-2] == "2h59m"
    assert ctl.ok("release", rid, "-o", "json").json()["expires_at"] is None

    refused = ctl("transfer", rid, "--to", first, "--from", first)
    assert refused.code == 1, refused  # a conflict: ownership is given by the current owner only
    assert "ownership is given by the current owner" in refused.err

    # Hand it to the stand of a pipeline by name, then manage the holding there.
    held = ctl.ok("transfer", rid, "--to", "stand/hello", "--keep-for", "30m", "-o", "json").json()
    holdings = ctl.ok("get", "stands", "hello", "-o", "json").json()["holdings"]
    assert rid in [h["id"] for h in holdings]
    assert held["owner"] == server.get("stands/hello/")["id"]
    assert rid in ctl.ok("stand", "show", "hello").out
    assert ctl.ok("stand", "extend", "hello", rid, "--by", "1h", "-o", "json").json()["expires_at"] > held["expires_at"]
    assert ctl.ok("stand", "release", "hello", rid, "-o", "json").json()["expires_at"] is None
    assert ctl("extend", rid, "--by", "soon").code == 2
    ctl.ok("delete", rid, "--wait")


def test_a_stand_is_made_when_named_as_an_owner_never_by_reading_it(server: Server, ctl: Ctl) -> None:
    assert server.get("stands/environment/") == {
        "pipeline": "environment",
        "namespace": "default",
        "id": None,
        "holdings": [],
    }
    missing = ctl("tree", "stand/environment")
    assert missing.code == 3, missing
    assert "does not exist yet" in missing.err
    assert ctl.ok("stand", "show", "environment", "-o", "json").json()["id"] is None
    assert server.get("stands/environment/")["id"] is None, "reading a stand makes none"

    rid = ctl.ok("apply", "test.sleep", "handed", "--owner", stand(ctl)).out.strip().removeprefix("record/")
    wait_ready(server, rid)
    held = ctl.ok("transfer", rid, "--to", "stand/environment", "-o", "json").json()
    made = server.get("stands/environment/")
    assert held["owner"] == made["id"]
    assert [h["id"] for h in made["holdings"]] == [rid]
    assert "graphene.stand/environment" in ctl.ok("tree", "stand/environment").out
    ctl.ok("delete", rid, "--wait")


def test_delete_wait_removes_the_subtree(server: Server, ctl: Ctl) -> None:
    root = stand(ctl)
    child = ctl.ok("apply", "test.sleep", "doomed", "--owner", root, "--spec", "-", stdin="delete_ms: 200").out
    child_id = child.strip().removeprefix("record/")
    wait_ready(server, child_id)

    deleted = ctl.ok("delete", root, "--wait", "--timeout", "30s", "-o", "json").json()
    assert deleted["phase"] == "deleted"
    assert server.get(f"records/{child_id}/")["phase"] == "deleted"
    assert ctl.ok("get", "records", "--owner", root, "-o", "json").json() == []
    tombstones = ctl.ok("get", "records", "--owner", root, "--include-deleted", "-o", "json").json()
    assert [r["id"] for r in tombstones] == [child_id]


# --- runs ------------------------------------------------------------------------------------


def test_run_start_checks_inputs_before_sending(server: Server, ctl: Ctl, tmp_path: Path) -> None:
    runs_before = server.get("runs/?pipeline=hello&limit=1000")["results"]
    result = ctl("run", "start", "hello", "--input", "pause_seconds=soon", "-i", "nmae=Ada", "-i", "name=")
    assert result.code == 2
    assert result.out == ""
    assert "do not match its schema; nothing was started" in result.err
    assert "pause_seconds: 'soon' is not a number" in result.err
    assert "nmae: unknown input" in result.err
    assert "name:" in result.err
    missing = ctl("run", "start", "release")
    assert missing.code == 2
    assert "version: required" in missing.err
    file = tmp_path / "inputs.json"
    file.write_text(json.dumps({"version": "one"}))
    bad_file = ctl("run", "start", "release", "--inputs", str(file))
    assert bad_file.code == 2
    assert "version:" in bad_file.err
    assert server.get("runs/?pipeline=hello&limit=1000")["results"] == runs_before

    fields = ctl.ok("run", "inputs", "hello").out
    assert "pause_seconds" in fields
    assert "number" in fields
    assert "a durable pause between the steps" in fields
    assert (
        ctl.ok("run", "start", "hello", "--help-inputs", "-o", "json").json()
        == server.get("pipelines/hello/")["input_schema"]
    )


def test_run_start_watch_succeeds_and_result_prints_the_outputs(server: Server, ctl: Ctl) -> None:
    result = ctl(
        "run",
        "start",
        "hello",
        "-i",
        "name=Ada",
        "-i",
        "pause_seconds=0.2",
        "--watch",
        "--interval",
        "0.3",
        "-o",
        "json",
    )
    assert result.code == 0, result.err
    run = result.json()
    assert run["status"] == "succeeded"
    assert run["inputs"] == {"name": "Ada", "pause_seconds": 0.2}
    assert run["outputs"]["message"] == "Hello, Ada!"
    assert "succeeded" in result.err
    assert "step greet" in result.err

    assert ctl.ok("run", "result", run["id"]).json() == run["outputs"]
    assert yaml.safe_load(ctl.ok("run", "result", f"run/{run['id']}", "-o", "yaml").out) == run["outputs"]
    assert ctl.ok("describe", f"run/{run['id']}", "-o", "json").json() == server.get(f"runs/{run['id']}/")
    described = ctl.ok("describe", f"run/{run['id']}").out
    assert "hello #" in described
    assert "step greet" in described
    assert "Journal" in described
    listed = ctl.ok("run", "list", "--pipeline", "hello", "-o", "json").json()
    assert listed == server.get("runs/?pipeline=hello&limit=100")["results"]
    assert run["id"] in ctl.ok("get", "runs", "--status", "succeeded", "-o", "name").out
    assert ctl.ok("run", "watch", run["id"]).code == 0


def test_a_cancelled_run_exits_4(server: Server, ctl: Ctl) -> None:
    started = ctl.ok("run", "start", "hello", "-i", "pause_seconds=600").out.strip()
    assert started.startswith("run/")
    run_id = started.removeprefix("run/")
    cancelled = ctl.ok("run", "cancel", started, "-o", "json").json()
    assert cancelled["status"] == "cancelled"

    watched = ctl("run", "watch", run_id)
    assert watched.code == 4
    assert "cancelled" in watched.err
    assert f"graphenectl logs run/{run_id}" in watched.err
    result = ctl("run", "result", run_id)
    assert result.code == 4
    assert result.out == ""


# --- errors ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args",
    [
        ("get", "records", MISSING),
        ("describe", f"run/{MISSING}"),
        ("describe", MISSING),
        ("delete", MISSING),
        ("run", "start", "no-such-pipeline"),
        ("run", "watch", MISSING),
    ],
)
def test_unknown_ids_exit_3(ctl: Ctl, args: tuple[str, ...]) -> None:
    result = ctl(*args)
    assert result.code == 3, result
    assert result.err.startswith("graphenectl: error: ")
    assert result.out == ""


@pytest.mark.parametrize(
    "args",
    [
        ("get", "widgets"),
        ("get", "records", "-o", "xml"),
        ("get", "runs", "--kind", "file"),
        ("apply", "test.sleep", "x", "--ttl", "forever"),
        ("apply", "file", "x", "--owner", MISSING, "--spec", "/no/such/file.yaml"),
        ("logs", "not-a-uuid"),  # no record could have it: the server's 400 names the id
    ],
)
def test_usage_errors_exit_2(ctl: Ctl, args: tuple[str, ...]) -> None:
    assert ctl(*args).code == 2


def test_apply_reports_the_servers_field_errors(ctl: Ctl) -> None:
    result = ctl("apply", "test.sleep", "orphan")
    assert result.code == 2
    assert "owner" in result.err
