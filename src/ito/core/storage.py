"""Containment of checkpoint storage inside a booking's storage (DESIGN §5.8 gate 5, §7.3).

A manifest may put its checkpoints at any URI *inside* the booking's storage root. The worker
later parses the stored URI with ``urllib.parse`` and percent-decodes its path, so a check on the
raw string is not enough: ``%2e%2e`` segments, a ``#`` that the worker drops, or a ``//`` that a
path library collapses would each let a manifest point the worker's writes, pruning and cleanup
(``rmtree``) outside the booking, or at another run's directory.

So every URI here is refused unless it has one plain shape: ``scheme://netloc/seg/seg…`` of
printable ASCII, no query, fragment, parameters, credentials or backslash, no percent-encoded
``/``, ``.``, ``\\`` or ``%``, no ``.``, ``..`` or empty segment (one trailing ``/`` is allowed
and dropped), and decoded segments without control characters. Containment is then decided on
the decoded segments, which are exactly what the worker's ``unquote`` produces, so the check and
the use cannot disagree. Every refusal is ``checkpoint_storage_invalid``; messages and details
never carry the URI (it might hold credentials).

``file://`` URIs name this host only (netloc empty or ``localhost``); any other scheme
(``s3://``, ``gs://`` …) needs the same netloc (bucket) as the root, and the rules apply to its
key. Pure: no I/O.

A booking's own storage URI is checked when the desk records the booking
(:func:`booking_storage_uri`): only ``file://`` (the one kind the worker writes), an absolute,
plain path that is neither the file system's root nor a system directory. Whether the path is
free of symbolic links can only be known on disk, where the worker proves it before every use
(``ito.pipeline.storage_fs``).
"""

from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass
from functools import lru_cache
from urllib.parse import unquote, urlsplit

from ito.core.errors import ErrorCode, ItoError

__all__ = [
    "booking_storage_uri",
    "checkpoint_local_parts",
    "checkpoint_local_path",
    "contained_storage_uri",
    "run_checkpoint_uri",
]

_CODE: ErrorCode = "checkpoint_storage_invalid"
_URI = re.compile(
    r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*)://(?P<netloc>[^/]*)(?P<path>/.*)?\Z", re.DOTALL
)
_MALFORMED_ESCAPE = re.compile(r"%(?![0-9A-Fa-f]{2})")
# '/', '.', '\' and '%' itself (a second decoding would turn %252e into '.').
_FORBIDDEN_ESCAPE = re.compile(r"%(?:2f|2e|5c|25)", re.IGNORECASE)
_RUN_ID = re.compile(r"run_[a-z2-7]{16,}", re.IGNORECASE)
"""A segment that may be a server-minted run id (``ito.server.ids.new_id``: ``run_`` and 24
lowercase base32 characters today); deliberately broader than the exact format."""
_LOCAL_NETLOCS = ("", "localhost")
_SYSTEM_TREES = frozenset(
    {
        "bin",
        "boot",
        "dev",
        "etc",
        "lib",
        "lib32",
        "lib64",
        "libx32",
        "proc",
        "root",
        "run",
        "sbin",
        "sys",
        "usr",
    }
)
"""Top-level directories of the operating system: storage is refused at them and anywhere
inside them (the worker would create, prune and delete there)."""
_SYSTEM_DIRS = frozenset(
    {
        ("home",),
        ("media",),
        ("mnt",),
        ("opt",),
        ("srv",),
        ("tmp",),
        ("var",),
        ("var", "cache"),
        ("var", "lib"),
        ("var", "log"),
        ("var", "spool"),
        ("var", "tmp"),
    }
)
"""Shared directories whose subdirectories make fine storage but which are not one booking's
storage themselves."""


@dataclass(frozen=True)
class _Uri:
    scheme: str
    netloc: str
    raw: tuple[str, ...]
    """Path segments as written (percent-encoding kept), trailing slash dropped."""
    decoded: tuple[str, ...]
    """The same segments percent-decoded: the names the worker will use."""

    def render(self, raw: tuple[str, ...]) -> str:
        # An empty path is the file system's root for file://, the bucket itself otherwise.
        empty = "/" if self.scheme == "file" else ""
        path = "/" + "/".join(raw) if raw else empty
        return f"{self.scheme}://{self.netloc}{path}"


def _refuse(what: str, reason: str) -> ItoError:
    return ItoError(_CODE, f"{what} {reason}", reason=reason)


@lru_cache(maxsize=1024)
def _parse(uri: str, what: str) -> _Uri:
    # Memoised: a create parses its booking's root and the run's URI several times; the answer
    # is immutable and a refusal is raised anew (exceptions are not cached).
    if not uri:
        raise _refuse(what, "is empty")
    if len(uri) > 2048:
        raise _refuse(what, "is too long")
    if any(not 0x21 <= ord(ch) <= 0x7E for ch in uri):
        raise _refuse(what, "contains a space, control or non-ASCII character")
    for ch, reason in (
        ("\\", "contains a backslash"),
        ("?", "has a query"),
        ("#", "has a fragment"),
        (";", "has parameters"),
    ):
        if ch in uri:
            raise _refuse(what, reason)
    if _MALFORMED_ESCAPE.search(uri):
        raise _refuse(what, "has a malformed percent-escape")
    if _FORBIDDEN_ESCAPE.search(uri):
        raise _refuse(what, "percent-encodes '/', '.', '\\' or '%'")
    match = _URI.match(uri)
    if match is None:
        raise _refuse(what, "is not an absolute scheme://… URI")
    scheme, netloc, path = match["scheme"].lower(), match["netloc"], match["path"] or ""
    if "@" in netloc:
        raise _refuse(what, "must not carry credentials")
    if scheme == "file":
        if netloc not in _LOCAL_NETLOCS:
            raise _refuse(what, "names another host (file:// takes no host but localhost)")
        if not path:
            raise _refuse(what, "has no absolute path")
    elif not netloc:
        raise _refuse(what, "has no bucket or host")
    # The worker parses with urllib; for the shapes admitted above it must read the same parts.
    try:
        split = urlsplit(uri)
    except ValueError:
        raise _refuse(what, "is not a well-formed URI") from None
    if (split.scheme, split.netloc, split.path, split.query, split.fragment) != (
        scheme,
        netloc,
        path,
        "",
        "",
    ):
        raise _refuse(what, "is not a well-formed URI")

    raw = path.split("/")[1:] if path else []
    if raw and raw[-1] == "":
        raw.pop()  # one trailing slash
    decoded = []
    for segment in raw:
        if segment == "":
            raise _refuse(what, "has an empty path segment ('//')")
        if segment in (".", ".."):
            raise _refuse(what, "has a '.' or '..' path segment")
        try:
            name = unquote(segment, errors="strict")
        except UnicodeDecodeError:
            raise _refuse(what, "percent-encodes bytes that are not UTF-8") from None
        if (
            name in (".", "..")
            or "/" in name
            or "\\" in name
            or any(ord(ch) < 0x20 or 0x7F <= ord(ch) <= 0x9F for ch in name)
        ):
            raise _refuse(
                what, "has a segment that decodes to a control character or a path separator"
            )
        decoded.append(name)
    joined = "/" + "/".join(decoded)
    if posixpath.normpath(joined) != joined:
        raise _refuse(what, "is not a normalised path")
    return _Uri(scheme, netloc, tuple(raw), tuple(decoded))


def _inside(uri: str, root: str) -> tuple[_Uri, _Uri]:
    base = _parse(root, "the booking's storage URI")
    target = _parse(uri, "checkpoint storage")
    if target.scheme != base.scheme:
        raise _refuse("checkpoint storage", "must use the booking's storage scheme")
    if base.scheme != "file" and target.netloc != base.netloc:
        raise _refuse("checkpoint storage", "must be in the booking's bucket")
    if target.decoded[: len(base.decoded)] != base.decoded:
        raise _refuse("checkpoint storage", "must be inside the booking's storage")
    return base, target


def contained_storage_uri(uri: str, root: str) -> str:
    """``uri`` normalised, when it is the booking storage ``root`` or inside it.

    The answer is written as the root is (its scheme, netloc and path) followed by the rest of
    ``uri``'s segments, without a trailing slash. Raises ``checkpoint_storage_invalid`` when
    either URI has a refused shape or ``uri`` lies outside ``root``.
    """
    base, target = _inside(uri, root)
    return base.render(base.raw + target.raw[len(base.raw) :])


def run_checkpoint_uri(storage: str, root: str, run_id: str) -> str:
    """Where a run's checkpoints go: ``root/runs/<run_id>`` for ``storage == "booking"``, else
    ``<storage>/<run_id>`` with ``storage`` inside ``root`` (the root itself allowed) and not
    inside another run's directory (no segment below the root shaped like a run id), normalised.
    """
    if storage == "booking":
        booking_root = _parse(root, "the booking's storage URI")
        raw = (*booking_root.raw, "runs")
    else:
        booking_root, target = _inside(storage, root)
        below = len(booking_root.decoded)
        if any(_RUN_ID.fullmatch(name) for name in target.decoded[below:]):
            raise _refuse("checkpoint storage", "must not be inside another run's directory")
        raw = booking_root.raw + target.raw[below:]
    return contained_storage_uri(booking_root.render((*raw, run_id)), root)


def checkpoint_local_path(checkpoint_uri: str, storage_root: str, run_id: str) -> str:
    """For the worker, before it creates, prunes or deletes anything: the absolute, decoded
    local path of a run's stored ``checkpoint_uri``, when it is a ``file://`` URI strictly inside
    the booking's ``storage_root`` whose last segment is ``run_id``.

    Raises ``checkpoint_storage_invalid`` otherwise (never returns the root itself, so a
    cleanup can never remove the whole booking storage). The string only: what the path names on
    disk is proven by ``ito.pipeline.storage_fs`` at each use.
    """
    root, parts = checkpoint_local_parts(checkpoint_uri, storage_root, run_id)
    return root.rstrip("/") + "/" + "/".join(parts)


def booking_storage_uri(uri: str) -> str:
    """``uri`` normalised, when it can be a booking's checkpoint storage root: a well-formed
    ``file://`` URI (this host) of an absolute path that is not ``/``, not inside an operating
    system tree (``/etc``, ``/usr``, ``/proc`` …) and not a shared top-level directory itself
    (``/tmp``, ``/home``, ``/var/lib`` …). Raises ``checkpoint_storage_invalid`` otherwise,
    including for other schemes (``s3://`` …), which no worker writes yet."""
    what = "the booking's storage URI"
    parsed = _parse(uri, what)
    if parsed.scheme != "file":
        raise _refuse(what, "must be a file:// URI (the only storage a worker writes)")
    if not parsed.decoded:
        raise _refuse(what, "must not be the file system's root")
    if parsed.decoded[0] in _SYSTEM_TREES or parsed.decoded in _SYSTEM_DIRS:
        raise _refuse(what, "must not be a system directory")
    return parsed.render(parsed.raw)


def checkpoint_local_parts(
    checkpoint_uri: str, storage_root: str, run_id: str
) -> tuple[str, tuple[str, ...]]:
    """:func:`checkpoint_local_path` split where the worker proves it on disk: the booking
    root's absolute, decoded local path and the decoded segments from it down to the run's
    directory (at least one, the last being ``run_id``)."""
    base, target = _inside(checkpoint_uri, storage_root)
    if target.scheme != "file":
        raise _refuse(
            "checkpoint storage", "is not file:// storage, the only kind this worker writes"
        )
    if len(target.decoded) <= len(base.decoded) or target.decoded[-1] != run_id:
        raise _refuse(
            "checkpoint storage", "is not this run's directory inside the booking's storage"
        )
    return "/" + "/".join(base.decoded), target.decoded[len(base.decoded) :]
