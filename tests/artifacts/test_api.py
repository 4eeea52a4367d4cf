"""Artifacts over REST and their lifecycle as records: upload, download, list, refusals that leave
nothing behind, the blob kept while any record names it, TTL, files made from artifacts, the sweep."""

from __future__ import annotations

import hashlib
import os
import time
import uuid
import warnings
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.utils import timezone
from rest_framework.test import APIClient

from apps.artifacts import blobs
from apps.records import services as records
from apps.records.choices import Phase
from apps.records.models import Record
from kinds import get_kind
from tests import factories

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def store(settings: Any, tmp_path: Path) -> Path:
    settings.GRAPHENE_ARTIFACT_ROOT = tmp_path / "store"
    return Path(settings.GRAPHENE_ARTIFACT_ROOT)


def blob_files(store: Path) -> list[Path]:
    return sorted(p for p in store.rglob("*") if p.is_file())


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def upload(api: APIClient, owner: Record, name: str, data: bytes, **params: Any) -> Any:
    query = "&".join(f"{k}={v}" for k, v in {"name": name, "owner": owner.pk, **params}.items())
    return api.post(f"/api/v1/artifacts/?{query}", data=data, content_type="application/octet-stream")


def download(api: APIClient, artifact_id: str, **headers: Any) -> Any:
    return api.get(f"/api/v1/artifacts/{artifact_id}/content/", HTTP_ACCEPT="*/*", **headers)


def body_of(response: Any) -> bytes:
    with warnings.catch_warnings():  # the test client is synchronous; the server streams asynchronously
        warnings.simplefilter("ignore")
        return b"".join(response)


def test_upload_download_and_metadata(
    api: APIClient, store: Path, eager: None, django_capture_on_commit_callbacks: Any
) -> None:
    stand = factories.stand("build")
    data = os.urandom(3 * blobs.CHUNK + 5)
    with django_capture_on_commit_callbacks(execute=True):
        response = upload(api, stand, "dist/app.zip", data, sha256=sha(data), ttl_seconds=3600, label="team=ci")
    assert response.status_code == 201, response.json()
    meta = response.json()
    assert meta["name"] == "dist/app.zip"
    assert meta["record_name"] == "dist/app.zip"
    assert (meta["sha256"], meta["size"]) == (sha(data), len(data))
    assert meta["content_type"] == "application/zip"  # guessed from the name
    assert meta["owner"] == str(stand.pk)
    assert meta["labels"] == {"team": "ci"}
    assert meta["expires_at"] is not None
    record = Record.objects.get(pk=meta["id"])
    assert (record.kind, record.phase) == ("artifact", Phase.READY)
    assert record.outputs["digest"] == f"sha256:{sha(data)}"
    assert blob_files(store) == [blobs.path_of(sha(data))], "one blob, no staged leftovers"

    got = download(api, meta["id"])
    assert got.status_code == 200
    assert got["Content-Length"] == str(len(data))
    assert got["ETag"] == f'"{sha(data)}"'
    assert got["Content-Disposition"] == 'attachment; filename="app.zip"'
    assert got["Content-Type"] == "application/zip"
    assert body_of(got) == data
    assert download(api, meta["id"], HTTP_IF_NONE_MATCH=f'"{sha(data)}"').status_code == 304

    again = api.get(f"/api/v1/artifacts/{meta['id']}/").json()
    assert again["phase"] == "ready"  # the upload answered before convergence (pending)
    assert {k: v for k, v in again.items() if k not in ("phase", "updated_at")} == {
        k: v for k, v in meta.items() if k not in ("phase", "updated_at")
    }
    assert meta["content_url"].endswith(f"/api/v1/artifacts/{meta['id']}/content/")


def test_multipart_upload_and_idempotent_retry(
    api: APIClient, store: Path, eager: None, django_capture_on_commit_callbacks: Any
) -> None:
    stand = factories.stand("build")
    form = {"file": SimpleUploadedFile("report.html", b"<h1>ok</h1>", content_type="text/html"), "name": "report.html"}
    with django_capture_on_commit_callbacks(execute=True):
        first = api.post(f"/api/v1/artifacts/?owner={stand.pk}", data=form, format="multipart")
    assert first.status_code == 201, first.json()
    assert first.json()["content_type"] == "text/html"
    again = upload(api, stand, "report.html", b"<h1>ok</h1>")
    assert again.status_code == 200
    assert again.json()["id"] == first.json()["id"], "the same bytes: the same artifact"
    other = upload(api, stand, "report.html", b"<h1>changed</h1>")
    assert other.status_code == 409
    assert "already exists with other content" in other.json()["detail"]
    assert blob_files(store) == [blobs.path_of(sha(b"<h1>ok</h1>"))], "the refused upload left no blob"


def test_bad_uploads_leave_neither_blob_nor_record(api: APIClient, store: Path, settings: Any) -> None:
    stand, doomed = factories.stand("build"), factories.stand("doomed")
    records.record_delete_request(record=doomed)
    before = Record.objects.count()

    def refused(response: Any, status: int, text: str) -> None:
        assert response.status_code == status, response.json()
        assert text in response.json()["detail"], response.json()
        assert Record.objects.count() == before
        assert blob_files(store) == []

    refused(api.post("/api/v1/artifacts/", data=b"x", content_type="application/octet-stream"), 400, "name and owner")
    refused(upload(api, stand, "a.txt", b"data", sha256=sha(b"other")), 400, "damaged on the way")
    refused(upload(api, stand, "a.txt", b"data", sha256="nope"), 400, "64 hex digits")
    refused(upload(api, Record(pk=uuid.uuid4()), "a.txt", b"data"), 404, "no record")
    refused(upload(api, stand, " padded", b"data"), 400, "blanks")
    refused(upload(api, stand, "a.txt", b"data", ttl_seconds="soon"), 400, "not an integer")
    refused(upload(api, stand, "a.txt", b"data", content_type="nonsense"), 400, "not a media type")
    settings.GRAPHENE_ARTIFACT_MAX_BYTES = 3
    refused(upload(api, stand, "a.txt", b"data"), 413, "limit is 3")
    refused(upload(api, doomed, "a.txt", b"da"), 409, "being deleted")
    anonymous = APIClient().post(f"/api/v1/artifacts/?name=a&owner={stand.pk}", data=b"da", content_type="text/plain")
    assert anonymous.status_code == 401
    assert blob_files(store) == []


def test_list_filters_and_pages(api: APIClient, django_capture_on_commit_callbacks: Any) -> None:
    build, other = factories.stand("build"), factories.stand("other")
    with django_capture_on_commit_callbacks(execute=False):
        for i in range(3):
            assert upload(api, build, f"log-{i}.txt", f"line {i}".encode(), label=f"i={i}").status_code == 201
        assert upload(api, other, "log-0.txt", b"elsewhere").status_code == 201
    everything = api.get("/api/v1/artifacts/").json()["results"]
    assert [a["name"] for a in everything] == ["log-0.txt", "log-2.txt", "log-1.txt", "log-0.txt"]  # newest first
    assert [a["owner"] for a in api.get("/api/v1/artifacts/?name=log-0.txt").json()["results"]] == [
        str(other.pk),
        str(build.pk),
    ]
    assert [a["name"] for a in api.get("/api/v1/artifacts/?pipeline=other").json()["results"]] == ["log-0.txt"]
    assert [a["name"] for a in api.get("/api/v1/artifacts/?label=i=1").json()["results"]] == ["log-1.txt"]
    page = api.get("/api/v1/artifacts/?limit=2").json()
    assert len(page["results"]) == 2
    assert page["next"]
    assert len(api.get(page["next"]).json()["results"]) == 2
    assert api.get("/api/v1/artifacts/?run=x").status_code == 400
    assert api.get(f"/api/v1/artifacts/?run={uuid.uuid4()}").json()["results"] == []
    assert api.get(f"/api/v1/artifacts/{uuid.uuid4()}/").status_code == 404
    assert APIClient().get("/api/v1/artifacts/").status_code == 401


def test_the_blob_goes_with_the_last_record_that_names_it(
    api: APIClient, store: Path, eager: None, django_capture_on_commit_callbacks: Any
) -> None:
    one, two = factories.stand("one"), factories.stand("two")
    data = b"shared bytes"
    with django_capture_on_commit_callbacks(execute=True):
        first = Record.objects.get(pk=upload(api, one, "a.bin", data).json()["id"])
        second = Record.objects.get(pk=upload(api, two, "b.bin", data).json()["id"])
    assert blob_files(store) == [blobs.path_of(sha(data))], "deduplicated: one blob for two records"

    with django_capture_on_commit_callbacks(execute=True):
        records.record_delete_request(record=first)
    assert Record.objects.get(pk=first.pk).phase == Phase.DELETED
    assert blobs.exists(sha(data)), "the other record still names it"
    assert body_of(download(api, str(second.pk))) == data
    assert download(api, str(first.pk)).status_code == 404

    with django_capture_on_commit_callbacks(execute=True):
        records.record_delete_request(record=second)
    assert Record.objects.get(pk=second.pk).phase == Phase.DELETED
    assert blob_files(store) == []


def test_a_record_being_deleted_does_not_keep_the_blob_for_another(
    api: APIClient, store: Path, eager: None, django_capture_on_commit_callbacks: Any
) -> None:
    """Two records of one digest deleted together: the second delete sees the first one
    ``deleting`` and removes the blob (neither keeps it for the other)."""
    one, two = factories.stand("one"), factories.stand("two")
    with django_capture_on_commit_callbacks(execute=True):
        first = Record.objects.get(pk=upload(api, one, "a.bin", b"bytes").json()["id"])
        second = Record.objects.get(pk=upload(api, two, "a.bin", b"bytes").json()["id"])
    Record.objects.filter(pk=first.pk).update(phase=Phase.DELETING)  # its delete is under way
    get_kind("artifact").delete(Record.objects.get(pk=second.pk))
    assert blob_files(store) == []


def test_ttl_expiry_deletes_the_artifact_and_its_blob(
    api: APIClient, store: Path, eager: None, django_capture_on_commit_callbacks: Any
) -> None:
    stand = factories.stand("build")
    with django_capture_on_commit_callbacks(execute=True):
        meta = upload(api, stand, "nightly.zip", b"PK...", ttl_seconds=60).json()
    with django_capture_on_commit_callbacks(execute=True):
        assert records.records_expire(now=timezone.now()) == 0
        assert records.records_expire(now=timezone.now() + timedelta(seconds=61)) == 1
    assert Record.objects.get(pk=meta["id"]).phase == Phase.DELETED
    assert blob_files(store) == []
    assert [a["id"] for a in api.get("/api/v1/artifacts/").json()["results"]] == []
    assert [a["id"] for a in api.get("/api/v1/artifacts/?include_deleted=true").json()["results"]] == [meta["id"]]


def test_a_file_record_copies_an_artifact_and_checks_drift_by_digest(
    api: APIClient, settings: Any, eager: None, django_capture_on_commit_callbacks: Any
) -> None:
    stand = factories.stand("deploy")
    data = bytes(range(256)) * 10  # not UTF-8: files take any bytes from an artifact
    with django_capture_on_commit_callbacks(execute=True):
        artifact = upload(api, stand, "app.bin", data).json()
        file = records.record_declare(
            kind="file",
            name="app",
            owner=stand,
            spec={"path": f"art/{uuid.uuid4()}/app.bin", "content": {"$artifact": artifact["id"]}, "mode": 0o600},
        )
    file.refresh_from_db()
    assert file.phase == Phase.READY, file.last_error
    path = Path(file.outputs["path"])
    assert path.read_bytes() == data
    assert file.outputs["digest"] == f"sha256:{artifact['sha256']}"
    assert records.records_observe(record_ids=[file.pk])["clean"] == 1

    path.write_bytes(b"tampered")
    with django_capture_on_commit_callbacks(execute=True):
        assert records.records_observe(record_ids=[file.pk])["healing"] == 1
    assert path.read_bytes() == data, "healed from the artifact"

    with pytest.raises(Exception, match=r"oneOf|does not match"):
        records.record_declare(
            kind="file", name="bad", owner=stand, spec={"path": "x", "content": {"$artifact": "a", "x": 1}}
        )
    with django_capture_on_commit_callbacks(execute=True):
        missing = records.record_declare(
            kind="file", name="missing", owner=stand, spec={"path": "y", "content": {"$artifact": str(uuid.uuid4())}}
        )
    missing.refresh_from_db()
    assert missing.phase == Phase.CREATE_FAILED
    assert "no artifact" in missing.last_error


def test_the_sweeper_removes_blobs_no_record_names(
    api: APIClient, store: Path, settings: Any, eager: None, django_capture_on_commit_callbacks: Any
) -> None:
    stand = factories.stand("build")
    with django_capture_on_commit_callbacks(execute=True):
        kept = upload(api, stand, "kept.txt", b"kept").json()
    orphan = blobs.stage([b"orphan: a publish that died before its commit"])
    blobs.commit(orphan)
    leftover = blobs.stage([b"an upload that died half-way"])
    young = [f for f in records.records_sweep(dry_run=True) if f["kind"] == "artifact"]
    assert young == [], "young files are left alone (grace period)"

    settings.GRAPHENE_ARTIFACT_SWEEP_GRACE_SECONDS = 0
    time.sleep(0.01)  # mtimes strictly before "now"
    found = {f["external_id"]: f for f in records.records_sweep() if f["kind"] == "artifact"}
    assert set(found) == {f"sha256:{orphan.sha256}", f"tmp/{leftover.path.name}"}
    assert not blobs.exists(orphan.sha256)
    assert not leftover.path.exists()
    assert blobs.exists(kept["sha256"])
