"""Per-process hints for the lock-free part of a run creation: never authority.

A create prepares gate 5 (resource checks, estimate) before its write transaction, from the
booking as last seen and a manifest known to the account. Reading those from the database for
every create would cost a transaction of its own; this process remembers them instead:

* the last seen view of each booking — possibly stale: the write transaction reads the booking
  afresh, re-checks its eligibility and evaluates gate 5 again whenever the view differs;
* which (account, digest) manifests exist — safe to remember: manifests are immutable and never
  deleted.

Both are bounded (least recently used first out) and per process; with several server processes
each keeps its own. Forgetting an entry only costs one read.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

from ito.core.gates import BookingView

__all__ = ["MAX_ENTRIES", "booking_hint", "manifest_known", "remember_booking", "remember_manifest"]

MAX_ENTRIES = 4096

_lock = threading.Lock()
_bookings: OrderedDict[tuple[str, str], Any] = OrderedDict()
_manifests: OrderedDict[tuple[str, str], Any] = OrderedDict()


def _put(entries: OrderedDict[tuple[str, str], Any], key: tuple[str, str], value: Any) -> None:
    with _lock:
        entries[key] = value
        entries.move_to_end(key)
        while len(entries) > MAX_ENTRIES:
            entries.popitem(last=False)


def booking_hint(account_id: str, booking_id: str) -> BookingView | None:
    with _lock:
        view: BookingView | None = _bookings.get((account_id, booking_id))
    return view


def remember_booking(view: BookingView) -> None:
    _put(_bookings, (view.account_id, view.id), view)


def manifest_known(account_id: str, digest: str) -> bool:
    with _lock:
        return (account_id, digest) in _manifests


def remember_manifest(account_id: str, digest: str) -> None:
    _put(_manifests, (account_id, digest), None)
