"""Supervise one leased attempt of a run: prepare its data, launch the pipeline through an
executor, stream the pipeline's events to the API, heartbeat, obey cancel and budget stops, and
finish the run with the status the pipeline reported (or ``failed`` if it crashed).

The pipeline (rank 0) appends one JSON event per line to ``events-<attempt>.jsonl``; this loop
tails that file and parses each line with the event models (:mod:`ito.core.pipeline_events`): a
line that is not exactly one event is logged and dropped, never forwarded. A report batch the
server refuses as malformed (a 4xx) is logged and dropped too, and the heartbeat goes on, so a
bad event never costs the run its lease; a retryable failure keeps the batch for the next round
without holding up the heartbeat. A lost lease means another attempt may already run
elsewhere: the processes are killed and nothing more is reported.
"""

from __future__ import annotations

import base64
import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from ito.core.errors import ErrorCode, ItoError, is_error_code
from ito.core.pipeline_events import (
    DoneEvent,
    LogEvent,
    PipelineEvent,
    ReportedEvent,
    SpikeEvent,
    StageEvent,
    parse_event_line,
)
from ito.core.run_spec import RunSpecDocument
from ito.core.storage import checkpoint_local_parts
from ito.core.worker_messages import CleanupJob, Lease
from ito.pipeline.spec import stop_file
from ito.pipeline.storage_fs import StoragePath, proven_dir, remove_tree
from ito.worker.api import WorkerApi, report_batches
from ito.worker.executors import Executor, LaunchSpec

if TYPE_CHECKING:
    from ito.pipeline.data_prep import BookingStorage

__all__ = ["EventTail", "Supervisor", "checkpoint_storage", "cleanup_run"]

POLL_SECONDS = 0.2
_LOST = ("lease_lost", "run_not_found", "credential_revoked")
"""Answers after which this attempt must stop at once: another may be running."""
log = logging.getLogger("ito.worker")
POST_TRAINING = ("sft", "dpo", "rlvr")
_FINAL = ("succeeded", "gate_failed", "failed")
"""``done`` statuses that end the run (``spike`` and ``stopped`` hand it to a human or a stop)."""


def checkpoint_storage(uri: str, storage_root: str | None, run_id: str) -> StoragePath:
    """The local directory of a run's checkpoints as the booking's storage root and the
    components below it, re-checked here against that root (the server checked it too; this
    process is the one that would ``rmtree`` it). What it names on disk is proven at each use
    (:mod:`ito.pipeline.storage_fs`)."""
    if not storage_root:
        raise ItoError("checkpoint_storage_invalid", "the booking has no checkpoint storage")
    root, parts = checkpoint_local_parts(uri, storage_root, run_id)
    return StoragePath(Path(root), parts)


def initial_weights_spec(lease: Lease, storage_root: Path) -> dict[str, Any] | None:
    """The engine's ``initial_weights`` for the lease's resolved revision, below the booking's
    (resolved) ``storage_root``: a ``run:`` checkpoint's step directory (the source run's
    checkpoint URI re-checked against the booking's storage as this worker's own is) or the
    Hugging Face directory (re-checked inside it)."""
    from ito.core.revisions import InitialWeights, storage_parts

    if lease.initial_weights is None:
        return None
    try:
        weights = InitialWeights.from_dict(lease.initial_weights)
    except TypeError:
        raise ItoError("revision_unresolvable", "the run's initial weights are malformed") from None
    if weights.kind == "hf":
        if weights.path is None:
            raise ItoError("revision_unresolvable", "the run's initial weights are malformed")
        # Inside the booking's storage, re-checked here, below the root as this worker found it.
        path = str(storage_root.joinpath(*storage_parts(weights.path, lease.booking.storage_uri)))
    else:
        if weights.checkpoint_uri is None or weights.run_id is None or weights.step is None:
            raise ItoError("revision_unresolvable", "the run's initial weights are malformed")
        try:
            source = checkpoint_storage(
                weights.checkpoint_uri, lease.booking.storage_uri, weights.run_id
            )
        except ItoError:
            raise ItoError(
                "revision_unresolvable",
                "the initial weights' checkpoint is outside the booking's storage",
            ) from None
        path = str(
            storage_root.joinpath(*source.parts, str(weights.stage), f"step_{weights.step:08d}")
        )
    return {
        "kind": weights.kind,
        "path": path,
        "sha256": weights.sha256,
        "revision": weights.revision,
    }


class EventTail:
    """New complete lines of a growing JSONL file, each parsed as its event model."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.partial = b""

    def read(self) -> list[PipelineEvent]:
        try:
            with self.path.open("rb") as handle:
                handle.seek(self.offset)
                chunk = handle.read()
        except FileNotFoundError:
            return []
        self.offset += len(chunk)
        data = self.partial + chunk
        *lines, self.partial = data.split(b"\n")
        events: list[PipelineEvent] = []
        for line in lines:
            if line.strip():
                try:
                    events.append(parse_event_line(line))
                except ValueError as exc:
                    # Logged by where it is wrong, never by what it says (it may carry anything).
                    log.warning(
                        "%s: a malformed pipeline event was dropped (%s)", self.path.name, exc
                    )
                    events.append(
                        LogEvent(
                            level="warning",
                            message=f"a malformed pipeline event was dropped ({exc})",
                        )
                    )
        return events


@dataclass
class Outcome:
    status: str
    failure_code: ErrorCode | None
    message: str


class Supervisor:
    def __init__(
        self,
        api: WorkerApi,
        home: Path,
        executor_factory: Callable[[], Executor],
        *,
        spec_overrides: dict[str, Any] | None = None,
        stop: threading.Event | None = None,
    ) -> None:
        self.api = api
        self.home = home
        self.executor_factory = executor_factory
        self.spec_overrides = spec_overrides or {}
        self.stop = stop or threading.Event()
        """Set when the worker shuts down: the processes are killed and the lease left to
        expire, so the run goes ``recovering`` and resumes under the next worker."""

    def run(self, lease: Lease) -> Outcome | None:
        run_id, attempt = lease.run_id, lease.attempt
        workdir = self.home / "work" / run_id
        workdir.mkdir(parents=True, exist_ok=True, mode=0o700)
        raw = base64.b64decode(lease.manifest_b64)
        document = json.loads(raw)
        try:
            storage = checkpoint_storage(lease.checkpoint_uri, lease.booking.storage_uri, run_id)
            with proven_dir(storage, create=True) as proven:
                # The pipeline gets the resolved root and the proven directory below it; it
                # re-proves the chain before each of its own writes, prunes and deletes.
                real_root = proven.real.parents[len(storage.parts) - 1]
                checkpoints = proven.real
        except ItoError as exc:
            return self._finish(run_id, attempt, Outcome("failed", exc.code, exc.message))
        self.api.report(
            run_id, attempt, [LogEvent(level="info", message=f"checkpoints at {checkpoints}")]
        )

        from ito.pipeline.data_prep import BookingStorage

        uri = lease.booking.storage_uri
        booking_storage = BookingStorage(uri, real_root) if uri else None
        prep = self._prepare(run_id, attempt, raw, workdir, booking_storage)
        if prep is not None or self.stop.is_set():
            return prep  # an outcome, or None: the worker is stopping and leaves the lease
        bound = self._bind_provenance(run_id, attempt, workdir, lease.provenance_sha256)
        if isinstance(bound, Outcome):
            return bound
        try:
            initial = initial_weights_spec(lease, real_root)
        except ItoError as exc:
            return self._finish(run_id, attempt, Outcome("failed", exc.code, exc.message))
        events_path = workdir / f"events-{attempt}.jsonl"
        restart = lease.restart_from
        fields: dict[str, Any] = {
            "run_id": run_id,
            "attempt": attempt,
            "manifest": document,
            "workdir": str(workdir),
            "checkpoint_dir": str(checkpoints),
            "storage_root": str(real_root),
            "events_path": str(events_path),
            # The curriculum, then the post-training stages the manifest asks for.
            "stages": [s["stage"] for s in document["curriculum"]]
            + [s for s in POST_TRAINING if (document.get("post_training") or {}).get(s)],
            "restart_from": restart.model_dump() if restart is not None else None,
            "accelerator": {
                "gpu": lease.booking.gpu,
                "gpus_per_node": lease.booking.gpus_per_node,
            },
            # The layout gate 5 planned, for the engine to build exactly (None: its default).
            "layout": (lease.parallelism or {}).get("layout"),
            # Training reads only shards whose digests are those of this bound report.
            "provenance_sha256": bound,
            # What it may resume from: the checkpoints the server recorded for the run.
            "recorded_checkpoints": list(lease.recorded_checkpoints),
            # The weights it starts from (None: random); the engine verifies them first.
            "initial_weights": initial,
        }
        try:
            spec = RunSpecDocument.model_validate(fields | self.spec_overrides)
        except ValidationError:
            return self._finish(
                run_id,
                attempt,
                Outcome("failed", "invalid_arguments", "the run spec for the engine is invalid"),
            )
        spec_path = workdir / f"spec-{attempt}.json"
        spec_path.write_text(spec.model_dump_json())
        booking = lease.booking
        executor = self.executor_factory()
        groups = int((document.get("resources") or {}).get("replica_groups", 1))
        try:
            executor.start(
                LaunchSpec(
                    run_id=run_id,
                    attempt=attempt,
                    spec_path=spec_path,
                    workdir=workdir,
                    nodes=booking.nodes,
                    gpus_per_node=booking.gpus_per_node,
                    replica_groups=groups,
                    gpu=booking.gpu,
                )
            )
        except ItoError as exc:
            executor.kill()
            return self._finish(run_id, attempt, Outcome("failed", exc.code, exc.message))
        ttl = lease.lease_ttl_s
        try:
            return self._follow(
                run_id,
                attempt,
                executor,
                EventTail(events_path),
                lease.heartbeat_s,
                ttl=ttl,
                stop_grace_s=ttl / 2,
                stop_path=stop_file(workdir, attempt),
            )
        except BaseException:
            # Whatever went wrong here, no training process outlives its supervision.
            executor.kill()
            raise

    def _bind_provenance(
        self, run_id: str, attempt: int, workdir: Path, bound: str | None
    ) -> str | Outcome:
        """Upload this preparation's report and have the server bind it to the run (DESIGN
        §7.4); its digest, or the run's failure when the server refuses it (another report is
        bound, the report does not describe the manifest's data, contamination over the
        policy). An attempt that finds its report already bound sends nothing."""
        from ito.core.provenance import provenance_digest
        from ito.pipeline.data_prep import PROVENANCE_FILE, prepared_dir

        report = (prepared_dir(workdir) / PROVENANCE_FILE).read_bytes()
        digest = provenance_digest(report)
        if bound == digest:
            return digest
        try:
            return self.api.provenance(run_id, attempt, report).sha256
        except ItoError as exc:
            if exc.retryable or exc.code in _LOST:
                raise
            return self._finish(run_id, attempt, Outcome("failed", exc.code, exc.message))

    def _prepare(
        self,
        run_id: str,
        attempt: int,
        raw: bytes,
        workdir: Path,
        storage: BookingStorage | None,
    ) -> Outcome | None:
        if (workdir / "prepared" / "provenance.json").exists():
            return None
        from ito.core.manifest import parse_manifest
        from ito.pipeline.data_prep import prepare_data

        self.api.report(run_id, attempt, [StageEvent(stage="data_prep", status="started")])
        started = time.monotonic()
        result: dict[str, Any] = {}

        def work() -> None:
            try:
                result["report"] = prepare_data(parse_manifest(raw), workdir, storage=storage)
            except ItoError as exc:
                result["error"] = exc
            except Exception as exc:
                result["crash"] = exc

        thread = threading.Thread(target=work, daemon=True)
        thread.start()
        while thread.is_alive():
            thread.join(timeout=1.0)
            if self.stop.is_set():
                return None
            if thread.is_alive():
                beat = self.api.heartbeat(run_id, attempt)
                if beat.stop is not None:
                    thread.join()
                    return self._finish(
                        run_id,
                        attempt,
                        Outcome("cancelled", None, "cancelled during data prep")
                        if beat.stop == "cancel"
                        else _stop_outcome("cost_bound_reached", None, during="data prep")
                        if beat.stop == "cost_bound"
                        else Outcome(
                            "failed",
                            _stop_code(beat.stop_code),
                            "stopped during data prep: the budget or the booking does not allow "
                            "another interval",
                        ),
                    )
        if "error" in result:
            error: ItoError = result["error"]
            return self._finish(run_id, attempt, Outcome("failed", error.code, error.message))
        if "crash" in result:
            return self._finish(
                run_id, attempt, Outcome("failed", "internal_error", "data preparation crashed")
            )
        report = result["report"]
        kept = ", ".join(f"{d.id} {d.input_rows}→{d.output_rows} rows" for d in report.datasets)
        self.api.report(
            run_id,
            attempt,
            [
                LogEvent(
                    level="info",
                    message=f"data prepared in {time.monotonic() - started:.1f} s: {kept}; "
                    f"eval items found in training data {report.eval_contaminated_fraction:.2%}"[
                        :3000
                    ],
                ),
                StageEvent(stage="data_prep", status="completed"),
            ],
        )
        return None

    def _follow(
        self,
        run_id: str,
        attempt: int,
        executor: Executor,
        tail: EventTail,
        heartbeat_s: float,
        *,
        ttl: float,
        stop_grace_s: float,
        stop_path: Path,
    ) -> Outcome | None:
        done: DoneEvent | None = None
        next_beat = 0.0
        stop_deadline: float | None = None
        """Set once a budget or booking stop asked the engine to checkpoint and exit."""
        stop_code: ErrorCode = "budget_exceeded"
        unsent: list[ReportedEvent] = []
        last_contact = time.monotonic()
        """When the API last answered. Past one lease TTL of silence the lease may be gone and
        another attempt running: the processes are killed and nothing more is reported."""

        def send(events: list[PipelineEvent]) -> None:
            """Report what is waiting, batch by batch. A refused batch (malformed: 4xx) is
            logged and dropped; a retryable failure keeps the rest for the next round and
            returns, so the heartbeat still runs; a lost lease raises."""
            nonlocal last_contact
            unsent.extend(e for e in events if not isinstance(e, DoneEvent))
            for size in [len(batch) for batch in report_batches(unsent)]:
                try:
                    self.api.report(run_id, attempt, unsent[:size])
                except ItoError as exc:
                    if exc.code in _LOST:
                        raise
                    if exc.retryable:
                        log.warning(
                            "run %s: a report batch was not delivered (%s); it is "
                            "sent again next round",
                            run_id,
                            exc.code,
                        )
                        return
                    log.warning(
                        "run %s: a report batch of %d event(s) was refused (%s) and dropped",
                        run_id,
                        size,
                        exc.code,
                    )
                else:
                    last_contact = time.monotonic()
                del unsent[:size]

        spiked = False
        ended = False
        """Whether the engine's final ``done`` was read (what follows is filtered)."""
        while True:
            try:
                events = _until_final(tail.read(), ended=ended)
                done = next((e for e in events if isinstance(e, DoneEvent)), done)
                spiked = spiked or any(isinstance(e, SpikeEvent) for e in events)
                send(events)
                if spiked:
                    # The run now awaits a human; the server released the lease.
                    executor_wait(executor)
                    return Outcome("awaiting_approval", None, "loss spike: restart proposed")
                ended = ended or (done is not None and done.status in _FINAL)
                exit_code = executor.poll()
                if exit_code is None and done is not None and done.status == "failed":
                    # The engine's last word, a coded failure: the rank that found it is
                    # leaving, and a peer still waiting in a collective for it would crash into
                    # a torchrun restart (DESIGN §7.3: such an end never restarts). The ranks
                    # are stopped now. (After a success or a gate the ranks leave by
                    # themselves, with their closing log lines — a replica group's digest.)
                    executor.kill()
                    exit_code = -9
                if exit_code is not None:
                    rest = _until_final(tail.read(), ended=ended)
                    done = next((e for e in rest if isinstance(e, DoneEvent)), done)
                    send(rest)
                    if done is not None and done.status == "spike":
                        return Outcome("awaiting_approval", None, "loss spike: restart proposed")
                    if stop_deadline is not None:
                        return self._finish(run_id, attempt, _stop_outcome(stop_code, done))
                    return self._finish(run_id, attempt, _outcome(done, exit_code))
                if stop_deadline is not None and time.monotonic() > stop_deadline:
                    executor.kill()
                    return self._finish(run_id, attempt, _stop_outcome(stop_code, None))
                if self.stop.is_set():
                    executor.kill()
                    return None
                if time.monotonic() >= next_beat:
                    beat = self.api.heartbeat(run_id, attempt)
                    last_contact = time.monotonic()
                    next_beat = last_contact + heartbeat_s
                    if beat.stop == "cancel":
                        executor.kill()
                        return self._finish(
                            run_id,
                            attempt,
                            Outcome(
                                "cancelled",
                                None,
                                "cancelled; the processes were stopped and the "
                                "last committed checkpoint kept",
                            ),
                        )
                    if beat.stop in ("budget", "booking", "cost_bound") and stop_deadline is None:
                        # The server stops while the worst case until the next beat is still
                        # under the ceiling (or inside the term): that headroom (the lease TTL)
                        # pays for a final checkpoint.
                        stop_code = _stop_code(beat.stop_code)
                        stop_path.write_text(beat.stop + "\n")
                        stop_deadline = time.monotonic() + stop_grace_s
            except ItoError as exc:
                if exc.code in _LOST:
                    executor.kill()
                    return None
                if not exc.retryable:
                    raise
                if time.monotonic() - last_contact > ttl:
                    log.error(
                        "run %s: no answer from the API for a lease TTL; stopping the "
                        "processes (the run resumes from its last commit)",
                        run_id,
                    )
                    executor.kill()
                    return None
                next_beat = time.monotonic() + min(heartbeat_s, 1.0)
            time.sleep(POLL_SECONDS)

    def _finish(self, run_id: str, attempt: int, outcome: Outcome) -> Outcome:
        self.api.finish(
            run_id,
            attempt,
            outcome.status,
            failure_code=outcome.failure_code,
            message=outcome.message,
        )
        return outcome


def executor_wait(executor: Executor, timeout: float = 120.0) -> None:
    """Let the pipeline exit by itself (it stops after a spike); kill it past ``timeout``."""
    deadline = time.monotonic() + timeout
    while executor.poll() is None:
        if time.monotonic() > deadline:
            executor.kill()
            return
        time.sleep(POLL_SECONDS)


def _until_final(events: list[PipelineEvent], *, ended: bool) -> list[PipelineEvent]:
    """``events`` as the run's: up to and including the first final ``done``, then (and once
    the run has ``ended``) only log lines — what a rank writes after the engine's last word (a
    restarted generation's ``restart`` or ``stage`` events, say) is not the run's."""
    kept: list[PipelineEvent] = []
    for event in events:
        if ended:
            if isinstance(event, LogEvent):
                kept.append(event)
            continue
        kept.append(event)
        ended = isinstance(event, DoneEvent) and event.status in _FINAL
    return kept


def _stop_code(code: str | None) -> ErrorCode:
    """The registered code of a heartbeat's stop (a budget stop names none); one this worker
    does not know is an internal error, not a guess."""
    if code is None:
        return "budget_exceeded"
    return code if is_error_code(code) else "internal_error"


def _stop_outcome(code: ErrorCode, done: DoneEvent | None, *, during: str = "") -> Outcome:
    if code == "cost_bound_reached":
        # Not an end: the run waits for a human to approve a new bound (or to cancel it).
        if during:
            where = f"stopped during {during}"
        elif done is not None and done.status == "stopped":
            where = f"checkpoint committed at step {done.step}"
        else:
            where = "the engine did not checkpoint in time; the last committed checkpoint is kept"
        return Outcome("awaiting_approval", code, f"stopped at the approved cost bound; {where}")
    why = (
        "the next interval would cross the budget ceiling"
        if code == "budget_exceeded"
        else f"the booking can no longer be used ({code})"
    )
    if done is not None and done.status == "stopped":
        return Outcome(
            "failed", code, f"stopped because {why}; checkpoint committed at step {done.step}"
        )
    return Outcome(
        "failed",
        code,
        f"stopped because {why}; the engine did not checkpoint in "
        "time and was killed; the last committed checkpoint is kept",
    )


def _outcome(done: DoneEvent | None, exit_code: int) -> Outcome:
    if done is not None and done.status in ("succeeded", "gate_failed"):
        status = done.status
        if status == "succeeded":
            # The server names the stages that ran (their ``completed`` events) in the event.
            return Outcome(status, None, "every stage of the run's plan passed its gate")
        if done.code == "ladder_rejected":
            return Outcome(
                status,
                "ladder_rejected",
                "the ladder decision job rejected the custom data; no training step of the "
                "run was taken",
            )
        message = f"an eval gate failed: {done.reason or done.stage or ''}".strip()
        return Outcome(status, "eval_gate_failed", message)
    if done is not None and done.status == "failed" and is_error_code(done.code):
        return Outcome(
            "failed", done.code, (done.reason or "")[:500] or "the pipeline refused to continue"
        )
    return Outcome(
        "failed",
        "pipeline_crashed",
        f"the training processes exited with code {exit_code} after their restarts",
    )


def cleanup_run(api: WorkerApi, home: Path, job: CleanupJob) -> int:
    """Delete a run's checkpoints and scratch data; report the bytes freed and the real paths.

    Each tree is deleted through a freshly proven parent, without following any link: a link
    planted inside a run's directory is removed, never its target; a link on the way to it
    refuses the cleanup (``checkpoint_storage_invalid``) and deletes nothing there."""
    run_id = job.run_id
    trees = [
        checkpoint_storage(job.checkpoint_uri, job.storage_uri, run_id),
        StoragePath(home / "work", (run_id,)),
    ]
    freed = 0
    deleted = []
    for tree in trees:
        removed = remove_tree(tree)
        if removed is not None:
            freed += removed[0]
            deleted.append(str(removed[1]))
    api.cleaned(run_id, freed, deleted)
    return freed
