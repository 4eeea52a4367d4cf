"""graphene_sdk.testing: protected records in the in-memory world behave as in Graphene — a
deletion stops at a protected record (it, what it owns and its owners stay, ``deletion_waiting``
says why), the rest goes children first, and unprotecting finishes it. No database."""

from __future__ import annotations

from datetime import timedelta

import pytest
from graphene_sdk import Context, pipeline
from graphene_sdk.testing import World
from pydantic import BaseModel


class Nothing(BaseModel):
    pass


@pipeline("kit-protect", inputs=Nothing)
def kit_protect(ctx: Context, inputs: Nothing) -> None:
    net = ctx.declare("docker.network", "net")
    db = ctx.declare("docker.container", "db", parent=net, protect=True)
    ctx.declare("docker.volume", "data", parent=db)
    ctx.declare("docker.container", "cache", parent=net)
    ctx.declare("docker.volume", "scratch")


@pipeline("kit-keep", inputs=Nothing)
def kit_keep(ctx: Context, inputs: Nothing) -> None:
    db = ctx.declare("docker.container", "db")
    db.ready()
    ctx.to_stand(db, keep_for=timedelta(hours=1))


def test_a_finished_run_stops_at_the_protected_record_until_it_is_unprotected() -> None:
    world = World()
    result = world.run(kit_protect)
    assert result.succeeded, result.error_text
    assert [r.name for r in world.deletions] == ["scratch", "cache"]
    net, db, data = result.record("net"), result.record("db"), result.record("data")
    assert db.protected
    assert [r.alive for r in (net, db, data)] == [True, True, True]
    assert {net.deletion_waiting, db.deletion_waiting, data.deletion_waiting} == {"RunSucceeded"}
    world.assert_no_leaks()  # kept on purpose, not leaked
    assert [r.name for r in world.unprotect(db)] == ["data", "db", "net"]
    assert {r.deletion_reason for r in (net, db, data)} == {"RunSucceeded"}
    assert not db.protected


def test_an_operator_protects_a_stand_holding_past_its_ttl() -> None:
    world = World()
    assert world.run(kit_keep).succeeded
    (db,) = world.stand(kit_keep)
    assert world.protect(db) is db
    assert world.advance(hours=2) == []  # its TTL ran out: the deletion waits on it
    assert (db.alive, db.deletion_waiting) == (True, "Expired")
    assert world.advance(hours=2) == []  # and does not start again
    with pytest.raises(ValueError, match="being deleted"):
        world.protect(db)
    assert world.unprotect(db) == [db]
    assert db.deletion_reason == "Expired"


def test_deleting_a_protected_record_waits_and_unprotecting_an_unprotected_one_deletes_nothing() -> None:
    world = World()
    assert world.run(kit_keep).succeeded
    (db,) = world.stand(kit_keep)
    assert world.unprotect(db) == []
    world.protect(db)
    assert world.delete(db) == []
    assert db.deletion_waiting == "DeletedByUser"
    assert world.unprotect(db) == [db]


@pipeline("kit-libs", inputs=Nothing)
def kit_libs(ctx: Context, inputs: Nothing) -> None:
    from graphene_sdk.libs import docker, git
    from graphene_sdk.libs.file import file

    docker.volume(ctx, "data", protect=True)
    docker.network(ctx, "net")
    file(ctx, "notes", path="notes.txt", content="hi\n", protect=True)
    git.checkout(ctx, "src", repository="https://example.invalid/repo.git", protect=True)


def test_the_resource_libraries_pass_protect_on() -> None:
    world = World()
    result = world.run(kit_libs)
    assert result.succeeded, result.error_text
    assert {r.name: r.protected for r in result.records} == {"data": True, "net": False, "notes": True, "src": True}
    assert [r.name for r in world.deletions] == ["net"]
