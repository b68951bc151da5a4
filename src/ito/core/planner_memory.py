"""Memory per GPU of one layout: model states, activations, buffers.

Model states follow the Ultra-Scale Playbook ("Memory usage in transformers", ZeRO-3) for
mixed-precision Adam as FSDP2 runs it: fp32 sharded parameters (4 bytes), fp32 sharded
gradients (4, ``reduce_dtype=float32``) and two fp32 Adam moments (8), i.e. 16 bytes per
parameter, divided by every degree that splits the parameter: tensor parallel (all but the
RMSNorm weights, which stay whole), the pipeline stage, and the FSDP shard group
``dp_shard × cp``. Replication (``dp_replicate``) divides nothing. On the CPU stand-in AdamW's
per-tensor ``step`` counters are counted too.

Activations follow Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large
Transformer Models", §4, eq. 2 and 4), rewritten for Llama's layer:

* no dropout (their ``sbh`` mask terms vanish), RMSNorm instead of LayerNorm;
* attention by a fused kernel (SDPA flash / memory-efficient): the ``5·a·s²·b`` score and
  softmax terms vanish, the kernel keeps its fp32 log-sum-exp, 4 bytes per head and token;
* grouped-query attention: k and v are ``kv_heads/heads`` as wide as q;
* the SwiGLU MLP of width ``f`` keeps four ``f``-wide tensors (gate, up, SiLU(gate), their
  product) where GPT's GeLU MLP keeps two ``4h``-wide ones;
* tensor parallelism with sequence parallelism divides what is stored by ``tp`` (their eq. 4),
  except the inputs of the column-parallel projections, which PyTorch's DTensor sequence
  parallel keeps all-gathered (two ``h``-wide tensors per layer). The engine applies sequence
  parallelism (:mod:`ito.pipeline.parallelize`: norms and residual stream on ``1/tp`` of the
  tokens); under selective checkpointing it keeps the row-parallel blocks' reduce-scattered
  outputs (``1/tp`` of the tokens, as counted here), not the whole-sequence partial sums of the
  o and down matmuls, which it recomputes (``bench/planner_memory.py`` check (b), row
  ``70b_256``);
* Hugging Face's ``LlamaRMSNorm`` upcasts its input and keeps that fp32 copy (for ``pow`` and
  the normalising product) beside the normalised tensor in compute precision (counted as
  Korthikanti's norm input): 4 more bytes per element, two norms per layer, whole on every
  tensor-parallel rank (found by check (b) and a census of one layer's saved tensors).

Per layer and token, with ``e`` bytes per element (2 in bf16), ``t`` = tp, ``g`` = kv/heads,
``a`` = heads: ``none`` keeps ``e·(4h + 2gh + 4f)/t + 2e·h + 2·4·h + 4a/t``; ``selective``
keeps the outputs of the matmuls and of attention and recomputes norms and element-wise ops,
``e·(4h + 2gh + 2f)/t + 4a/t``; ``full`` keeps the layer's input only, ``e·h/t``, and
rematerialises one layer at a time. Every mode also holds one layer's full activations as the
working set of the backward in progress.

The loss is its own term (``loss``), on the last stage only: the engine computes it a chunk of
``LOSS_CHUNK_TOKENS`` tokens at a time (:mod:`ito.pipeline.loss`), recomputing a chunk's
logits in the backward, so one chunk's fp32 log-softmax, its gradient and the fp32 logits'
gradient are the most that lives at once (12 bytes per vocabulary entry and chunk token; the
chunk's compute-precision logits and their gradient live only beside two of these, never three),
whole on every tensor-parallel rank (the engine gathers the logits; no loss parallel).
Under 1F1B (Narayanan et al. 2021 §2.2) the first stage
holds ``min(pp, micro-batches)`` micro-batches of activations.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Literal

from ito.core.planner_inputs import ActivationCheckpointing, Layout, ModelShape, PlannerInput

__all__ = [
    "FRAGMENTATION_MARGIN",
    "LOSS_CHUNK_TOKENS",
    "MemoryBreakdown",
    "activation_bytes_per_token",
    "largest_unit",
    "loss_bytes",
    "memory_per_gpu",
    "minimum_gpus",
    "stage_memory",
    "stage_parameters",
    "stage_tensors",
    "tp_local_parameters",
]

STATE_BYTES = {"parameters": 4, "gradients": 4, "optimizer_states": 8}
"""fp32 sharded parameters, fp32 sharded gradients, Adam's two fp32 moments (ZeRO §3.1)."""
REDUCE_BYTES = 4
"""Gradients are reduced in fp32 (``MixedPrecisionPolicy(reduce_dtype=float32)``)."""
LOSS_CHUNK_TOKENS = 1024
"""Tokens whose logits the engine's loss holds at once (:data:`ito.pipeline.loss.CHUNK_TOKENS`
is this value)."""
LOGIT_BYTES_PER_ENTRY = 12
"""fp32 log-softmax output, its gradient and the fp32 logits' gradient, live together in one
chunk's backward (cross-entropy on upcast logits, as TorchTitan computes it; the chunk's bf16
logits are freed once upcast and their gradient is made after the log-softmax's is freed)."""
NORM_FP32_BYTES = 4
"""The fp32 copy of its input an RMSNorm keeps per element (it upcasts before normalising)."""
LSE_BYTES_PER_HEAD = 4
"""The fp32 log-sum-exp a flash-attention kernel saves per head and token."""
RUNTIME_RESERVE = 2 << 30
"""Bytes outside PyTorch's allocator on a GPU: CUDA context, NCCL channels, cuBLAS workspaces
(assumed: about 0.5 GiB of context plus NCCL's buffers)."""
FRAGMENTATION_MARGIN = 0.10
"""Share of memory left unplanned for the caching allocator's fragmentation: reserved memory
commonly runs 5-15 % above allocated in PyTorch training (an assumption, to be calibrated)."""


@dataclass(frozen=True)
class MemoryBreakdown:
    """Bytes per GPU on the layout's fullest pipeline stage."""

    parameters: int
    gradients: int
    optimizer_states: int
    activations: int
    loss: int
    """One chunk of the loss's fp32 logits and their gradients (last stage only)."""
    buffers: int
    """FSDP's all-gathered parameters and unsharded gradients in flight (or, with a pipeline,
    the stage's unsharded parameters and accumulated gradients)."""
    runtime_reserve: int
    capacity: int
    stage: Literal["only", "first", "last"]

    @property
    def peak_allocated(self) -> int:
        """What ``torch.cuda.max_memory_allocated`` should show."""
        return (
            self.parameters
            + self.gradients
            + self.optimizer_states
            + self.activations
            + self.loss
            + self.buffers
        )

    @property
    def total(self) -> int:
        return self.peak_allocated + self.runtime_reserve

    @property
    def headroom(self) -> int:
        return self.capacity - self.total

    @property
    def usable(self) -> int:
        return int(self.capacity * (1 - FRAGMENTATION_MARGIN))

    @property
    def fits(self) -> bool:
        return self.total <= self.usable

    def to_dict(self) -> dict[str, Any]:
        return asdict(self) | {
            "peak_allocated": self.peak_allocated,
            "total": self.total,
            "headroom": self.headroom,
            "usable": self.usable,
        }


def activation_bytes_per_token(
    shape: ModelShape, tp: int, mode: ActivationCheckpointing, element: int
) -> float:
    """Bytes one decoder layer keeps per token between its forward and its backward."""
    h, f, g = shape.hidden, shape.ffn, shape.kv_fraction
    lse = LSE_BYTES_PER_HEAD * shape.heads / tp
    if mode == "none":
        norms = 2 * (element + NORM_FP32_BYTES) * h
        return element * (4 * h + 2 * g * h + 4 * f) / tp + norms + lse
    if mode == "selective":
        return element * (4 * h + 2 * g * h + 2 * f) / tp + lse
    return element * h / tp


def loss_bytes(shape: ModelShape, tokens: int) -> int:
    """The loss's peak over a micro-batch of ``tokens``: one chunk's fp32 logits, log-softmax
    and gradients (assumed: the engine's chunked loss, :mod:`ito.pipeline.loss`; whole on every
    tensor-parallel rank)."""
    return LOGIT_BYTES_PER_ENTRY * shape.vocab * min(LOSS_CHUNK_TOKENS, tokens)


def stage_parameters(shape: ModelShape, layout: Layout, stage: str = "fullest") -> int:
    """Parameters of one pipeline stage: the embedding goes with the first, the final norm
    and output projection with the last (TorchTitan's pipeline split); ``fullest`` is the
    larger of the two."""
    layers = layout.layers_per_stage(shape.layers) * shape.layer_parameters
    if layout.pp == 1:
        return shape.parameters
    if stage == "first":
        return layers + shape.embedding_parameters
    if stage == "last":
        return layers + shape.output_parameters
    return layers + max(shape.embedding_parameters, shape.output_parameters)


def stage_norms(shape: ModelShape, layout: Layout, stage: str = "fullest") -> int:
    """RMSNorm weights of one pipeline stage: two per decoder layer, the final one on the
    last stage."""
    layers = layout.layers_per_stage(shape.layers) if layout.pp > 1 else shape.layers
    final = shape.hidden if layout.pp == 1 or stage in ("last", "fullest") else 0
    return 2 * shape.hidden * layers + final


def tp_local_parameters(shape: ModelShape, layout: Layout, stage: str = "fullest") -> float:
    """Parameters of one pipeline stage on one tensor-parallel rank, before FSDP shards them.

    The engine's tensor-parallel plan (``ito.pipeline.parallelize``) splits the projections,
    the embedding and the output head by ``tp`` but keeps every RMSNorm weight whole on each
    tensor-parallel rank (as TorchTitan does without sequence-parallel norms). Dividing the
    norms too left the planner 640 bytes short per rank for the tiny model at ``tp=2``
    (bench/planner_memory.py, check (a)); this counts what a rank holds, to the byte."""
    norms = stage_norms(shape, layout, stage)
    return (stage_parameters(shape, layout, stage) - norms) / layout.tp + norms


PARAMETER_TENSORS_PER_LAYER = 9
"""q, k, v, o, gate, up, down and the two RMSNorm weights (no biases in Llama)."""
STEP_BYTES = 4
"""AdamW's ``step`` counter: one fp32 scalar per parameter tensor, whole on every rank."""


def stage_tensors(shape: ModelShape, layout: Layout, stage: str = "fullest") -> int:
    """Parameter tensors of one pipeline stage: the decoder layers', the embedding on the first
    stage, the final norm and output projection on the last."""
    layers = layout.layers_per_stage(shape.layers) if layout.pp > 1 else shape.layers
    tensors = layers * PARAMETER_TENSORS_PER_LAYER
    if layout.pp == 1:
        return tensors + 3
    if stage == "first":
        return tensors + 1
    return tensors + 2


def largest_unit(shape: ModelShape, tp: int = 1) -> float:
    """FSDP units are the decoder layers, the embedding and the output (TorchTitan
    ``apply_fsdp``); the largest, on one tensor-parallel rank (norms whole), bounds what one
    all-gather materialises."""
    h = shape.hidden
    layer = (shape.layer_parameters - 2 * h) / tp + 2 * h
    return max(layer, shape.embedding_parameters / tp, (shape.output_parameters - h) / tp + h)


def stage_memory(
    inp: PlannerInput, layout: Layout, stage: Literal["only", "first", "last"]
) -> MemoryBreakdown:
    """Bytes per GPU of one pipeline stage (``only`` without a pipeline)."""
    shape, e, t = inp.model, inp.compute_bytes, layout.tp
    local = tp_local_parameters(shape, layout, stage)
    shard = local / layout.fsdp
    states = {name: round(bytes_ * shard) for name, bytes_ in STATE_BYTES.items()}
    if not inp.on_gpu:
        # torch.optim.AdamW (foreach, not capturable) keeps each parameter's ``step`` as a
        # CPU scalar tensor: on a GPU it is host memory, on the CPU stand-in it is held with
        # the moments (84 bytes for the tiny model, counted by bench/planner_memory.py (a)).
        states["optimizer_states"] += STEP_BYTES * stage_tensors(shape, layout, stage)

    tokens = layout.tokens_per_microbatch(inp.seq_len)
    layers = layout.layers_per_stage(shape.layers)
    kept = activation_bytes_per_token(shape, t, layout.activation_checkpointing, e)
    working = activation_bytes_per_token(shape, t, "none", e)
    in_flight = min(layout.pp, layout.microbatches) if stage == "first" else 1
    activations = kept * layers * tokens * in_flight + working * tokens
    loss = 0 if stage == "first" else loss_bytes(shape, tokens)

    unit = largest_unit(shape, t)
    upcast = REDUCE_BYTES if e != REDUCE_BYTES else 0
    if layout.pp == 1:
        # Two units all-gathered (the one computing, the one prefetched) and one unit's
        # gradient with its fp32 copy for the reduce-scatter (FSDP2 defaults).
        buffers = 2 * e * unit + (e + upcast) * unit
    else:
        # torch.distributed.pipelining keeps FSDP2 stages unsharded across micro-batches and
        # accumulates unsharded fp32 gradients until the last one (stage.py
        # ``backward_maybe_with_nosync``).
        buffers = e * local + REDUCE_BYTES * local + e * unit
    return MemoryBreakdown(
        parameters=states["parameters"],
        gradients=states["gradients"],
        optimizer_states=states["optimizer_states"],
        activations=round(activations),
        loss=loss,
        buffers=round(buffers),
        runtime_reserve=RUNTIME_RESERVE if inp.on_gpu else 0,
        capacity=inp.accelerator.memory_bytes,
        stage=stage,
    )


def memory_per_gpu(inp: PlannerInput, layout: Layout) -> MemoryBreakdown:
    """The fuller of the first and last pipeline stages (the only one without a pipeline)."""
    if layout.pp == 1:
        return stage_memory(inp, layout, "only")
    first = stage_memory(inp, layout, "first")
    last = stage_memory(inp, layout, "last")
    return first if first.total >= last.total else last


def minimum_gpus(inp: PlannerInput) -> int:
    """GPUs the model states alone need, fully sharded: a lower bound on any layout."""
    room = inp.accelerator.memory_bytes * (1 - FRAGMENTATION_MARGIN)
    room -= RUNTIME_RESERVE if inp.on_gpu else 0
    states = sum(STATE_BYTES.values()) * inp.model.parameters
    return max(1, -(-int(states) // int(room)))
