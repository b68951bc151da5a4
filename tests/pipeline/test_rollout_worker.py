"""The rollout worker's weight assembly: the shards the trainer ranks publish, joined back into
the whole model (the end-to-end path — publish under torchrun, assemble in the worker, the same
losses as the synchronous loop — is in ``test_post_training_engine``)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, cast

import pytest
import torch

from ito.core.errors import ItoError
from ito.pipeline.rollout_worker import RolloutClient, WorkerConfig, assemble

if TYPE_CHECKING:
    from ito.pipeline.post_training import RlvrStep


def test_shards_of_uneven_sizes_and_replicated_parameters_assemble_into_the_whole_model(
    tmp_path: Path,
) -> None:
    # FSDP2 splits dim 0 as torch.chunk does: 5 rows over 2 ranks are 3 + 2; 1 row over 2
    # ranks leaves rank 1 an empty shard.
    whole = {
        "w": torch.arange(20.0).reshape(5, 4),
        "one": torch.ones(1, 3),
        "cols": torch.arange(6.0).reshape(2, 3),
        "norm": torch.full((4,), 2.0),
    }
    world = 2
    for rank in range(world):
        shards: dict[str, tuple[torch.Tensor, int | None, tuple[int, ...]]] = {}
        for name in ("w", "one"):
            chunks = list(torch.chunk(whole[name], world, dim=0))
            chunks += [whole[name][:0]] * (world - len(chunks))
            shards[name] = (chunks[rank].clone(), 0, tuple(whole[name].shape))
        shards["cols"] = (
            torch.chunk(whole["cols"], world, dim=1)[rank].clone(),
            1,
            tuple(whole["cols"].shape),
        )
        shards["norm"] = (whole["norm"].clone(), None, tuple(whole["norm"].shape))
        torch.save(shards, tmp_path / f"rank{rank}.pt")
    state = assemble(tmp_path, world)
    assert set(state) == set(whole)
    for name, value in whole.items():
        assert torch.equal(state[name], value), name


def test_a_worker_that_failed_ends_the_trainers_wait_with_its_code(tmp_path: Path) -> None:
    """A rank without the worker's process (rank 1) learns of its failure from the error
    file the worker leaves, instead of waiting for a batch that never comes."""
    config = WorkerConfig(
        rlvr=cast("RlvrStep", None),
        size="tiny",
        rope_base=10_000.0,
        world=2,
        first=0,
        end=1,
        lookahead=0,
        max_staleness=0,
    )
    client = RolloutClient(tmp_path, config, rank=1)
    (tmp_path / "error").write_text("Traceback: the worker fell over")
    with pytest.raises(ItoError) as caught:
        client._wait(tmp_path / "batch-0-0.pt")
    assert caught.value.code == "rollout_worker_failed"
