"""The engine applies the planned layout (DESIGN §7.2): the same run on one process, FSDP over
two, tensor parallel over two, HSDP over two, FSDP × TP over four, a two-stage 1F1B pipeline
and that pipeline with tensor (and sequence) parallel over four give the same loss curve
(fp32, same data and seed, the same global batch of 8 sequences); a checkpoint written under one
layout resumes under another (DCP resharding) and continues the curve; a degree the engine
cannot apply, or degrees that do not make the world, end the run before training with their
code.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from ito.core.errors import ItoError
from ito.core.run_spec import LayoutSpec
from ito.pipeline.layout import EngineLayout
from tests.pipeline.distributed_checks import assert_check_passes
from tests.pipeline.equivalence_layouts import LAYOUTS
from tests.pipeline.test_pretrain_engine import (
    assert_same_losses,
    events,
    losses,
    make_spec,
    torchrun,
)

STEPS = 20
SEQ_LEN = 128
GLOBAL_SEQUENCES = 8
REL_TOL = 1e-5


def layout_spec(root: Path, layout: dict[str, Any] | None, **overrides: Any) -> Path:
    path = make_spec(root, stages=["pretrain"], max_steps_per_stage=STEPS, **overrides)
    doc = json.loads(path.read_text())
    doc["manifest"]["curriculum"][0]["tokens"] = GLOBAL_SEQUENCES * SEQ_LEN * STEPS
    doc["manifest"]["checkpoint"] = {"every_steps": 5, "keep_last": 4, "storage": "booking"}
    doc["layout"] = layout
    path.write_text(json.dumps(doc))
    return path


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    roots = {}
    for name, (nproc, layout) in LAYOUTS.items():
        root = tmp_path_factory.mktemp(name)
        result = torchrun(layout_spec(root, layout), nproc=nproc)
        assert result.returncode == 0, result.stdout[-4000:]
        roots[name] = root
    return roots


# ---- the layout as the spec gives it (pure) ---------------------------------------------------


def test_a_spec_without_a_layout_is_fsdp_over_every_rank() -> None:
    layout = EngineLayout.from_spec(None, 8)
    assert layout.degrees == {"pp": 1, "dp_replicate": 1, "dp_shard": 8, "cp": 1, "tp": 1}
    assert (layout.micro_batch, layout.grad_accum, layout.planned) == (4, 1, False)


@pytest.mark.parametrize(
    ("fields", "world", "code"),
    [
        ({"pp": 2, "pp_microbatches": 1}, 2, "layout_unsupported"),
        ({"pp": 2, "pp_microbatches": 2, "grad_accum": 2}, 2, "layout_unsupported"),
        ({"cp": 2}, 2, "layout_unsupported"),
        ({"pp_microbatches": 4, "dp_shard": 2}, 2, "layout_unsupported"),
        ({"dp_shard": 2, "tp": 2}, 2, "mesh_mismatch"),
        ({"dp_shard": 1}, 2, "mesh_mismatch"),
    ],
)
def test_a_layout_the_engine_cannot_apply_exactly_is_refused(
    fields: dict[str, int], world: int, code: str
) -> None:
    with pytest.raises(ItoError) as caught:
        EngineLayout.from_spec(LayoutSpec(**fields), world)  # type: ignore[arg-type]
    assert caught.value.code == code


# ---- real runs under torchrun -----------------------------------------------------------------


@pytest.mark.slow
def test_every_layout_gives_the_same_losses_for_twenty_steps(runs: dict[str, Path]) -> None:
    reference = dict(losses(events(runs["one_process"])))
    assert sorted(reference) == list(range(1, STEPS + 1))
    assert reference[STEPS] < reference[1] - 0.5
    for name, root in runs.items():
        evs = events(root)
        assert evs[-1]["type"] == "done" and evs[-1]["status"] == "succeeded", name
        assert [s for s, _ in losses(evs)] == list(range(1, STEPS + 1)), name
        assert_same_losses(losses(evs), reference)


@pytest.mark.slow
def test_every_layout_exports_the_whole_model_with_the_same_weights(
    runs: dict[str, Path],
) -> None:
    """Sharded (FSDP, TP, HSDP) or split into pipeline stages, the export holds every
    parameter of the model, whole, and they are the one-process run's (to the losses'
    tolerance)."""

    def weights(root: Path) -> dict[str, torch.Tensor]:
        (export,) = [e for e in events(root) if e["type"] == "export"]
        return load_file(str(Path(export["path"]) / "model.safetensors"))

    reference = weights(runs["one_process"])
    for name, root in runs.items():
        mine = weights(root)
        assert sorted(mine) == sorted(reference), name
        for key, tensor in mine.items():
            assert tensor.shape == reference[key].shape, (name, key)
            # AdamW normalises each update: an element whose gradient is near zero can move by
            # up to the learning rate (3e-3) on a sign the summation order flips, so weights
            # trained under another layout agree to a fraction of that.
            assert torch.allclose(tensor, reference[key], rtol=1e-3, atol=1e-3), (name, key)


@pytest.mark.slow
def test_each_run_reports_the_mesh_it_built_as_planned(runs: dict[str, Path]) -> None:
    for name, (nproc, layout) in LAYOUTS.items():
        (mesh,) = [e for e in events(runs[name]) if e["type"] == "mesh"]
        planned = {
            dim: layout.get(dim, 1) for dim in ("pp", "dp_replicate", "dp_shard", "cp", "tp")
        }
        assert mesh["dims"] == planned, name
        assert math.prod(mesh["dims"].values()) == nproc
        assert list(mesh["dims"]) == ["pp", "dp_replicate", "dp_shard", "cp", "tp"]
        assert mesh["planned"] is True and mesh["param_dtype"] == "float32"
        assert (mesh["micro_batch"], mesh["grad_accum"], mesh["pp_microbatches"]) == (
            layout["micro_batch"],
            layout.get("grad_accum", 1),
            layout.get("pp_microbatches", 1),
        )
        assert mesh["activation_checkpointing"] == layout.get("activation_checkpointing", "none")


@pytest.mark.slow
@pytest.mark.parametrize("target", ["tp_2", "one_process", "pp_2"])
def test_a_checkpoint_written_at_dp_shard_2_resumes_under_another_layout(
    runs: dict[str, Path], tmp_path: Path, target: str
) -> None:
    # The dp_shard=2 run's checkpoints, cut back to step 10.
    shutil.copytree(runs["dp_shard_2"] / "ckpt", tmp_path / "ckpt")
    for step in (15, 20):
        shutil.rmtree(tmp_path / "ckpt" / "pretrain" / f"step_{step:08d}")
    nproc, layout = LAYOUTS[target]
    # A later attempt of that run: it may resume from the checkpoints the server recorded.
    recorded = [e["sha256"] for e in events(runs["dp_shard_2"]) if e["type"] == "checkpoint"]
    result = torchrun(layout_spec(tmp_path, layout, recorded_checkpoints=recorded), nproc=nproc)
    assert result.returncode == 0, result.stdout[-4000:]
    evs = events(tmp_path)
    # Resumed at step 10: the losses start at 11 and follow the saved run's curve.
    assert [s for s, _ in losses(evs)] == list(range(11, STEPS + 1))
    assert_same_losses(losses(evs), dict(losses(events(runs["dp_shard_2"]))))


@pytest.mark.slow
def test_a_context_parallel_degree_ends_the_run_layout_unsupported_before_training(
    tmp_path: Path,
) -> None:
    spec = layout_spec(tmp_path, {"cp": 2, "micro_batch": 4})
    result = torchrun(spec, nproc=2)
    assert result.returncode == 0  # a coded refusal ends the run once: no torchrun restart
    evs = events(tmp_path)
    assert evs[-1]["type"] == "done" and evs[-1]["status"] == "failed"
    assert evs[-1]["code"] == "layout_unsupported"
    assert not [e for e in evs if e["type"] in ("metric", "mesh")]


@pytest.mark.slow
def test_the_meta_device_model_gets_the_seeded_eager_initialisation_on_a_tp_fsdp_mesh() -> None:
    assert_check_passes("init_check.py", "dp_shard=1", "tp=2")


@pytest.mark.slow
@pytest.mark.parametrize("layout", [["dp_shard=1", "tp=2"], ["dp_shard=2"]], ids=["tp_2", "fsdp"])
def test_selective_checkpointing_replays_the_matmuls_the_planner_charges_for_with_and_without_tp(
    layout: list[str],
) -> None:
    """Under tensor parallel the o projection's matmul runs again in the backward (down's is
    marked too, but the checkpoint stops replaying before it); without, no matmul does."""
    assert_check_passes("recompute_check.py", *layout)
