"""``graphenectl artifact get|put``: download and upload artifacts (list them with ``get artifacts``).

Bytes are streamed in chunks both ways, never held in memory; a download is written beside
its destination and renamed once complete and its sha256 checked, an upload sends the digest
it computed so the server refuses damaged bytes.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
import uuid
from pathlib import Path, PurePosixPath
from typing import IO, Annotated, Any

import typer

from graphenectl._errors import CliError, NotFoundError, UsageError
from graphenectl._options import OutputOpt
from graphenectl._output import Format, emit, info, note
from graphenectl._resources import ARTIFACT_COLUMNS, RESOURCES, human_size
from graphenectl._session import record_id, session
from graphenectl._time import parse_duration

CHUNK = 1024 * 1024
# Downloads and uploads at least this big report their progress on stderr.
PROGRESS_FROM_BYTES = 8 * 1024 * 1024
ARTIFACT = RESOURCES["artifact"]

artifact_app = typer.Typer(
    name="artifact",
    help="Artifacts: bytes kept in Graphene's blob store (builds, reports). List them with `get artifacts`.",
    no_args_is_help=True,
)


class Progress:
    """One line on stderr, redrawn on a terminal (else a line every few seconds), for big transfers."""

    def __init__(self, verb: str, what: str, total: int | None) -> None:
        self.verb, self.what, self.total = verb, what, total
        self.done = 0
        self.enabled = total is None or total >= PROGRESS_FROM_BYTES
        self.tty = sys.stderr.isatty()
        self.started = self.shown = time.monotonic()
        if self.enabled and not self.tty:  # a log (CI): say it began, then a line every few seconds
            size = f" ({human_size(total)})" if total is not None else ""
            sys.stderr.write(f"{verb} {what}{size}…\n")
            sys.stderr.flush()

    def add(self, n: int) -> None:
        self.done += n
        now = time.monotonic()
        if self.enabled and now - self.shown >= (0.2 if self.tty else 5.0):
            self.shown = now
            self._show()

    def _show(self, end: str = "") -> None:
        rate = self.done / max(time.monotonic() - self.started, 1e-6)
        part = f"{human_size(self.done)}"
        if self.total:
            part += f" of {human_size(self.total)} ({100 * self.done // max(self.total, 1)}%)"
        line = f"{self.verb} {self.what}: {part}, {human_size(int(rate))}/s"
        if self.tty:
            sys.stderr.write(f"\r\x1b[2K{line}{end}")
        else:
            sys.stderr.write(f"{line}\n")
        sys.stderr.flush()

    def finish(self) -> None:
        if self.enabled and self.tty:
            self._show(end="\n")


class _CountingReader:
    """A file object for urllib to send from, counting what it reads."""

    def __init__(self, stream: IO[bytes], progress: Progress) -> None:
        self.stream, self.progress = stream, progress

    def read(self, size: int = -1) -> bytes:
        data = self.stream.read(CHUNK if size is None or size < 0 else min(size, CHUNK))
        self.progress.add(len(data))
        return data


def _is_uuid(value: str) -> bool:
    try:
        uuid.UUID(value)
    except ValueError:
        return False
    return True


def find_artifact(ref: str, pipeline: str | None) -> dict[str, Any]:
    """An artifact by id, or the newest of that name (of ``pipeline`` if given)."""
    client = session.client()
    ident = ref.removeprefix("artifact/")
    if _is_uuid(ident):
        body: dict[str, Any] = client.get(f"artifacts/{ident}/")
        return body
    params = {"name": ident, "pipeline": pipeline, "namespace": session.list_namespace(), "limit": 1}
    page = client.page("artifacts/", params)
    if not page.items:
        where = f" of pipeline {pipeline!r}" if pipeline else ""
        raise NotFoundError(
            f"no artifact named {ident!r}{where}", hint="list them with `graphenectl get artifacts --pipeline NAME`"
        )
    return page.items[0]


@artifact_app.command("get")
def artifact_get(
    ref: Annotated[str, typer.Argument(metavar="ID_OR_NAME", help="an artifact id, or a name (the newest of it)")],
    output_file: Annotated[
        str | None,
        typer.Option(
            "--output-file", "-o", help="where to save it (default: the name's last part, here); - for stdout"
        ),
    ] = None,
    pipeline: Annotated[
        str | None, typer.Option("--pipeline", help="with a name: the newest of that pipeline's artifacts")
    ] = None,
    force: Annotated[bool, typer.Option("--force", "-f", help="overwrite an existing file")] = False,
) -> None:
    """Download an artifact (its sha256 is checked; progress on stderr for big ones).

    Examples:

      graphenectl artifact get 3f0c…                     (saved under its name's last part)

      graphenectl artifact get dist/app.tar.gz --pipeline build -o app.tar.gz

      graphenectl artifact get report.html -o - | less
    """
    artifact = find_artifact(ref, pipeline)
    name = str(artifact["name"])
    to_stdout = output_file == "-"
    target = None if to_stdout else Path(output_file or PurePosixPath(name).name)
    if target is not None and target.is_dir():
        target = target / PurePosixPath(name).name
    if target is not None and target.exists() and not force:
        raise UsageError(f"{target} exists; pass --force to overwrite it, or -o another path")
    size = int(artifact.get("size") or 0)
    progress = Progress("downloading", name, size)
    hasher = hashlib.sha256()
    partial = target.with_name(f".{target.name}.{os.getpid()}.part") if target is not None else None
    response = session.client().open_raw(
        "GET", f"artifacts/{artifact['id']}/content/", timeout=max(session.timeout, 60)
    )
    try:
        with response:
            out: IO[bytes] = sys.stdout.buffer if partial is None else partial.open("wb")
            try:
                while chunk := response.read(CHUNK):
                    hasher.update(chunk)
                    out.write(chunk)
                    progress.add(len(chunk))
                out.flush()
            finally:
                if partial is not None:
                    out.close()
        progress.finish()
        if hasher.hexdigest() != artifact["sha256"] or progress.done != size:
            raise CliError(
                f"the download of {name} is damaged ({progress.done} bytes, sha256 {hasher.hexdigest()}; "
                f"expected {size} bytes, {artifact['sha256']}): try again"
            )
        if partial is not None and target is not None:
            os.replace(partial, target)
    except BaseException:
        if partial is not None:
            partial.unlink(missing_ok=True)
        raise
    if target is not None:
        info(f"saved artifact/{artifact['id']} ({human_size(size)}, sha256 {artifact['sha256'][:12]}…) to {target}")


def _sha256_of(path: Path) -> str:
    hasher = hashlib.sha256()
    with path.open("rb") as stream:
        while chunk := stream.read(CHUNK):
            hasher.update(chunk)
    return hasher.hexdigest()


@artifact_app.command("put")
def artifact_put(
    file: Annotated[Path, typer.Argument(help="the file to upload", exists=True, dir_okay=False, readable=True)],
    owner: Annotated[str, typer.Option("--owner", help="who holds it: stand/<pipeline>, run/<id> or a record id")],
    name: Annotated[str | None, typer.Option("--name", help="the artifact's name (default: the file's name)")] = None,
    content_type: Annotated[
        str | None, typer.Option("--content-type", help="media type (default: guessed from the name)")
    ] = None,
    ttl_opt: Annotated[str | None, typer.Option("--ttl", help="delete it after this long: 30m, 4h, 7d")] = None,
    label: Annotated[list[str] | None, typer.Option("--label", "-l", help="k=v (repeatable)")] = None,
    output: OutputOpt = Format.name,
) -> None:
    """Upload FILE as an artifact held by OWNER (streamed; the server checks its sha256).

    Uploading the same bytes under the same name and owner again changes nothing (exit 0);
    other bytes under a name the owner already holds are refused.

    Examples:

      graphenectl artifact put dist/app.tar.gz --owner stand/build --ttl 7d

      graphenectl artifact put report.html --name reports/today.html --owner <record id> -o json
    """
    for value in label or []:
        for part in value.split(","):
            if part and "=" not in part:
                raise UsageError(f"label {part!r} must look like key=value")
    size = file.stat().st_size
    params: dict[str, Any] = {
        "name": name or file.name,
        "owner": record_id(owner, owner=True),
        "sha256": _sha256_of(file),
        "content_type": content_type,
        "ttl_seconds": parse_duration(ttl_opt, option="--ttl") if ttl_opt else None,
        "label": [p for value in label or [] for p in value.split(",") if p],
    }
    progress = Progress("uploading", params["name"], size)
    headers = {"Content-Type": "application/octet-stream", "Content-Length": str(size), "Accept": "application/json"}
    with file.open("rb") as stream:
        response = session.client().open_raw(
            "POST",
            "artifacts/",
            params=params,
            data=_CountingReader(stream, progress),
            headers=headers,
            timeout=max(session.timeout, 300),
        )
        with response:
            body = json.loads(response.read())
            created = response.status == 201
    progress.finish()
    note(
        f"artifact/{body['id']} {'stored' if created else 'unchanged (same bytes already held)'}: "
        f"{body['name']}, {human_size(body['size'])}"
    )
    emit(body, output, columns=ARTIFACT_COLUMNS, name_of=ARTIFACT.name_of)
