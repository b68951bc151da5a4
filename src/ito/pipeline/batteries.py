"""The eval batteries: what each eval a manifest names (``EvalSpec.eval``) measures, and how
(DESIGN §7.5).

=================== ======================================================================
eval                value
=================== ======================================================================
``heldout_loss``    mean next-token loss (nats) over the held-out documents of the data,
                    packed into sequences of the stage's length (the first
                    ``MAX_EVAL_SEQUENCES``)
``perplexity``      ``exp`` of that loss
``exact_match``     fraction of prompt/answer items whose greedy continuation of the prompt,
                    up to its first end-of-text, equals the answer (both stripped of
                    surrounding whitespace); at most the longest answer's token count + 1
                    new tokens (room for the end-of-text), capped at ``MAX_NEW_TOKENS``
``sampled_exact_match``
                    the same items' mean fraction of ``SAMPLES`` continuations sampled at
                    temperature 1 from the whole vocabulary that equal the answer (pass@1
                    estimated from 16 samples): what RLVR's reward measures, which greedy
                    decoding hides once the answer is the mode; each item's draws come from
                    a generator seeded by its index, so the value is the same at every gate
                    for the same weights, whatever the layout
``multiple_choice`` fraction of prompt/options/answer items where the answer is the option of
                    highest summed log-likelihood after the prompt (lm-evaluation-harness's
                    ``acc``; ties go to the first option)
=================== ======================================================================

Item evals read the first ``MAX_EVAL_ITEMS`` items of the data, in file order. Every battery
runs on any layout but a pipeline-parallel one for the item evals (refused at plan:
:mod:`ito.core.runtime_support`): data-parallel rank ``r`` of ``dp`` takes items ``r, r+dp, …``
(its tensor-parallel peers the same), every rank runs the same number of forwards (FSDP2
gathers parameters in each) padding with weight-zero work, and the counts are all-reduced, so
the value is the same on every rank and does not depend on the layout.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from ito.core.errors import ItoError
from ito.pipeline.data import pack
from ito.pipeline.loss import IGNORE_INDEX
from ito.pipeline.tokenizer import EOS

if TYPE_CHECKING:
    from tokenizers import Tokenizer

    from ito.data.rows import Row
    from ito.pipeline.pipeline_stages import PipelineRunner

__all__ = [
    "BATTERIES",
    "MAX_EVAL_ITEMS",
    "MAX_EVAL_SEQUENCES",
    "MAX_NEW_TOKENS",
    "Battery",
    "EvalContext",
    "exact_match",
    "heldout_loss",
    "multiple_choice",
    "perplexity",
    "sampled_continuations",
    "sampled_exact_match",
]

MAX_EVAL_SEQUENCES = 64
"""Held-out sequences a loss eval reads at most (the first ones, in file order)."""
MAX_EVAL_ITEMS = 256
"""Eval items an item eval reads at most (the first ones, in file order)."""
MAX_NEW_TOKENS = 64
"""Bound on the tokens greedy generation adds, whatever the answers' lengths."""
ITEM_BATCH = 32
"""Sequences per forward of an item eval, per rank."""
SAMPLES = 16
"""Samples per item of ``sampled_exact_match``."""
SAMPLE_SEED = 20261205
"""Seeds ``sampled_exact_match``'s draws: the same items are drawn the same at every gate."""


@dataclass
class EvalContext:
    """What a battery reads of the engine: the model as laid out, and the data."""

    model: torch.nn.Module
    tokenizer: Tokenizer
    device: torch.device
    dp_rank: int
    """Data-parallel rank inside this torchrun world (tensor-parallel peers share it)."""
    dp_world: int
    micro_batch: int
    """Sequences per forward of a loss eval (a pipeline: sequences per schedule)."""
    heldout: Callable[[str], list[str]]
    """The held-out documents of a data id."""
    rows: Callable[[str], list[Row]]
    """The rows of a data id (eval items)."""
    pipeline: PipelineRunner | None = None


@dataclass(frozen=True)
class Battery:
    measure: Callable[[EvalContext, str, int], float]
    """(context, data id, the stage's sequence length) → the value, the same on every rank."""
    items: bool
    """Whether it reads eval items (needs the whole model in each forward)."""


# ---- held-out loss ------------------------------------------------------------------------------


def heldout_loss(ctx: EvalContext, data_id: str, seq_len: int) -> float:
    docs = ctx.heldout(data_id)
    total_tokens = sum(len(e.ids) + 1 for e in ctx.tokenizer.encode_batch(docs))
    sequences = pack(ctx.tokenizer, docs, min(seq_len, total_tokens))[:MAX_EVAL_SEQUENCES]
    sums = torch.zeros(2, dtype=torch.float64)
    ctx.model.train(False)
    with torch.no_grad():
        for batch, weight in _loss_batches(ctx, sequences):
            tokens = batch.to(ctx.device)
            if ctx.pipeline is not None:
                per_token = ctx.pipeline.token_losses(tokens)
                if per_token is None:
                    continue  # not the last stage: the loss is counted there
            else:
                # The chunked loss (ito.pipeline.loss): one chunk of fp32 logits at a time.
                per_token = ctx.model(input_ids=tokens, labels=tokens, loss_reduction="none").loss
            per_seq = per_token.sum(dim=1).cpu().double()
            sums[0] += (per_seq * weight).sum()
            sums[1] += weight.sum() * (batch.shape[1] - 1)
    ctx.model.train()
    sums = sums.to(ctx.device)
    dist.all_reduce(sums)
    return float(sums[0] / sums[1])


def perplexity(ctx: EvalContext, data_id: str, seq_len: int) -> float:
    return math.exp(min(heldout_loss(ctx, data_id, seq_len), 700.0))


def _loss_batches(
    ctx: EvalContext, sequences: torch.Tensor
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    n = len(sequences)
    rank, world, size = ctx.dp_rank, ctx.dp_world, ctx.micro_batch
    per_rank = -(-n // world)
    for b in range(-(-per_rank // size)):
        index = [rank + world * (b * size + j) for j in range(size)]
        weight = torch.tensor([1.0 if i < n else 0.0 for i in index], dtype=torch.float64)
        yield sequences[[i if i < n else 0 for i in index]], weight


# ---- eval items ---------------------------------------------------------------------------------


def _items(ctx: EvalContext, data_id: str, eval_name: str) -> list[Row]:
    """The first items of ``data_id`` this eval can use, or ``data_invalid``."""
    rows = ctx.rows(data_id)
    if eval_name == "multiple_choice":
        items = [r for r in rows if r.options]
        wanted = "prompt, options and answer"
    else:
        items = [r for r in rows if "answer" in dict(r.fields)]
        wanted = "prompt and answer"
    if not items:
        raise ItoError(
            "data_invalid",
            f"data {data_id!r} holds no eval item with {wanted}: {eval_name} cannot be measured",
            data_id=data_id,
            reason="no_eval_items",
        )
    return items[:MAX_EVAL_ITEMS]


def _forwards(ctx: EvalContext, mine: int, per_batch: int = ITEM_BATCH) -> int:
    """Batches every rank runs: the most any rank needs (ranks of one world run in step)."""
    count = torch.tensor([-(-mine // per_batch)], dtype=torch.long, device=ctx.device)
    dist.all_reduce(count, op=dist.ReduceOp.MAX)
    return int(count.item())


def _fraction(ctx: EvalContext, hits: float, count: float) -> float:
    sums = torch.tensor([hits, count], dtype=torch.float64, device=ctx.device)
    dist.all_reduce(sums)
    return float(sums[0] / sums[1])


def _eos(tokenizer: Tokenizer) -> int:
    eos = tokenizer.token_to_id(EOS)
    if eos is None:
        raise ValueError("the tokenizer has no end-of-text token")
    return int(eos)


def _continuations(
    ctx: EvalContext,
    prompts: list[list[int]],
    max_new: int,
    pick: Callable[[torch.Tensor, int], torch.Tensor],
) -> list[list[int]]:
    """Continuation of each prompt (token ids), ``max_new`` tokens each, the next token chosen
    by ``pick(last logits in float32, new-token index)`` (after an end-of-text only end-of-text
    follows). Prompts are left-padded and masked; every call runs exactly ``max_new``
    forwards, so ranks that call it equally often stay in step. No KV cache: the bound is
    small and the forward is the training one."""
    eos = _eos(ctx.tokenizer)
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[eos] * (width - len(p)) + p for p in prompts], device=ctx.device)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=ctx.device)
    done = torch.zeros(len(prompts), dtype=torch.bool, device=ctx.device)
    for step in range(max_new):
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        logits = ctx.model(input_ids=ids, attention_mask=mask, position_ids=positions).logits
        nxt = pick(logits[:, -1].float(), step)
        nxt = torch.where(done, torch.full_like(nxt, eos), nxt)
        done |= nxt == eos
        ids = torch.cat([ids, nxt[:, None]], dim=1)
        mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
    return ids[:, width:].tolist()


def greedy_continuations(
    ctx: EvalContext, prompts: list[list[int]], max_new: int
) -> list[list[int]]:
    """Greedy continuation of each prompt (see :func:`_continuations`)."""
    return _continuations(ctx, prompts, max_new, lambda logits, _: logits.argmax(-1))


def sampled_continuations(
    ctx: EvalContext, prompts: list[list[int]], uniforms: torch.Tensor
) -> list[list[int]]:
    """A continuation of each prompt sampled at temperature 1 from the whole vocabulary, new
    token ``t`` of prompt ``i`` drawn by inverting the model's distribution at
    ``uniforms[i, t]`` (one row of ``max_new`` uniforms in [0, 1) per prompt): the draws are
    the caller's, so a prompt's sample does not depend on the prompts batched with it."""
    draws = uniforms.to(ctx.device, torch.float32)

    def pick(logits: torch.Tensor, step: int) -> torch.Tensor:
        cdf = torch.softmax(logits, dim=-1).cumsum(-1)
        chosen = torch.searchsorted(cdf, draws[:, step : step + 1] * cdf[:, -1:], right=True)
        return chosen.squeeze(1).clamp(max=logits.shape[-1] - 1)

    return _continuations(ctx, prompts, draws.shape[1], pick)


def _answer_items(ctx: EvalContext, data_id: str, eval_name: str) -> tuple[list[Row], int, int]:
    """The prompt/answer items of a generation eval, the end-of-text id, and the tokens to
    generate: the longest answer's + 1 (room for the end-of-text), at most ``MAX_NEW_TOKENS``."""
    items = _items(ctx, data_id, eval_name)
    answers = [r.get("answer") for r in items]
    longest = max(len(e.ids) for e in ctx.tokenizer.encode_batch(answers))
    return items, _eos(ctx.tokenizer), min(MAX_NEW_TOKENS, longest + 1)


def exact_match(ctx: EvalContext, data_id: str, seq_len: int) -> float:
    items, eos, max_new = _answer_items(ctx, data_id, "exact_match")
    tok = ctx.tokenizer
    mine = items[ctx.dp_rank :: ctx.dp_world]
    prompts = [e.ids for e in tok.encode_batch([r.get("prompt") for r in mine])]
    hits = 0
    ctx.model.train(False)
    with torch.no_grad():
        for b in range(_forwards(ctx, len(mine))):
            chunk = list(range(b * ITEM_BATCH, min(len(mine), (b + 1) * ITEM_BATCH)))
            batch = [prompts[i] for i in chunk] or [[eos]]  # weight-zero work keeps step
            outputs = greedy_continuations(ctx, batch, max_new)
            for i, out in zip(chunk, outputs, strict=False):
                text = tok.decode(out[: out.index(eos)] if eos in out else out)
                hits += text.strip() == mine[i].get("answer").strip()
    ctx.model.train()
    return _fraction(ctx, hits, len(mine))


def _item_uniforms(index: int, samples: int, max_new: int) -> torch.Tensor:
    """The draws of item ``index``'s samples: from a generator seeded by the item's index in
    the data, so the value does not depend on the layout or the batching."""
    generator = torch.Generator().manual_seed(SAMPLE_SEED * 1_000_003 + index)
    return torch.rand((samples, max_new), generator=generator)


def sampled_exact_match(ctx: EvalContext, data_id: str, seq_len: int) -> float:
    items, eos, max_new = _answer_items(ctx, data_id, "sampled_exact_match")
    tok = ctx.tokenizer
    indices = list(range(ctx.dp_rank, len(items), ctx.dp_world))
    prompts = [e.ids for e in tok.encode_batch([items[i].get("prompt") for i in indices])]
    per_batch = max(1, ITEM_BATCH // SAMPLES)
    hits = 0.0
    ctx.model.train(False)
    with torch.no_grad():
        for b in range(_forwards(ctx, len(indices), per_batch)):
            chunk = list(range(b * per_batch, min(len(indices), (b + 1) * per_batch)))
            if not chunk:  # weight-zero work keeps step
                sampled_continuations(ctx, [[eos]], torch.zeros((1, max_new)))
                continue
            batch = [prompts[j] for j in chunk for _ in range(SAMPLES)]
            draws = torch.cat([_item_uniforms(indices[j], SAMPLES, max_new) for j in chunk])
            outputs = sampled_continuations(ctx, batch, draws)
            for n, out in enumerate(outputs):
                text = tok.decode(out[: out.index(eos)] if eos in out else out)
                answer = items[indices[chunk[n // SAMPLES]]].get("answer")
                hits += (text.strip() == answer.strip()) / SAMPLES
    ctx.model.train()
    return _fraction(ctx, hits, len(indices))


def _option_tokens(tokenizer: Tokenizer, prompt: str, option: str) -> tuple[list[int], int]:
    """The ids of prompt + option and where the option's start (its tokens as the joined text
    tokenises, when the prompt's own tokens are a prefix of them)."""
    context = tokenizer.encode(prompt).ids
    whole = tokenizer.encode(prompt + option).ids
    if whole[: len(context)] == context and len(whole) > len(context):
        return whole, len(context)
    return context + tokenizer.encode(option).ids, len(context)


def option_loglikelihoods(ctx: EvalContext, sequences: list[tuple[list[int], int]]) -> list[float]:
    """Summed log-likelihood of each sequence's tokens from its start index on, given the
    tokens before (one right-padded forward)."""
    eos = _eos(ctx.tokenizer)
    width = max(len(ids) for ids, _ in sequences)
    ids = torch.full((len(sequences), width), eos, dtype=torch.long)
    labels = torch.full((len(sequences), width), IGNORE_INDEX, dtype=torch.long)
    for i, (seq, start) in enumerate(sequences):
        ids[i, : len(seq)] = torch.tensor(seq)
        labels[i, start : len(seq)] = torch.tensor(seq[start:])
    ids, labels = ids.to(ctx.device), labels.to(ctx.device)
    per_token = ctx.model(input_ids=ids, labels=labels, loss_reduction="none").loss
    return [-float(x) for x in per_token.float().sum(dim=1).cpu()]


def multiple_choice(ctx: EvalContext, data_id: str, seq_len: int) -> float:
    items = _items(ctx, data_id, "multiple_choice")
    mine = items[ctx.dp_rank :: ctx.dp_world]
    sequences: list[tuple[list[int], int]] = []
    owner: list[tuple[int, int]] = []
    """(item, option) of each sequence."""
    for i, row in enumerate(mine):
        for j, option in enumerate(row.options):
            sequences.append(_option_tokens(ctx.tokenizer, row.get("prompt"), option))
            owner.append((i, j))
    scores: list[float] = []
    ctx.model.train(False)
    with torch.no_grad():
        for b in range(_forwards(ctx, len(sequences))):
            batch = sequences[b * ITEM_BATCH : (b + 1) * ITEM_BATCH]
            scores += option_loglikelihoods(ctx, batch or [([_eos(ctx.tokenizer)] * 2, 1)])
    ctx.model.train()
    best: dict[int, tuple[float, int]] = {}
    for (i, j), score in zip(owner, scores, strict=False):
        if i not in best or score > best[i][0]:
            best[i] = (score, j)
    hits = 0
    for i, row in enumerate(mine):
        answer = row.get("answer").strip()
        hits += row.options[best[i][1]].strip() == answer
    return _fraction(ctx, hits, len(mine))


BATTERIES: dict[str, Battery] = {
    "heldout_loss": Battery(heldout_loss, items=False),
    "perplexity": Battery(perplexity, items=False),
    "exact_match": Battery(exact_match, items=True),
    "sampled_exact_match": Battery(sampled_exact_match, items=True),
    "multiple_choice": Battery(multiple_choice, items=True),
}
"""Every eval the engine measures, by the name the manifest gives it."""
