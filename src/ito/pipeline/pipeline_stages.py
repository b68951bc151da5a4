"""Pipeline parallel with ``torch.distributed.pipelining`` (DESIGN §7.2): each ``pp`` rank holds
one stage — a contiguous run of decoder layers, the first stage also the embeddings, the last
also the final norm and the output head — and a 1F1B schedule (Narayanan et al. 2021, §2.2)
runs ``pp_microbatches`` micro-batches through them per optimizer step.

A stage is the Hugging Face model with the other stages' modules removed: the layers it keeps
sit in a ``ModuleDict`` under their original indices, so its parameter names are the whole
model's (a checkpoint saved under one layout loads under another) and FSDP2 / tensor parallel
apply to it unchanged. Its forward takes token ids (first stage) or hidden states and returns
hidden states, on the last stage after the final norm. The schedule's loss function applies the
last stage's output head with the chunked causal-LM loss (:mod:`ito.pipeline.loss`: mean over
every predicted token, one chunk of logits at a time); it runs outside the stage's forward, while
FSDP2 keeps the root's parameters (the head's) unsharded until the backward. The schedule scales
the gradients by the micro-batch count, so the step equals one over the whole batch.
"""

from __future__ import annotations

from types import MethodType
from typing import TYPE_CHECKING

import torch
from torch import nn

from ito.pipeline.loss import CHUNK_TOKENS, causal_lm_loss

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh
    from transformers import LlamaForCausalLM

    from ito.pipeline.layout import EngineLayout

__all__ = ["PipelineRunner", "split_stage", "stage_layers"]


def stage_layers(layers: int, stage: int, stages: int) -> range:
    """The decoder layers of ``stage``: contiguous, the first stages one longer when the count
    does not divide (TorchTitan's even split)."""
    base, extra = divmod(layers, stages)
    start = stage * base + min(stage, extra)
    return range(start, start + base + (1 if stage < extra else 0))


def split_stage(model: LlamaForCausalLM, stage: int, stages: int) -> None:
    """Keep only ``stage``'s modules of the (meta-device) ``model`` and give it the stage's
    forward."""
    inner = model.model
    keep = stage_layers(len(inner.layers), stage, stages)
    inner.layers = nn.ModuleDict({str(i): inner.layers[i] for i in keep})
    if stage > 0:
        inner.embed_tokens = None
    if stage < stages - 1:
        inner.norm = None
        model.lm_head = None
    model.forward = MethodType(_stage_forward, model)


def _stage_forward(self: LlamaForCausalLM, x: torch.Tensor) -> torch.Tensor:
    """LlamaModel's forward over this stage's layers (no cache; SDPA is causal without a mask).

    Under tensor parallel the residual stream is sharded along the sequence over the tp ranks
    (:func:`ito.pipeline.parallelize.sequence_parallel_mesh`): a stage sends its rank's shard
    of the hidden states, ``(batch, seq / tp, hidden)``, and the next stage takes it back as
    that shard of the whole sequence (so the sequence must divide by ``tp``)."""
    from ito.pipeline.parallelize import sequence_parallel_mesh

    inner = self.model
    sp_mesh = sequence_parallel_mesh(self)
    hidden: torch.Tensor
    if inner.embed_tokens is not None:
        hidden = inner.embed_tokens(x)
    elif sp_mesh is not None:
        from torch.distributed.tensor import DTensor, Shard

        hidden = DTensor.from_local(x, sp_mesh, [Shard(1)], run_check=False)
    else:
        hidden = x
    positions = torch.arange(hidden.shape[1], device=hidden.device).unsqueeze(0)
    rope = inner.rotary_emb(hidden, position_ids=positions)
    for layer in inner.layers.values():
        hidden = layer(
            hidden, attention_mask=None, position_embeddings=rope, position_ids=positions
        )
    if inner.norm is not None:
        return inner.norm(hidden)  # type: ignore[no-any-return]
    if sp_mesh is not None:
        from torch.distributed.tensor import DTensor

        assert isinstance(hidden, DTensor)
        return hidden.to_local()
    return hidden


class PipelineRunner:
    """This rank's stage and the 1F1B schedule over the ``pp`` mesh dimension."""

    def __init__(
        self,
        model: LlamaForCausalLM,
        mesh: DeviceMesh,
        layout: EngineLayout,
        device: torch.device,
        chunk_tokens: int = CHUNK_TOKENS,
    ) -> None:
        from torch.distributed.pipelining import PipelineStage, Schedule1F1B

        pp_mesh = mesh["pp"]
        self.group = pp_mesh.get_group()
        self.stage_index = pp_mesh.get_local_rank()
        self.first = self.stage_index == 0
        self.last = self.stage_index == layout.pp - 1
        self.device = device
        self.model = model
        self.head = model.lm_head
        self.chunk_tokens = chunk_tokens
        stage = PipelineStage(model, self.stage_index, layout.pp, device, group=self.group)
        self.schedule = Schedule1F1B(
            stage, n_microbatches=layout.pp_microbatches, loss_fn=self._loss
        )

    def _loss(self, hidden: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        assert self.head is not None, "only the last stage computes the loss"
        return causal_lm_loss(hidden, self.head, tokens, chunk_tokens=self.chunk_tokens)

    def train_step(self, batch: torch.Tensor) -> torch.Tensor:
        """Forward and backward of the batch; the mean loss on the last stage, 0 elsewhere."""
        losses: list[torch.Tensor] = []
        self._run(self.schedule.step, batch, losses)
        if not self.last:
            return torch.zeros((), device=self.device)
        return torch.stack([loss.detach().float() for loss in losses]).mean()

    def token_losses(self, batch: torch.Tensor) -> torch.Tensor | None:
        """Forward only; on the last stage each position's loss ``(batch, seq)`` (the last
        position's 0: it predicts nothing), ``None`` elsewhere."""
        out = self._run(self.schedule.eval, batch, [])
        if not self.last:
            return None
        assert self.head is not None
        from torch.distributed.fsdp import FSDPModule

        # The schedule's evaluation leaves the stage resharded; the head, applied outside the
        # stage's forward, needs its parameters gathered (the stage's data-parallel peers all
        # run this, as they ran the forward).
        root = self.model if isinstance(self.model, FSDPModule) else None
        if root is not None:
            root.unshard()
        try:
            return causal_lm_loss(
                out, self.head, batch, reduction="none", chunk_tokens=self.chunk_tokens
            )
        finally:
            if root is not None:
                root.reshard()

    def _run(self, call: object, batch: torch.Tensor, losses: list[torch.Tensor]) -> torch.Tensor:
        assert callable(call)
        if self.first and self.last:
            raise AssertionError("a pipeline has at least two stages")
        if self.first:
            return call(batch)  # type: ignore[no-any-return]
        if self.last:
            return call(target=batch, losses=losses)  # type: ignore[no-any-return]
        return call()  # type: ignore[no-any-return]
