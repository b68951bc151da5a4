"""The layouts of the equivalence tests (tests/pipeline/test_layouts.py), also measured by
bench/planner_memory.py: one table, so the bench and the tests cannot drift apart."""

from __future__ import annotations

from typing import Any

LAYOUTS: dict[str, tuple[int, dict[str, Any]]] = {
    "one_process": (1, {"micro_batch": 4, "grad_accum": 2}),
    "dp_shard_2": (2, {"dp_shard": 2, "micro_batch": 4}),
    "tp_2": (
        2,
        {"tp": 2, "micro_batch": 4, "grad_accum": 2, "activation_checkpointing": "selective"},
    ),
    "dp_replicate_2": (
        2,
        {"dp_replicate": 2, "micro_batch": 4, "activation_checkpointing": "full"},
    ),
    "dp_shard_2_tp_2": (4, {"dp_shard": 2, "tp": 2, "micro_batch": 4}),
    "pp_2": (2, {"pp": 2, "micro_batch": 4, "pp_microbatches": 2}),
    "pp_2_tp_2": (
        4,
        {
            "pp": 2,
            "tp": 2,
            "micro_batch": 4,
            "pp_microbatches": 2,
            "activation_checkpointing": "selective",
        },
    ),
}
"""Processes and layout; every one trains on 8 sequences per step (three of them recompute their
activations: checkpointing changes memory, never the numbers; ``pp_2_tp_2`` sends the
sequence-parallel shards of the hidden states between its stages)."""
