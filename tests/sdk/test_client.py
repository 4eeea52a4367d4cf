"""The SDK's ``Client`` against the shared web server and workers: each method on real runs,
records, logs, stands and artifacts; the server's errors as ``ClientError``."""

from __future__ import annotations

import hashlib
import threading
import uuid
from pathlib import Path
from typing import Any

import pytest
from graphene_sdk import (
    ArtifactInfo,
    Client,
    ClientError,
    LogLine,
    Paged,
    RecordInfo,
    RunEvent,
    RunHandle,
    RunInfo,
    StandSummary,
)
from rest_framework.authtoken.models import Token

from apps.observability.models import LogLine as StoredLine
from tests import factories
from tests.conftest import wait_for
from tests.harness.web import WebServer
from tests.pipelines.sample import ChatterInputs, ChatterOutput, chatter

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def token(django_user_model: Any) -> str:
    user = django_user_model.objects.create_user(username="sdk", password="pw")
    factories.bind(user, "developer")
    return str(Token.objects.create(user=user).key)


@pytest.fixture
def client(web: WebServer, token: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Client:
    """A client given the server and token (no contexts file, no GRAPHENE_* environment)."""
    for name in ("GRAPHENE_SERVER", "GRAPHENE_TOKEN", "GRAPHENE_CONTEXT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "no-config"))
    return Client(web.url, token=token, ca_file=web.ca_file)


def run_record(handle: RunHandle[Any]) -> str:
    """The run's root record (where its log and tree hang)."""
    record = wait_for(lambda: handle.get().record, timeout=30, what="the run's record")
    assert record is not None
    return record


def messages(lines: list[LogLine]) -> list[str]:
    return [line.message for line in lines if line.message.startswith("chatter line")]


def test_records_of_a_run_are_listed_by_selectors_read_walked_and_paged(client: Client, workers: Any) -> None:
    handle = client.start(chatter, ChatterInputs(lines=2))
    output: ChatterOutput = handle.result(timeout=60)
    assert output == ChatterOutput(lines=2)
    run = handle.get()

    # The run ended: its tree was deleted (tombstones), except what it handed to the stand.
    ours = {r.name: r for r in client.records.list(labels={"team": "sdk"})}
    assert sorted(ours) == ["env", "inner"]
    assert all(isinstance(r, RecordInfo) and r.phase == "ready" for r in ours.values())
    assert ours["env"].labels == {"team": "sdk", "role": "db"}
    assert ours["env"].created_by_run == run.id
    assert [r.name for r in client.records.list(labels=["team=sdk", "role=db"])] == ["env"]
    assert list(client.records.list(labels={"team": "web"})) == []
    cache = list(client.records.list(labels={"team": "web"}, include_deleted=True))
    assert [(r.name, r.phase) for r in cache] == [("cache", "deleted")]
    assert [r.name for r in client.records.list(phase="deleted", labels={"team": "web"})] == ["cache"]
    assert {r.name for r in client.records.list(kind="test.sleep", phase=["ready"])} >= {"env", "inner"}
    assert [r.name for r in client.records.list(owner=ours["env"].id)] == ["inner"]
    assert [r.name for r in client.records.list(name_prefix="inn", labels={"team": "sdk"})] == ["inner"]

    # Paging: one record a page, the iterator follows the cursor.
    paged = client.records.list(labels={"team": "sdk"}, page_size=1)
    assert isinstance(paged, Paged)
    pages = list(paged.pages())
    assert [len(p.items) for p in pages] == [1, 1]
    assert pages[0].next_url
    assert pages[-1].next_url is None
    assert [r.name for r in paged] == [p.items[0].name for p in pages] == ["inner", "env"]  # newest first
    assert [r.name for r in paged.first(1)] == ["inner"]

    env = client.records.get(ours["env"].id)
    stand = client.stands.get("sample.chatter")
    assert stand.id is not None
    assert [(o.kind, o.name) for o in env.owner_chain] == [("graphene.stand", "sample.chatter")]
    assert env.owner == stand.id
    assert env.children["total"] == 1
    assert env.ref == "test.sleep/env"

    tree = client.records.tree(stand.id)
    assert [(n.kind, n.name) for n in tree.walk()] == [
        ("graphene.stand", "sample.chatter"),
        ("test.sleep", "env"),
        ("test.sleep", "inner"),
    ]
    assert not tree.walk()[-1].truncated
    shallow = client.records.tree(stand.id, depth=1)
    assert [n.name for n in shallow.walk()] == ["sample.chatter", "env"]
    assert shallow.children[0].truncated

    events = list(client.records.events(env.id))
    assert events[0].type == "declared"
    assert [e.id for e in events] == sorted(e.id for e in events)  # oldest first
    moves = [(e.data.get("from"), e.data.get("to")) for e in events if e.type == "phase_changed"]
    assert ("creating", "ready") in moves
    assert events[-1].type == "transferred_in"  # to the stand
    assert [e.id for e in client.records.events(env.id, page_size=2)] == [e.id for e in events]


def test_runs_are_listed_read_watched_cancelled_and_resumed(client: Client, workers: Any) -> None:
    held = client.start(chatter, ChatterInputs(lines=0, hold=True))
    wait_for(lambda: held.get().status == "suspended", timeout=60, what="the run to sleep")
    failed = client.start_by_name("sample.chatter", {"lines": 1, "fail": True})
    ended = failed.wait(timeout=60)
    assert ended.status == "failed"
    assert "asked to fail" in ended.error
    with pytest.raises(ClientError, match="failed") as not_ok:
        failed.result(timeout=5)
    assert not_ok.value.code == "failed"

    listed = list(client.runs.list(pipeline="sample.chatter"))
    assert [r.id for r in listed] == [failed.id, held.id]  # newest first
    assert all(isinstance(r, RunInfo) for r in listed)
    assert [r.id for r in client.runs.list(pipeline="sample.chatter", status="failed")] == [failed.id]
    assert [r.id for r in client.runs.list(status=["suspended", "queued"])] == [held.id]

    info = client.runs.get(held.id)
    assert (info.pipeline, info.number, info.status) == ("sample.chatter", 1, "suspended")
    assert info.inputs == {"lines": 0, "gap_ms": 0, "hold": True, "fail": False}
    assert info.record is not None
    assert not info.done
    assert info.journal
    assert info.journal[0].seq == 1
    calls = [e.call for e in info.journal]
    assert calls[0] == "declare test.sleep/env"
    assert calls[1].startswith("declare test.sleep/inner under ")

    # watch: every status move from the first, ending with the one that ends the run.
    watched = list(client.watch(failed.id, timeout=30))
    assert all(isinstance(e, RunEvent) for e in watched)
    assert watched[-1].to_status == "failed"
    assert watched[-1].is_final
    assert not any(e.is_final for e in watched[:-1])
    assert [e.id for e in watched] == [e.id for e in client.runs.events(failed.id)]

    cancelled = held.cancel()
    assert cancelled.status == "cancelled"
    assert [e.to_status for e in held.watch(timeout=30)][-1] == "cancelled"

    resumed = client.resume(failed.id)
    assert resumed.status == "queued"
    assert client.wait(failed.id, timeout=60).status == "failed"  # it fails again, by replay
    moves = [e.to_status for e in client.runs.events(failed.id)]
    assert moves.count("failed") == 2
    assert "queued" in moves[moves.index("failed") :]

    parent = client.start_by_name("sample.parent", {"count": 2, "concurrency": 2, "seconds": 0.05})
    assert parent.wait(timeout=60).status == "succeeded"
    children = list(client.runs.list(parent=parent.id))
    assert sorted((c.pipeline, c.parent, c.status) for c in children) == [("sample.child", parent.id, "succeeded")] * 2

    succeeded = client.start(chatter, ChatterInputs(lines=0))
    succeeded.wait(timeout=60)
    with pytest.raises(ClientError) as refused:
        client.runs.resume(succeeded.id)
    assert refused.value.status == 409
    assert refused.value.code == "conflict"
    assert "start a new run instead" in refused.value.detail


def test_a_run_log_is_tailed_listed_and_followed_live_until_the_run_ends(client: Client, workers: Any) -> None:
    handle = client.start(chatter, ChatterInputs(lines=4, gap_ms=300))
    record = run_record(handle)

    followed: list[LogLine] = []
    live_while_running = None
    for line in client.logs.follow(record, check_every=0.2):
        followed.append(line)
        if line.message == "chatter line 0":
            live_while_running = not handle.get().done
    assert live_while_running, "the first line arrived while the run was still running"
    assert handle.get().done, "follow ends only once the run has ended"
    assert messages(followed) == [f"chatter line {i}" for i in range(4)]
    assert len({line.id for line in followed}) == len(followed), "each line once"
    assert all(isinstance(line, LogLine) and line.record_name for line in followed)

    everything = list(client.logs.list(record))
    assert [line.id for line in everything] == [line.id for line in followed]
    assert [line.id for line in client.logs.list(record, page_size=2)] == [line.id for line in everything]
    assert messages(client.logs.tail(handle.get(), 2)) == ["chatter line 2", "chatter line 3"]  # a RunInfo
    assert client.logs.tail(client.records.get(record), 2) == client.logs.tail(record, 2)  # a RecordInfo
    assert messages(client.logs.tail(record, 10, grep="LINE 1")) == ["chatter line 1"]
    assert client.logs.tail(record, 5, severity="error") == []
    # The run has ended: a follow shows the last lines and returns.
    assert messages(list(client.logs.follow(record, tail=1))) == ["chatter line 3"]
    after = next(line for line in everything if line.message == "chatter line 1").id
    assert messages(list(client.logs.follow(record, after=after))) == ["chatter line 2", "chatter line 3"]


def test_following_a_run_can_be_left_early_and_ends_on_a_cancel(client: Client, workers: Any) -> None:
    handle = client.start(chatter, ChatterInputs(lines=2, hold=True))
    record = run_record(handle)
    stream = client.logs.follow(record)
    assert next(stream).message == "chatter line 0"
    stream.close()  # leaving early closes the connection and stops its reader
    assert not [t for t in threading.enumerate() if t.name.startswith("graphene-sse")]

    wait_for(lambda: handle.get().status == "suspended", timeout=60, what="the run to hold")
    follower = client.logs.follow(record, check_every=0.2)
    assert messages([next(follower), next(follower)]) == ["chatter line 0", "chatter line 1"]
    handle.cancel()
    assert messages(list(follower)) == [], "it ends once the run is cancelled, repeating nothing"
    assert handle.get().status == "cancelled"


def test_stands_are_listed_and_read(client: Client, workers: Any) -> None:
    assert client.stands.get("sample.chatter").id is None  # nothing handed over yet
    client.start(chatter, ChatterInputs(lines=0)).result(timeout=60)
    again = client.start(chatter, ChatterInputs(lines=0))
    again.result(timeout=60)  # replace=True: the second run's env replaces the first's

    def summary() -> StandSummary | None:
        [mine] = [s for s in client.stands.list() if s.pipeline == "sample.chatter"]
        return mine if (mine.holdings, mine.records) == (1, 2) else None

    held = wait_for(summary, timeout=30, what="the first run's holding to be deleted")
    assert held is not None
    stand = client.stands.get("sample.chatter")
    assert stand.id == held.id
    [holding] = stand.holdings
    assert (holding.record.name, holding.subtree_records) == ("env", 2)
    assert holding.record.created_by_run == again.id
    assert holding.record.expires_at is not None


def test_artifacts_are_put_found_read_and_downloaded(client: Client, workers: Any, tmp_path: Path) -> None:
    owner = client.stands.ensure("sample.chatter")
    assert client.stands.ensure("sample.chatter") == owner
    assert client.record_id("stand/sample.chatter") == owner

    data = b"report bytes\n" * 1000
    put = client.artifacts.put(data, name="reports/today.txt", owner=owner, labels={"kind": "report"}, ttl=3600)
    assert isinstance(put, ArtifactInfo)
    assert (put.name, put.size, put.sha256) == ("reports/today.txt", len(data), hashlib.sha256(data).hexdigest())
    assert put.owner == owner
    assert put.labels == {"kind": "report"}
    assert put.expires_at is not None
    assert put.content_type == "text/plain"
    assert client.artifacts.put(data, name="reports/today.txt", owner=owner).id == put.id  # the same bytes
    with pytest.raises(ClientError) as clash:
        client.artifacts.put(b"other bytes", name="reports/today.txt", owner=owner)
    assert clash.value.status == 409

    source = tmp_path / "build.bin"
    source.write_bytes(bytes(range(256)) * 4096)
    from_file = client.artifacts.put(source, name="dist/build.bin", owner=owner)
    assert from_file.size == source.stat().st_size

    wait_for(lambda: client.artifacts.get(put.id).phase == "ready", what="the artifact to be ready")
    got = client.artifacts.get(put.id)
    assert (got.id, got.name, got.sha256, got.labels) == (put.id, put.name, put.sha256, put.labels)
    assert client.artifacts.find("reports/today.txt").id == put.id
    assert client.artifacts.find("reports/today.txt", pipeline="sample.chatter").id == put.id
    assert {a.name for a in client.artifacts.list(pipeline="sample.chatter")} == {"reports/today.txt", "dist/build.bin"}
    assert [a.id for a in client.artifacts.list(labels={"kind": "report"})] == [put.id]
    with pytest.raises(ClientError) as missing:
        client.artifacts.find("nothing.txt")
    assert missing.value.status == 404

    assert client.artifacts.read(put.id) == data
    assert client.artifacts.read(put) == data
    (tmp_path / "out").mkdir()
    saved = client.artifacts.download(from_file, tmp_path / "out")  # a directory: under the name's last part
    assert saved == tmp_path / "out" / "build.bin"
    assert saved.read_bytes() == source.read_bytes()
    named = client.artifacts.download(put.id, tmp_path / "copy.txt")
    assert named.read_bytes() == data
    assert not [p for p in tmp_path.rglob("*") if p.name.endswith(".part")], "no partial download is left"


def test_server_errors_keep_their_shape(client: Client, web: WebServer, workers: Any) -> None:
    with pytest.raises(ClientError) as invalid:
        client.start_by_name("sample.chatter", {"lines": "many"})
    assert invalid.value.status == 400
    assert invalid.value.code == "validation_failed"
    assert "inputs.lines" in invalid.value.fields
    assert list(client.runs.list(pipeline="sample.chatter")) == [], "nothing was started"

    with pytest.raises(ClientError) as missing:
        client.runs.get(str(uuid.uuid4()))
    assert (missing.value.status, missing.value.code) == (404, "not_found")
    assert "GET /api/v1/runs/" in str(missing.value)
    with pytest.raises(ClientError) as no_pipeline:
        client.stands.get("no.such.pipeline")
    assert no_pipeline.value.status == 404
    assert "no pipeline 'no.such.pipeline'" in no_pipeline.value.detail

    refused = Client(client.server, token="not-a-token", ca_file=web.ca_file)
    with pytest.raises(ClientError) as unauthorized:
        refused.records.list().first(1)
    assert unauthorized.value.status == 401
    assert "graphenectl login" in str(unauthorized.value)


@pytest.mark.own_web  # it restarts the server
def test_a_follow_rides_out_a_server_restart_without_losing_or_repeating_a_line(
    client: Client, web: WebServer, workers: Any
) -> None:
    handle = client.start(chatter, ChatterInputs(lines=6, gap_ms=400))
    record = run_record(handle)
    followed: list[LogLine] = []
    for line in client.logs.follow(record, check_every=0.2):
        followed.append(line)
        if line.message == "chatter line 1":
            web.kill()  # SIGKILL: the stream drops; the run goes on writing lines meanwhile
            wait_for(lambda: StoredLine.objects.filter(message="chatter line 2").exists(), timeout=30)
            web.start()
    assert messages(followed) == [f"chatter line {i}" for i in range(6)]
    assert len({line.id for line in followed}) == len(followed), "each line once"
    assert handle.get().status == "succeeded"
