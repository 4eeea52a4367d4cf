"""graphenectl against a real embedded server: put, get artifacts (table, json), artifact get."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from tests.harness.embedded import Ctl, Server

pytestmark = [pytest.mark.system, pytest.mark.xdist_group("graphene-up")]  # the CLI tests' embedded server


def test_put_list_and_get(ctl: Ctl, server: Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data = os.urandom(9 * 1024 * 1024)  # big enough for a progress line
    source = tmp_path / "app.bin"
    source.write_bytes(data)
    status, record = server.api("POST", "records/", {"kind": "graphene.stand", "name": "cli-artifacts"})
    assert status == 201, record

    put = ctl.ok("artifact", "put", str(source), "--name", "dist/app.bin", "--owner", record["id"], "--ttl", "2h")
    artifact_id = put.out.strip().removeprefix("artifact/")
    assert put.out.strip() == f"artifact/{artifact_id}"
    assert "uploading dist/app.bin (9.0 MiB)" in put.err
    assert "stored" in put.err
    again = ctl.ok("artifact", "put", str(source), "--name", "dist/app.bin", "--owner", record["id"], "-o", "json")
    assert again.json()["id"] == artifact_id
    assert "unchanged" in again.err

    table = ctl.ok("get", "artifacts")
    header, *rows = table.out.splitlines()
    assert header.split() == ["NAMESPACE", "ID", "NAME", "SIZE", "PHASE", "PIPELINE", "TTL", "AGE"]
    assert any(row.split()[:4] == ["default", artifact_id, "dist/app.bin", "9.0"] for row in rows), table.out
    listed = ctl.ok("get", "artifacts", "-o", "json").json()
    assert [a["sha256"] for a in listed if a["id"] == artifact_id] == [hashlib.sha256(data).hexdigest()]
    assert ctl.ok("get", "artifacts", artifact_id, "-o", "json").json()["size"] == len(data)

    target = tmp_path / "out" / "copy.bin"
    target.parent.mkdir()
    got = ctl.ok("artifact", "get", artifact_id, "-o", str(target))
    assert target.read_bytes() == data
    assert "downloading dist/app.bin (9.0 MiB)" in got.err
    assert "saved" in got.err
    refused = ctl("artifact", "get", artifact_id, "-o", str(target))
    assert refused.code == 2
    assert "--force" in refused.err
    monkeypatch.chdir(target.parent)  # by name, saved under the name's last part, here
    ctl.ok("artifact", "get", "dist/app.bin")
    assert (target.parent / "app.bin").read_bytes() == data

    missing = ctl("artifact", "get", "no-such-artifact")
    assert missing.code == 3
    assert "no artifact named 'no-such-artifact'" in missing.err
    no_owner = ctl("artifact", "put", str(source))
    assert no_owner.code == 2
    assert "--owner" in no_owner.err
    bad_owner = ctl("artifact", "put", str(source), "--owner", "not-a-uuid")
    assert bad_owner.code == 2, bad_owner.err  # a malformed id is a usage error, naming the field
    assert "owner: not a record id" in bad_owner.err
    assert "Download an artifact" in ctl.ok("artifact", "get", "--help").out
