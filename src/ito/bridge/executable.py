"""Finding the canonical client: only through ``ECC_ITO_CLI_EXECUTABLE``, never through PATH.

ECC's ``resolveItoExecutable``/``assertUsableExecutable``, adapted to a Python client:

* unset or blank → ``client_not_configured``; relative → ``client_executable_invalid`` (no
  search, no guess);
* the path is resolved (``realpath``); **a symlink is allowed** — as in ECC, which resolves
  the link and checks and runs the file it points to. Every check below applies to that
  resolved file, and the resolved path is what gets spawned, so swapping the link afterwards
  changes nothing;
* the resolved file must be a regular file with an execute bit that this user may execute,
  and writable by nobody but its owner (no group/other write bit);
* ECC refuses a "shim" whose interpreter would be found through PATH (``#!/usr/bin/env node``
  with a hostile ``node`` first on PATH). Here: a script's ``#!`` interpreter must be an
  absolute path, not an ``env`` indirection, and pass the same checks as the client.
  (ECC additionally pins the file name ``dist/bin/ito.js`` of its Node package; a Python
  console script has no fixed install path — venv, pipx, ``~/.local/bin`` — so the name is not
  pinned; ownership of the decision is the explicit absolute path plus these checks.)
"""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping

from ito.core.errors import ItoError

__all__ = ["EXECUTABLE_OVERRIDE", "resolve_client"]

EXECUTABLE_OVERRIDE = "ECC_ITO_CLI_EXECUTABLE"
_SHEBANG_BYTES = 256


def resolve_client(environ: Mapping[str, str]) -> str:
    """The resolved absolute path of the canonical client, or a refusal."""
    configured = (environ.get(EXECUTABLE_OVERRIDE) or "").strip()
    if not configured:
        raise ItoError(
            "client_not_configured",
            f"{EXECUTABLE_OVERRIDE} is not set. ECC never resolves the credential-bearing 'ito' "
            "client from PATH: set it to the explicit absolute path of the installed "
            "canonical client (for example <venv>/bin/ito).",
        )
    if not os.path.isabs(configured):
        raise ItoError(
            "client_executable_invalid",
            f"{EXECUTABLE_OVERRIDE} must be an absolute path explicitly configured by the operator",
        )
    resolved = _usable(configured, "the canonical client")
    interpreter = _interpreter(resolved)
    if interpreter is not None:
        _usable(interpreter, "the client's interpreter")
    return resolved


def _usable(candidate: str, what: str) -> str:
    try:
        resolved = os.path.realpath(candidate, strict=True)
        info = os.stat(resolved)
    except (OSError, RuntimeError):
        raise ItoError(
            "client_executable_invalid",
            f"{EXECUTABLE_OVERRIDE}: {what} does not resolve to an existing file",
        ) from None
    if not stat.S_ISREG(info.st_mode):
        raise ItoError(
            "client_executable_invalid", f"{EXECUTABLE_OVERRIDE}: {what} is not a regular file"
        )
    if not info.st_mode & 0o111 or not os.access(resolved, os.X_OK):
        raise ItoError(
            "client_executable_invalid", f"{EXECUTABLE_OVERRIDE}: {what} is not executable"
        )
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise ItoError(
            "client_executable_invalid",
            f"{EXECUTABLE_OVERRIDE}: {what} is writable by group or others",
        )
    return resolved


def _interpreter(path: str) -> str | None:
    """The ``#!`` interpreter of a script, None for a binary; refuses a PATH-resolved one."""
    try:
        with open(path, "rb") as handle:
            head = handle.read(_SHEBANG_BYTES)
    except OSError:
        raise ItoError(
            "client_executable_invalid",
            f"{EXECUTABLE_OVERRIDE}: the canonical client is not readable",
        ) from None
    if not head.startswith(b"#!"):
        return None
    words = head[2:].split(b"\n", 1)[0].split()
    interpreter = os.fsdecode(words[0]) if words else ""
    if not os.path.isabs(interpreter) or os.path.basename(interpreter) == "env":
        raise ItoError(
            "client_executable_invalid",
            f"{EXECUTABLE_OVERRIDE}: refusing a shim whose interpreter would be "
            "found through PATH; its #! line must name an absolute interpreter",
        )
    return interpreter
