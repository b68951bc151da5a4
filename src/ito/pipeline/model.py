"""The Llama decoder, its FSDP2 sharding, the optimizer and the learning-rate schedule.

The architecture comes from the size table (:mod:`ito.core.model_sizes`); weights are random,
seeded from the run id, the same whatever the layout. The model is built on the ``meta`` device
and sharded before any parameter is materialised (:mod:`ito.pipeline.parallelize`).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import torch
from torch.optim.lr_scheduler import LambdaLR
from transformers import LlamaConfig, LlamaForCausalLM
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

from ito.core.hardware import ACCELERATORS
from ito.core.model_sizes import ModelSize
from ito.pipeline.loss import use_chunked_loss
from ito.pipeline.parallelize import (
    initialize,
    parallelize,
    place_grads_as_parameters,
    uses_fsdp,
)
from ito.pipeline.pipeline_stages import split_stage

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

    from ito.pipeline.layout import EngineLayout

__all__ = [
    "PEAK_LR",
    "LocalAdamW",
    "build_model",
    "build_optimizer",
    "build_scheduler",
    "lay_out_model",
    "llama_config",
    "lr_factor",
    "peak_flops",
]

PEAK_LR: dict[str, float] = {"tiny": 3e-3, "150m": 6e-4, "1b": 3e-4, "8b": 3e-4}
"""Peak AdamW learning rate per size, in the range of published Llama-style recipes of that
scale (GPT-3 paper Table 2.1 for the 125M–1.3B rows; Llama 3 used 3e-4 at 8B)."""
WEIGHT_DECAY = 0.1
BETAS = (0.9, 0.95)
WARMUP_FRACTION = 0.1
MIN_LR_RATIO = 0.1
"""Cosine decay ends at a tenth of the peak (Chinchilla, Hoffmann et al. 2022, §3)."""


def llama_config(size: ModelSize) -> LlamaConfig:
    """The Llama architecture of a size of the table (untied embeddings, no dropout)."""
    return LlamaConfig(
        vocab_size=size.vocab,
        hidden_size=size.hidden,
        intermediate_size=size.ffn,
        num_hidden_layers=size.layers,
        num_attention_heads=size.heads,
        num_key_value_heads=size.kv_heads,
        max_position_embeddings=size.max_seq_len,
        tie_word_embeddings=False,
        attention_dropout=0.0,
    )


def lay_out_model(size: ModelSize, mesh: DeviceMesh, layout: EngineLayout) -> LlamaForCausalLM:
    """The model of ``size`` on the ``meta`` device, laid out on ``mesh`` as ``layout`` says
    (this rank's pipeline stage, tensor parallel, activation checkpointing, FSDP2) and with the
    chunked loss (:mod:`ito.pipeline.loss`), before any parameter is materialised: what
    :func:`build_model` initialises, and what ``bench/planner_memory.py`` runs under
    ``FakeTensorMode``."""
    with torch.device("meta"):
        model = LlamaForCausalLM(llama_config(size))
    if layout.pp > 1:
        split_stage(model, mesh["pp"].get_local_rank(), layout.pp)
    else:
        use_chunked_loss(model)
    parallelize(model, mesh, layout)
    return model


def build_model(
    size: ModelSize, seed: int, mesh: DeviceMesh, layout: EngineLayout, device: torch.device
) -> LlamaForCausalLM:
    """The model of ``size`` laid out on ``mesh`` as ``layout`` says, initialised from ``seed``
    (the same values on any layout); with a pipeline, this rank's stage of it. Leaves the
    global RNG as seeded initialisation leaves it."""
    model = lay_out_model(size, mesh, layout)
    template = None
    if layout.pp > 1:
        # The whole model's construction order, to replay the draws of the other stages.
        with torch.device("meta"):
            template = LlamaForCausalLM(llama_config(size))
    initialize(model, seed, device, template)
    if not uses_fsdp(layout):
        place_grads_as_parameters(model)
    return model


class LocalAdamW(torch.optim.AdamW):
    """AdamW whose update runs on the local shards of DTensor parameters: one ``foreach``
    kernel per device and dtype over every parameter, plain or DTensor, instead of DTensor's
    dispatch (a sharding propagation per tensor per op). AdamW is element-wise, so the update
    of a shard is the shard of the update: the same values as ``torch.optim.AdamW``. The
    states stay DTensors laid out as their parameters (checkpoints are unchanged)."""

    def _init_group(  # type: ignore[no-untyped-def]
        self, group, params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps
    ) -> bool:
        has_complex: bool = super()._init_group(  # type: ignore[no-untyped-call]
            group, params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps
        )
        for tensors in (grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs):
            for i, (param, tensor) in enumerate(zip(params, tensors, strict=False)):
                tensors[i] = _local_like(tensor, param)
        params[:] = [_local_like(p, p) for p in params]
        return has_complex


def _local_like(tensor: torch.Tensor, param: torch.Tensor) -> torch.Tensor:
    """The local shard of ``tensor`` laid out as ``param`` (a gradient in another layout is
    redistributed first), or ``tensor`` itself when neither is a DTensor."""
    from torch.distributed.tensor import DTensor

    if not isinstance(tensor, DTensor):
        return tensor
    assert isinstance(param, DTensor)
    if tensor.placements != param.placements:
        tensor = tensor.redistribute(param.device_mesh, param.placements)
    return tensor.to_local()


def build_optimizer(model: torch.nn.Module, size_name: str) -> torch.optim.AdamW:
    return LocalAdamW(
        model.parameters(),
        lr=PEAK_LR[size_name],
        betas=BETAS,
        weight_decay=WEIGHT_DECAY,
        foreach=True,
    )


def anneal_factor(step: int, total_steps: int) -> float:
    """The ``midtrain`` stage's schedule: the same linear warmup to the peak, then a linear
    anneal to zero over the rest of the stage — the decay phase of a warmup-stable-decay
    schedule (Hu et al. 2024, MiniCPM) on the stage's own mix, annealed to zero as Llama 3
    anneals its final high-quality data (§3.4.3). ``step`` is the number of optimizer steps
    already taken in the stage (LambdaLR's convention)."""
    warmup = max(1, int(total_steps * WARMUP_FRACTION))
    if step < warmup:
        return (step + 1) / warmup
    return max(0.0, 1.0 - (step - warmup) / max(1, total_steps - warmup))


def lr_factor(step: int, total_steps: int) -> float:
    """Linear warmup then cosine decay to ``MIN_LR_RATIO``; ``step`` is the number of optimizer
    steps already taken in the stage (LambdaLR's convention)."""
    warmup = max(1, int(total_steps * WARMUP_FRACTION))
    if step < warmup:
        return (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total_steps - warmup))
    return MIN_LR_RATIO + (1 - MIN_LR_RATIO) * 0.5 * (1 + math.cos(math.pi * progress))


def build_scheduler(
    optimizer: torch.optim.Optimizer,
    total_steps: int,
    *,
    anneal: bool = False,
    scale: float = 1.0,
) -> LambdaLR:
    """The stage's schedule: warmup then cosine (each stage restarts its own warmup from the
    peak rate, not from where the last stage decayed to); with ``anneal``, warmup then a
    linear anneal to zero (:func:`anneal_factor`). ``scale``: the stage's peak as a fraction
    of the optimizer's (post-training's smaller rates)."""
    for group in optimizer.param_groups:
        group["lr"] = group.setdefault("initial_lr", group["lr"])
    factor = anneal_factor if anneal else lr_factor
    return LambdaLR(optimizer, lambda step: scale * factor(step, total_steps))


def set_rope_base(model: torch.nn.Module, base: float) -> int:
    """Give every rotary embedding of ``model`` the base ``base`` (its inverse frequencies
    recomputed on their own device, as :class:`LlamaRotaryEmbedding` computes them at init);
    returns how many it changed. The frequencies are not persistent buffers: each stage sets
    them when it starts, a resumed one included."""
    changed = 0
    for module in model.modules():
        if isinstance(module, LlamaRotaryEmbedding):
            inv = module.inv_freq
            dim = inv.numel() * 2
            fresh = 1.0 / (
                base ** (torch.arange(0, dim, 2, dtype=torch.float, device=inv.device) / dim)
            )
            with torch.no_grad():
                inv.copy_(fresh)
                module.original_inv_freq.copy_(fresh)
            changed += 1
    return changed


def rope_base(config: LlamaConfig) -> float:
    """The model's own RoPE base (θ)."""
    params: dict[str, Any] = dict(config.rope_parameters or {})
    return float(params["rope_theta"])


def peak_flops() -> float | None:
    """Dense bf16 peak FLOP/s of this process's GPU when the hardware table knows it."""
    if not torch.cuda.is_available():
        return None
    name = torch.cuda.get_device_name().lower()
    for key, accel in ACCELERATORS.items():
        if key != "cpu" and key in name:
            return accel.peak_bf16_flops
    return None
