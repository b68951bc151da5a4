"""The checkpointer proves its directories on disk before each save, commit and prune: a link
swapped in between two saves, or while a save is being written, refuses the step
(``checkpoint_storage_invalid``) and nothing outside the booking's storage is written or pruned
(DESIGN §7.3). One process, a real gloo group, real DCP files."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from ito.core.errors import ItoError
from ito.pipeline.checkpoint import COMMIT, Checkpointer, committed_checkpoints
from ito.pipeline.events import EventWriter
from ito.pipeline.storage_fs import StoragePath

RUN_DIR = ("runs", "run_x")


@pytest.fixture(scope="module")
def group() -> Iterator[dist.ProcessGroup]:
    dist.init_process_group(
        "gloo",
        store=dist.HashStore(),  # type: ignore[attr-defined]
        rank=0,
        world_size=1,
    )
    try:
        yield dist.new_group(backend="gloo")
    finally:
        dist.destroy_process_group()


def _outside(tmp_path: Path) -> tuple[Path, dict[str, bytes]]:
    outside = tmp_path / "outside"
    step = outside / "step_00000001"
    step.mkdir(parents=True)
    (step / COMMIT).write_text(json.dumps({"step": 1, "stage": "pretrain"}))
    (step / "precious.bin").write_bytes(b"\x01" * 256)
    return outside, _files(outside)


def _files(top: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(top)): p.read_bytes() if p.is_file() else b""
        for p in sorted(top.rglob("*"))
    }


def _checkpointer(tmp_path: Path, group: dist.ProcessGroup) -> tuple[Checkpointer, Path]:
    root = tmp_path / "storage"
    (root / "runs").mkdir(parents=True)
    events = EventWriter(tmp_path / "events.jsonl", enabled=True)
    return Checkpointer(StoragePath(root, RUN_DIR), 1, events, group), root / "runs" / "run_x"


def _save(ckpt: Checkpointer, step: int) -> None:
    model = torch.nn.Linear(4, 4)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    ckpt.save(
        stage="pretrain",
        step=step,
        tokens_seen=step,
        model=model,
        optimizer=optimizer,
        trainer={"step": step},
    )


def test_a_stage_directory_swapped_for_a_link_refuses_the_next_save_and_prunes_nothing(
    tmp_path: Path, group: dist.ProcessGroup
) -> None:
    outside, before = _outside(tmp_path)
    ckpt, run_dir = _checkpointer(tmp_path, group)
    _save(ckpt, 2)
    ckpt.finish()
    assert [c.step for c in committed_checkpoints(StoragePath(tmp_path / "storage", RUN_DIR))] == [
        2
    ]

    os.rename(run_dir / "pretrain", tmp_path / "moved-away")
    (run_dir / "pretrain").symlink_to(outside)
    with pytest.raises(ItoError) as refused:
        _save(ckpt, 3)
    assert refused.value.code == "checkpoint_storage_invalid"
    assert _files(outside) == before
    ckpt.close()


def test_a_run_directory_swapped_while_a_save_is_written_is_never_committed(
    tmp_path: Path, group: dist.ProcessGroup
) -> None:
    outside, before = _outside(tmp_path)
    ckpt, run_dir = _checkpointer(tmp_path, group)
    _save(ckpt, 4)
    os.rename(run_dir, tmp_path / "moved-away")
    run_dir.symlink_to(outside)
    with pytest.raises(ItoError) as refused:
        ckpt.finish()
    assert refused.value.code == "checkpoint_storage_invalid"
    assert _files(outside) == before
    # What was written went into the directory proven at the save, never committed.
    assert not (tmp_path / "moved-away" / "pretrain" / "step_00000004" / COMMIT).exists()
    ckpt.close()


def test_a_step_another_replica_group_of_the_run_committed_is_kept_not_saved_again(
    tmp_path: Path, group: dist.ProcessGroup
) -> None:
    """Two replica groups share the run's storage and journal: the one that came up late
    trains steps the other already committed. Its save of such a step keeps the commit (a
    second save would race it), while a committed directory the run never recorded still
    refuses the save."""
    root = tmp_path / "storage"
    (root / "runs").mkdir(parents=True)
    journal = tmp_path / "events.jsonl"
    storage = StoragePath(root, RUN_DIR)
    first = Checkpointer(storage, 2, EventWriter(journal, enabled=True), group, journal=journal)
    late = Checkpointer(storage, 2, EventWriter(journal, enabled=True), group, journal=journal)
    _save(first, 4)
    first.finish()
    step_dir = root / "runs" / "run_x" / "pretrain" / "step_00000004"
    committed = _files(step_dir)
    _save(late, 4)  # the late group's trusted set predates the commit: the journal has it
    late.finish()
    assert _files(step_dir) == committed
    lines = [json.loads(line) for line in journal.read_text().splitlines()]
    assert [e["step"] for e in lines if e["type"] == "checkpoint"] == [4]
    assert any(
        e["type"] == "log" and "already committed by this run" in e["message"] for e in lines
    )

    planted = root / "runs" / "run_x" / "pretrain" / "step_00000006"
    planted.mkdir()
    (planted / COMMIT).write_text(json.dumps({"step": 6, "stage": "pretrain"}))
    with pytest.raises(ItoError) as refused:
        _save(late, 6)
    assert refused.value.code == "checkpoint_storage_invalid"
