"""Read a reviewed manifest without being tricked (DESIGN §6.1).

The path must be absolute and no component may be a symbolic link. Every directory on the way
from ``/`` to the file must be owned by us or root (``manifest_wrong_owner``) and writable by
nobody else (``manifest_unsafe_permissions``): whoever can write a directory on the path can
swap what lies below it between review and confirm. Above the file's own directory, a
world-writable directory is accepted only if root owns it and it is sticky (``/tmp``): there
nobody can rename or remove an entry they do not own. The file is opened with
``O_NOFOLLOW`` (a link swapped in at the last moment fails the open) and ``O_NONBLOCK`` (a FIFO
cannot hang us), and everything else is judged on the open descriptor: a regular file, owned by
us or root, not writable by group or others, in a directory others cannot write, at most the
size bound. The digest is of the bytes read from that descriptor. Afterwards the descriptor and
the path must still name the same unchanged file, or the read is refused as
``manifest_changed``. Nothing here touches the network.
"""

from __future__ import annotations

import errno
import hashlib
import os
import stat
from dataclasses import dataclass
from pathlib import PurePosixPath

from ito.core.errors import ItoError
from ito.core.manifest import MANIFEST_MAX_BYTES

__all__ = ["SecureRead", "read_manifest_securely"]

DEFAULT_MAX_BYTES = MANIFEST_MAX_BYTES
"""The server's bound: a manifest it would refuse as too large is refused before any call."""
_OPEN_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK


@dataclass(frozen=True)
class SecureRead:
    path: str
    raw: bytes
    digest: str


def read_manifest_securely(path: str, max_bytes: int = DEFAULT_MAX_BYTES) -> SecureRead:
    if not path or not os.path.isabs(path):
        raise ItoError("manifest_path_not_absolute")
    _refuse_symlink_components(path)
    _check_directories(path)
    try:
        fd = os.open(path, _OPEN_FLAGS)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise ItoError("manifest_symlink") from None
        if exc.errno == errno.ENOENT:
            raise ItoError("manifest_not_found", "no file at the manifest path") from None
        if exc.errno in (errno.EACCES, errno.EPERM):
            raise ItoError("manifest_wrong_owner", "the manifest cannot be read") from None
        raise ItoError("manifest_not_regular_file", "the manifest cannot be opened") from None
    try:
        before = os.fstat(fd)
        _check_descriptor(before, path, max_bytes)
        raw = _read_all(fd, max_bytes + 1)
        if len(raw) > max_bytes:
            raise ItoError("manifest_too_large", max_bytes=max_bytes)
        digest = "sha256:" + hashlib.sha256(raw).hexdigest()
        after = os.fstat(fd)
    finally:
        os.close(fd)
    try:
        on_path = os.lstat(path)
    except OSError:
        raise ItoError("manifest_changed", "the manifest path changed during the read") from None
    if not (_same(before, after) and _same(before, on_path)) or len(raw) != before.st_size:
        raise ItoError("manifest_changed")
    return SecureRead(path=path, raw=raw, digest=digest)


def _refuse_symlink_components(path: str) -> None:
    current = PurePosixPath("/")
    for part in PurePosixPath(path).parts[1:]:
        current = current / part
        try:
            mode = os.lstat(current).st_mode
        except FileNotFoundError:
            raise ItoError("manifest_not_found", "no file at the manifest path") from None
        except OSError:
            raise ItoError(
                "manifest_not_regular_file", "the manifest path cannot be inspected"
            ) from None
        if stat.S_ISLNK(mode):
            raise ItoError("manifest_symlink")


def _check_directories(path: str) -> None:
    """Owner and write bits of every directory from ``/`` down to the file's own."""
    me = os.getuid()
    parent = PurePosixPath(path).parent
    chain = [*reversed(parent.parents), parent]
    for directory in chain:
        try:
            st = os.lstat(directory)
        except OSError:
            raise ItoError(
                "manifest_not_regular_file", "the manifest path cannot be inspected"
            ) from None
        if st.st_uid not in (me, 0):
            raise ItoError(
                "manifest_wrong_owner", "a directory on the manifest path is owned by another user"
            )
        if not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            continue
        shared_tmp = st.st_uid == 0 and st.st_mode & stat.S_ISVTX
        if directory == parent or not shared_tmp:
            raise ItoError(
                "manifest_unsafe_permissions",
                "a directory on the manifest path is writable by group or others",
            )


def _check_descriptor(st: os.stat_result, path: str, max_bytes: int) -> None:
    if not stat.S_ISREG(st.st_mode):
        raise ItoError("manifest_not_regular_file")
    if st.st_uid not in (os.getuid(), 0):
        raise ItoError("manifest_wrong_owner")
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise ItoError("manifest_unsafe_permissions", "the manifest is writable by group or others")
    if st.st_size > max_bytes:
        raise ItoError("manifest_too_large", max_bytes=max_bytes)


def _read_all(fd: int, limit: int) -> bytes:
    chunks: list[bytes] = []
    total = 0
    while total < limit:
        chunk = os.read(fd, min(65536, limit - total))
        if not chunk:
            break
        chunks.append(chunk)
        total += len(chunk)
    return b"".join(chunks)


def _same(a: os.stat_result, b: os.stat_result) -> bool:
    return (a.st_dev, a.st_ino, a.st_size, a.st_mtime_ns) == (
        b.st_dev,
        b.st_ino,
        b.st_size,
        b.st_mtime_ns,
    )
