"""``torch.distributed.checkpoint``'s files, written and read without trusting the disk.

A checkpoint lives in the booking's storage, which the tenant can write. Three things follow:

- **Writes create, never reuse.** DCP's own file system opens with ``Path.open("wb")``, which
  follows a link planted where a shard will go and truncates whatever it points at. Here every
  file is created ``O_CREAT | O_EXCL | O_NOFOLLOW`` (:class:`ExclusiveFileSystem`): an entry
  already there — a link, a hard link, a file — refuses the save.
- **Every file is named in the commit.** :func:`file_manifest` lists every file of a step
  directory with its size and sha256 once the save is done; the commit document carries the
  list, so the checkpoint's digest (:func:`ito.core.revisions.checkpoint_digest`, over
  ``.metadata`` and ``COMMIT``) covers every byte of it.
- **Nothing is parsed before it is verified.** :func:`stage_verified` copies a checkpoint's
  files out of the storage into a directory only the engine writes, hashing each as it is read
  (one open, one read), and refuses unless the commit's digest is the one the server recorded
  and every file matches the commit's list. DCP then loads the private copy, so what was
  verified is what is trained. Its ``.metadata`` is a pickle: :class:`VerifiedReader` reads it
  with an unpickler that admits only DCP's metadata classes (defence in depth — a verified
  file was written by the engine itself).
"""

from __future__ import annotations

import errno
import hashlib
import io
import json
import os
import pickle
import shutil
import stat
import time
from collections.abc import Generator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, cast

import torch
from torch.distributed.checkpoint.filesystem import (
    FileSystem,
    FileSystemReader,
    FileSystemWriter,
)
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta

from ito.core.errors import ErrorCode, ItoError
from ito.core.revisions import checkpoint_digest
from ito.pipeline.storage_fs import ProvenDir

__all__ = [
    "COMMIT",
    "METADATA",
    "ExclusiveFileSystem",
    "VerifiedReader",
    "checkpoint_writer",
    "file_manifest",
    "load_metadata",
    "remove_staged",
    "stage_verified",
    "staging_path",
]

COMMIT = "COMMIT"
METADATA = ".metadata"
"""DCP's metadata file (the shards' layout), written once every rank's bytes are on disk."""

MAX_COMMIT_BYTES = 16 << 20
MAX_METADATA_BYTES = 256 << 20
_CHUNK = 1 << 20
_CODE: ErrorCode = "checkpoint_storage_invalid"

_METADATA_CLASSES = {
    ("torch.distributed.checkpoint.metadata", name)
    for name in (
        "Metadata",
        "StorageMeta",
        "MetadataIndex",
        "TensorProperties",
        "TensorStorageMetadata",
        "BytesStorageMetadata",
        "ChunkStorageMetadata",
        "_MEM_FORMAT_ENCODING",
    )
} | {
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("torch", "Size"),
    ("torch.serialization", "_get_layout"),
    ("pathlib", "PosixPath"),
    ("collections", "OrderedDict"),
}
"""Every global a DCP ``.metadata`` written by this engine names (read from real ones), besides
the dtypes; nothing else is ever constructed from one."""


def _refuse(reason: str, message: str, **details: object) -> ItoError:
    return ItoError(_CODE, message, reason=reason, **details)


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _METADATA_CLASSES:
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        # The global is not echoed: it is the tenant's text.
        raise _refuse("metadata_refused", "the checkpoint's metadata names a class it may not")


def load_metadata(data: bytes) -> Metadata:
    """DCP's metadata from ``data``, admitting only its own classes (``checkpoint_storage_invalid``
    for anything else, or for bytes that are not a metadata pickle)."""
    try:
        metadata = _MetadataUnpickler(io.BytesIO(data)).load()
    except ItoError:
        raise
    except Exception:
        raise _refuse("metadata_unreadable", "the checkpoint's metadata is unreadable") from None
    if not isinstance(metadata, Metadata):
        raise _refuse("metadata_unreadable", "the checkpoint's metadata is unreadable")
    return metadata


class ExclusiveFileSystem(FileSystem):
    """DCP's file system with every file created exclusively and none opened through a link."""

    @contextmanager
    def create_stream(self, path: str | os.PathLike[str], mode: str) -> Generator[io.IOBase]:
        flags = os.O_NOFOLLOW | os.O_CLOEXEC
        if "w" in mode or "a" in mode or "+" in mode:
            flags |= os.O_WRONLY | os.O_CREAT | os.O_EXCL
        else:
            flags |= os.O_RDONLY
        try:
            fd = os.open(path, flags, 0o600)
        except FileExistsError:
            raise _refuse(
                "entry_exists", "checkpoint storage already holds a file the save would write"
            ) from None
        except OSError as exc:
            if exc.errno == errno.ELOOP:  # a link where a file was expected
                raise _refuse(
                    "contains a symbolic link", "checkpoint storage contains a link"
                ) from None
            raise
        with os.fdopen(fd, mode) as stream:
            yield cast(io.IOBase, stream)


def checkpoint_writer(path: Path) -> FileSystemWriter:
    """DCP's writer into the (fresh) directory ``path``, creating every file exclusively."""
    writer = FileSystemWriter(str(path), overwrite=False)
    writer.fs = ExclusiveFileSystem()
    return writer


class VerifiedReader(FileSystemReader):
    """DCP's reader for a directory :func:`stage_verified` filled: no link followed, and its
    metadata unpickled by :func:`load_metadata`."""

    def __init__(self, path: Path) -> None:
        super().__init__(str(path))
        self.fs = ExclusiveFileSystem()

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        if kwargs.get("rank") is not None:
            raise _refuse("metadata_refused", "per-rank checkpoint metadata is not read")
        with self.fs.create_stream(self._get_metadata_path(), "rb") as stream:
            data = stream.read(MAX_METADATA_BYTES + 1)
        if len(data) > MAX_METADATA_BYTES:
            raise _refuse("metadata_unreadable", "the checkpoint's metadata is too large")
        metadata = load_metadata(data)
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        assert metadata.storage_meta is not None
        metadata.storage_meta.load_id = self.load_id
        return metadata


def _open_regular(directory: ProvenDir, name: str) -> int:
    """``name`` in ``directory`` opened for reading (:meth:`ProvenDir.open_regular`)."""
    try:
        return directory.open_regular(name)
    except FileNotFoundError:
        raise _refuse("file_missing", "a file the checkpoint lists is missing") from None
    except OSError:
        raise _refuse(
            "file_unreadable", "a file the checkpoint lists is not a regular file"
        ) from None


def file_manifest(directory: ProvenDir) -> dict[str, dict[str, Any]]:
    """Every file of a step directory the engine has just written (``COMMIT`` and its temporary
    aside), with its size and sha256. Anything but a regular file with one link refuses."""
    files: dict[str, dict[str, Any]] = {}
    for name in directory.entries():
        if name in (COMMIT, f".{COMMIT}.tmp"):
            continue
        st = os.lstat(name, dir_fd=directory.fd)
        if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
            raise _refuse(
                "foreign_entry", "checkpoint storage holds an entry the save did not create"
            )
        fd = _open_regular(directory, name)
        h = hashlib.sha256()
        size = 0
        with os.fdopen(fd, "rb") as handle:
            while chunk := handle.read(_CHUNK):
                h.update(chunk)
                size += len(chunk)
        files[name] = {"bytes": size, "sha256": h.hexdigest()}
    if METADATA not in files:
        raise _refuse("metadata_missing", "the checkpoint has no metadata")
    return files


def read_commit(directory: ProvenDir) -> bytes:
    """The ``COMMIT`` document's bytes (bounded; a regular file reached without a link)."""
    try:
        return directory.read_bounded(COMMIT, MAX_COMMIT_BYTES)
    except FileNotFoundError:
        raise _refuse("file_missing", "the checkpoint has no COMMIT") from None
    except OSError:
        raise _refuse("commit_unreadable", "the checkpoint's COMMIT is unreadable") from None


def commit_digest(directory: ProvenDir) -> str | None:
    """The digest a committed step directory claims (its ``.metadata`` and ``COMMIT`` hashed,
    nothing parsed), or ``None`` where either is missing or unreadable."""
    try:
        commit = read_commit(directory)
        fd = _open_regular(directory, METADATA)
    except ItoError:
        return None
    with os.fdopen(fd, "rb") as handle:
        metadata = handle.read(MAX_METADATA_BYTES + 1)
    if len(metadata) > MAX_METADATA_BYTES:
        return None
    return checkpoint_digest(metadata, commit)


def _listed(info: object) -> dict[str, tuple[int, str]]:
    files = info.get("files") if isinstance(info, dict) else None
    if not isinstance(files, dict) or METADATA not in files:
        raise _refuse(
            "checkpoint_unverifiable",
            "the checkpoint lists no files to verify (written before checkpoints carried one)",
        )
    listed: dict[str, tuple[int, str]] = {}
    for name, entry in files.items():
        ok = (
            isinstance(name, str)
            and name not in ("", ".", "..", COMMIT)
            and "/" not in name
            and "\0" not in name
            and isinstance(entry, dict)
            and isinstance(entry.get("bytes"), int)
            and isinstance(entry.get("sha256"), str)
        )
        if not ok:
            raise _refuse("commit_unreadable", "the checkpoint's file list is malformed")
        listed[name] = (int(entry["bytes"]), str(entry["sha256"]))
    return listed


def stage_verified(source: ProvenDir, digest: str, dest: Path) -> dict[str, Any]:
    """Copy the committed checkpoint in ``source`` into the new directory ``dest`` (which must
    not exist; the engine's own, outside the booking's storage), verifying as it reads: the
    ``COMMIT`` and ``.metadata`` must have ``digest`` (the one the server recorded) and every
    file the ``COMMIT`` lists its size and sha256. Returns the ``COMMIT`` document; refuses
    with ``checkpoint_storage_invalid`` and removes ``dest`` on any mismatch."""
    commit = read_commit(source)
    try:
        info = json.loads(commit)
    except ValueError:
        raise _refuse("commit_unreadable", "the checkpoint's COMMIT is not JSON") from None
    listed = _listed(info)
    os.mkdir(dest, 0o700)
    try:
        for name, (size, sha256) in sorted(listed.items()):
            fd = _open_regular(source, name)
            h = hashlib.sha256()
            copied = 0
            out_fd = os.open(
                dest / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600
            )
            with os.fdopen(fd, "rb") as src, os.fdopen(out_fd, "wb") as out:
                while copied <= size and (chunk := src.read(_CHUNK)):
                    h.update(chunk)
                    copied += len(chunk)
                    out.write(chunk)
            if copied != size or h.hexdigest() != sha256:
                raise _refuse(
                    "checkpoint_tampered",
                    "a checkpoint file differs from what its commit recorded",
                    file=name,
                )
        metadata = (dest / METADATA).read_bytes()
        if checkpoint_digest(metadata, commit) != digest:
            raise _refuse(
                "digest_mismatch", "the checkpoint's digest is not the one the server recorded"
            )
    except BaseException:
        remove_staged(dest)
        raise
    return cast(dict[str, Any], info)


def staging_path(workdir: Path, label: str) -> Path:
    """A new (not yet existing) path for :func:`stage_verified` under the engine's own
    ``workdir`` — never the booking's storage."""
    staging = workdir / "verified"
    staging.mkdir(mode=0o700, parents=True, exist_ok=True)
    return staging / f"{label}-{os.getpid()}-{time.monotonic_ns()}"


def remove_staged(path: Path) -> None:
    """Delete a directory :func:`stage_verified` filled."""
    shutil.rmtree(path, ignore_errors=True)
