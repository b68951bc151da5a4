"""The event models (:mod:`ito.core.pipeline_events`): every event type the engine writes is one
model, each field bounded and typed; anything else is refused, naming where and never echoing
what it said."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from ito.core.pipeline_events import (
    LOG_MESSAGE_MAX_CHARS,
    CheckpointEvent,
    DoneEvent,
    GateEvent,
    LogEvent,
    MeshEvent,
    MetricEvent,
    RestartEvent,
    SpikeEvent,
    StageEvent,
    parse_event_line,
    pipeline_event,
    reported_event,
)
from ito.pipeline.events import EventWriter

WRITTEN: list[tuple[str, dict[str, Any], type]] = [
    ("log", {"level": "error", "message": "Traceback …"}, LogEvent),
    ("stage", {"stage": "pretrain", "status": "started"}, StageEvent),
    (
        "metric",
        {
            "stage": "pretrain",
            "step": 3,
            "values": {
                "loss": 2.5,
                "lr": 1e-3,
                "grad_norm": 0.7,
                "tokens_per_s": 1e4,
                "mfu": None,
                "step_seconds": 0.2,
                "replicas": 2,
            },
        },
        MetricEvent,
    ),
    (
        "checkpoint",
        {
            "stage": "pretrain",
            "step": 4,
            "path": "/s/runs/r/pretrain/step_4",
            "bytes": 12345,
            "seconds": 0.5,
            "blocking_seconds": 0.01,
        },
        CheckpointEvent,
    ),
    (
        "gate",
        {
            "stage": "pretrain",
            "battery": "b",
            "passed": False,
            "results": [
                {
                    "eval": "heldout_loss",
                    "data": "web",
                    "value": 3.1,
                    "threshold": 3.0,
                    "passed": False,
                    "initial": 6.0,
                    "rule": "heldout_loss(web) ≤ 0.5 × step 0",
                },
                {
                    "eval": "exact_match",
                    "data": "arith",
                    "value": None,
                    "threshold": 0.5,
                    "passed": False,
                    "initial": None,
                    "rule": "exact_match(arith) ≥ 0.5",
                },
            ],
        },
        GateEvent,
    ),
    (
        "gate",
        {
            "stage": "ladder",
            "battery": "core",
            "passed": False,
            "results": [
                {
                    "eval": "heldout_loss",
                    "data": "web",
                    "value": 4.56,
                    "reference": 4.05,
                    "threshold": 4.0905,
                    "passed": False,
                    "rule": "heldout_loss(web) with custom ≤ 1.01 × without",
                },
            ],
            "ladder": {
                "proxy_size": "tiny",
                "margin": 0.01,
                "stage": "pretrain",
                "reference_data": ["web"],
                "custom_data": ["custom"],
                "tokens": 19456,
                "steps": 19,
                "seconds": {"reference": 1.0, "with_custom": 1.2},
            },
        },
        GateEvent,
    ),
    ("restart", {"restarts": 1}, RestartEvent),
    (
        "spike",
        {
            "stage": "pretrain",
            "step": 9,
            "loss": 12.0,
            "z": None,
            "checkpoint_step": 8,
            "skip_steps": 1,
        },
        SpikeEvent,
    ),
    (
        "mesh",
        {
            "dims": {"pp": 1, "dp_replicate": 2, "dp_shard": 4, "cp": 1, "tp": 8},
            "device": "cuda",
            "micro_batch": 1,
            "grad_accum": 2,
            "activation_checkpointing": "selective",
            "param_dtype": "bfloat16",
            "reduce_dtype": "float32",
            "planned": True,
        },
        MeshEvent,
    ),
    ("done", {"status": "stopped", "stage": "pretrain", "step": 8}, DoneEvent),
    (
        "done",
        {"status": "failed", "code": "checkpoint_storage_invalid", "reason": "link"},
        DoneEvent,
    ),
]


@pytest.mark.parametrize(("kind", "fields", "model"), WRITTEN)
def test_every_event_the_engine_writes_is_read_back_as_its_model(
    tmp_path: Path,
    kind: str,
    fields: dict[str, Any],
    model: type,
) -> None:
    path = tmp_path / "events.jsonl"
    writer = EventWriter(path, enabled=True)
    writer.emit(kind, **fields)
    writer.close()
    event = parse_event_line(path.read_bytes().strip())
    assert isinstance(event, model)
    assert event.model_dump(mode="json")["type"] == kind
    # Every field as the engine gave it (and none it did not give but its defaults).
    dumped = event.model_dump(mode="json", exclude_unset=True)
    assert {k: dumped[k] for k in fields} == fields
    assert event.ts is not None and event.ts > 0
    if kind != "done":
        assert reported_event(json.loads(path.read_bytes())) == event


@pytest.mark.parametrize(
    "bad",
    [
        {"type": "metric", "stage": "pretrain", "step": 1, "values": {"loss": float("nan")}},
        {"type": "metric", "stage": "pretrain", "step": 1, "values": {"loss": float("inf")}},
        {"type": "metric", "stage": "pretrain", "step": -1, "values": {}},
        {"type": "metric", "stage": "pretrain", "step": 2**31, "values": {}},
        {"type": "metric", "stage": "pretrain", "step": True, "values": {}},
        {"type": "metric", "stage": "pretrain", "step": 1, "values": {"bad name": 1.0}},
        {
            "type": "metric",
            "stage": "pretrain",
            "step": 1,
            "values": {f"m{i}": 1.0 for i in range(65)},
        },
        {"type": "stage", "stage": "x" * 31, "status": "started"},
        {"type": "log", "message": "x" * (6 * LOG_MESSAGE_MAX_CHARS + 1)},
        {"type": "log", "message": 5},
        {"type": "checkpoint", "stage": "p", "step": 1, "path": "", "bytes": 1, "seconds": 1.0},
        {"type": "checkpoint", "stage": "p", "step": 1, "path": "/p", "bytes": -1, "seconds": 1.0},
        {"type": "gate", "stage": "p", "battery": "b", "passed": True, "results": [{}]},
        {"type": "done", "status": "failed", "code": "Not A Code"},
        {"type": "spike", "stage": "p", "step": 1, "loss": 1.0, "z": 1.0, "checkpoint_step": 0},
        {"type": "restart", "restarts": 0},
        {
            "type": "mesh",
            "dims": {"tp": 0},
            "device": "cpu",
            "micro_batch": 1,
            "grad_accum": 1,
            "activation_checkpointing": "none",
            "param_dtype": "float32",
            "reduce_dtype": "float32",
            "planned": False,
        },
        {"type": "log", "message": "hi", "ts": -1.0},
    ],
)
def test_a_malformed_event_is_refused_naming_where_not_what(bad: dict[str, Any]) -> None:
    with pytest.raises(ValueError) as refused:
        pipeline_event(bad)
    assert "x" * 20 not in str(refused.value)


def test_done_is_the_engines_last_word_and_never_reported() -> None:
    assert isinstance(pipeline_event({"type": "done", "status": "succeeded"}), DoneEvent)
    with pytest.raises(ValueError):
        reported_event({"type": "done", "status": "succeeded"})


def test_the_engine_cannot_write_a_malformed_event_and_cuts_long_log_lines(
    tmp_path: Path,
) -> None:
    path = tmp_path / "events.jsonl"
    writer = EventWriter(path, enabled=True)
    with pytest.raises(ValueError):
        writer.emit("stage", stage="pretrain", status="paused")
    writer.log("error", "y" * (3 * LOG_MESSAGE_MAX_CHARS))
    writer.emit("step", replica=0, step=1)  # the drill's records are not pipeline events
    writer.close()
    lines = path.read_bytes().splitlines()
    assert len(lines) == 2
    logged = parse_event_line(lines[0])
    assert isinstance(logged, LogEvent) and len(logged.message) <= LOG_MESSAGE_MAX_CHARS
    assert json.loads(lines[1])["type"] == "step"
