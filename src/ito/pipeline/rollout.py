"""Sampling completions from the policy (RLVR's rollouts, DESIGN §7.6).

The forward is the training one (no KV cache: RLVR's completions here are short, and the
sharded model's forward is what exists under every layout). Every call runs exactly ``max_new``
forwards whatever the samples do, so the ranks of one world, which gather parameters in each
forward, stay in step. The draw is made on the CPU from a seeded generator: the same seed gives
the same completions on any device and after a resume, and tensor-parallel peers (which hold the
same logits) draw the same tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["Completion", "sample_completions"]


@dataclass(frozen=True)
class Completion:
    tokens: list[int]
    """The sampled tokens up to and including the first end-of-text (all ``max_new`` of them
    when none came: a truncated completion)."""
    truncated: bool
    """No end-of-text within ``max_new`` tokens."""


def sample_completions(
    model: torch.nn.Module,
    prompts: list[list[int]],
    *,
    max_new: int,
    eos: int,
    generator: torch.Generator,
    device: torch.device,
    temperature: float = 1.0,
) -> list[Completion]:
    """One sampled completion of each prompt (token ids), at ``temperature``. Prompts are
    left-padded and masked, positions counted from each prompt's first token."""
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[eos] * (width - len(p)) + p for p in prompts], device=device)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=device)
    done = torch.zeros(len(prompts), dtype=torch.bool)
    out = torch.full((len(prompts), max_new), eos, dtype=torch.long)
    was_training = model.training
    model.train(False)
    with torch.no_grad():
        for t in range(max_new):
            positions = (mask.cumsum(-1) - 1).clamp(min=0)
            logits = model(input_ids=ids, attention_mask=mask, position_ids=positions).logits
            probs = torch.softmax(logits[:, -1].float().cpu() / temperature, dim=-1)
            nxt = torch.multinomial(probs, 1, generator=generator).squeeze(1)
            nxt = torch.where(done, torch.full_like(nxt, eos), nxt)
            out[:, t] = nxt
            done |= nxt == eos
            ids = torch.cat([ids, nxt[:, None].to(device)], dim=1)
            mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
    model.train(was_training)
    completions = []
    for row in out.tolist():
        if eos in row:
            completions.append(Completion(row[: row.index(eos) + 1], truncated=False))
        else:
            completions.append(Completion(row, truncated=True))
    return completions
