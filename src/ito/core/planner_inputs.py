"""What the parallelism planner is asked (:class:`PlannerInput`) and the layouts it weighs.

A :class:`ModelShape` is a Llama decoder's architecture; a :class:`Layout` is one way of running
it: data-parallel replicate and shard degrees, tensor, pipeline and context-parallel degrees,
micro-batch, micro-batches per step and activation checkpointing. The device mesh is built in
TorchTitan's order, outermost first ``pp, dp_replicate, dp_shard, cp, tp`` (torchtitan
``ParallelDims.build_mesh``): tensor-parallel ranks are neighbours, so they share a node.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Literal, get_args

from ito.core.hardware import Accelerator, Fabric
from ito.core.model_sizes import ModelSize

__all__ = [
    "MESH_ORDER",
    "ActivationCheckpointing",
    "Layout",
    "ModelShape",
    "Parallelism",
    "PlannerInput",
]

ActivationCheckpointing = Literal["none", "selective", "full"]
AC_MODES: tuple[ActivationCheckpointing, ...] = get_args(ActivationCheckpointing)

MESH_ORDER: tuple[str, ...] = ("pp", "dp_replicate", "dp_shard", "cp", "tp")
"""Mesh dimensions, outermost first (TorchTitan ``ParallelDims``)."""

FFN_MULTIPLE = 256
"""Llama rounds the SwiGLU width to a multiple of 256 (``multiple_of`` in Meta's llama code)."""


@dataclass(frozen=True)
class ModelShape:
    """A Llama decoder: grouped-query attention, SwiGLU MLP, RMSNorm, untied embeddings."""

    layers: int
    hidden: int
    heads: int
    kv_heads: int
    ffn: int
    vocab: int

    def __post_init__(self) -> None:
        for name in ("layers", "hidden", "heads", "kv_heads", "ffn", "vocab"):
            if getattr(self, name) < 1:
                raise ValueError(f"model.{name} must be at least 1")
        if self.hidden % self.heads:
            raise ValueError("model.hidden must be a multiple of model.heads")
        if self.heads % self.kv_heads:
            raise ValueError("model.heads must be a multiple of model.kv_heads")

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def kv_fraction(self) -> float:
        """kv heads / heads: the k and v projections' width relative to q's."""
        return self.kv_heads / self.heads

    @property
    def layer_parameters(self) -> int:
        """q and o (h² each), k and v (h·kv·head_dim each), SwiGLU (3·h·ffn), two RMSNorms."""
        h = self.hidden
        attention = 2 * h * h + 2 * h * self.kv_heads * self.head_dim
        return attention + 3 * h * self.ffn + 2 * h

    @property
    def embedding_parameters(self) -> int:
        return self.vocab * self.hidden

    @property
    def output_parameters(self) -> int:
        """The untied output projection and the final RMSNorm."""
        return self.vocab * self.hidden + self.hidden

    @property
    def parameters(self) -> int:
        return (
            self.layers * self.layer_parameters + self.embedding_parameters + self.output_parameters
        )

    def flops_per_token(self, seq_len: int) -> float:
        """Model FLOPs per trained token, 6·N + 12·L·h·s: the same definition as
        :meth:`ito.core.model_sizes.ModelSize.flops_per_token` (Kaplan et al. 2020 §2.1), so a
        predicted MFU compares with the one the engine measures."""
        return 6.0 * self.parameters + 12.0 * self.layers * self.hidden * seq_len

    @classmethod
    def from_size(cls, size: ModelSize) -> ModelShape:
        return cls(
            layers=size.layers,
            hidden=size.hidden,
            heads=size.heads,
            kv_heads=size.kv_heads,
            ffn=size.ffn,
            vocab=size.vocab,
        )

    @classmethod
    def with_parameters(
        cls, parameters: int, *, layers: int, hidden: int, heads: int, kv_heads: int, vocab: int
    ) -> ModelShape:
        """The shape whose SwiGLU width makes the parameter count closest to ``parameters``
        (the width solved from :attr:`parameters`, rounded to a multiple of 256)."""
        if min(layers, hidden, heads, kv_heads, vocab) < 1 or hidden % heads:
            raise ValueError("model: layers, hidden, heads, kv_heads, vocab must be positive")
        h = hidden
        fixed = 2 * h * h + 2 * h * kv_heads * (h // heads) + 2 * h
        per_layer = (parameters - 2 * vocab * h - h) / layers
        ffn = round((per_layer - fixed) / (3 * h) / FFN_MULTIPLE) * FFN_MULTIPLE
        if ffn < FFN_MULTIPLE:
            raise ValueError("model.parameters is too small for this many layers of this width")
        return cls(layers, hidden, heads, kv_heads, ffn, vocab)


@dataclass(frozen=True)
class Parallelism:
    """Choices pinned by the caller (a manifest's ``resources.parallelism``): every field set
    is validated instead of chosen; ``None`` leaves it to the planner."""

    dp_replicate: int | None = None
    dp_shard: int | None = None
    tp: int | None = None
    pp: int | None = None
    cp: int | None = None
    micro_batch: int | None = None
    activation_checkpointing: ActivationCheckpointing | None = None

    def __post_init__(self) -> None:
        for name in ("dp_replicate", "dp_shard", "tp", "pp", "cp", "micro_batch"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ValueError(f"parallelism.{name} must be a positive integer")
        ac = self.activation_checkpointing
        if ac is not None and ac not in AC_MODES:
            raise ValueError(f"parallelism.activation_checkpointing must be one of {AC_MODES}")

    @classmethod
    def from_mapping(cls, values: Mapping[str, object]) -> Parallelism:
        """From a manifest's ``parallelism`` mapping; an unknown key is an error."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"parallelism: unknown keys {unknown}; known: {sorted(known)}")
        return cls(**values)  # type: ignore[arg-type]

    @property
    def pinned(self) -> dict[str, object]:
        return {
            f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not None
        }


@dataclass(frozen=True)
class PlannerInput:
    model: ModelShape
    seq_len: int
    """Tokens per sequence."""
    accelerator: Accelerator
    nodes: int
    gpus_per_node: int
    fabric: Fabric
    """What joins the nodes."""
    global_batch_tokens: int | None = None
    """Tokens per optimizer step; ``None`` lets the planner size it (one micro-batch per
    data-parallel rank, or enough micro-batches to keep a pipeline's bubble small)."""
    fp8: bool = False
    """fp8 matmuls requested (the planner never turns them on by itself: numerics change)."""
    pinned: Parallelism = field(default_factory=Parallelism)
    compile: bool = True
    """Whether the layers may be compiled (``torch.compile``) on a GPU; ``False`` where the
    engine that will run the plan does not compile (a run's plan, :mod:`ito.core.run_plan`)."""
    allow_wasteful: bool = False
    """Report wasteful choices (a faster or smaller layout exists) as warnings instead of
    refusing: for tests and benchmarks that must run one layout on purpose. What cannot run
    is refused regardless."""

    def __post_init__(self) -> None:
        if self.seq_len < 1:
            raise ValueError("seq_len must be at least 1")
        if self.nodes < 1 or self.gpus_per_node < 1:
            raise ValueError("nodes and gpus_per_node must be at least 1")
        tokens = self.global_batch_tokens
        if tokens is not None and (tokens < self.seq_len or tokens % self.seq_len):
            raise ValueError("global_batch_tokens must be a whole number of sequences")

    @property
    def world(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def sequences(self) -> int | None:
        """Sequences per optimizer step, when the batch is given."""
        tokens = self.global_batch_tokens
        return None if tokens is None else tokens // self.seq_len

    @property
    def on_gpu(self) -> bool:
        return self.accelerator.compute_capability is not None

    @property
    def compiles(self) -> bool:
        return self.on_gpu and self.compile

    @property
    def compute_bytes(self) -> int:
        """Bytes of one parameter or activation element as the model computes: bf16 on a GPU
        (FSDP2 ``MixedPrecisionPolicy(param_dtype=bfloat16)``), fp32 on the CPU stand-in."""
        return 2 if self.on_gpu else 4


@dataclass(frozen=True)
class Layout:
    """One candidate: degrees, micro-batching and activation checkpointing."""

    dp_replicate: int
    dp_shard: int
    tp: int
    pp: int
    cp: int
    micro_batch: int
    """Sequences per micro-batch on one data-parallel rank."""
    microbatches: int
    """Micro-batches per optimizer step on one data-parallel rank: gradient accumulation
    without a pipeline, the pipeline schedule's micro-batches with one."""
    activation_checkpointing: ActivationCheckpointing

    @property
    def world(self) -> int:
        return self.dp_replicate * self.dp_shard * self.tp * self.pp * self.cp

    @property
    def dp(self) -> int:
        return self.dp_replicate * self.dp_shard

    @property
    def fsdp(self) -> int:
        """Ranks one parameter is sharded over: TorchTitan shards over ``dp_shard × cp``."""
        return self.dp_shard * self.cp

    def degree(self, dim: str) -> int:
        return int(getattr(self, dim))

    def stride(self, dim: str) -> int:
        """Rank distance between neighbours of ``dim``: the product of the inner degrees."""
        inner = MESH_ORDER[MESH_ORDER.index(dim) + 1 :]
        return math.prod(self.degree(d) for d in inner)

    def describe(self) -> str:
        dims = ("dp_replicate", "dp_shard", "tp", "pp", "cp")
        degrees = " ".join(f"{dim}={self.degree(dim)}" for dim in dims)
        return (
            f"{degrees} micro_batch={self.micro_batch} "
            f"activation_checkpointing={self.activation_checkpointing}"
        )

    def layers_per_stage(self, layers: int) -> int:
        """The largest stage's layer count (TorchTitan splits unevenly when it must)."""
        return -(-layers // self.pp)

    def tokens_per_microbatch(self, seq_len: int) -> int:
        """Tokens one rank holds activations for per micro-batch (context parallel splits the
        sequence)."""
        return self.micro_batch * seq_len // self.cp
