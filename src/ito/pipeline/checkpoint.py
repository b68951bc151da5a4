"""Distributed checkpoints that training does not wait for, committed atomically (DESIGN §7.3).

Layout: ``<root>/<stage>/step_<global step:08d>/`` holds the DCP files; ``COMMIT`` (JSON: step,
stage, bytes, seconds, tokens_seen, …) is written by rank 0 last, by rename, after every rank's
bytes and the DCP metadata are on disk. A directory without ``COMMIT`` is never loaded. The
checkpoint event carries the digest of ``.metadata`` and ``COMMIT``
(:func:`ito.core.revisions.checkpoint_digest`), which names the checkpoint to a later run that
starts from it.

Saving is ``dcp.async_save`` with a :class:`DefaultStager` staging in a background thread, so the
call returns at once; the one thing training must not do before staging has copied the state is
change it, so :meth:`Checkpointer.wait_staging` is called right before each optimizer step (the
TorchTitan "zero-overhead checkpointing" order). The upload runs on its own gloo group so its
collectives never interleave with the training collectives of the main thread.

What a checkpoint holds: the FSDP2-sharded model and optimizer (``get_state_dict``), one
``trainer`` record shared by all ranks (stage, step, data position, scheduler) and one ``rng``
record per rank (torch, CUDA and Python generator states).

Where: every save, commit and prune first proves its directory inside the booking's storage on
disk (:mod:`ito.pipeline.storage_fs`: walked from the root without following a link), and DCP
writes through ``/proc/self/fd/N`` of the step directory it proved, so a link swapped in on the
way refuses the step (``checkpoint_storage_invalid``) instead of redirecting it.
"""

from __future__ import annotations

import json
import random
import time
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.checkpoint.state_dict_loader import load
from torch.distributed.checkpoint.state_dict_saver import AsyncSaveResponse, async_save

from ito.core.errors import ErrorCode, ItoError
from ito.core.revisions import checkpoint_digest
from ito.pipeline.dcp_files import (
    COMMIT,
    METADATA,
    VerifiedReader,
    checkpoint_writer,
    commit_digest,
    file_manifest,
    read_commit,
)
from ito.pipeline.events import EventWriter
from ito.pipeline.storage_fs import ProvenDir, StoragePath, open_proven, proven_dir

__all__ = [
    "COMMIT",
    "METADATA",
    "Checkpointer",
    "Committed",
    "checkpoint_location",
    "committed_checkpoints",
    "load_checkpoint",
    "restore_rng",
    "rng_record",
]


@dataclass(frozen=True)
class Committed:
    stage: str
    step: int
    path: Path
    info: dict[str, Any]
    """The ``COMMIT`` document."""
    digest: str | None = None
    """What its ``.metadata`` and ``COMMIT`` hash to (:func:`ito.core.revisions.checkpoint_digest`):
    compared with the digests the run recorded before anything in it is trusted."""


def _storage(root: Path | StoragePath) -> StoragePath:
    return root if isinstance(root, StoragePath) else StoragePath(root)


def _step_name(step: int) -> str:
    return f"step_{step:08d}"


def checkpoint_location(root: Path | StoragePath, stage: str, step: int) -> StoragePath:
    """Where the checkpoint of ``stage`` at global ``step`` lives below ``root``."""
    return _storage(root).child(stage, _step_name(step))


def committed_checkpoints(root: Path | StoragePath) -> list[Committed]:
    """Every committed checkpoint under ``root`` (a bare path is its own storage root), oldest
    step first; only real directories count (a link in their place is never followed)."""
    where = _storage(root)
    try:
        top = open_proven(where)
    except FileNotFoundError:
        return []
    found = []
    with top:
        for stage in top.subdirs():
            try:
                stage_dir = top.subdir(stage)
            except (OSError, ItoError):
                continue  # swapped for a link since it was listed
            with stage_dir:
                for name in stage_dir.subdirs():
                    try:
                        with stage_dir.subdir(name) as step_dir:
                            info = json.loads(read_commit(step_dir))
                            digest = commit_digest(step_dir)
                        step = int(info["step"])
                    except (OSError, ItoError, ValueError, KeyError, TypeError):
                        continue
                    if name == _step_name(step) and info.get("stage") == stage:
                        found.append(Committed(stage, step, stage_dir.real / name, info, digest))
    return sorted(found, key=lambda c: c.step)


def remove_uncommitted(root: Path | StoragePath) -> list[Path]:
    """Delete step directories that never got their ``COMMIT`` (left by a killed attempt)."""
    where = _storage(root)
    try:
        top = open_proven(where)
    except FileNotFoundError:
        return []
    removed = []
    with top:
        for stage in top.subdirs():
            with proven_dir(where.child(stage)) as stage_dir:
                for name in stage_dir.subdirs():
                    if not name.startswith("step_"):
                        continue
                    with stage_dir.subdir(name) as step_dir:
                        if COMMIT in step_dir.entries():
                            continue
                    stage_dir.remove(name)
                    removed.append(stage_dir.real / name)
    return removed


def rng_record() -> bytes:
    state: dict[str, Any] = {
        "torch": torch.get_rng_state().tolist(),
        "python": _jsonable(random.getstate()),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state().tolist()
    return json.dumps(state).encode()


def restore_rng(record: bytes) -> None:
    state = json.loads(record)
    torch.set_rng_state(torch.tensor(state["torch"], dtype=torch.uint8))
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(torch.tensor(state["cuda"], dtype=torch.uint8))


def _jsonable(value: Any) -> Any:
    if isinstance(value, tuple | list):
        return [_jsonable(v) for v in value]
    return value


def _state(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, trainer: bytes, rng: bytes
) -> dict[str, Any]:
    model_sd, optim_sd = get_state_dict(model, optimizer)
    return {
        "model": model_sd,
        "optim": optim_sd,
        "trainer": trainer,
        f"rng_rank{dist.get_rank()}": rng,
    }


def load_checkpoint(
    path: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer, group: dist.ProcessGroup
) -> tuple[dict[str, Any], bytes | None]:
    """Load in place from ``path``, a verified private copy of a checkpoint
    (:func:`ito.pipeline.dcp_files.stage_verified`); returns the trainer record and this rank's
    RNG record (``None`` when the checkpoint was written by a world without this rank)."""
    rng_key = f"rng_rank{dist.get_rank()}"
    state = _state(model, optimizer, b"", b"")
    saved_keys = VerifiedReader(path).read_metadata().state_dict_metadata
    if rng_key not in saved_keys:
        del state[rng_key]
    load(state, storage_reader=VerifiedReader(path), process_group=group)
    set_state_dict(
        model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"]
    )
    trainer: dict[str, Any] = json.loads(state["trainer"])
    rng = state.get(rng_key)
    return trainer, rng if isinstance(rng, bytes) else None


@dataclass
class _Pending:
    stage: str
    step: int
    path: Path
    """The step directory's real location (reported)."""
    directory: ProvenDir
    """The step directory DCP writes into, held open until the commit."""
    tokens_seen: int
    started: float
    blocking: float
    staging: Future[None] | None
    upload: Future[Any]
    finished_at: float | None = None


class Checkpointer:
    """Saves asynchronously, one save in flight at a time; rank 0 commits and prunes."""

    def __init__(
        self,
        root: Path | StoragePath,
        keep_last: int,
        events: EventWriter,
        group: dist.ProcessGroup,
        *,
        recorded: frozenset[str] = frozenset(),
        journal: Path | None = None,
    ) -> None:
        self.storage = _storage(root)
        """The run's checkpoint directory inside the booking's storage."""
        self.keep_last = keep_last
        self.events = events
        self.group = group
        self.is_coordinator = dist.get_rank() == 0
        cuda = torch.cuda.is_available()
        # Pinned memory and non-blocking copies need an accelerator; on CPU the background
        # thread does a plain copy.
        self._stager = DefaultStager(
            StagingOptions(
                use_pinned_memory=cuda,
                use_shared_memory=False,
                use_async_staging=True,
                use_non_blocking_copy=cuda,
            )
        )
        self._pending: _Pending | None = None
        self.trusted: set[str] = set(recorded)
        """Digests of the checkpoints this run recorded (the server's list, the journal's and
        each commit's): only these are resumed from or pruned; anything else in the storage
        was not written by the run and is left alone."""
        self._journal = journal
        self._journal_read = 0

    def recorded(self) -> list[Committed]:
        """The committed checkpoints under the storage that this run recorded, oldest first."""
        self._read_journal()
        return [c for c in committed_checkpoints(self.storage) if c.digest in self.trusted]

    def _read_journal(self) -> None:
        """Add the digests of the checkpoint events in the run's journal (the events file in
        the worker's own directory, outside the booking's storage) written since the last read:
        the commits of this attempt's earlier processes and of other replica groups."""
        if self._journal is None:
            return
        try:
            with self._journal.open("rb") as journal:
                journal.seek(self._journal_read)
                data = journal.read()
        except FileNotFoundError:
            return
        complete = data.rfind(b"\n") + 1
        self._journal_read += complete
        for line in data[:complete].splitlines():
            if b'"checkpoint"' not in line:
                continue
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if event.get("type") == "checkpoint" and isinstance(event.get("sha256"), str):
                self.trusted.add(event["sha256"])

    def save(
        self,
        *,
        stage: str,
        step: int,
        tokens_seen: int,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        trainer: dict[str, Any],
    ) -> None:
        # Waiting here for the previous save is a stall of training too: count it.
        start = time.monotonic()
        self.finish()
        name = _step_name(step)
        # Rank 0 creates the step directory (new, never one already there); the others then
        # open the one it made.
        verdict: list[object] = [None]
        made: ProvenDir | None = None
        if self.is_coordinator:
            try:
                with proven_dir(self.storage.child(stage), create=True) as stage_dir:
                    if self._committed_by_this_run(stage_dir, name):
                        verdict[0] = "kept"
                    else:
                        made = self._fresh(stage_dir, name)
            except ItoError as exc:
                verdict[0] = (exc.code, exc.message, dict(exc.details))
        try:
            dist.broadcast_object_list(verdict, src=0, group=self.group)
        except BaseException:
            if made is not None:
                made.close()
            raise
        if verdict[0] == "kept":
            # Another replica group of this run committed this very step (a group that came up
            # late trains the steps the others already did, to the same state): its commit
            # stands, and a second save of the step would only race it.
            self.events.log("info", f"step {step} is already committed by this run; kept")
            return
        failure = cast("tuple[ErrorCode, str, dict[str, Any]] | None", verdict[0])
        if failure is not None:
            raise ItoError(failure[0], failure[1], **failure[2])
        if made is not None:
            directory = made
        else:
            with proven_dir(self.storage.child(stage)) as stage_dir:
                directory = stage_dir.subdir(name)
        try:
            state = _state(model, optimizer, json.dumps(trainer).encode(), rng_record())
            response = async_save(
                state,
                storage_writer=checkpoint_writer(directory.handle),
                process_group=self.group,
                async_stager=self._stager,
            )
        except BaseException:
            directory.close()
            raise
        if isinstance(response, AsyncSaveResponse):
            staging: Future[None] | None = response.staging_completion
            upload: Future[Any] = response.upload_completion
        else:
            staging, upload = None, response
        pending = _Pending(
            stage,
            step,
            directory.real,
            directory,
            tokens_seen,
            start,
            time.monotonic() - start,
            staging,
            upload,
        )
        upload.add_done_callback(lambda _: setattr(pending, "finished_at", time.monotonic()))
        self._pending = pending

    def _committed_by_this_run(self, stage_dir: ProvenDir, name: str) -> bool:
        """Whether ``name`` here is a committed checkpoint this run recorded (its journal read
        again first: another replica group may have committed it since)."""
        if name not in stage_dir.entries():
            return False
        self._read_journal()
        try:
            with stage_dir.subdir(name) as old:
                return COMMIT in old.entries() and commit_digest(old) in self.trusted
        except (OSError, ItoError):
            return False

    def _fresh(self, stage_dir: ProvenDir, name: str) -> ProvenDir:
        """The step directory ``name``, created now: never one already there. What a crashed
        attempt left uncommitted is deleted first (without following a link inside); a
        committed one refuses the save (``checkpoint_storage_invalid``)."""
        if name in stage_dir.entries():
            try:
                with stage_dir.subdir(name) as old:
                    committed = COMMIT in old.entries()
            except ItoError:
                committed = True  # a link or a file where the step directory would go
            if committed:
                raise ItoError(
                    "checkpoint_storage_invalid",
                    "checkpoint storage already holds the step directory a save would create",
                    reason="entry_exists",
                )
            stage_dir.remove(name)
            self.events.log("warning", f"removed an uncommitted checkpoint at {name}")
        return stage_dir.subdir(name, create=True, new=True)

    def wait_staging(self) -> None:
        """Block until the in-flight save has copied the state (call before mutating it)."""
        if self._pending is not None:
            self.wait_staging_of(self._pending)

    @staticmethod
    def wait_staging_of(pending: _Pending) -> None:
        if pending.staging is not None:
            start = time.monotonic()
            pending.staging.result()
            pending.staging = None
            pending.blocking += time.monotonic() - start

    def poll(self) -> None:
        """Commit the in-flight save if it has finished; never blocks."""
        if self._pending is not None and self._pending.upload.done():
            self.finish()

    def finish(self) -> None:
        """Wait for the in-flight save, then commit it (rank 0)."""
        pending = self._pending
        if pending is None:
            return
        self._pending = None
        try:
            self.wait_staging_of(pending)
            pending.upload.result()
            if self.is_coordinator:
                self._commit(pending)
        finally:
            pending.directory.close()

    def close(self) -> None:
        self.finish()
        self._stager.close()

    def _commit(self, pending: _Pending) -> None:
        finished = pending.finished_at or time.monotonic()
        name = _step_name(pending.step)
        # Proven again: the step directory must still be the one DCP wrote into, reached from
        # the root without a link, or nothing is committed (and nothing pruned).
        with proven_dir(self.storage.child(pending.stage, name)) as again:
            if again.identity() != pending.directory.identity():
                raise ItoError(
                    "checkpoint_storage_invalid",
                    "checkpoint storage changed while a checkpoint was written",
                    reason="step directory replaced",
                )
            files = file_manifest(again)
            size = sum(int(f["bytes"]) for f in files.values())
            info = {
                "step": pending.step,
                "stage": pending.stage,
                "bytes": size,
                "seconds": round(finished - pending.started, 6),
                "blocking_seconds": round(pending.blocking, 6),
                "tokens_seen": pending.tokens_seen,
                "world_size": dist.get_world_size(),
                # Every file of the step with its size and sha256: the digest below covers
                # them all, and nothing is loaded from here unless they still match.
                "files": files,
            }
            tmp = f".{COMMIT}.tmp"
            commit = json.dumps(info).encode()
            again.unlink(tmp, missing_ok=True)
            again.write_new(tmp, commit)
            again.replace(tmp, COMMIT)
            digest = checkpoint_digest(again.read(METADATA), commit)
        self.trusted.add(digest)
        pruned = []
        for old in self.recorded()[: -self.keep_last]:
            with proven_dir(self.storage.child(old.stage)) as stage_dir:
                # The marker goes first so a crash mid-delete leaves an ignored directory, never
                # a committed one with files missing.
                with stage_dir.subdir(_step_name(old.step)) as step_dir:
                    step_dir.unlink(COMMIT, missing_ok=True)
                stage_dir.remove(_step_name(old.step))
            pruned.append({"stage": old.stage, "step": old.step})
        # The commit, and what the keep-last policy deleted for it: the API marks those
        # checkpoints deleted rather than listing them as if they were still on disk.
        self.events.emit(
            "checkpoint",
            stage=pending.stage,
            step=pending.step,
            path=str(pending.path),
            bytes=size,
            seconds=info["seconds"],
            blocking_seconds=info["blocking_seconds"],
            sha256=digest,
            **({"pruned": pruned} if pruned else {}),
        )
