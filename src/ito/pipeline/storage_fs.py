"""Directories proven inside a booking's storage on disk, for everything that creates, writes,
prunes or deletes there (DESIGN §5.8 gate 5, §7.3).

``ito.core.storage`` decides containment on the URI; what a path names on disk is another
matter: a symbolic link anywhere below the booking's root (``…/storage-A/runs → /elsewhere``)
would send a run's checkpoints, its keep-last pruning and its cleanup ``rmtree`` outside the
booking. So no code here resolves a path below the root by name. Each use walks from the root
down, one component at a time, with ``openat(…, O_NOFOLLOW | O_DIRECTORY)`` relative to the
directory opened before it, and acts through the descriptor it ends on.

What is guaranteed, per use (a save, a commit, a prune, a cleanup — the walk is redone each
time, never cached):

- The root itself is not a symbolic link and every component below it is a real directory (a
  symbolic link — dangling or not — or any other file refuses with
  ``checkpoint_storage_invalid``). Components *above* the root are the operator's layout and
  are followed; the real location reported is the root's resolved path plus the proven
  components.
- What is created, written, renamed or deleted lies in the directory the walk ended on: files
  are opened relative to its descriptor with ``O_NOFOLLOW | O_EXCL``, and tools that insist on a
  path (``torch.distributed.checkpoint``, the tokenizer) get ``/proc/self/fd/N``, which the
  kernel resolves to that very directory, so swapping a component for a link after the walk
  redirects nothing.
- Deleting uses ``shutil.rmtree(name, dir_fd=parent)``, descriptor-based on Linux
  (``rmtree.avoids_symlink_attacks``): it refuses a symbolic-link top and unlinks links inside
  the tree instead of following them.
- Directories created here are ``0700``: no other user can plant a link inside them between a
  walk and the writes that follow it.

Not covered, and why: a process running as the worker's own user can plant a link inside a
``0700`` directory between our walk and a tool's ``open`` of a file in it (it could equally
write the target itself); a mount point inside the root is followed (only an administrator can
make one); a directory renamed out of the root *after* the walk keeps receiving the writes of
that one use (it can only be moved by someone who could already write to it, and the next use's
walk no longer finds it — the commit that follows a save re-walks and checks it is the same
directory).
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from ito.core.errors import ErrorCode, ItoError

__all__ = ["ProvenDir", "StoragePath", "open_proven", "proven_dir", "remove_tree", "tree_bytes"]

_CODE: ErrorCode = "checkpoint_storage_invalid"
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_DIR_MODE = 0o700
_PROC_FD = "/proc/self/fd"


def _refuse(reason: str, **details: object) -> ItoError:
    return ItoError(_CODE, f"checkpoint storage {reason}", reason=reason, **details)


@dataclass(frozen=True)
class StoragePath:
    """A directory named as a booking's storage root and the components below it."""

    root: Path
    """The booking's storage root (absolute; components above it are the operator's)."""
    parts: tuple[str, ...] = ()
    """Plain names below the root: no ``''``, ``.``, ``..``, ``/`` or NUL."""

    def __post_init__(self) -> None:
        if not self.root.is_absolute():
            raise _refuse("root is not an absolute path")
        for name in self.parts:
            if name in ("", ".", "..") or "/" in name or "\0" in name:
                raise _refuse("has a path component that is not a plain name")

    def child(self, *names: str) -> StoragePath:
        return StoragePath(self.root, (*self.parts, *names))

    @property
    def path(self) -> Path:
        """The path as named (for messages and tests; never used to reach the disk here)."""
        return self.root.joinpath(*self.parts)


class ProvenDir:
    """An open directory reached from the root without following a link; close it (or use
    :func:`proven_dir`) when done."""

    def __init__(self, fd: int, real: Path) -> None:
        self.fd = fd
        self.real = real
        """Where it is: the root's resolved path and the proven components."""

    @property
    def handle(self) -> Path:
        """A path naming exactly this directory for tools that only take paths: the kernel
        resolves ``/proc/self/fd/N`` to the open directory, whatever its name now points at.
        (Without ``/proc`` only the real path, as proven a moment ago, is left.)"""
        if os.path.isdir(_PROC_FD):
            return Path(_PROC_FD, str(self.fd))
        return self.real

    def identity(self) -> tuple[int, int]:
        st = os.fstat(self.fd)
        return st.st_dev, st.st_ino

    def subdir(self, name: str, *, create: bool = False, new: bool = False) -> ProvenDir:
        """A child directory, opened without following a link (created ``0700`` if asked;
        with ``new``, created here and now: an entry already there refuses)."""
        if new:
            try:
                os.mkdir(name, _DIR_MODE, dir_fd=self.fd)
            except FileExistsError:
                raise _refuse("already holds an entry where a new directory goes") from None
        return ProvenDir(_open_child(self.fd, name, create=create), self.real / name)

    def write_new(self, name: str, data: bytes) -> None:
        """Create ``name`` here (it must not exist, not even as a link) and write ``data``."""
        fd = os.open(
            name,
            os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
            0o600,
            dir_fd=self.fd,
        )
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())

    def read(self, name: str) -> bytes:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=self.fd)
        with os.fdopen(fd, "rb") as handle:
            return handle.read()

    def open_regular(self, name: str) -> int:
        """``name`` here opened for reading (the caller closes it): a regular file reached
        without a link, and never waited on — ``O_NONBLOCK``, so a FIFO planted in its place
        answers at once instead of holding the reader until someone writes to it.
        ``FileNotFoundError`` when it is missing, another ``OSError`` for a link, a FIFO, a
        device or a directory."""
        fd = os.open(
            name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=self.fd
        )
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise OSError(errno.EINVAL, "not a regular file", name)
        return fd

    def read_bounded(self, name: str, limit: int) -> bytes:
        """The bytes of the regular file ``name`` here (:meth:`open_regular`), at most
        ``limit`` of them: a larger one raises ``OSError`` (``EFBIG``) without being read."""
        with os.fdopen(self.open_regular(name), "rb") as handle:
            data = handle.read(limit + 1)
        if len(data) > limit:
            raise OSError(errno.EFBIG, f"larger than {limit} bytes", name)
        return data

    def replace(self, src: str, dst: str) -> None:
        os.replace(src, dst, src_dir_fd=self.fd, dst_dir_fd=self.fd)

    def unlink(self, name: str, *, missing_ok: bool = False) -> None:
        try:
            os.unlink(name, dir_fd=self.fd)
        except FileNotFoundError:
            if not missing_ok:
                raise

    def entries(self) -> list[str]:
        """Names of everything here."""
        return sorted(os.listdir(self.fd))

    def subdirs(self) -> list[str]:
        """Names of the real directories here (links and other files skipped)."""
        with os.scandir(self.fd) as entries:
            return sorted(e.name for e in entries if e.is_dir(follow_symlinks=False))

    def remove(self, name: str) -> int:
        """Delete the tree ``name`` here without following any link; the bytes it held."""
        try:
            st = os.lstat(name, dir_fd=self.fd)
        except FileNotFoundError:
            return 0
        if not stat.S_ISDIR(st.st_mode):
            raise _refuse("holds a link or file where a directory was expected")
        with self.subdir(name) as child:
            freed = tree_bytes(child)
        shutil.rmtree(name, dir_fd=self.fd)
        return freed

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> ProvenDir:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _open_child(parent: int, name: str, *, create: bool) -> int:
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=parent)
    except FileNotFoundError:
        if not create:
            raise
    except OSError as exc:
        raise _why(parent, name, exc) from None
    # Another rank may have made it a moment ago, or a link sits there: the open decides.
    with contextlib.suppress(FileExistsError):
        os.mkdir(name, _DIR_MODE, dir_fd=parent)
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=parent)
    except OSError as exc:
        raise _why(parent, name, exc) from None


def _why(parent: int, name: str, exc: OSError) -> ItoError:
    if exc.errno in (errno.ELOOP, errno.ENOTDIR, errno.EMLINK):
        try:
            link = stat.S_ISLNK(os.lstat(name, dir_fd=parent).st_mode)
        except OSError:
            link = False
        return _refuse(
            "contains a symbolic link"
            if link
            else "contains a non-directory where a directory was expected"
        )
    return _refuse("cannot be opened", errno=exc.errno)


def _open_root(root: Path, *, create: bool) -> ProvenDir:
    if create and not os.path.lexists(root):
        # The booking's root and whatever is missing above it: the operator's layout.
        os.makedirs(root, mode=_DIR_MODE, exist_ok=True)
    try:
        fd = os.open(root, _DIR_FLAGS)
    except FileNotFoundError:
        raise
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR) and os.path.islink(root):
            raise _refuse("root is a symbolic link") from None
        raise _refuse("root is not an accessible directory", errno=exc.errno) from None
    try:
        real = Path(os.path.realpath(root))
        st = os.stat(real)
        if not os.path.samestat(st, os.fstat(fd)):
            raise _refuse("root changed while it was opened")
    except BaseException:
        os.close(fd)
        raise
    return ProvenDir(fd, real)


def open_proven(where: StoragePath, *, create: bool = False) -> ProvenDir:
    """Walk from the root to ``where`` without following a link; the caller closes it.

    Raises ``checkpoint_storage_invalid`` for a link or non-directory on the way (the root
    included), ``FileNotFoundError`` for a missing one when ``create`` is false (with
    ``create``, what is missing is made, ``0700``).
    """
    current = _open_root(where.root, create=create)
    try:
        for name in where.parts:
            nxt = current.subdir(name, create=create)
            current.close()
            current = nxt
    except BaseException:
        current.close()
        raise
    return current


@contextmanager
def proven_dir(where: StoragePath, *, create: bool = False) -> Iterator[ProvenDir]:
    """:func:`open_proven` as a context manager."""
    opened = open_proven(where, create=create)
    try:
        yield opened
    finally:
        opened.close()


def remove_tree(where: StoragePath) -> tuple[int, Path] | None:
    """Delete ``where`` (never the root itself) through a freshly proven parent: the bytes it
    held and its real path, or ``None`` when it was not there."""
    if not where.parts:
        raise _refuse("root is never deleted")
    try:
        with proven_dir(StoragePath(where.root, where.parts[:-1])) as parent:
            name = where.parts[-1]
            try:
                os.lstat(name, dir_fd=parent.fd)
            except FileNotFoundError:
                return None
            return parent.remove(name), parent.real / name
    except FileNotFoundError:
        return None


def tree_bytes(top: ProvenDir) -> int:
    """Bytes of the regular files under an open directory; links are counted as themselves,
    never followed."""
    total = 0
    for _, _, files, dir_fd in os.fwalk(".", dir_fd=top.fd, follow_symlinks=False):
        for name in files:
            try:
                st = os.lstat(name, dir_fd=dir_fd)
            except FileNotFoundError:
                continue
            if stat.S_ISREG(st.st_mode):
                total += st.st_size
    return total
