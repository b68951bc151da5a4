"""The engine's pure parts, in one process: spec checks, the held-out split, the data order,
the schedule, the tokenizer, the events file and which checkpoint directories count."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import pytest
import torch

from ito.core.hardware import device_matches
from ito.core.manifest import parse_manifest
from ito.core.run_spec import BookedAccelerator
from ito.pipeline.accelerator import accelerator_problem
from ito.pipeline.checkpoint import COMMIT, committed_checkpoints, remove_uncommitted
from ito.pipeline.data import PackedData, pack, read_documents, split_heldout
from ito.pipeline.events import EventWriter
from ito.pipeline.model import (
    MIN_LR_RATIO,
    anneal_factor,
    build_scheduler,
    llama_config,
    lr_factor,
    rope_base,
    set_rope_base,
)
from ito.pipeline.spec import load_spec
from ito.pipeline.tokenizer import build_tokenizer, load_tokenizer
from ito.recipes import build_recipe


@pytest.fixture
def recipe_dir(tmp_path: Path) -> tuple[Path, dict[str, Any]]:
    data = tmp_path / "data"
    data.mkdir()
    recipe = build_recipe("test", str(data))
    for name, content in recipe.files.items():
        (data / name).write_bytes(content)
    return data, recipe.manifest


def write_spec(tmp_path: Path, manifest: dict[str, Any], **overrides: Any) -> Path:
    doc = {
        "run_id": "r",
        "attempt": 1,
        "manifest": manifest,
        "workdir": str(tmp_path / "w"),
        "checkpoint_dir": str(tmp_path / "c"),
        "events_path": str(tmp_path / "e.jsonl"),
        "stages": ["pretrain"],
        "max_steps_per_stage": None,
        "fail_at": None,
        "loss_spike_at": None,
        **overrides,
    }
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(doc))
    return path


def test_spec_reads_the_contract_and_refuses_unknown_stages_and_relative_paths(
    tmp_path: Path, recipe_dir: tuple[Path, dict[str, Any]]
) -> None:
    _, manifest = recipe_dir
    spec = load_spec(
        write_spec(tmp_path, manifest, fail_at={"rank": 1, "step": 5}, max_steps_per_stage=3)
    )
    assert spec.stages == ("pretrain",) and spec.max_steps_per_stage == 3
    assert spec.fail_at is not None and (spec.fail_at.rank, spec.fail_at.step) == (1, 5)
    assert spec.fail_at.rejoin_after_steps is None
    held = load_spec(
        write_spec(
            tmp_path,
            manifest,
            fail_at={"rank": 0, "step": 5, "replica": 1, "rejoin_after_steps": 6},
        )
    )
    assert held.fail_at is not None and held.fail_at.rejoin_after_steps == 6
    without = {
        **manifest,
        "curriculum": [s for s in manifest["curriculum"] if s["stage"] != "midtrain"],
    }
    with pytest.raises(ValueError, match=r"spec\.stages\[0\]"):
        load_spec(write_spec(tmp_path, without, stages=["midtrain"]))
    with pytest.raises(ValueError, match=r"spec\.workdir"):
        load_spec(write_spec(tmp_path, manifest, workdir="relative"))


def test_spec_carries_the_booked_accelerator_and_the_plan_and_refuses_an_unknown_one(
    tmp_path: Path, recipe_dir: tuple[Path, dict[str, Any]]
) -> None:
    _, manifest = recipe_dir
    layout = {"dp_shard": 4, "tp": 2, "param_dtype": "bfloat16"}
    spec = load_spec(
        write_spec(
            tmp_path, manifest, accelerator={"gpu": "h100", "gpus_per_node": 8}, layout=layout
        )
    )
    assert spec.accelerator is not None
    assert (spec.accelerator.gpu, spec.accelerator.gpus_per_node) == ("h100", 8)
    assert spec.layout is not None
    assert (spec.layout.dp_shard, spec.layout.tp, spec.layout.param_dtype) == (4, 2, "bfloat16")
    with pytest.raises(ValueError, match=r"spec\.accelerator\.gpu"):
        load_spec(write_spec(tmp_path, manifest, accelerator={"gpu": "tpu", "gpus_per_node": 8}))


def test_the_cpu_stand_in_needs_no_device_and_a_gpu_booking_needs_its_gpus() -> None:
    assert accelerator_problem(None) is None
    assert accelerator_problem(BookedAccelerator(gpu="cpu", gpus_per_node=2)) is None
    problem = accelerator_problem(BookedAccelerator(gpu="h100", gpus_per_node=1))
    if not torch.cuda.is_available():
        assert problem is not None and "h100" in problem
    elif not device_matches("h100", torch.cuda.get_device_name(0)):
        assert problem is not None
    else:
        assert problem is None
    # More GPUs per node than any machine has is refused wherever this runs.
    assert accelerator_problem(BookedAccelerator(gpu="h100", gpus_per_node=1024)) is not None


def test_heldout_split_is_disjoint_stable_and_never_empty(
    recipe_dir: tuple[Path, dict[str, Any]], tmp_path: Path
) -> None:
    _, manifest = recipe_dir
    ref = parse_manifest(json.dumps(manifest).encode()).data_by_id()["web"]
    docs = read_documents(ref, tmp_path)
    train, held = split_heldout(docs, "pretrain")
    assert held and train and not set(train) & set(held)
    assert len(train) + len(held) == len(docs)
    assert split_heldout(list(reversed(docs)), "pretrain")[1] == list(reversed(held))
    assert split_heldout(["a", "b"], "pretrain")[1] != []
    assert split_heldout(docs, "eval") == ([], docs)


def test_data_file_that_does_not_match_its_digest_is_refused_unless_prepared(
    recipe_dir: tuple[Path, dict[str, Any]], tmp_path: Path
) -> None:
    data, manifest = recipe_dir
    ref = parse_manifest(json.dumps(manifest).encode()).data_by_id()["web"]
    (data / "web.jsonl").write_text('{"text": "tampered"}\n')
    with pytest.raises(ValueError, match="sha256"):
        read_documents(ref, tmp_path)
    (tmp_path / "prepared").mkdir()
    (tmp_path / "prepared" / "web.jsonl").write_text('{"text": "clean"}\n')
    assert read_documents(ref, tmp_path) == ["clean"]


def test_tokenizer_is_deterministic_and_packs_full_rows(tmp_path: Path) -> None:
    texts = [f"we know that {i} plus {i + 1} makes {2 * i + 1} ." for i in range(300)]
    build_tokenizer(texts, 300, tmp_path / "a")
    build_tokenizer(texts, 300, tmp_path / "b")
    assert (tmp_path / "a" / "tokenizer.json").read_bytes() == (
        tmp_path / "b" / "tokenizer.json"
    ).read_bytes()
    tokenizer = load_tokenizer(tmp_path / "a")
    rows = pack(tokenizer, texts, 16)
    assert rows.shape[1] == 16 and rows.dtype == torch.long
    assert tokenizer.decode(rows[0].tolist()).startswith("we know that 0 plus 1")


def test_batches_are_a_pure_function_of_step_and_rank_and_cover_the_data() -> None:
    sequences = torch.arange(40).view(10, 4)
    a, b = PackedData(sequences, seed=7, stage_index=0), PackedData(sequences, 7, 0)
    assert torch.equal(a.batch(3, 1, 2, 2), b.batch(3, 1, 2, 2))
    # One epoch = 10 sequences = steps 0..4 of 2 ranks × 1; every sequence exactly once.
    seen = [int(a.batch(k, r, 2, 1)[0, 0]) // 4 for k in range(5) for r in range(2)]
    assert sorted(seen) == list(range(10))
    assert not torch.equal(PackedData(sequences, 8, 0).batch(0, 0, 1, 10), a.batch(0, 0, 1, 10))


def test_schedule_warms_up_linearly_then_decays_to_a_tenth() -> None:
    assert lr_factor(0, 100) == pytest.approx(0.1)
    assert lr_factor(9, 100) == pytest.approx(1.0)
    assert lr_factor(10, 100) == pytest.approx(1.0)
    assert lr_factor(100, 100) == pytest.approx(MIN_LR_RATIO)
    values = [lr_factor(s, 100) for s in range(10, 101)]
    assert all(x >= y for x, y in itertools.pairwise(values))


def test_midtrain_warms_up_then_anneals_linearly_to_zero() -> None:
    values = [anneal_factor(s, 100) for s in range(101)]
    assert values[0] == pytest.approx(0.1) and values[9] == pytest.approx(1.0)
    assert values[10] == pytest.approx(1.0) and values[100] == 0.0
    steps = [x - y for x, y in itertools.pairwise(values[10:])]
    assert all(d == pytest.approx(1 / 90) for d in steps)
    # The scheduler the engine builds for the stage follows the same line.
    param = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.SGD([param], lr=2.0)
    scheduler = build_scheduler(optimizer, 20, anneal=True)
    rates = []
    for _ in range(20):
        rates.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    assert rates == pytest.approx([2.0 * anneal_factor(k, 20) for k in range(20)])


def test_a_scaled_rope_base_is_the_model_built_with_that_base() -> None:
    from ito.core.model_sizes import SIZES

    size = SIZES["tiny"]
    from transformers import LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(llama_config(size))
    base = rope_base(llama_config(size))
    tokens = torch.randint(0, size.vocab, (2, 64))
    before = model(tokens).logits
    assert set_rope_base(model, base * 4) >= 1
    scaled = model(tokens).logits
    assert not torch.allclose(before, scaled)  # positions are encoded differently
    # A model configured with θ × 4 and the same weights answers the same.
    config = llama_config(size)
    config.rope_parameters = {**dict(config.rope_parameters or {}), "rope_theta": base * 4}
    reference = LlamaForCausalLM(config)
    reference.load_state_dict(model.state_dict())
    torch.testing.assert_close(reference(tokens).logits, scaled)
    # And back.
    set_rope_base(model, base)
    torch.testing.assert_close(model(tokens).logits, before)


def test_events_are_whole_json_lines_and_non_finite_numbers_become_null(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    writer = EventWriter(path, enabled=True)
    writer.emit("metric", stage="pretrain", step=1, values={"loss": float("nan"), "lr": 1.0})
    writer.log("info", "hello")
    writer.close()
    EventWriter(tmp_path / "other.jsonl", enabled=False).emit("log", message="dropped")
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert lines[0]["values"] == {"loss": None, "lr": 1.0} and lines[0]["type"] == "metric"
    assert lines[1] == {**lines[1], "type": "log", "level": "info", "message": "hello"}
    assert all(isinstance(line["ts"], float) for line in lines)
    assert not (tmp_path / "other.jsonl").exists()


def test_only_directories_with_a_valid_commit_marker_count(tmp_path: Path) -> None:
    def step_dir(stage: str, step: int, commit: dict[str, Any] | str | None) -> Path:
        path = tmp_path / stage / f"step_{step:08d}"
        path.mkdir(parents=True)
        if commit is not None:
            text = commit if isinstance(commit, str) else json.dumps(commit)
            (path / COMMIT).write_text(text)
        return path

    step_dir("pretrain", 3, {"step": 3, "stage": "pretrain"})
    step_dir("pretrain", 6, None)
    step_dir("pretrain", 7, "{not json")
    step_dir("pretrain", 8, {"step": 9, "stage": "pretrain"})
    step_dir("long_context", 9, {"step": 9, "stage": "pretrain"})
    assert [(c.stage, c.step) for c in committed_checkpoints(tmp_path)] == [("pretrain", 3)]
    removed = remove_uncommitted(tmp_path)
    assert [p.name for p in removed] == ["step_00000006"]
    assert (tmp_path / "pretrain" / "step_00000003").exists()
