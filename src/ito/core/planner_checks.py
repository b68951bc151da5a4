"""The planner's refusal rules: what makes a layout impossible or wasteful, each with its code.

Reasons are of two kinds: ``impossible`` (the layout cannot run: it does not fit, a degree does
not divide what it splits, a rank would have no data) and ``wasteful`` (it would run, but a
faster or smaller one exists). Codes are a public contract: add new ones, never rename one.
Every rule cites its source next to it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from enum import StrEnum

from ito.core.planner_inputs import Layout, ModelShape, PlannerInput
from ito.core.planner_memory import MemoryBreakdown, memory_per_gpu, minimum_gpus
from ito.core.planner_time import StepTime, step_time

__all__ = [
    "FP8_MIN_CAPABILITY",
    "MAX_BUBBLE",
    "MAX_EXPOSED_DP",
    "MIN_TP_COLUMNS",
    "Candidate",
    "Reason",
    "ReasonCode",
    "evaluate",
    "global_reasons",
    "idle",
    "nearest",
    "tp_misfit",
    "useful_tp",
]

MAX_BUBBLE = 0.25
"""Largest pipeline bubble (p-1)/(m+p-1) accepted (Narayanan et al. 2021 §2.2 keep m ≫ p; a
quarter of the step idle is where we call it waste)."""
MAX_EXPOSED_DP = 0.25
"""Largest data-parallel communication the compute cannot hide, as a share of the compute."""
MIN_TP_COLUMNS = 768
"""Narrowest per-rank hidden slice tensor parallelism is worth: Megatron-LM's configurations
(Narayanan et al. 2021, Table 1) grow the tensor-parallel degree with the hidden size and never
go below hidden/tp = 768; narrower matmuls run far from peak."""
FP8_MIN_CAPABILITY = (8, 9)
"""fp8 tensor cores arrive with Ada/Hopper, compute capability 8.9 (``torch._scaled_mm``)."""


class ReasonCode(StrEnum):
    """Stable codes of refusal reasons."""

    degrees_mismatch_world = "degrees_mismatch_world"
    tp_across_nodes = "tp_across_nodes"
    tp_not_dividing_model = "tp_not_dividing_model"
    pp_more_stages_than_layers = "pp_more_stages_than_layers"
    pp_too_few_microbatches = "pp_too_few_microbatches"
    cp_not_dividing_sequence = "cp_not_dividing_sequence"
    cp_unsupported = "cp_unsupported"
    fp8_unsupported = "fp8_unsupported"
    fabric_not_inter_node = "fabric_not_inter_node"
    memory_exceeded = "memory_exceeded"
    idle_accelerators = "idle_accelerators"
    micro_batch_not_dividing = "micro_batch_not_dividing"
    pipeline_bubble = "pipeline_bubble"
    cp_not_needed = "cp_not_needed"
    exposed_communication = "exposed_communication"
    fsdp_all_gather_exposed = "fsdp_all_gather_exposed"
    tp_not_needed = "tp_not_needed"
    pp_not_needed = "pp_not_needed"
    full_checkpointing_not_needed = "full_checkpointing_not_needed"
    booking_oversized = "booking_oversized"
    layout_with_replica_groups = "layout_with_replica_groups"
    """A layout other than FSDP inside each torchft replica group (not applied yet)."""

    @property
    def wasteful(self) -> bool:
        """The layout would run, but a faster or smaller one exists."""
        return self in _WASTEFUL


_WASTEFUL = frozenset(
    {
        ReasonCode.pipeline_bubble,
        ReasonCode.cp_not_needed,
        ReasonCode.exposed_communication,
        ReasonCode.fsdp_all_gather_exposed,
        ReasonCode.tp_not_needed,
        ReasonCode.pp_not_needed,
        ReasonCode.full_checkpointing_not_needed,
        ReasonCode.booking_oversized,
    }
)


@dataclass(frozen=True)
class Reason:
    code: ReasonCode
    message: str
    """One sentence, with the numbers that decided it."""

    def to_dict(self) -> dict[str, str]:
        return {"code": self.code.value, "message": self.message}


@dataclass(frozen=True)
class Candidate:
    """One layout weighed, with what refuses it (empty when nothing does)."""

    layout: Layout
    reasons: tuple[Reason, ...]
    memory: MemoryBreakdown | None = None
    time: StepTime | None = None

    @property
    def speed(self) -> float:
        """Predicted tokens per second (0 when never timed)."""
        return self.time.tokens_per_second if self.time else 0.0

    def blocking(self, allow_wasteful: bool) -> list[Reason]:
        return [r for r in self.reasons if not (allow_wasteful and r.code.wasteful)]


def _gib(value: float) -> str:
    return f"{value / (1 << 30):.1f} GiB"


def _seconds(value: float) -> str:
    return f"{value:.3g} s" if value >= 1 else f"{value * 1e3:.3g} ms"


def tp_misfit(shape: ModelShape, tp: int) -> list[str]:
    """What a tensor-parallel degree fails to divide (TorchTitan shards attention by heads and
    kv heads and the MLP by its width, ``parallelize_llama``)."""
    return [
        f"{name} ({value})"
        for name, value in (
            ("heads", shape.heads),
            ("kv heads", shape.kv_heads),
            ("ffn", shape.ffn),
        )
        if value % tp
    ]


def _structure(inp: PlannerInput, layout: Layout) -> list[Reason]:
    shape, g = inp.model, inp.gpus_per_node
    reasons = []
    # TorchTitan keeps tp innermost in its mesh so TP ranks share a node's NVLink; its
    # per-layer collectives over a fabric would stall every layer.
    if layout.tp > g or g % layout.tp:
        reasons.append(
            Reason(
                ReasonCode.tp_across_nodes,
                f"tensor parallel degree {layout.tp} does not fit inside a node of {g} GPUs; "
                "its per-layer collectives would cross the fabric",
            )
        )
    misfit = tp_misfit(shape, layout.tp)
    if misfit:
        reasons.append(
            Reason(
                ReasonCode.tp_not_dividing_model,
                f"tensor parallel degree {layout.tp} does not divide {', '.join(misfit)}",
            )
        )
    # torch.distributed.pipelining: every stage needs a layer, and 1F1B needs at least as many
    # micro-batches as stages (the schedule refuses fewer).
    if layout.pp > shape.layers:
        reasons.append(
            Reason(
                ReasonCode.pp_more_stages_than_layers,
                f"{layout.pp} pipeline stages for {shape.layers} layers",
            )
        )
    if layout.pp > 1 and layout.microbatches < layout.pp:
        reasons.append(
            Reason(
                ReasonCode.pp_too_few_microbatches,
                f"{layout.microbatches} micro-batches per step cannot fill {layout.pp} "
                "pipeline stages",
            )
        )
    bubble = (layout.pp - 1) / (layout.microbatches + layout.pp - 1)
    if bubble > MAX_BUBBLE:
        # Narayanan et al. 2021 §2.2: 1F1B idles (p-1)/(m+p-1) of the step.
        reasons.append(
            Reason(
                ReasonCode.pipeline_bubble,
                f"the pipeline bubble (p-1)/(m+p-1) = {bubble:.2f} exceeds {MAX_BUBBLE}; "
                "more micro-batches per step or fewer stages",
            )
        )
    if layout.cp > 1:
        reasons.extend(_context_parallel(inp, layout))
    return reasons


def _context_parallel(inp: PlannerInput, layout: Layout) -> list[Reason]:
    reasons = []
    # TorchTitan's load-balanced ring attention cuts every sequence into 2·cp chunks.
    if inp.seq_len % (2 * layout.cp):
        reasons.append(
            Reason(
                ReasonCode.cp_not_dividing_sequence,
                f"context parallel degree {layout.cp} needs a sequence length that is a "
                f"multiple of {2 * layout.cp}",
            )
        )
    reasons.append(
        Reason(
            ReasonCode.cp_unsupported,
            "the engine does not apply context parallelism yet, and a planned degree is never "
            "silently ignored",
        )
    )
    # A sequence needs context parallelism only when one sequence alone does not fit, even
    # with every layer recomputed.
    folded = replace(
        layout,
        dp_shard=layout.dp_shard * layout.cp,
        cp=1,
        micro_batch=1,
        activation_checkpointing="full",
    )
    if memory_per_gpu(inp, folded).fits:
        reasons.append(
            Reason(
                ReasonCode.cp_not_needed,
                f"a sequence of {inp.seq_len} tokens fits on a GPU without context parallelism",
            )
        )
    return reasons


def evaluate(inp: PlannerInput, layout: Layout) -> Candidate:
    """Memory, time and every reason that refuses ``layout``."""
    reasons = _structure(inp, layout)
    memory = memory_per_gpu(inp, layout)
    if not memory.fits:
        reasons.append(
            Reason(
                ReasonCode.memory_exceeded,
                f"{layout.describe()} needs {_gib(memory.total)} per GPU on the "
                f"{memory.stage} stage, more than the {_gib(memory.usable)} usable of "
                f"{_gib(memory.capacity)}",
            )
        )
    time = step_time(inp, layout)
    exposed = time.data_parallel_exposed_seconds
    if exposed > MAX_EXPOSED_DP * time.compute_seconds:
        # The Ultra-Scale Playbook ("Data parallelism"): data parallelism scales only while
        # its gradient traffic overlaps the backward pass.
        reasons.append(
            Reason(
                ReasonCode.exposed_communication,
                f"{_seconds(exposed)} of data-parallel traffic per step cannot hide behind "
                f"{_seconds(time.compute_seconds)} of compute over {inp.fabric.name}",
            )
        )
    gather, forward = time.all_gather_per_layer_seconds, time.forward_per_layer_seconds
    if layout.pp == 1 and time.fsdp.crosses_nodes and gather > forward:
        # FSDP2 prefetches the next layer's all-gather behind this layer's forward, every
        # micro-batch (a pipeline stage gathers once per step instead, counted above); where
        # the fabric is too slow for that, HSDP shards inside a node and replicates across
        # nodes (TorchTitan dp_replicate × dp_shard).
        reasons.append(
            Reason(
                ReasonCode.fsdp_all_gather_exposed,
                f"a layer's all-gather across nodes takes {_seconds(gather)}, longer than its "
                f"forward ({_seconds(forward)}); shard inside a node and replicate across "
                "nodes (HSDP) instead",
            )
        )
    if layout.activation_checkpointing == "full":
        # Korthikanti et al. 2022 §5: recompute only what memory demands.
        selective = replace(layout, activation_checkpointing="selective")
        if memory_per_gpu(inp, selective).fits:
            reasons.append(
                Reason(
                    ReasonCode.full_checkpointing_not_needed,
                    "selective activation checkpointing fits at this micro-batch; full "
                    "recomputation would add a third to the compute",
                )
            )
    return Candidate(layout, tuple(reasons), memory, time)


def idle(sequences: int, dp: int) -> Reason:
    return Reason(
        ReasonCode.idle_accelerators,
        f"the batch of {sequences} sequences cannot give each of the {dp} data-parallel ranks "
        "the same whole number of sequences; some would idle",
    )


def global_reasons(inp: PlannerInput) -> list[Reason]:
    """What refuses the booking whatever the layout."""
    accel, reasons = inp.accelerator, []
    capability = accel.compute_capability
    if inp.fp8 and (
        capability is None or capability < FP8_MIN_CAPABILITY or accel.peak_fp8_flops is None
    ):
        shown = "none" if capability is None else f"{capability[0]}.{capability[1]}"
        reasons.append(
            Reason(
                ReasonCode.fp8_unsupported,
                f"fp8 needs compute capability 8.9 or newer; {accel.name} has {shown}",
            )
        )
    if inp.nodes > 1 and not inp.fabric.inter_node:
        reasons.append(
            Reason(
                ReasonCode.fabric_not_inter_node,
                f"{inp.fabric.name} does not join nodes; {inp.nodes} nodes need a fabric",
            )
        )
    sequences, tp = inp.sequences, useful_tp(inp)
    if sequences is not None and sequences * tp < inp.world:
        # Every GPU needs a share of some sequence: data parallelism gives one per sequence,
        # tensor parallelism splits one over at most ``useful_tp`` GPUs, and pipelines or
        # context parallelism do not widen a small batch (a pipeline needs m ≥ 3(p-1)
        # micro-batches to keep its bubble small; the engine has no context parallelism).
        reasons.append(
            Reason(
                ReasonCode.booking_oversized,
                f"a batch of {sequences} sequences keeps at most {sequences * tp} GPUs busy "
                f"(tensor parallel up to {tp} for a hidden size of {inp.model.hidden}), but "
                f"{inp.world} are booked; the model states alone fit on "
                f"{minimum_gpus(inp)} GPU(s)",
            )
        )
    return reasons


def useful_tp(inp: PlannerInput) -> int:
    """The largest tensor-parallel degree inside a node that divides the model and leaves
    every rank at least MIN_TP_COLUMNS of the hidden size."""
    return max(
        t
        for t in range(1, inp.gpus_per_node + 1)
        if inp.gpus_per_node % t == 0
        and not tp_misfit(inp.model, t)
        and (t == 1 or inp.model.hidden // t >= MIN_TP_COLUMNS)
    )


def _need(candidate: Candidate) -> tuple[float, float]:
    memory = candidate.memory.total if candidate.memory else float("inf")
    return memory, -candidate.speed


def nearest(candidates: Sequence[Candidate], allow_wasteful: bool = False) -> list[Reason]:
    """The reasons of the candidates that came closest (fewest reasons), one per code."""
    if not candidates:
        return []
    fewest = min(len(c.blocking(allow_wasteful)) for c in candidates)
    found: dict[ReasonCode, Reason] = {}
    # The sentence of the layout closest to fitting speaks for each code.
    for candidate in sorted(candidates, key=_need):
        blocking = candidate.blocking(allow_wasteful)
        if len(blocking) == fewest:
            for reason in blocking:
                found.setdefault(reason.code, reason)
    return list(found.values())
