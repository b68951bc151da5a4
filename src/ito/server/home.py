"""Private state at rest: what ``ito-server`` creates is readable by its user alone.

Every ``ito-server`` command sets the process umask to 077 before it opens anything, so each
file it or its libraries create (the SQLite database and its ``-wal``/``-shm``/``-journal``
siblings, the pepper file, anything later) is 0600 and each directory 0700 — whatever the
directory already held. State that already exists is fixed rather than refused, with one
warning on stderr per fix: ``$ITO_HOME`` open to group or others goes to 0700, an embedded
SQLite file or sibling open to them goes to 0600. (Refusing would leave an operator's existing
install unable to start for a permission it can safely repair itself.) Symbolic links are left
alone: they are not ours to change.
"""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

__all__ = ["private_umask", "secure_state"]

SQLITE_SIBLINGS = ("", "-wal", "-shm", "-journal")


def private_umask() -> None:
    os.umask(0o077)


def secure_state(home: Path, sqlite_path: Path | None) -> list[str]:
    """Fix the modes of ``home`` and of the SQLite file's family; returns what was fixed (each
    also warned about on stderr)."""
    fixed: list[str] = []
    if _tighten(home, 0o700, directory=True):
        fixed.append(str(home))
    if sqlite_path is not None:
        for suffix in SQLITE_SIBLINGS:
            path = sqlite_path.with_name(sqlite_path.name + suffix)
            if _tighten(path, 0o600, directory=False):
                fixed.append(str(path))
    for name in fixed:
        print(
            f"ito-server: warning: {name} was accessible to other users; its mode is now "
            f"{'0700' if name == str(home) else '0600'}",
            file=sys.stderr,
        )
    return fixed


def _tighten(path: Path, mode: int, *, directory: bool) -> bool:
    try:
        info = path.lstat()
    except FileNotFoundError:
        return False
    if stat.S_ISLNK(info.st_mode) or stat.S_ISDIR(info.st_mode) != directory:
        return False
    if info.st_uid != os.getuid() or not info.st_mode & 0o077:
        return False
    os.chmod(path, mode)
    return True
