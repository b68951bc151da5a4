"""Distributed checkpoints that training does not wait for, committed atomically (DESIGN §7.3).

Layout: ``<root>/<stage>/step_<global step:08d>/`` holds the DCP files; ``COMMIT`` (JSON: step,
stage, bytes, seconds, tokens_seen, …) is written by rank 0 last, by rename, after every rank's
bytes and the DCP metadata are on disk. A directory without ``COMMIT`` is never loaded.

Saving is ``dcp.async_save`` with a :class:`DefaultStager` staging in a background thread, so the
call returns at once; the one thing training must not do before staging has copied the state is
change it, so :meth:`Checkpointer.wait_staging` is called right before each optimizer step (the
TorchTitan "zero-overhead checkpointing" order). The upload runs on its own gloo group so its
collectives never interleave with the training collectives of the main thread.

What a checkpoint holds: the FSDP2-sharded model and optimizer (``get_state_dict``), one
``trainer`` record shared by all ranks (stage, step, data position, scheduler) and one ``rng``
record per rank (torch, CUDA and Python generator states).
"""

from __future__ import annotations

import json
import os
import random
import shutil
import time
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.filesystem import FileSystemReader
from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.checkpoint.state_dict_loader import load
from torch.distributed.checkpoint.state_dict_saver import AsyncSaveResponse, async_save

from ito.pipeline.events import EventWriter

__all__ = [
    "COMMIT",
    "Checkpointer",
    "Committed",
    "committed_checkpoints",
    "load_checkpoint",
    "restore_rng",
    "rng_record",
]

COMMIT = "COMMIT"


@dataclass(frozen=True)
class Committed:
    stage: str
    step: int
    path: Path
    info: dict[str, Any]
    """The ``COMMIT`` document."""


def committed_checkpoints(root: Path) -> list[Committed]:
    """Every committed checkpoint under ``root``, oldest step first."""
    found = []
    for marker in root.glob(f"*/step_*/{COMMIT}"):
        try:
            info = json.loads(marker.read_text(encoding="utf-8"))
            step = int(info["step"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
        stage_dir = marker.parent.parent.name
        if marker.parent.name == f"step_{step:08d}" and info.get("stage") == stage_dir:
            found.append(Committed(str(info["stage"]), step, marker.parent, info))
    return sorted(found, key=lambda c: c.step)


def remove_uncommitted(root: Path) -> list[Path]:
    """Delete step directories that never got their ``COMMIT`` (left by a killed attempt)."""
    removed = []
    for step_dir in root.glob("*/step_*"):
        if step_dir.is_dir() and not (step_dir / COMMIT).exists():
            shutil.rmtree(step_dir, ignore_errors=True)
            removed.append(step_dir)
    return removed


def rng_record() -> bytes:
    state: dict[str, Any] = {"torch": torch.get_rng_state().tolist(),
                             "python": _jsonable(random.getstate())}
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


def _state(model: torch.nn.Module, optimizer: torch.optim.Optimizer, trainer: bytes,
           rng: bytes) -> dict[str, Any]:
    model_sd, optim_sd = get_state_dict(model, optimizer)
    return {"model": model_sd, "optim": optim_sd, "trainer": trainer,
            f"rng_rank{dist.get_rank()}": rng}


def load_checkpoint(path: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                    group: dist.ProcessGroup) -> tuple[dict[str, Any], bytes | None]:
    """Load in place; returns the trainer record and this rank's RNG record (``None`` when the
    checkpoint was written by a world without this rank)."""
    rng_key = f"rng_rank{dist.get_rank()}"
    state = _state(model, optimizer, b"", b"")
    saved_keys = FileSystemReader(str(path)).read_metadata().state_dict_metadata
    if rng_key not in saved_keys:
        del state[rng_key]
    load(state, checkpoint_id=str(path), process_group=group)
    set_state_dict(model, optimizer, model_state_dict=state["model"],
                   optim_state_dict=state["optim"])
    trainer: dict[str, Any] = json.loads(state["trainer"])
    rng = state.get(rng_key)
    return trainer, rng if isinstance(rng, bytes) else None


@dataclass
class _Pending:
    stage: str
    step: int
    path: Path
    tokens_seen: int
    started: float
    blocking: float
    staging: Future[None] | None
    upload: Future[Any]
    finished_at: float | None = None


class Checkpointer:
    """Saves asynchronously, one save in flight at a time; rank 0 commits and prunes."""

    def __init__(self, root: Path, keep_last: int, events: EventWriter,
                 group: dist.ProcessGroup) -> None:
        self.root = root
        self.keep_last = keep_last
        self.events = events
        self.group = group
        self.is_coordinator = dist.get_rank() == 0
        cuda = torch.cuda.is_available()
        # Pinned memory and non-blocking copies need an accelerator; on CPU the background
        # thread does a plain copy.
        self._stager = DefaultStager(StagingOptions(
            use_pinned_memory=cuda, use_shared_memory=False, use_async_staging=True,
            use_non_blocking_copy=cuda))
        self._pending: _Pending | None = None

    def save(self, *, stage: str, step: int, tokens_seen: int, model: torch.nn.Module,
             optimizer: torch.optim.Optimizer, trainer: dict[str, Any]) -> None:
        # Waiting here for the previous save is a stall of training too: count it.
        start = time.monotonic()
        self.finish()
        path = self.root / stage / f"step_{step:08d}"
        state = _state(model, optimizer, json.dumps(trainer).encode(), rng_record())
        response = async_save(state, checkpoint_id=str(path), process_group=self.group,
                                  async_stager=self._stager)
        if isinstance(response, AsyncSaveResponse):
            staging: Future[None] | None = response.staging_completion
            upload: Future[Any] = response.upload_completion
        else:
            staging, upload = None, response
        pending = _Pending(stage, step, path, tokens_seen, start, time.monotonic() - start,
                           staging, upload)
        upload.add_done_callback(lambda _: setattr(pending, "finished_at", time.monotonic()))
        self._pending = pending

    def wait_staging(self) -> None:
        """Block until the in-flight save has copied the state (call before mutating it)."""
        pending = self._pending
        if pending is not None and pending.staging is not None:
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
        self.wait_staging()
        pending.upload.result()
        self._pending = None
        if self.is_coordinator:
            self._commit(pending)

    def close(self) -> None:
        self.finish()
        self._stager.close()

    def _commit(self, pending: _Pending) -> None:
        finished = pending.finished_at or time.monotonic()
        size = sum(f.stat().st_size for f in pending.path.rglob("*") if f.is_file())
        info = {"step": pending.step, "stage": pending.stage, "bytes": size,
                "seconds": round(finished - pending.started, 6),
                "blocking_seconds": round(pending.blocking, 6),
                "tokens_seen": pending.tokens_seen, "world_size": dist.get_world_size()}
        tmp = pending.path / f".{COMMIT}.tmp"
        tmp.write_text(json.dumps(info), encoding="utf-8")
        os.replace(tmp, pending.path / COMMIT)
        self.events.emit("checkpoint", stage=pending.stage, step=pending.step,
                         path=str(pending.path), bytes=size, seconds=info["seconds"],
                         blocking_seconds=info["blocking_seconds"])
        for old in committed_checkpoints(self.root)[: -self.keep_last]:
            # The marker goes first so a crash mid-delete leaves an ignored directory, never a
            # committed one with files missing.
            (old.path / COMMIT).unlink(missing_ok=True)
            shutil.rmtree(old.path, ignore_errors=True)
