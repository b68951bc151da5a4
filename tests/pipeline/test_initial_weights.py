"""Initial weights (``model.revision``) loaded by the engine: real ``torchrun`` with two gloo
processes (FSDP over both) on the test recipe.

A first run trains pretrain and commits its checkpoints and export; runs that start from its
checkpoint (DCP, model part only) or from its Hugging Face export must measure, at their step 0,
the first run's last held-out loss — not a random model's — and a digest that does not match
refuses the run before it trains.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.pipeline.equivalence_layouts import LAYOUTS
from tests.pipeline.test_pretrain_engine import MAX_STEPS, events, make_spec, torchrun

pytestmark = pytest.mark.slow

EVAL = "eval/heldout_loss/web"
TARGETS = ["dp_shard_2", "one_process", "tp_2", "pp_2"]
"""Layouts the loading runs use (the source trains FSDP over two processes): DCP reshards the
checkpoint, the Hugging Face slices follow each layout's shards."""


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("source")
    result = torchrun(make_spec(root, stages=["pretrain"]))
    assert result.returncode == 0, result.stdout[-4000:]
    return root


def _step0_eval(evs: list[dict[str, Any]]) -> float:
    (value,) = [
        e["values"][EVAL]
        for e in evs
        if e["type"] == "metric" and e["step"] == 0 and EVAL in e["values"]
    ]
    return float(value)


def _last_gate_value(evs: list[dict[str, Any]]) -> float:
    gate = [e for e in evs if e["type"] == "gate"][-1]
    (result,) = gate["results"]
    return float(result["value"])


def _start_from(
    tmp_path: Path,
    weights: dict[str, Any],
    *,
    target: str = "dp_shard_2",
    refused: bool = False,
    stages: tuple[str, ...] = ("pretrain",),
    rope_base_scale: float | None = None,
) -> list[dict[str, Any]]:
    nproc, layout = LAYOUTS[target]
    spec = make_spec(
        tmp_path,
        run_id="run-test-2",
        stages=list(stages),
        max_steps_per_stage=1,
        initial_weights=weights,
        layout=layout,
    )
    if rope_base_scale is not None:
        _scale_long_context(spec, rope_base_scale)
    result = torchrun(spec, nproc=nproc)
    # A refusal with a code ends the ranks cleanly, once (exit 0: no torchrun restart); the
    # final event carries the code the worker fails the run with.
    assert result.returncode == 0, result.stdout[-4000:]
    evs = events(tmp_path)
    assert (evs[-1]["type"] == "done" and evs[-1]["status"] == "failed") == refused
    return evs


@pytest.mark.parametrize("target", TARGETS)
def test_a_run_from_a_committed_checkpoint_starts_at_its_eval_loss(
    source: Path, tmp_path: Path, target: str
) -> None:
    evs = events(source)
    (ckpt,) = [e for e in evs if e["type"] == "checkpoint" and e["step"] == MAX_STEPS]
    weights = {
        "kind": "run",
        "path": ckpt["path"],
        "sha256": ckpt["sha256"],
        "revision": f"run:run_source@{MAX_STEPS}",
    }
    started = _start_from(tmp_path, weights, target=target)
    # One step cannot improve 5 % on trained weights: the test recipe's gate (relative to step
    # 0, now the loaded model) fails it, which is the gate's business, not this test's.
    assert started[-1]["type"] == "done" and started[-1]["status"] in ("succeeded", "gate_failed")
    assert [e["step"] for e in started if e["type"] == "metric" and "loss" in e["values"]] == [1]
    assert any(
        e["type"] == "log" and e["message"].startswith("initial weights loaded") for e in started
    )
    trained, random_model = _last_gate_value(evs), _step0_eval(evs)
    assert random_model > 5.0  # the untrained model: about ln(vocab)
    assert math.isclose(_step0_eval(started), trained, rel_tol=1e-4)
    assert _step0_eval(started) < random_model - 1.0


@pytest.mark.parametrize("target", TARGETS)
def test_a_run_from_a_hugging_face_export_starts_at_its_eval_loss(
    source: Path, tmp_path: Path, target: str
) -> None:
    evs = events(source)
    (export,) = [e for e in evs if e["type"] == "export"]
    weights = {
        "kind": "hf",
        "path": export["path"],
        "sha256": export["sha256"],
        "revision": f"hf:{export['path']}@sha256:{export['sha256']}",
    }
    started = _start_from(tmp_path, weights, target=target)
    assert started[-1]["type"] == "done" and started[-1]["status"] in ("succeeded", "gate_failed")
    assert math.isclose(_step0_eval(started), _last_gate_value(evs), rel_tol=1e-4)


LONG_SCALE = 1000.0
"""The largest long-context RoPE scale a manifest takes: the test model is weak, its loss
depends little on the base."""


def _scale_long_context(spec: Path, scale: float) -> None:
    doc = json.loads(spec.read_text())
    (stage,) = [s for s in doc["manifest"]["curriculum"] if s["stage"] == "long_context"]
    stage["rope_base_scale"] = scale
    spec.write_text(json.dumps(doc))


@pytest.fixture(scope="module")
def long_source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A source whose last stage trained with the long-context RoPE base."""
    root = tmp_path_factory.mktemp("long-source")
    spec = make_spec(root, stages=["pretrain", "long_context"])
    _scale_long_context(spec, LONG_SCALE)
    result = torchrun(spec)
    assert result.returncode == 0, result.stdout[-4000:]
    return root


@pytest.mark.parametrize("kind", ["run", "hf"])
def test_weights_trained_with_the_long_context_rope_base_start_at_their_eval_loss(
    long_source: Path, tmp_path: Path, kind: str
) -> None:
    """Step 0 measures the loaded weights with the RoPE base of the stage that gates on it:
    with the model's own base instead, long-context weights read another loss than their
    source's."""
    evs = events(long_source)
    if kind == "run":
        found = max(
            (e for e in evs if e["type"] == "checkpoint" and "/long_context/" in e["path"]),
            key=lambda e: e["step"],
        )
        revision = f"run:run_source@{found['step']}"
    else:
        (found,) = [e for e in evs if e["type"] == "export" and e["stage"] == "long_context"]
        revision = f"hf:{found['path']}@sha256:{found['sha256']}"
    weights = {"kind": kind, "path": found["path"], "sha256": found["sha256"], "revision": revision}
    started = _start_from(tmp_path, weights, stages=("long_context",), rope_base_scale=LONG_SCALE)
    assert started[-1]["type"] == "done" and started[-1]["status"] in ("succeeded", "gate_failed")
    # The same weights, layout and eval batches give the same value to the last bit; with the
    # model's own base the weak test model reads 4e-5 off (4.88599 against 4.88578).
    assert math.isclose(_step0_eval(started), _last_gate_value(evs), rel_tol=1e-9)


@pytest.mark.parametrize("kind", ["run", "hf"])
def test_weights_whose_digest_differs_refuse_the_run_before_it_trains(
    source: Path, tmp_path: Path, kind: str
) -> None:
    evs = events(source)
    if kind == "run":
        (found,) = [e for e in evs if e["type"] == "checkpoint" and e["step"] == MAX_STEPS]
    else:
        (found,) = [e for e in evs if e["type"] == "export"]
    weights = {"kind": kind, "path": found["path"], "sha256": "0" * 64, "revision": "x"}
    started = _start_from(tmp_path, weights, refused=True)
    done = started[-1]
    assert done["type"] == "done" and done["status"] == "failed"
    assert done["code"] == "revision_unresolvable"
    assert not [e for e in started if e["type"] == "metric" and "loss" in e["values"]]


def test_weights_trained_with_another_vocabulary_refuse_the_run(
    source: Path, tmp_path: Path
) -> None:
    """The export's own tokenizer with two tokens' ids swapped: the weights would be read with
    the wrong ids, so the run is refused instead of learning from garbage."""
    (export,) = [e for e in events(source) if e["type"] == "export"]
    directory = tmp_path / "export"
    shutil.copytree(export["path"], directory)
    document = json.loads((directory / "tokenizer.json").read_text())
    vocab = document["model"]["vocab"]
    first, second = sorted(vocab, key=vocab.get)[300:302]
    vocab[first], vocab[second] = vocab[second], vocab[first]
    (directory / "tokenizer.json").write_text(json.dumps(document))
    weights = {
        "kind": "hf",
        "path": str(directory),
        "sha256": export["sha256"],
        "revision": f"hf:{directory}@sha256:{export['sha256']}",
    }
    started = _start_from(tmp_path / "run", weights, refused=True)
    done = started[-1]
    assert done["type"] == "done" and done["code"] == "revision_unresolvable"
    assert not [e for e in started if e["type"] == "metric" and "loss" in e["values"]]


def test_a_directory_reached_through_a_link_in_the_booking_storage_is_refused(
    source: Path, tmp_path: Path
) -> None:
    """Below the booking's storage the engine proves the directory on disk as it proves its
    checkpoints: a link in its place (here to the real export, elsewhere) is not followed."""
    (export,) = [e for e in events(source) if e["type"] == "export"]
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "tiny").symlink_to(export["path"])
    weights = {
        "kind": "hf",
        "path": str(tmp_path / "models" / "tiny"),
        "sha256": export["sha256"],
        "revision": "hf-link",
    }
    spec = make_spec(
        tmp_path,
        run_id="run-test-3",
        stages=["pretrain"],
        max_steps_per_stage=1,
        initial_weights=weights,
        storage_root=str(tmp_path),
    )
    result = torchrun(spec)
    assert result.returncode == 0  # a coded refusal: once, cleanly
    done = events(tmp_path)[-1]
    assert done["type"] == "done" and done["code"] == "revision_unresolvable"
