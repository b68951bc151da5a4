"""Predicted step time of one layout: compute, recomputation, the pipeline bubble, and the
communication the compute cannot hide.

Compute is the model FLOPs of the step's tokens, ``(6·N + 12·L·h·s)`` per token, split evenly
over the GPUs, at ``peak × kernel_efficiency`` (:mod:`ito.core.hardware`). Each collective is a
ring (NCCL's algorithm for large messages): a rank of a group of ``d`` sends ``(d-1)/d`` of the
buffer for an all-gather or a reduce-scatter, twice that for an all-reduce (the Ultra-Scale
Playbook, "A quick focus on collective operations"). A group inside a node runs at the GPU's
NVLink bandwidth; a group spanning nodes with ``k`` members per node shares the node's fabric
bandwidth with the node's other ``g/k`` groups doing the same collective at the same time.
NCCL reaches about ``COLLECTIVE_EFFICIENCY`` of the link (nccl-tests bus bandwidth).

What overlaps (FSDP2 and TorchTitan defaults): FSDP's all-gathers and reduce-scatters run beside
the compute of the same micro-batch, except the first unit's all-gather and the last unit's
reduce-scatter; HSDP's replicate all-reduce runs once per step (the engine defers it with
``set_requires_all_reduce(False)`` on all but the last micro-batch) beside the last
micro-batch's backward; with a pipeline, the stage's parameters stay unsharded and the
gradients are reduced once after the last micro-batch, in the open. Tensor-parallel
collectives (two all-gathers and two reduce-scatters per layer forward, as many backward, the
forward's again when recomputed) and pipeline sends are on the critical path: all exposed.
Recomputation is a share of the compute (:data:`RECOMPUTE`) plus, where the engine repeats a
matmul, that matmul's forward FLOPs (:func:`recomputed_matmul_flops`).
The pipeline bubble of 1F1B is ``(p-1)`` micro-batch times, a share ``(p-1)/(m+p-1)`` of the
step (Narayanan et al. 2021 §2.2).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from ito.core.planner_inputs import Layout, ModelShape, PlannerInput
from ito.core.planner_memory import REDUCE_BYTES, largest_unit, tp_local_parameters

__all__ = [
    "COLLECTIVE_EFFICIENCY",
    "StepTime",
    "Traffic",
    "group_bandwidth",
    "recomputed_matmul_flops",
    "step_time",
]

COLLECTIVE_EFFICIENCY = 0.8
"""Bus bandwidth NCCL reaches on large messages, as a share of the link (nccl-tests on
NVLink and on 400 Gb/s InfiniBand report 80-90 %; the lower end is assumed)."""
RECOMPUTE = {"none": 0.0, "selective": 0.03, "full": 1.0 / 3.0}
"""Extra compute of activation checkpointing, as a share of the step's compute. ``full``
repeats the forward: 2 of the 6 FLOPs per parameter and token, a third of the attention.
``selective`` repeats norms and element-wise ops, memory-bound kernels assumed at 3 %
(Korthikanti et al. 2022 report 2-4 % for their selective recomputation, Table 4), and under
tensor parallel one matmul more (:func:`recomputed_matmul_flops`)."""
TP_COLLECTIVES_PER_LAYER = {"none": 8, "selective": 10, "full": 12}
"""Sequence-parallel collectives per layer and micro-batch, each one micro-batch's hidden
states: all-gather and reduce-scatter around attention and around the MLP, forward and
backward (Korthikanti et al. §4.2.2); recomputing the norms repeats the two all-gathers, full
recomputation the whole forward's four."""
FP8_LINEAR_SPEEDUP = 1.5
"""Speed-up of the linear layers in fp8 over bf16. Peak doubles, but casts and scaling eat much
of it: TorchTitan reports about 1.5x end to end for Llama 3.1 8B with Float8 (Liang et al.
2024, "TorchTitan", Table 2). Attention stays in bf16."""


@dataclass(frozen=True)
class Traffic:
    """One kind of communication, per GPU and optimizer step."""

    bytes: float
    """Bytes this GPU sends."""
    seconds: float
    exposed_seconds: float
    """The part no compute hides."""
    bandwidth: float
    """Effective bytes/s of the group."""
    crosses_nodes: bool


_NONE = Traffic(bytes=0.0, seconds=0.0, exposed_seconds=0.0, bandwidth=0.0, crosses_nodes=False)


@dataclass(frozen=True)
class StepTime:
    compute_seconds: float
    """Forward, backward and recomputation on one GPU."""
    recompute_seconds: float
    bubble_seconds: float
    bubble_fraction: float
    fsdp: Traffic
    replicate: Traffic
    tp: Traffic
    pp: Traffic
    all_gather_per_layer_seconds: float
    """One decoder layer's FSDP all-gather."""
    forward_per_layer_seconds: float
    """One decoder layer's forward for one micro-batch: what that all-gather must hide behind."""
    step_seconds: float
    tokens_per_second: float
    mfu: float

    @property
    def data_parallel_exposed_seconds(self) -> float:
        return self.fsdp.exposed_seconds + self.replicate.exposed_seconds

    def to_dict(self) -> dict[str, Any]:
        return asdict(self) | {"data_parallel_exposed_seconds": self.data_parallel_exposed_seconds}


def _over(amount: float, rate: float) -> float:
    """Seconds to move ``amount`` at ``rate``; a link that does not exist never finishes."""
    return amount / rate if rate > 0 else float("inf")


def _members_per_node(inp: PlannerInput, degree: int, stride: int) -> int:
    g = inp.gpus_per_node
    return 1 if stride >= g else min(degree, g // stride)


def group_bandwidth(inp: PlannerInput, degree: int, stride: int) -> tuple[float, bool]:
    """Effective bytes/s per rank of a ring collective over ``degree`` ranks ``stride`` apart,
    and whether the group spans nodes."""
    link = inp.accelerator.link_bandwidth
    k = _members_per_node(inp, degree, stride)
    if degree <= k:
        return link * COLLECTIVE_EFFICIENCY, False
    shared = inp.fabric.node_bandwidth(inp.gpus_per_node) * k / inp.gpus_per_node
    return min(link, shared) * COLLECTIVE_EFFICIENCY, True


def _traffic(inp: PlannerInput, sent: float, degree: int, stride: int, exposed: float) -> Traffic:
    if degree == 1 or sent == 0:
        return _NONE
    bandwidth, crosses = group_bandwidth(inp, degree, stride)
    seconds = _over(sent, bandwidth)
    return Traffic(sent, seconds, min(seconds, max(0.0, exposed)), bandwidth, crosses)


def recomputed_matmul_flops(shape: ModelShape, layout: Layout) -> float:
    """Forward FLOPs per token, over the whole model, of the matmuls activation checkpointing
    repeats beyond :data:`RECOMPUTE`'s share (each GPU does its ``1/tp`` of them).

    Selective checkpointing keeps every matmul's output (Korthikanti et al. 2022, "selective
    activation recomputation": only the cheap, memory-hungry ops are recomputed), except
    under tensor parallel: there the engine keeps the output of the reduce-scatter that ends
    each block instead of the row-parallel o and down projections' whole-sequence partial sums
    and marks those two matmuls for recomputation (:data:`ito.pipeline.parallelize.SAVED_OPS`).
    Only o's runs again: the backward needs neither matmul's output, and non-reentrant
    checkpointing replays a layer's forward only until the last tensor the backward needs is
    packed again (``torch.utils.checkpoint``'s early stop, on by default) — down's input, packed
    just before down's matmul would run; o's matmul comes earlier in the layer and is replayed.
    So ``2·h·h`` FLOPs per token and layer (o is ``h × h``), none for down's ``2·h·f``. Assumed:
    eager (uncompiled) layers with early stop, as the engine runs them
    (``tests/pipeline/recompute_check.py`` counts the matmuls the engine replays). Without
    tensor parallel, or with ``none`` or ``full``, nothing beyond the share."""
    if layout.activation_checkpointing != "selective" or layout.tp == 1:
        return 0.0
    return shape.layers * 2.0 * shape.hidden * shape.hidden


def _seconds_per_flop_per_token(inp: PlannerInput, layout: Layout) -> float:
    """Seconds on one GPU per step for each model FLOP per trained token, at bf16 speed: the
    step's tokens split over the GPUs; a pipeline is as slow as its fullest stage."""
    shape, accel = inp.model, inp.accelerator
    tokens = layout.dp * layout.micro_batch * layout.microbatches * inp.seq_len
    imbalance = layout.layers_per_stage(shape.layers) * layout.pp / shape.layers
    return tokens / layout.world * imbalance / (accel.peak_bf16_flops * accel.kernel_efficiency)


def _base_compute(inp: PlannerInput, layout: Layout) -> tuple[float, float]:
    """Seconds of forward and backward on one GPU per step, without recomputation, and the
    model FLOPs per token."""
    shape = inp.model
    flops_per_token = shape.flops_per_token(inp.seq_len)
    seconds = flops_per_token * _seconds_per_flop_per_token(inp, layout)
    if inp.fp8:
        linear = 6.0 * shape.parameters / flops_per_token
        seconds *= linear / FP8_LINEAR_SPEEDUP + (1 - linear)
    return seconds, flops_per_token


def _recompute(inp: PlannerInput, layout: Layout, base: float) -> float:
    """Seconds of recomputation on one GPU per step: :data:`RECOMPUTE`'s share of ``base`` and
    the repeated matmuls (linear layers: fp8 speeds them up too)."""
    matmul = recomputed_matmul_flops(inp.model, layout) * _seconds_per_flop_per_token(inp, layout)
    if inp.fp8:
        matmul /= FP8_LINEAR_SPEEDUP
    return base * RECOMPUTE[layout.activation_checkpointing] + matmul


def _fsdp(inp: PlannerInput, layout: Layout, per_micro: float) -> tuple[Traffic, float]:
    """FSDP2's all-gathers (compute dtype) and reduce-scatters (fp32) over ``dp_shard × cp``,
    and one decoder layer's all-gather in seconds."""
    shape, e, d = inp.model, inp.compute_bytes, layout.fsdp
    if d == 1:
        return _NONE, 0.0
    share = (d - 1) / d
    local = tp_local_parameters(shape, layout)
    unit = largest_unit(shape, layout.tp)
    stride = layout.stride("cp")  # dp_shard × cp is one flattened group with tp inside it
    bandwidth = group_bandwidth(inp, d, stride)[0]
    layer = _over(e * shape.layer_parameters / layout.tp * share, bandwidth)
    m = layout.microbatches
    if layout.pp == 1:
        # Forward and backward all-gathers and a reduce-scatter every micro-batch, beside its
        # compute; the first unit's all-gather and the last one's reduce-scatter in the open.
        per_micro_bytes = (2 * e + REDUCE_BYTES) * local * share
        hidden_behind = max(0.0, _over(per_micro_bytes, bandwidth) - per_micro)
        edges = _over((e + REDUCE_BYTES) * unit * share, bandwidth)
        traffic = _traffic(inp, per_micro_bytes * m, d, stride, m * hidden_behind + edges)
        return traffic, layer
    # A pipeline stage gathers once (beside its first micro-batch) and reduces once, after its
    # last backward.
    gather, reduce = e * local * share, REDUCE_BYTES * local * share
    exposed = max(0.0, _over(gather, bandwidth) - per_micro) + _over(reduce, bandwidth)
    return _traffic(inp, gather + reduce, d, stride, exposed), layer


def _replicate(inp: PlannerInput, layout: Layout, per_micro: float) -> Traffic:
    """HSDP's all-reduce of the fp32 gradient shards across replicas, once per step."""
    r = layout.dp_replicate
    if r == 1:
        return _NONE
    shard = tp_local_parameters(inp.model, layout) / layout.fsdp
    sent = 2 * REDUCE_BYTES * shard * (r - 1) / r
    stride = layout.stride("dp_replicate")
    seconds = _over(sent, group_bandwidth(inp, r, stride)[0])
    # Beside the last micro-batch's backward (two thirds of its compute), or after a pipeline.
    exposed = seconds if layout.pp > 1 else seconds - per_micro * 2 / 3
    return _traffic(inp, sent, r, stride, exposed)


def step_time(inp: PlannerInput, layout: Layout) -> StepTime:
    shape, e = inp.model, inp.compute_bytes
    t, p, m = layout.tp, layout.pp, layout.microbatches
    base, flops_per_token = _base_compute(inp, layout)
    recompute = _recompute(inp, layout, base)
    compute = base + recompute
    per_micro = compute / m
    bubble = (p - 1) * per_micro

    fsdp, gather_layer = _fsdp(inp, layout, per_micro)
    replicate = _replicate(inp, layout, per_micro)
    layers = layout.layers_per_stage(shape.layers)
    hidden_states = e * shape.hidden * layout.tokens_per_microbatch(inp.seq_len)
    per_layer = TP_COLLECTIVES_PER_LAYER[layout.activation_checkpointing]
    tp_bytes = per_layer * hidden_states * (t - 1) / t * layers * m
    tp = _traffic(inp, tp_bytes, t, 1, float("inf"))
    pp_bytes = 2 * m * hidden_states / t  # activations forward, their gradients backward
    pp = _traffic(inp, pp_bytes, p, layout.stride("pp"), float("inf"))

    exposed = sum(x.exposed_seconds for x in (fsdp, replicate, tp, pp))
    step = compute + bubble + exposed
    tokens = layout.dp * layout.micro_batch * m * inp.seq_len
    return StepTime(
        compute_seconds=compute,
        recompute_seconds=recompute,
        bubble_seconds=bubble,
        bubble_fraction=(p - 1) / (m + p - 1),
        fsdp=fsdp,
        replicate=replicate,
        tp=tp,
        pp=pp,
        all_gather_per_layer_seconds=gather_layer,
        forward_per_layer_seconds=base / m / 3 / layers,
        step_seconds=step,
        tokens_per_second=tokens / step,
        mfu=tokens * flops_per_token / (step * layout.world * inp.accelerator.peak_bf16_flops),
    )
