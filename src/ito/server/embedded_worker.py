"""The embedded default's in-process worker (DESIGN §2): ``ito-server serve`` runs, for every
completed booking that has work, the same :class:`~ito.worker.loop.WorkerLoop` an
``ito-worker`` would run, against its own API over loopback.

Each loop authenticates like any worker: with a booking-bound worker key minted at first need.
The key lives only in this process's memory (its hash in the store, like every key) and is
revoked when the server stops.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path

from sqlalchemy import or_, select

from ito.core.states import RunState
from ito.server.services.audit import Actor, audited
from ito.server.services.credentials import create_key, revoke_key
from ito.server.store.db import Database
from ito.server.store.tables import Booking, Run

__all__ = ["EmbeddedWorkers"]

log = logging.getLogger("ito.server.worker")


class EmbeddedWorkers:
    def __init__(
        self, db: Database, pepper: str, api_url: str, home: Path, *, poll_seconds: float = 1.0
    ) -> None:
        self.db = db
        self.pepper = pepper
        self.api_url = api_url
        self.home = home
        self.poll_seconds = poll_seconds
        self.stop_event = threading.Event()
        self.loops: dict[str, threading.Thread] = {}
        self.keys: dict[str, str] = {}
        self.scanner: threading.Thread | None = None

    def start(self) -> None:
        self.scanner = threading.Thread(
            target=self._scan_forever, name="ito-embedded-workers", daemon=True
        )
        self.scanner.start()

    def stop(self) -> None:
        self.stop_event.set()
        for thread in [*self.loops.values(), *([self.scanner] if self.scanner else [])]:
            thread.join(timeout=60)
        with self.db.write() as session:
            for key_id in self.keys.values():
                revoke_key(session, key_id)

    def _scan_forever(self) -> None:
        while not self.stop_event.is_set():
            try:
                for booking_id in self._bookings_with_work():
                    if booking_id not in self.loops or not self.loops[booking_id].is_alive():
                        self._start_loop(booking_id)
            except Exception:
                log.exception("embedded worker scan failed")
            self.stop_event.wait(self.poll_seconds)

    def _bookings_with_work(self) -> list[str]:
        with self.db.read() as session:
            rows = session.scalars(
                select(Run.booking_id)
                .join(Booking, Booking.id == Run.booking_id)
                .where(
                    or_(
                        Run.state.in_(
                            [
                                RunState.queued.value,
                                RunState.recovering.value,
                                RunState.running.value,
                                RunState.cancelling.value,
                            ]
                        ),
                        Run.cleanup_state == "cleaning",
                    )
                )
                .distinct()
            )
            return list(rows)

    def _start_loop(self, booking_id: str) -> None:
        from ito.worker.api import WorkerApi
        from ito.worker.executors import LocalExecutor
        from ito.worker.loop import WorkerLoop

        # Every key minted is in the desk's audit trail, these too: who (the server itself),
        # for which account and booking, and which key it revoked first.
        with audited(
            self.db,
            Actor("server:embedded-worker"),
            "key.create",
            target_kind="key",
            details={"role": "worker", "name": "embedded worker", "booking_id": booking_id},
        ) as (session, note):
            booking = session.get(Booking, booking_id)
            assert booking is not None
            note.account_id = booking.account_id
            previous = self.keys.get(booking_id)
            if previous is not None:
                # A loop that ended (its key revoked, say) leaves no usable key behind.
                revoke_key(session, previous)
                note.details["revoked_key_id"] = previous
            minted = create_key(
                session,
                self.pepper,
                account_id=booking.account_id,
                role="worker",
                booking_id=booking_id,
                name="embedded worker",
            )
            note.target_id = minted.key_id
        self.keys[booking_id] = minted.key_id
        api = WorkerApi(self.api_url, minted.api_key)
        loop = WorkerLoop(
            api,
            self.home / booking_id,
            LocalExecutor,
            poll_seconds=self.poll_seconds,
            stop=self.stop_event,
        )
        thread = threading.Thread(
            target=loop.run_forever, name=f"ito-worker-{booking_id}", daemon=True
        )
        self.loops[booking_id] = thread
        thread.start()
        log.info("embedded worker started for booking %s (key %s)", booking_id, minted.prefix)
