"""The losses of post-training (DESIGN §7.6): SFT, DPO and GRPO with DAPO's fixes.

Every function here works on per-token log-probabilities of the sampled/labelled tokens —
``-model(input_ids=…, labels=…, loss_reduction="none").loss``, where position ``t`` holds the
log-probability of token ``t + 1`` (:func:`ito.pipeline.loss.shift_labels`) and positions whose
label is ``IGNORE_INDEX`` hold 0 — so they run on the engine's chunked loss unchanged, under any
layout, without the logits of a whole micro-batch existing at once.

References: DPO, Rafailov et al. 2023, eq. 7. GRPO, Shao et al. 2024 (DeepSeekMath), §4.1.
DAPO, Yu et al. 2025: clip-higher (§3.1, decoupled ε_low/ε_high), dynamic sampling (§3.2,
groups whose rewards are all equal carry no gradient and are dropped), token-level policy
gradient loss (§3.3, every token of the step weighs the same, whatever its sequence's length),
overlong reward shaping (§3.4, :func:`ito.core.rewards.overlong_penalty`) with truncated
completions masked out of the loss. No KL term (DAPO drops it).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ito.pipeline.loss import IGNORE_INDEX

__all__ = [
    "dapo_policy_loss",
    "dpo_loss",
    "group_advantages",
    "informative_groups",
    "prompt_completion",
    "sequence_logps",
]


def prompt_completion(
    prompt: list[int], completion: list[int], eos: int, max_len: int
) -> tuple[list[int], list[int]]:
    """One SFT/DPO example: ``prompt + completion + eos`` and its labels, the prompt's
    positions ``IGNORE_INDEX`` (the loss is on the completion and its end only). Cut to
    ``max_len`` tokens from the end of the prompt side first (the completion is what is
    learned); ``ValueError`` when even the completion does not fit."""
    whole = [*completion, eos]
    if len(whole) > max_len:
        raise ValueError(f"a completion of {len(whole)} tokens does not fit {max_len}")
    kept = prompt[max(0, len(prompt) - (max_len - len(whole))) :]
    return kept + whole, [IGNORE_INDEX] * len(kept) + whole


def sequence_logps(token_logps: torch.Tensor) -> torch.Tensor:
    """Sum over each sequence's labelled tokens: ``(batch, seq) -> (batch,)``."""
    return token_logps.sum(dim=-1)


def dpo_loss(
    policy_chosen: torch.Tensor,
    policy_rejected: torch.Tensor,
    reference_chosen: torch.Tensor,
    reference_rejected: torch.Tensor,
    beta: float,
    *,
    rpo_alpha: float = 0.0,
    chosen_tokens: torch.Tensor | None = None,
) -> torch.Tensor:
    """Per pair: ``−log σ(β·((π_c − ref_c) − (π_r − ref_r)))`` over summed log-probabilities
    of the completions (Rafailov et al. 2023, eq. 7); with ``rpo_alpha``, plus that weight ×
    the chosen completion's negative log-likelihood per token, ``−π_c / chosen_tokens`` (RPO,
    Pang et al. 2024, eq. 1; TRL's ``rpo_alpha``)."""
    margin = (policy_chosen - reference_chosen) - (policy_rejected - reference_rejected)
    loss = -F.logsigmoid(beta * margin)
    if rpo_alpha:
        assert chosen_tokens is not None, "RPO's term needs the chosen completions' lengths"
        loss = loss + rpo_alpha * (-policy_chosen / chosen_tokens)
    return loss


def group_advantages(rewards: torch.Tensor, group_size: int, eps: float = 1e-4) -> torch.Tensor:
    """GRPO's advantage of each sample: its reward minus its group's mean, over the group's
    standard deviation (unbiased, as GRPO's reference code; ``eps`` keeps an all-equal group
    at 0). ``rewards`` are ordered group by group."""
    groups = rewards.view(-1, group_size)
    mean = groups.mean(dim=1, keepdim=True)
    std = groups.std(dim=1, keepdim=True)
    return ((groups - mean) / (std + eps)).view(-1)


def informative_groups(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """DAPO's dynamic sampling: which groups have rewards that are not all equal (the others
    have advantage 0 everywhere and teach nothing). ``(n,) -> (n // group_size,)`` booleans."""
    groups = rewards.view(-1, group_size)
    return (groups != groups[:, :1]).any(dim=1)


def dapo_policy_loss(
    logps: torch.Tensor,
    old_logps: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_low: float,
    clip_high: float,
    normaliser: float | None,
) -> torch.Tensor:
    """The clipped policy-gradient loss of one micro-batch.

    ``logps``/``old_logps`` ``(batch, seq)`` per completion token under the current policy and
    the policy that generated the sample, ``advantages`` ``(batch,)``, ``mask`` ``(batch, seq)``
    1 on the completion tokens that count (0 on the prompt, padding, and every token of a
    truncated completion). Per token: ``−min(r·A, clip(r, 1 − ε_low, 1 + ε_high)·A)`` with
    ``r = exp(logp − old_logp)``.

    ``normaliser``: the token count of the whole step (every micro-batch on every rank): the
    sum is divided by it, so each token weighs the same and accumulating micro-batches gives
    the gradient of the whole batch (DAPO's token-level loss). ``None``: GRPO's sample-level
    mean — each sequence's mean over its tokens, averaged over the micro-batch's sequences.
    """
    ratio = torch.exp(logps - old_logps)
    adv = advantages[:, None]
    clipped = torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    per_token = -torch.minimum(ratio * adv, clipped * adv) * mask
    if normaliser is not None:
        return per_token.sum() / normaliser
    lengths = mask.sum(dim=1).clamp(min=1)
    return (per_token.sum(dim=1) / lengths).mean()
