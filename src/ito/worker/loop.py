"""The worker loop: perform requested cleanups, lease the next run of the booking, supervise it,
repeat — until stopped."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ito.core.errors import ItoError
from ito.worker.api import WorkerApi
from ito.worker.executors import Executor
from ito.worker.supervisor import Supervisor, cleanup_run

__all__ = ["WorkerLoop"]

log = logging.getLogger("ito.worker")


class WorkerLoop:
    def __init__(
        self,
        api: WorkerApi,
        home: Path,
        executor_factory: Callable[[], Executor],
        *,
        poll_seconds: float = 1.0,
        stop: threading.Event | None = None,
        spec_overrides: dict[str, Any] | None = None,
    ) -> None:
        self.api = api
        self.stop = stop or threading.Event()
        self.supervisor = Supervisor(
            api, home, executor_factory, spec_overrides=spec_overrides, stop=self.stop
        )
        self.home = home
        self.poll_seconds = poll_seconds
        self.refused_cleanups: set[str] = set()
        """Runs whose cleanup was refused (logged once; retried every round)."""

    def tick(self) -> bool:
        """One round; True if it did any work."""
        worked = False
        for job in self.api.cleanups():
            try:
                freed = cleanup_run(self.api, self.home, job)
            except ItoError as exc:
                if exc.code != "checkpoint_storage_invalid":
                    raise
                # Nothing was deleted through the refused path; the run stays ``cleaning`` and
                # the next round tries again. Leasing other runs goes on meanwhile.
                if job.run_id not in self.refused_cleanups:
                    self.refused_cleanups.add(job.run_id)
                    log.error("run %s: cleanup refused (%s)", job.run_id, exc.message)
                continue
            log.info("cleaned run %s: %d bytes freed", job.run_id, freed)
            worked = True
        lease = self.api.lease()
        if lease is not None:
            log.info("leased run %s attempt %s", lease.run_id, lease.attempt)
            outcome = self.supervisor.run(lease)
            log.info(
                "run %s attempt %s ended: %s",
                lease.run_id,
                lease.attempt,
                outcome.status if outcome else "lease lost",
            )
            worked = True
        return worked

    def run_forever(self) -> None:
        while not self.stop.is_set():
            try:
                worked = self.tick()
            except ItoError as exc:
                if exc.code == "credential_revoked":
                    log.error("the worker credential was revoked; stopping")
                    return
                log.warning("worker round failed: %s", exc.code)
                worked = False
            except Exception:
                log.exception("worker round crashed")
                worked = False
            if not worked:
                self.stop.wait(self.poll_seconds)
