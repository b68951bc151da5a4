"""The run spec: what the worker hands the engine in ``spec.json`` (one file per attempt).

Pure and torch-free so the worker can import it to write specs. The manifest inside is the
already-validated document; it is validated again here (``parse_manifest``) because the engine
trusts nothing it did not check itself.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ito.core.manifest import Manifest, parse_manifest
from ito.pipeline.storage_fs import StoragePath

__all__ = ["FailAt", "Replica", "RestartFrom", "RunSpec", "load_spec", "stop_file"]


def stop_file(workdir: Path, attempt: int) -> Path:
    """The file whose existence asks an attempt's engine to checkpoint and stop (the worker
    writes it on a budget stop; rank 0 looks for it every step)."""
    return workdir / f"stop-{attempt}"


@dataclass(frozen=True)
class FailAt:
    rank: int
    """Global rank that exits with status 137."""
    step: int
    """Global step (1-based) at whose start it exits, before doing any work of that step (the
    first step at or past it that the rank runs: a group healed from a peer may jump over it)."""
    replica: int = 0
    """Replica group of that rank (runs with several replica groups)."""
    rejoin_after_steps: int | None = None
    """Runs with several replica groups: the killed group's restarted processes wait, before
    they contact any peer, until a checkpoint this many steps past the newest one they found
    on restarting is committed. This orders the drill (the survivor trains alone from the kill
    to that commit) without relying on how fast a restart happens to be."""


@dataclass(frozen=True)
class RestartFrom:
    step: int
    """Global step of the committed checkpoint to resume from."""
    skip_steps: int
    """Batches of data to skip after it (the window that produced the spike)."""


@dataclass(frozen=True)
class Replica:
    """Which replica group this torchrun world is, of how many, and where their lighthouse is
    (given on the command line: the spec file is shared by the groups)."""

    id: int
    groups: int
    lighthouse: str


@dataclass(frozen=True)
class RunSpec:
    run_id: str
    """Seeds the model initialisation and the data order."""
    attempt: int
    """1 for the first attempt; the worker increments it on every re-lease."""
    manifest: Manifest
    workdir: Path
    """Scratch directory; ``prepared/<data_id>.jsonl`` there replaces the raw data file."""
    checkpoint_dir: Path
    events_path: Path
    stages: tuple[str, ...]
    """Curriculum stages to run, in order; each must be in the manifest's curriculum."""
    max_steps_per_stage: int | None = None
    """Caps each stage's step count (test hook)."""
    fail_at: FailAt | None = None
    """Fault injection; fires only on attempt 1 and only before torchrun's first restart."""
    loss_spike_at: int | None = None
    """Fault injection: the batch of this global step is replaced by random tokens (a real loss
    spike); attempt 1 only."""
    pause_at_step: int | None = None
    """Fault injection: on attempt 1, before torchrun's first restart, every rank commits its
    in-flight checkpoint and then hangs at the start of this global step (up to
    ``PAUSE_S``), so a drill that kills the worker or a rank acts on a run that is certainly
    still training, however fast the machine."""
    min_step_seconds: float | None = None
    """Test hook: each step lasts at least this long (stands in for a slower accelerator, so a
    drill can act on a run that is still training)."""
    restart_from: RestartFrom | None = None
    """A human-approved restart: resume from exactly this checkpoint, skipping a data window."""
    replica: Replica | None = None
    """Set for runs with several replica groups."""
    storage_root: Path | None = None
    """The booking's storage root (resolved) that ``checkpoint_dir`` lies in: every checkpoint
    write, prune and delete re-proves the directories from it down (no link among them).
    ``None``: ``checkpoint_dir`` itself is the root (the engine run alone, in tests)."""
    document: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)
    """The spec as read, for logging."""

    @property
    def checkpoint_storage(self) -> StoragePath:
        """``checkpoint_dir`` as its root and the components below it."""
        if self.storage_root is None:
            return StoragePath(self.checkpoint_dir)
        return StoragePath(self.storage_root,
                           self.checkpoint_dir.relative_to(self.storage_root).parts)

    @property
    def stop_path(self) -> Path:
        return stop_file(self.workdir, self.attempt)


def load_spec(path: Path) -> RunSpec:
    """Read and check ``spec.json``; raises ``ValueError`` naming the offending field."""
    doc = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(doc, dict):
        raise ValueError("spec: must be a JSON object")
    manifest = parse_manifest(json.dumps(doc.get("manifest")).encode())
    stages = tuple(doc.get("stages") or [s.stage for s in manifest.curriculum])
    known = {s.stage for s in manifest.curriculum}
    for i, name in enumerate(stages):
        if name not in known:
            raise ValueError(f"spec.stages[{i}]: {name!r} is not a curriculum stage")
    fail_at = None
    if doc.get("fail_at") is not None:
        rejoin = doc["fail_at"].get("rejoin_after_steps")
        fail_at = FailAt(rank=int(doc["fail_at"]["rank"]), step=int(doc["fail_at"]["step"]),
                         replica=int(doc["fail_at"].get("replica", 0)),
                         rejoin_after_steps=int(rejoin) if rejoin is not None else None)
    spike_at = doc.get("loss_spike_at")
    if spike_at is not None and (not isinstance(spike_at, int) or spike_at < 1):
        raise ValueError("spec.loss_spike_at: must be a positive integer or null")
    restart = None
    if doc.get("restart_from") is not None:
        restart = RestartFrom(step=int(doc["restart_from"]["step"]),
                              skip_steps=int(doc["restart_from"]["skip_steps"]))
    max_steps = doc.get("max_steps_per_stage")
    if max_steps is not None and (not isinstance(max_steps, int) or max_steps < 1):
        raise ValueError("spec.max_steps_per_stage: must be a positive integer or null")
    pause_at = doc.get("pause_at_step")
    if pause_at is not None and (not isinstance(pause_at, int) or isinstance(pause_at, bool)
                                 or pause_at < 1):
        raise ValueError("spec.pause_at_step: must be a positive integer or null")
    pace = doc.get("min_step_seconds")
    if pace is not None and (not isinstance(pace, int | float) or isinstance(pace, bool)
                             or not 0 < pace <= 60):
        raise ValueError("spec.min_step_seconds: must be a number in (0, 60] or null")
    for key in ("workdir", "checkpoint_dir", "events_path"):
        if not isinstance(doc.get(key), str) or not Path(doc[key]).is_absolute():
            raise ValueError(f"spec.{key}: must be an absolute path")
    storage_root = doc.get("storage_root")
    if storage_root is not None:
        if not isinstance(storage_root, str) or not Path(storage_root).is_absolute():
            raise ValueError("spec.storage_root: must be an absolute path or null")
        below = Path(doc["checkpoint_dir"]).relative_to(storage_root) \
            if Path(doc["checkpoint_dir"]).is_relative_to(storage_root) else None
        if below is None or not below.parts or ".." in below.parts:
            raise ValueError("spec.checkpoint_dir: must lie strictly below spec.storage_root")
    return RunSpec(
        run_id=str(doc["run_id"]),
        attempt=int(doc.get("attempt", 1)),
        manifest=manifest,
        workdir=Path(doc["workdir"]),
        checkpoint_dir=Path(doc["checkpoint_dir"]),
        events_path=Path(doc["events_path"]),
        stages=stages,
        max_steps_per_stage=max_steps,
        fail_at=fail_at,
        loss_spike_at=spike_at,
        pause_at_step=pause_at,
        min_step_seconds=float(pace) if pace is not None else None,
        restart_from=restart,
        storage_root=Path(storage_root) if storage_root is not None else None,
        document=doc,
    )
