"""Parsed manifests, cached by digest, per server process.

A manifest is content-addressed: its digest is the sha256 of the exact bytes, and
:func:`ito.core.manifest.parse_manifest` of the same bytes always gives the same (frozen) model.
So a parse can be reused by anyone presenting the same digest, whatever the account or the
process: the cache holds no authority (callers still check that the account has the manifest)
and is never invalidated, only bounded. Each server process keeps its own; with several
processes (``ito-server serve --workers N``) each parses a manifest once. Only successful parses
are kept: refused bytes are parsed again each time, with the same error.

One parse at a time per process: a parse is pure CPU under the GIL, so several at once finish no
sooner, and each extra one competing for the GIL makes every other request of the process wait
longer for it (twelve maximal manifests planned at once held another tenant's read for 1.5 s
when they all ran together). Waiting parses queue on a lock, which costs nothing; the one that
enters looks in the cache again, so the same bytes sent twice at once are parsed once.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

from ito.core.manifest import Manifest, manifest_digest, parse_manifest

__all__ = ["MAX_ENTRIES", "cached_manifest", "parsed_manifest"]

MAX_ENTRIES = 256
"""Manifests kept at most (256 KiB bytes each at worst, far less once parsed); the least
recently used goes first."""

_lock = threading.Lock()
_parsing = threading.Lock()
"""Held for the duration of one parse (see the module docstring)."""
_entries: OrderedDict[str, Manifest] = OrderedDict()


def parsed_manifest(raw: bytes, digest: str | None = None) -> Manifest:
    """``parse_manifest(raw)``, from the cache when these bytes were parsed before. ``digest``,
    when given, must be the digest of ``raw`` (a stored row's, computed when it was stored)."""
    key = digest or manifest_digest(raw)
    cached = _cached(key)
    if cached is not None:
        return cached
    with _parsing:
        cached = _cached(key)
        if cached is not None:
            return cached
        manifest = parse_manifest(raw)
    with _lock:
        _entries[key] = manifest
        _entries.move_to_end(key)
        while len(_entries) > MAX_ENTRIES:
            _entries.popitem(last=False)
    return manifest


def _cached(key: str) -> Manifest | None:
    with _lock:
        cached = _entries.get(key)
        if cached is not None:
            _entries.move_to_end(key)
        return cached


def cached_manifest(digest: str) -> Manifest | None:
    """The parsed manifest of ``digest`` if this process has parsed it, else ``None``."""
    with _lock:
        return _entries.get(digest)
