"""The causal-LM loss, computed a chunk of tokens at a time so the fp32 logits of the whole
micro-batch never exist.

``F.cross_entropy(lm_head(hidden).float(), labels)`` over a micro-batch of 8192 tokens and
Llama 3's 128,256-entry vocabulary holds 4 GiB of fp32 logits, as much again for their
log-softmax and, during the backward, their gradients: more than all the decoder layers'
activations of the 8B model under selective checkpointing. Here the output head and the fp32
loss run over ``CHUNK_TOKENS`` tokens at a time; every chunk but the last is wrapped in
``torch.utils.checkpoint`` (non-reentrant), so its logits are freed as soon as its loss is
summed and recomputed, one chunk at a time, during the backward. The last chunk's are kept,
as its backward runs first. The price is one more matmul of the output head per token for all
but the last chunk (about 2 % of the 8B model's training FLOPs at 8192 tokens).

The result equals ``F.cross_entropy`` over the whole micro-batch (mean over the labels that are
not ``IGNORE_INDEX``; only the order of the fp32 summation differs), gradients included, and
``LlamaForCausalLM(labels=…)``'s loss: each position predicts the next label, the last position
predicts nothing. Under tensor parallel the output head gathers each chunk's logits whole on
every rank (:func:`ito.pipeline.parallelize._root_plan`), so the loss is the same on each.
:mod:`ito.core.planner_memory` counts one chunk's logits and gradients (``loss`` in its memory
breakdown).
"""

from __future__ import annotations

from functools import partial
from types import MethodType
from typing import TYPE_CHECKING, Any, Literal

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from ito.core.planner_memory import LOSS_CHUNK_TOKENS

if TYPE_CHECKING:
    from collections.abc import Callable

    from transformers import LlamaForCausalLM

__all__ = [
    "CHUNK_TOKENS",
    "IGNORE_INDEX",
    "causal_lm_loss",
    "chunked_cross_entropy",
    "shift_labels",
    "use_chunked_loss",
]

CHUNK_TOKENS = LOSS_CHUNK_TOKENS
"""Tokens whose logits exist at once: the planner's figure, so the two cannot drift apart
(Liger-Kernel's fused linear cross entropy and TorchTitan's chunked loss use chunks of this
order: large enough that the output head's matmul stays efficient)."""
IGNORE_INDEX = -100
"""The label that predicts nothing (PyTorch's and Hugging Face's default)."""

Reduction = Literal["sum", "mean", "none"]


def _chunk_loss(
    head: Callable[[torch.Tensor], torch.Tensor], hidden: torch.Tensor, labels: torch.Tensor
) -> torch.Tensor:
    logits = head(hidden).float()
    return F.cross_entropy(logits, labels, ignore_index=IGNORE_INDEX, reduction="none")


def chunked_cross_entropy(
    hidden: torch.Tensor,
    head: Callable[[torch.Tensor], torch.Tensor],
    labels: torch.Tensor,
    *,
    reduction: Reduction = "mean",
    chunk_tokens: int = CHUNK_TOKENS,
) -> torch.Tensor:
    """``F.cross_entropy(head(hidden).float(), labels, ignore_index=IGNORE_INDEX)`` over
    ``chunk_tokens`` rows of ``hidden`` (``(tokens, hidden)``) at a time.

    ``mean`` divides the sum by the number of labels that are not ``IGNORE_INDEX`` (NaN when
    there is none, as ``F.cross_entropy``); ``none`` returns each token's loss (0 where
    ignored). Only the last chunk's logits outlive their own computation when gradients are
    recorded (see the module docstring)."""
    if chunk_tokens < 1:
        raise ValueError(f"chunk_tokens must be positive, not {chunk_tokens}")
    if hidden.dim() != 2 or labels.shape != hidden.shape[:1]:
        raise ValueError(
            f"hidden must be (tokens, hidden) and labels (tokens,): got {tuple(hidden.shape)} "
            f"and {tuple(labels.shape)}"
        )
    hiddens = torch.split(hidden, chunk_tokens)
    label_chunks = torch.split(labels, chunk_tokens)
    recompute = torch.is_grad_enabled()
    losses = []
    for i, (h, y) in enumerate(zip(hiddens, label_chunks, strict=True)):
        if recompute and i < len(hiddens) - 1:
            part = checkpoint(_chunk_loss, head, h, y, use_reentrant=False)
        else:
            part = _chunk_loss(head, h, y)
        assert isinstance(part, torch.Tensor)
        losses.append(part if reduction == "none" else part.sum())
    if reduction == "none":
        return torch.cat(losses)
    total = torch.stack(losses).sum()
    if reduction == "sum":
        return total
    return total / (labels != IGNORE_INDEX).sum()


def shift_labels(labels: torch.Tensor) -> torch.Tensor:
    """Position ``t`` predicts ``labels[t + 1]``; the last position predicts nothing
    (``IGNORE_INDEX``), as Hugging Face's ``ForCausalLMLoss`` shifts."""
    return F.pad(labels[..., 1:], (0, 1), value=IGNORE_INDEX)


def causal_lm_loss(
    hidden: torch.Tensor,
    head: Callable[[torch.Tensor], torch.Tensor],
    labels: torch.Tensor,
    *,
    reduction: Reduction = "mean",
    chunk_tokens: int = CHUNK_TOKENS,
) -> torch.Tensor:
    """The causal-LM loss of the final hidden states ``(batch, seq, hidden)`` against
    ``labels`` ``(batch, seq)`` (the input ids, or them with ``IGNORE_INDEX`` where a position
    is not trained): the mean over every predicted token, what ``LlamaForCausalLM(labels=…)``
    computes. ``none``: each position's loss, ``(batch, seq)``, the last one 0."""
    flat = hidden.reshape(-1, hidden.shape[-1])
    targets = shift_labels(labels).reshape(-1)
    loss = chunked_cross_entropy(
        flat, head, targets, reduction=reduction, chunk_tokens=chunk_tokens
    )
    return loss.view(labels.shape) if reduction == "none" else loss


def _tempered_head(
    head: Callable[[torch.Tensor], torch.Tensor], scale: float, hidden: torch.Tensor
) -> torch.Tensor:
    """``head``'s logits in fp32, times ``scale`` (1 / temperature)."""
    return head(hidden).float() * scale


def _forward(
    self: LlamaForCausalLM,
    input_ids: torch.Tensor | None = None,
    labels: torch.Tensor | None = None,
    loss_reduction: Reduction = "mean",
    temperature: float = 1.0,
    *,
    chunk_tokens: int = CHUNK_TOKENS,
    **kwargs: Any,
) -> Any:
    """``LlamaForCausalLM.forward`` with the chunked loss: with ``labels`` the loss only (no
    logits: they never exist whole), reduced as ``loss_reduction`` says (``none``: each
    position's loss, for evaluation); without them the logits. With ``temperature`` the loss
    is that of the distribution ``softmax(logits / temperature)`` (RLVR's sampling policy); the
    logits returned are never scaled."""
    from transformers.modeling_outputs import CausalLMOutputWithPast

    kwargs.setdefault("use_cache", False)  # training and evaluation keep no KV cache
    hidden = self.model(input_ids=input_ids, **kwargs).last_hidden_state
    if labels is None:
        return CausalLMOutputWithPast(logits=self.lm_head(hidden))
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    head: Callable[[torch.Tensor], torch.Tensor] = self.lm_head
    if temperature != 1.0:
        head = partial(_tempered_head, self.lm_head, 1.0 / temperature)
    loss = causal_lm_loss(hidden, head, labels, reduction=loss_reduction, chunk_tokens=chunk_tokens)
    return CausalLMOutputWithPast(loss=loss)


def use_chunked_loss(model: LlamaForCausalLM, chunk_tokens: int = CHUNK_TOKENS) -> None:
    """Give ``model`` (the whole model, not a pipeline stage) the chunked loss: the forward
    runs inside the model's own call, so FSDP2's hooks on the root (which holds the output
    head) gather and reduce the head's parameters as they would for Hugging Face's loss."""
    model.forward = MethodType(partial(_forward, chunk_tokens=chunk_tokens), model)
