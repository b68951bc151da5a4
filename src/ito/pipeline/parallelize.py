"""Applying a layout to the Llama decoder the TorchTitan way (DESIGN §7.2): built on the ``meta``
device, tensor parallel (DTensor ``parallelize_module``), activation checkpointing per decoder
layer, FSDP2 ``fully_shard`` over ``dp_shard`` (HSDP with ``dp_replicate``) with a
``MixedPrecisionPolicy``, then ``to_empty`` and a deterministic initialisation — so no rank ever
holds the full model, only one parameter at a time while it is initialised.

The initialisation reproduces, value for value, what ``torch.manual_seed(seed)`` followed by
``LlamaForCausalLM(config)`` on the same device gives (torch's default ``reset_parameters``
draws during construction, then Hugging Face's ``_init_weights`` — normal(0, 0.02) for linear
and embedding weights, ones for RMSNorm): each parameter's full value is drawn in that order
and only this rank's shard of it is kept, whatever the layout. Same seed, same model, on one
process or on any mesh.
"""

from __future__ import annotations

import math
from functools import partial
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh
    from transformers import LlamaForCausalLM

    from ito.pipeline.layout import EngineLayout

__all__ = [
    "TP_PLAN",
    "clip_grad_norm",
    "decoder_layers",
    "initialize",
    "parallelize",
    "place_grads_as_parameters",
    "sequence_parallel_mesh",
    "set_requires_all_reduce",
    "tensor_parallel",
    "uses_fsdp",
]

TP_PLAN: dict[str, str] = {
    "self_attn.q_proj": "colwise",
    "self_attn.k_proj": "colwise",
    "self_attn.v_proj": "colwise",
    "self_attn.o_proj": "rowwise",
    "mlp.gate_proj": "colwise",
    "mlp.up_proj": "colwise",
    "mlp.down_proj": "rowwise",
}
"""Megatron's split of a decoder layer (Shoeybi et al. 2019, §3): q, k, v, gate and up split by
output features, o and down by input features, so attention heads and the MLP's hidden width
are divided between the tensor-parallel ranks and one all-reduce ends each block. The heads per
rank follow from the local width (the attention reshapes to ``(-1, head_dim)``). The embedding
and the output head are split by vocabulary (:func:`_root_plan`); with sequence parallel between
the blocks (:func:`_layer_plan`)."""

SAVED_OPS: frozenset[Any] = frozenset(
    {
        torch.ops.aten.mm.default,
        torch.ops.aten.addmm.default,
        torch.ops.aten.bmm.default,
        torch.ops.aten._scaled_dot_product_efficient_attention.default,
        torch.ops.aten._scaled_dot_product_flash_attention.default,
        torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default,
        torch.ops.aten._scaled_dot_product_cudnn_attention.default,
    }
)
"""Selective activation checkpointing keeps the matmul and attention outputs and recomputes the
cheap element-wise ops (norms, SwiGLU, rotary) — Korthikanti et al. 2022 §4.3; TorchTitan's
op-level selective AC keeps the same ops. Under tensor parallel the row-parallel matmuls (o,
down) are the exception: their outputs are whole-sequence partial sums (``tp`` times the
memory of what follows them), so the output of the reduce-scatter that ends each block is kept
instead and the two matmuls are left to recomputation (TorchTitan keeps the reduce-scatter's
output too). Only o's actually runs again: the checkpoint stops replaying a layer once the last
tensor its backward needs (down's input) is packed again, before down's matmul
(``torch.utils.checkpoint``'s early stop), which is what the planner charges
(:func:`ito.core.planner_time.recomputed_matmul_flops`; ``tests/pipeline/recompute_check.py``
counts them)."""


def uses_fsdp(layout: EngineLayout) -> bool:
    """Whether :func:`parallelize` applies FSDP2: not when the data-parallel mesh is a single
    rank in full precision (nothing to shard, reduce or cast)."""
    return layout.dp_replicate * layout.dp_shard > 1 or layout.mixed_precision


def place_grads_as_parameters(model: torch.nn.Module) -> int:
    """Without FSDP2 (which reduce-scatters every gradient into its parameter's shard), a
    DTensor parameter's gradient can leave autograd in another placement than the parameter —
    the vocabulary-split embedding's comes out whole under sequence parallel. A hook after each
    accumulation redistributes it to the parameter's placement, so the gradient held between
    steps is the parameter's shard, as the planner counts it. Register it on the initialised
    model; returns the number of parameters hooked."""
    from torch.distributed.tensor import DTensor

    def to_parameter_placement(param: torch.Tensor) -> None:
        grad = param.grad
        if (
            isinstance(param, DTensor)
            and isinstance(grad, DTensor)
            and grad.placements != param.placements
        ):
            param.grad = grad.redistribute(param.device_mesh, param.placements)

    hooked = 0
    for param in model.parameters():
        if isinstance(param, DTensor):
            param.register_post_accumulate_grad_hook(to_parameter_placement)  # type: ignore[no-untyped-call]
            hooked += 1
    return hooked


def parallelize(model: LlamaForCausalLM, mesh: DeviceMesh, layout: EngineLayout) -> None:
    """Tensor parallel, activation checkpointing and FSDP2 over the meta-device ``model`` (no
    FSDP2 when the data-parallel mesh is a single rank in full precision)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    if layout.tp > 1:
        tensor_parallel(model, mesh["tp"])
    _activation_checkpointing(model, layout.activation_checkpointing)
    dp_mesh = mesh["dp_replicate", "dp_shard"] if layout.dp_replicate > 1 else mesh["dp_shard"]
    if not uses_fsdp(layout):
        # Nothing to shard, reduce or cast: FSDP2 would only add its hooks to every forward and
        # backward. The parameters keep their names (FSDP2 renames nothing), so checkpoints
        # load across layouts with and without it.
        return
    policy = MixedPrecisionPolicy(
        param_dtype=layout.param_dtype if layout.mixed_precision else None,
        reduce_dtype=layout.reduce_dtype if layout.mixed_precision else None,
    )
    # Each decoder layer is its own FSDP2 unit and the root holds the embeddings and the head,
    # so only one layer's full parameters are gathered at a time.
    for layer in decoder_layers(model):
        fully_shard(layer, mesh=dp_mesh, mp_policy=policy)
    fully_shard(model, mesh=dp_mesh, mp_policy=policy)


def set_requires_all_reduce(model: nn.Module, flag: bool) -> None:
    """Whether this backward ends with the data-parallel gradient reduction (FSDP2's
    ``set_requires_all_reduce``); a model :func:`parallelize` left unsharded has none."""
    from torch.distributed.fsdp import FSDPModule

    if isinstance(model, FSDPModule):
        model.set_requires_all_reduce(flag)


def decoder_layers(model: LlamaForCausalLM) -> list[nn.Module]:
    """The decoder layers this rank holds (all of them, or its pipeline stage's)."""
    layers = model.model.layers
    return list(layers.values()) if isinstance(layers, nn.ModuleDict) else list(layers)


def tensor_parallel(model: LlamaForCausalLM, tp_mesh: DeviceMesh) -> None:
    """The engine's tensor-parallel plan on the meta-device ``model`` over ``tp_mesh``: each
    decoder layer's Megatron split with sequence parallel (:func:`_layer_plan`), then the
    embedding, final norm and output head (:func:`_root_plan`); the mesh is recorded for
    :func:`sequence_parallel_mesh`. Only the plan: no activation checkpointing, no FSDP2 (what
    :func:`parallelize` adds), so a plain training loop can split a model exactly as the engine
    does (``bench/train_overhead.py``). Raises :class:`ItoError` (``layout_unsupported``) when
    the degree does not divide the heads and kv heads."""
    from torch.distributed.tensor.parallel import parallelize_module

    heads = int(model.config.num_attention_heads or 0)
    kv_heads = int(model.config.num_key_value_heads or 0)
    tp = tp_mesh.size()
    if heads % tp or kv_heads % tp:
        from ito.core.errors import ItoError

        raise ItoError(
            "layout_unsupported",
            f"tp={tp} does not divide the heads ({heads}) and kv heads ({kv_heads})",
        )
    plan = _layer_plan()
    for layer in decoder_layers(model):
        parallelize_module(layer, tp_mesh, plan)
    for name, style in _root_plan(model):
        parallelize_module(model.get_submodule(name), tp_mesh, style)
    setattr(model, _SP_MESH, tp_mesh)


_SP_MESH = "_ito_sequence_parallel_mesh"


def sequence_parallel_mesh(model: nn.Module) -> DeviceMesh | None:
    """The tensor-parallel mesh whose ranks shard ``model``'s residual stream along the
    sequence (:func:`_layer_plan`), ``None`` without tensor parallel."""
    mesh: DeviceMesh | None = getattr(model, _SP_MESH, None)
    return mesh


def _layer_plan() -> dict[str, Any]:
    """A decoder layer's plan: :data:`TP_PLAN`'s Megatron split with sequence parallel
    (Korthikanti et al. 2022, §4.2.2; TorchTitan's ``apply_tp``). Between the tensor-parallel
    regions the residual stream is a DTensor sharded along the sequence (``Shard(1)``) over the
    tp ranks, so the norms and the residual adds hold ``1/tp`` of the tokens: each RMSNorm runs
    on its shard (``SequenceParallel``), the attention's and the MLP's input is gathered whole
    (``PrepareModuleInput``: an all-gather in the forward, a reduce-scatter in the backward),
    and o and down end their block with a reduce-scatter back to the sequence shards instead of
    an all-reduce. Hugging Face's decoder layer passes the attention ``hidden_states`` by
    keyword; the rotary ``position_embeddings`` are plain whole-sequence tensors, applied to the
    gathered (local) q and k."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
    )

    styles: dict[str, Any] = {
        "colwise": ColwiseParallel,
        "rowwise": partial(RowwiseParallel, output_layouts=Shard(1), use_local_output=False),
    }
    plan: dict[str, Any] = {name: styles[style]() for name, style in TP_PLAN.items()}
    plan["input_layernorm"] = SequenceParallel()
    plan["post_attention_layernorm"] = SequenceParallel()
    plan["self_attn"] = PrepareModuleInput(
        input_kwarg_layouts={"hidden_states": Shard(1)},
        desired_input_kwarg_layouts={"hidden_states": Replicate()},
        use_local_output=True,
    )
    plan["mlp"] = PrepareModuleInput(
        input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),), use_local_output=True
    )
    return plan


def _root_plan(model: LlamaForCausalLM) -> list[tuple[str, Any]]:
    """The embedding split by vocabulary rows (each token's row lives on one rank, the others
    add zeros), its output reduce-scattered into the sequence shards of the residual stream (a
    DTensor of the whole sequence's shape, so Hugging Face's positions and mask see every
    token); the final norm on the sequence shards, its output gathered whole; the output head
    split by vocabulary columns, its logits gathered whole on every rank (no loss parallel:
    the chunked loss, :mod:`ito.pipeline.loss`, splits the gathered hidden states into chunks
    of tokens) — TorchTitan's ``apply_tp`` for ``tok_embeddings``, ``norm`` and ``output``, so
    a rank holds ``1/tp`` of the two largest matrices as the planner counts
    (:mod:`ito.core.planner_memory`). This stage's modules only, under a pipeline. A list of
    (module, style) pairs in order: the final norm gets two."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleOutput,
        RowwiseParallel,
        SequenceParallel,
    )

    plan: list[tuple[str, Any]] = []
    if model.model.embed_tokens is not None:
        embedding = RowwiseParallel(
            input_layouts=Replicate(), output_layouts=Shard(1), use_local_output=False
        )
        plan.append(("model.embed_tokens", embedding))
    if model.model.norm is not None:
        plan.append(("model.norm", SequenceParallel()))
        gather = PrepareModuleOutput(
            output_layouts=Shard(1), desired_output_layouts=Replicate(), use_local_output=True
        )
        plan.append(("model.norm", gather))
    if model.lm_head is not None:
        plan.append(("lm_head", ColwiseParallel(output_layouts=Replicate())))
    return plan


REDUCE_SCATTER: Any = torch.ops._c10d_functional.reduce_scatter_tensor.default


def _row_parallel(args: tuple[object, ...]) -> bool:
    """Whether an ``mm`` seen by the checkpoint policy (which sees DTensors) is a row-parallel
    projection's: its weight (transposed) split along the contracted dimension."""
    from torch.distributed.tensor import DTensor, Shard

    weight = args[1] if len(args) > 1 else None
    return isinstance(weight, DTensor) and any(
        isinstance(p, Shard) and p.dim == 0 for p in weight.placements
    )


def _activation_checkpointing(model: LlamaForCausalLM, mode: str) -> None:
    if mode == "none":
        return
    kwargs: dict[str, Any] = {"use_reentrant": False}
    if mode == "selective":
        from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

        def policy(ctx: object, op: object, *args: object, **kwargs: object) -> CheckpointPolicy:
            if op is REDUCE_SCATTER or (op is torch.ops.aten.mm.default and _row_parallel(args)):
                # Sequence parallel: a row-parallel matmul's output is a whole-sequence partial
                # sum; its reduce-scatter's output (this rank's 1/tp of the tokens) is kept.
                return (
                    CheckpointPolicy.MUST_SAVE
                    if op is REDUCE_SCATTER
                    else CheckpointPolicy.PREFER_RECOMPUTE
                )
            if op in SAVED_OPS:
                return CheckpointPolicy.MUST_SAVE
            return CheckpointPolicy.PREFER_RECOMPUTE

        kwargs["context_fn"] = partial(create_selective_checkpoint_contexts, policy)
    # Hugging Face's decoder layers are ``GradientCheckpointingLayer``s: this wraps each one's
    # forward in ``torch.utils.checkpoint`` without renaming a parameter (checkpoints written
    # under one mode load under another).
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)  # type: ignore[no-untyped-call]


@torch.no_grad()
def initialize(
    model: LlamaForCausalLM,
    seed: int,
    device: torch.device,
    template: LlamaForCausalLM | None = None,
) -> None:
    """Materialise the sharded ``model`` (``to_empty``) and give it the values
    ``torch.manual_seed(seed); LlamaForCausalLM(config)`` would on ``device``.

    ``template``: the whole model (on ``meta``) when ``model`` is one pipeline stage of it; the
    draws of the modules other stages hold are replayed and dropped, so every stage gets its
    part of the same model."""
    model.to_empty(device=device)
    held = dict(model.named_modules())
    whole = template if template is not None else model
    torch.manual_seed(seed)
    std = float(model.config.initializer_range)
    _replay(whole, "", model, held, std, device, set())


def _replay(
    module: nn.Module,
    name: str,
    root: LlamaForCausalLM,
    held: dict[str, nn.Module],
    std: float,
    device: torch.device,
    done: set[str],
) -> None:
    """The generator draws of constructing ``module``, in construction (= registration) order.

    A leaf's constructor draws first (nn.Linear's kaiming-uniform, nn.Embedding's normal);
    those values are overwritten, but the draws move the generator, so they are replayed on
    scratch. A Hugging Face sub-model (``PreTrainedModel``, e.g. ``LlamaModel``) ends its own
    construction with ``post_init``, which initialises its not yet initialised modules in order
    (normal(0, std) for linear and embedding weights, ones for RMSNorm): those values are kept.
    """
    from transformers import PreTrainedModel

    if isinstance(module, nn.Linear | nn.Embedding):
        scratch = torch.empty(module.weight.shape, device=device)
        if isinstance(module, nn.Linear):
            nn.init.kaiming_uniform_(scratch, a=math.sqrt(5))
        else:
            nn.init.normal_(scratch)
        return
    for child_name, child in module.named_children():
        _replay(
            child, f"{name}.{child_name}" if name else child_name, root, held, std, device, done
        )
    if not isinstance(module, PreTrainedModel):
        return
    for sub_name, sub in module.named_modules(prefix=name):
        if sub_name in done:
            continue
        done.add(sub_name)
        mine = held.get(sub_name)  # None: another pipeline stage holds it
        if isinstance(sub, nn.Linear | nn.Embedding):
            value = torch.empty(sub.weight.shape, device=device).normal_(0, std)
            if mine is not None:
                assert isinstance(mine.weight, torch.Tensor)
                _assign(mine.weight, value)
        elif mine is not None and "RMSNorm" in type(sub).__name__:
            weight = mine.weight
            assert isinstance(weight, torch.Tensor)
            _assign(weight, torch.ones(weight.shape, device=device))
        elif mine is not None and "RotaryEmbedding" in type(sub).__name__:
            root._init_weights(mine)  # type: ignore[no-untyped-call]  # inv_freq, no randomness


def _assign(param: torch.Tensor, full: torch.Tensor) -> None:
    """Copy this rank's part of ``full`` into ``param`` (a plain or sharded tensor)."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    if isinstance(param, DTensor):
        # src_data_rank=None: every rank holds ``full`` and keeps its own slice, no collective.
        local = distribute_tensor(full, param.device_mesh, param.placements, src_data_rank=None)
        param.to_local().copy_(local.to_local())
    else:
        param.copy_(full)


@torch.no_grad()
def clip_grad_norm(
    parameters: list[torch.Tensor],
    max_norm: float,
    pp_group: torch.distributed.ProcessGroup | None = None,
) -> torch.Tensor:
    """``torch.nn.utils.clip_grad_norm_`` for parameters that live on different meshes (tensor
    parallel weights on ``dp_shard × tp``, the rest on ``dp_shard``, or plain tensors whole on
    every rank), computed on the local shards: the squared norm of each kind's shards is summed
    over the mesh dimensions that shard them — one all-reduce per dimension and kind (FSDP or
    tensor parallel alone: one in all) — then with the other pipeline stages' (``pp_group``);
    the gradients are scaled in place with one ``foreach`` kernel. The same norm as DTensor's
    reductions give, without a DTensor dispatch per gradient. Returns the total norm as a plain
    tensor."""
    from torch.distributed.tensor import DTensor, Replicate

    grads = [p.grad for p in parameters if p.grad is not None]
    shards: dict[tuple[object, tuple[int, ...]], list[torch.Tensor]] = {}
    for grad in grads:
        key: tuple[object, tuple[int, ...]] = (None, ())
        shard = grad
        if isinstance(grad, DTensor):
            if any(p.is_partial() for p in grad.placements):
                # Not yet summed: the norm is of the sum (the scaling below stays local).
                grad = grad.redistribute(
                    placements=[Replicate() if p.is_partial() else p for p in grad.placements]
                )
            dims = tuple(i for i, p in enumerate(grad.placements) if p.is_shard())
            key, shard = (grad.device_mesh, dims), grad.to_local()
        shards.setdefault(key, []).append(shard)
    squares = []
    for (mesh, dims), group in shards.items():
        square = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(group))) ** 2
        for dim in dims:
            assert mesh is not None
            torch.distributed.all_reduce(square, group=mesh.get_group(dim))  # type: ignore[attr-defined]
        squares.append(square)
    total_square = torch.stack(squares).sum() if squares else torch.zeros(())
    if pp_group is not None:
        torch.distributed.all_reduce(total_square, group=pp_group)
    total = total_square.sqrt()
    local_grads = [g.to_local() if isinstance(g, DTensor) else g for g in grads]
    torch.nn.utils.clip_grads_with_norm_(local_grads, max_norm, total)
    return total
