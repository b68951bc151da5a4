"""Background duties of the server process: the lease sweeper (an expired lease is a failure:
the run goes ``recovering`` and can be leased again, §7.1) and, on the embedded default, the
in-process worker."""

from __future__ import annotations

import logging
import threading
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import TYPE_CHECKING

from anyio import to_thread

from ito.server.services.leases import expire_leases
from ito.server.store.tables import utcnow

if TYPE_CHECKING:
    from fastapi import FastAPI

    from ito.server.embedded_worker import EmbeddedWorkers
    from ito.server.state import AppState

__all__ = ["BackgroundDuties", "LeaseSweeper", "lifespan_for"]

log = logging.getLogger("ito.server")


class LeaseSweeper:
    def __init__(self, state: AppState) -> None:
        self.state = state
        self.stop_event = threading.Event()
        self.thread = threading.Thread(target=self._run, name="ito-lease-sweeper", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.stop_event.set()
        self.thread.join(timeout=30)

    def _run(self) -> None:
        while not self.stop_event.wait(self.state.settings.lease_sweep_seconds):
            try:
                with self.state.db.write() as session:
                    expired = expire_leases(session, utcnow())
                if expired:
                    log.warning("%d run(s) lost their worker and are recovering", expired)
            except Exception:
                log.exception("lease sweep failed")


class BackgroundDuties:
    """The lease sweeper and, with ``embedded_worker_url``, the in-process worker: started once
    per server, whatever the number of API processes."""

    def __init__(self, state: AppState, embedded_worker_url: str | None) -> None:
        self.sweeper = LeaseSweeper(state)
        self.workers: EmbeddedWorkers | None = None
        if embedded_worker_url is not None:
            from ito.server.embedded_worker import EmbeddedWorkers

            self.workers = EmbeddedWorkers(
                state.db, state.pepper, embedded_worker_url, state.settings.home / "worker"
            )

    def start(self) -> None:
        self.sweeper.start()
        if self.workers is not None:
            self.workers.start()

    def stop(self) -> None:
        if self.workers is not None:
            self.workers.stop()
        self.sweeper.stop()


def lifespan_for(
    state: AppState,
    embedded_worker_url: str | None,
    *,
    background: bool = True,
) -> Callable[[FastAPI], AbstractAsyncContextManager[None]]:
    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        # As many request threads as pooled connections: each thread holds at most one at a
        # time, so a request never opens (and, on return, closes) an overflow connection —
        # a new PostgreSQL backend per request under load — and threads past what the cores
        # run only contend for the GIL. Requests beyond it wait for a thread, in order.
        to_thread.current_default_thread_limiter().total_tokens = state.settings.db_pool_size
        duties = BackgroundDuties(state, embedded_worker_url) if background else None
        if duties is not None:
            duties.start()
        try:
            yield
        finally:
            if duties is not None:
                duties.stop()

    return lifespan
