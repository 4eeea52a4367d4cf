"""What the ``file`` kind does to a file, as one self-contained function.

``file_op`` uses only the standard library and imports inside its body, so that the same
code runs in the server's process (files under ``GRAPHENE_FILE_ROOT``) and, sent as an
agent's ``call`` command, on an agent's machine. It is the one place that knows the marker.

The marker is the extended attribute ``user.graphene.record`` holding the record id; on a
file system without user xattrs, a sidecar ``.<name>.graphene-record`` next to the file.
A file that exists without our marker (or with another record's) is never adopted,
overwritten or removed: ``write`` refuses it naming the owner, ``remove`` leaves it.
"""

from __future__ import annotations

from typing import Any


def file_op(op: str, path: str, record_id: str = "", data_b64: str = "", mode: int = 0o644) -> dict[str, Any] | None:
    """``write`` (adopt-or-create, atomic), ``observe`` (``None`` if absent), ``remove``
    (only if ours; absent is success), ``marker`` (the owner's record id or ``None``)."""
    import base64
    import errno
    import hashlib
    import os

    xattr = "user.graphene.record"
    head, name = os.path.split(path)
    sidecar = os.path.join(head, "." + name + ".graphene-record")

    def read_marker(target: str) -> str | None:
        try:
            return os.getxattr(target, xattr).decode() or None
        except OSError as exc:
            if exc.errno == errno.ENOENT:
                return None
            if exc.errno not in (errno.ENODATA, errno.ENOTSUP, errno.EOPNOTSUPP):
                raise
        side = os.path.join(os.path.dirname(target), "." + os.path.basename(target) + ".graphene-record")
        try:
            with open(side) as handle:
                return handle.read().strip() or None
        except FileNotFoundError:
            return None

    def write_marker(target: str, *, sidecar_too: bool = True) -> None:
        try:
            os.setxattr(target, xattr, record_id.encode())
        except OSError as exc:
            if exc.errno not in (errno.ENOTSUP, errno.EOPNOTSUPP):
                raise
            if sidecar_too:
                with open(sidecar, "w") as handle:
                    handle.write(record_id)

    def describe(data: bytes, file_mode: int) -> dict[str, Any]:
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        return {"path": path, "digest": digest, "size": len(data), "mode": file_mode}

    if op == "marker":
        owner = read_marker(path)
        return {"record": owner} if owner else None
    if op == "observe":
        try:
            with open(path, "rb") as handle:
                data = handle.read()
            file_mode = os.stat(path).st_mode & 0o7777
        except FileNotFoundError:
            return None
        return describe(data, file_mode)
    if op == "remove":
        if not os.path.lexists(path):
            if os.path.exists(sidecar):
                os.unlink(sidecar)
            return {"removed": False}
        if read_marker(path) != record_id:
            return {"removed": False, "foreign": True}  # not ours (any more): never removed
        os.unlink(path)
        if os.path.exists(sidecar):
            os.unlink(sidecar)
        return {"removed": True}
    if op != "write":
        raise ValueError(f"unknown file operation {op!r}")
    data = base64.b64decode(data_b64)
    exists = os.path.lexists(path)
    owner = read_marker(path) if exists else None
    if exists and owner != record_id:
        whose = f"record {owner}" if owner else "no Graphene record"
        raise FileExistsError(f"{path} already exists and belongs to {whose}; refusing to adopt it")
    os.makedirs(head or ".", exist_ok=True)
    if owner is None:
        # Create empty and mark first, then fill: a crash in between leaves a marked file
        # that the retried write adopts, never an unmarked one.
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode))
        write_marker(path)
    tmp = os.path.join(head, "." + name + "." + record_id + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fchmod(fd, mode)  # the umask narrowed the mode given to open
        os.fsync(fd)
    finally:
        os.close(fd)
    write_marker(tmp, sidecar_too=False)  # without xattrs, the file's sidecar already names us
    os.replace(tmp, path)
    return describe(data, mode)
