"""The run spec: what the worker hands the engine in ``spec.json`` (one file per attempt).

Pure and torch-free. The document's shape is :class:`ito.core.run_spec.RunSpecDocument`, which
the worker builds and this module validates; the manifest inside is the already-validated
document, validated again here (``parse_manifest``) because the engine trusts nothing it did
not check itself.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from ito.core.manifest import Manifest, parse_manifest
from ito.core.run_spec import (
    BookedAccelerator,
    ErrorAtSpec,
    InitialWeightsSpec,
    LayoutSpec,
    RunSpecDocument,
)
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
    """Stages to run, in order: the manifest's curriculum stages, then its post-training
    ones."""
    max_steps_per_stage: int | None = None
    """Caps each stage's step count (test hook)."""
    fail_at: FailAt | None = None
    """Fault injection; fires only on attempt 1 and only before torchrun's first restart."""
    error_at: ErrorAtSpec | None = None
    """Fault injection: a rank raises a registered error at a step, on every attempt (a
    deterministic failure, which must end the run once, with its code)."""
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
    rollout_worker: bool | None = None
    """Test hook: ``True`` forces RLVR's separate rollout worker, ``False`` the synchronous
    loop; ``None``: the engine chooses."""
    rollout_lookahead: int | None = None
    """Test hook: how far past the trainer's latest request RLVR's separate rollout worker may
    generate; ``None``: ``max_staleness`` (deeper only generates batches the staleness gate
    drops). A deeper one exercises the gate."""
    restart_from: RestartFrom | None = None
    """A human-approved restart: resume from exactly this checkpoint, skipping a data window."""
    replica: Replica | None = None
    """Set for runs with several replica groups."""
    storage_root: Path | None = None
    """The booking's storage root (resolved) that ``checkpoint_dir`` lies in: every checkpoint
    write, prune and delete re-proves the directories from it down (no link among them).
    ``None``: ``checkpoint_dir`` itself is the root (the engine run alone, in tests)."""
    layout: LayoutSpec | None = None
    """The planned parallel layout; ``None``: FSDP over every rank
    (:meth:`ito.pipeline.layout.EngineLayout.default`)."""
    accelerator: BookedAccelerator | None = None
    """The booked accelerator, checked before training (:mod:`ito.pipeline.accelerator`);
    ``None``: not checked (the engine run alone, in tests)."""
    initial_weights: InitialWeightsSpec | None = None
    """What the run starts from, loaded before step 0 when there is no checkpoint of its own
    to resume (:mod:`ito.pipeline.initial_weights`); ``None``: the seeded random
    initialisation."""
    provenance_sha256: str | None = None
    """The data-preparation report bound to the run: a prepared shard is read only if
    ``provenance.json`` has this digest and lists the shard's digest
    (:func:`ito.pipeline.data.read_documents`). ``None``: read as they are (tests)."""
    recorded_checkpoints: frozenset[str] = frozenset()
    """Digests of the checkpoints the server recorded for the run; with the journal's
    (``events_path``), the only ones resumed from or pruned."""
    document: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)
    """The spec as read, for logging."""

    @property
    def checkpoint_storage(self) -> StoragePath:
        """``checkpoint_dir`` as its root and the components below it."""
        if self.storage_root is None:
            return StoragePath(self.checkpoint_dir)
        return StoragePath(
            self.storage_root, self.checkpoint_dir.relative_to(self.storage_root).parts
        )

    @property
    def stop_path(self) -> Path:
        return stop_file(self.workdir, self.attempt)


def load_spec(path: Path) -> RunSpec:
    """Read and check ``spec.json`` against :class:`~ito.core.run_spec.RunSpecDocument`;
    raises ``ValueError`` naming the offending field (``spec.<field>``)."""
    raw = path.read_text(encoding="utf-8")
    try:
        doc = RunSpecDocument.model_validate_json(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in first["loc"])
        raise ValueError(f"spec{where}: {first['msg']}") from None
    manifest = parse_manifest(json.dumps(doc.manifest).encode())
    post = [n for n in ("sft", "dpo", "rlvr") if getattr(manifest.post_training, n) is not None]
    stages = tuple(doc.stages or [*(s.stage for s in manifest.curriculum), *post])
    known = [s.stage for s in manifest.curriculum] + post
    for i, name in enumerate(stages):
        if name not in known:
            raise ValueError(
                f"spec.stages[{i}]: {name!r} is not a curriculum or post-training stage of "
                "the manifest"
            )
    order = [known.index(name) for name in stages]
    if order != sorted(set(order)):
        raise ValueError("spec.stages: stages must be distinct and in the manifest's order")
    fail_at = None
    if doc.fail_at is not None:
        fail_at = FailAt(
            rank=doc.fail_at.rank,
            step=doc.fail_at.step,
            replica=doc.fail_at.replica,
            rejoin_after_steps=doc.fail_at.rejoin_after_steps,
        )
    restart = None
    if doc.restart_from is not None:
        restart = RestartFrom(step=doc.restart_from.step, skip_steps=doc.restart_from.skip_steps)
    return RunSpec(
        run_id=doc.run_id,
        attempt=doc.attempt,
        manifest=manifest,
        workdir=Path(doc.workdir),
        checkpoint_dir=Path(doc.checkpoint_dir),
        events_path=Path(doc.events_path),
        stages=stages,
        max_steps_per_stage=doc.max_steps_per_stage,
        fail_at=fail_at,
        error_at=doc.error_at,
        loss_spike_at=doc.loss_spike_at,
        pause_at_step=doc.pause_at_step,
        min_step_seconds=doc.min_step_seconds,
        restart_from=restart,
        rollout_worker=doc.rollout_worker,
        rollout_lookahead=doc.rollout_lookahead,
        storage_root=Path(doc.storage_root) if doc.storage_root is not None else None,
        layout=doc.layout,
        accelerator=doc.accelerator,
        initial_weights=doc.initial_weights,
        provenance_sha256=doc.provenance_sha256,
        recorded_checkpoints=frozenset(doc.recorded_checkpoints or ()),
        document=json.loads(raw),
    )
