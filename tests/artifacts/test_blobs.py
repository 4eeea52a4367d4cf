"""The blob store on disk: atomic writes, deduplication, digests verified, the size limit."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.db import transaction

from apps.artifacts import blobs, services
from apps.core.errors import ValidationFailed


@pytest.fixture(autouse=True)
def store(settings: Any, tmp_path: Path) -> Path:
    settings.GRAPHENE_ARTIFACT_ROOT = tmp_path / "store"
    return Path(settings.GRAPHENE_ARTIFACT_ROOT)


def files_under(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file())


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_a_blob_is_staged_then_moved_into_place_by_its_digest(store: Path) -> None:
    data = b"x" * (3 * blobs.CHUNK + 17)  # several chunks
    staged = blobs.stage(blobs.chunks_of_bytes(data))
    assert staged.sha256 == sha(data)
    assert staged.size == len(data)
    assert staged.path.parent == store / "tmp"
    assert not blobs.exists(staged.sha256)
    assert blobs.commit(staged) is True
    target = store / "sha256" / staged.sha256[:2] / staged.sha256
    assert target.read_bytes() == data
    assert target.stat().st_mode & 0o222 == 0, "blobs are read-only"
    assert files_under(store) == [target], "the staged file was moved, not copied"
    assert blobs.read_bytes(staged.sha256) == data


def test_the_same_content_is_stored_once(store: Path) -> None:
    first = blobs.stage([b"same ", b"bytes"])
    second = blobs.stage([b"same bytes"])
    assert first.sha256 == second.sha256
    assert blobs.commit(first) is True
    assert blobs.commit(second) is False, "deduplicated"
    assert files_under(store) == [blobs.path_of(first.sha256)]


def test_a_failed_stream_leaves_nothing(store: Path) -> None:
    def broken() -> Iterator[bytes]:
        yield b"partial data"
        raise OSError("the client went away")

    with pytest.raises(OSError, match="went away"):
        blobs.stage(broken())
    assert files_under(store) == []


def test_the_size_limit_is_enforced_while_streaming(store: Path, settings: Any) -> None:
    settings.GRAPHENE_ARTIFACT_MAX_BYTES = 10
    assert blobs.stage([b"0123456789"]).size == 10
    with pytest.raises(blobs.TooLarge, match="larger than the limit of 10 bytes") as caught:
        blobs.stage(b"x" for _ in range(11))
    assert caught.value.status_code == 413
    assert [p.name for p in files_under(store)] != []
    assert all(p.parent.name == "tmp" for p in files_under(store))
    assert len(files_under(store)) == 1, "only the first (accepted) staged file remains"


def test_an_expected_digest_is_verified(store: Path) -> None:
    data = b"payload"
    assert blobs.stage([data], expected_sha256="sha256:" + sha(data)).sha256 == sha(data)
    with pytest.raises(ValidationFailed, match="damaged on the way") as caught:
        blobs.stage([data], expected_sha256=sha(b"other"))
    assert caught.value.code == "digest_mismatch"
    with pytest.raises(ValidationFailed, match="64 hex digits"):
        blobs.stage([data], expected_sha256="abc")
    assert len(files_under(store)) == 1  # the first staged file only


def test_reading_a_damaged_blob_is_refused(store: Path) -> None:
    staged = blobs.stage([b"good"])
    blobs.commit(staged)
    path = blobs.path_of(staged.sha256)
    path.chmod(0o640)
    path.write_bytes(b"evil")
    with pytest.raises(blobs.BlobMissing, match="damaged"):
        blobs.read_bytes(staged.sha256)
    path.unlink()
    with pytest.raises(blobs.BlobMissing, match="removed outside Graphene"):
        blobs.open_blob(staged.sha256)


@pytest.mark.django_db(transaction=True)
def test_the_digest_lock_needs_a_transaction() -> None:
    with pytest.raises(RuntimeError, match="open transaction"), services.digest_lock(sha(b"x")):
        pass
    with transaction.atomic(), services.digest_lock(sha(b"x")):
        pass
