"""Post-training stages on the engine (DESIGN §7.6): SFT, DPO and RLVR (GRPO with DAPO's fixes).

They run inside the trainer's own stage loop — the same FSDP2/TP model and optimizer, the same
checkpoints, resume, events and telemetry as pre-training; what differs is what a step's batch
is and how its loss is formed (:mod:`ito.pipeline.post_losses`):

- **SFT**: one prompt/completion example per row, right-padded to the stage's ``seq_len`` (no
  packing, so no example attends to another), the loss on the completion and its end-of-text
  only: the mean over those tokens of the rank's batch.
- **DPO**: one chosen and one rejected row per pair; the reference is the policy at the start
  of the stage, whose summed log-probabilities of every pair are computed once, before the first
  step, and carried by every checkpoint of the stage (a resume does not recompute them from a
  later policy).
- **RLVR**: each step samples ``group_size`` completions of each prompt from the current policy
  (:mod:`ito.pipeline.rollout`), rewards them (:mod:`ito.core.rewards`, plus DAPO's overlong
  shaping), keeps only groups whose rewards differ (dynamic sampling,
  :class:`ito.core.rl_batches.DynamicSampler`), and takes one clipped policy-gradient step with
  token-level aggregation, truncated completions masked out, no KL term. In the synchronous
  loop the samples are the current policy's (on-policy: the ratio is 1 at the step); from the
  separate rollout worker (:mod:`ito.pipeline.rollout_worker`) they may lag and carry their
  generating policy's log-probabilities, against which clip-higher acts.

Every rank of a world keeps in step: equal numbers of forwards in every generation round and
micro-batch, groups gathered so each rank sees the same global list (and so keeps the same ones).

Batches are computed from (seed, stage, step), never iterated to, so a resumed stage continues
the same curve.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from ito.core.errors import ItoError
from ito.core.rewards import overlong_penalty, sample_reward
from ito.core.rl_batches import DynamicSampler
from ito.core.stage_plan import post_step_rows
from ito.pipeline.data import PackedData
from ito.pipeline.loss import IGNORE_INDEX
from ito.pipeline.parallelize import set_requires_all_reduce
from ito.pipeline.post_losses import (
    dapo_policy_loss,
    dpo_loss,
    group_advantages,
    prompt_completion,
)
from ito.pipeline.rollout import sample_completions

if TYPE_CHECKING:
    from tokenizers import Tokenizer

    from ito.core.manifest import RlvrRecipe
    from ito.data.rows import Row

__all__ = [
    "LR_SCALE",
    "POST_STAGES",
    "DpoExamples",
    "Group",
    "RlvrStep",
    "Round",
    "Sample",
    "dpo_reference",
    "dpo_step",
    "post_step_rows",
    "sft_examples",
    "sft_step",
]

POST_STAGES = ("sft", "dpo", "rlvr")
"""Post-training stages, in the order a run takes them."""
LR_SCALE = {"sft": 0.35, "dpo": 0.005, "rlvr": 0.05}
"""Each post-training stage's peak learning rate as a fraction of the model size's
pre-training peak (the same warmup-then-cosine schedule): fine-tuning moves the weights less
than pre-training does. SFT's, measured on the demo over four run seeds: at 0.2 held-out exact
match after SFT ranged 0.45–0.925 (and 0.725 on a fifth seed); at 0.35 it was 0.945–0.995 with
held-out web loss 3.6–4.9; at 0.5, 0.895–1.0 but one seed's web loss broke the recipe's
regression bound (5.69 > 5.3). RLVR's, measured on the demo's RLVR stage (625 steps) from two
DPO models, as held-out greedy exact match / accuracy sampled at temperature 1 (16 samples an
item) / reward over the stage: from 0.975 / 0.797, at 0.005 over 312 steps nothing moved
(reward 0.81–0.83); at 0.02, 0.975 / 0.821, reward 0.81 → 0.87; at 0.05, 0.965 / 0.833,
reward 0.80 → 0.88. From 0.895 / 0.592: at 0.005, 0.875 / 0.611, reward 0.60 → 0.65; at 0.02,
0.875 / 0.641, reward 0.61 → 0.69; at 0.05, 0.84 / 0.647, reward 0.61 → 0.74. RL raises the
sampled accuracy on held-out sums; from models that already answered them, past 0.02 it cost
greedy exact match. From a model with headroom (the demo's slipped carries, DPO at 0.73 /
0.402): at 0.02, 0.80, reward 0.60 → 0.68; at 0.05, 0.80, reward 0.59 → 0.69 (1,250 steps at
temperature 1: 0.78 / 0.591, reward 0.48 → 0.65), hence 0.05."""


def _example(
    tokenizer: Tokenizer, prompt: str, completion: str, eos: int, seq_len: int, data_id: str
) -> tuple[list[int], list[int]]:
    """``prompt + completion + eos`` right-padded to ``seq_len`` and its labels (the prompt and
    the padding ``IGNORE_INDEX``). The completion's tokens are those of the joined text after
    the prompt's own tokens — what the model saw in pre-training and what it generates when
    prompted with the prompt alone — unless the join merges across the boundary; then the
    completion is tokenized on its own (as :func:`ito.pipeline.batteries.option_loglikelihoods`
    scores an option)."""
    context = tokenizer.encode(prompt).ids
    whole = tokenizer.encode(prompt + completion).ids
    if whole[: len(context)] == context and len(whole) > len(context):
        answer = whole[len(context) :]
    else:
        answer = tokenizer.encode(completion).ids
    try:
        ids, labels = prompt_completion(context, answer, eos, seq_len)
    except ValueError:
        raise ItoError(
            "data_invalid",
            f"data {data_id!r} holds a completion longer than the stage's seq_len {seq_len}",
            data_id=data_id,
            reason="completion_too_long",
        ) from None
    pad = seq_len - len(ids)
    return ids + [eos] * pad, labels + [IGNORE_INDEX] * pad


def sft_examples(
    tokenizer: Tokenizer, rows: list[tuple[str, Row]], eos: int, seq_len: int
) -> torch.Tensor:
    """``(n, 2, seq_len)``: each example's ids and labels."""
    out = [
        _example(tokenizer, row.get("prompt"), row.get("completion"), eos, seq_len, data_id)
        for data_id, row in rows
    ]
    return torch.tensor(out, dtype=torch.long)


@dataclass(frozen=True)
class DpoExamples:
    pairs: torch.Tensor
    """``(n, 4, seq_len)``: chosen ids, chosen labels, rejected ids, rejected labels."""

    @classmethod
    def build(
        cls, tokenizer: Tokenizer, rows: list[tuple[str, Row]], eos: int, seq_len: int
    ) -> DpoExamples:
        out = []
        for data_id, row in rows:
            prompt = row.get("prompt")
            chosen = _example(tokenizer, prompt, row.get("chosen"), eos, seq_len, data_id)
            rejected = _example(tokenizer, prompt, row.get("rejected"), eos, seq_len, data_id)
            out.append([*chosen, *rejected])
        return cls(torch.tensor(out, dtype=torch.long))


def _micro_batches(rows: int, micro_batch: int) -> list[slice]:
    return [slice(i, min(rows, i + micro_batch)) for i in range(0, rows, micro_batch)]


def _logps(
    model: torch.nn.Module, ids: torch.Tensor, labels: torch.Tensor, temperature: float = 1.0
) -> torch.Tensor:
    """Per-position log-probability of the next labelled token ``(batch, seq)``, 0 where the
    next label is ``IGNORE_INDEX`` (:mod:`ito.pipeline.post_losses`), under
    ``softmax(logits / temperature)``."""
    per_token: torch.Tensor = model(
        input_ids=ids, labels=labels, loss_reduction="none", temperature=temperature
    ).loss
    return -per_token.float()


def sft_step(model: torch.nn.Module, batch: torch.Tensor, micro_batch: int) -> torch.Tensor:
    """Backward of the rank's SFT batch ``(m, 2, seq_len)``: the mean over its completion
    tokens. Returns that mean, detached."""
    ids, labels = batch[:, 0], batch[:, 1]
    tokens = int((labels[:, 1:] != IGNORE_INDEX).sum())
    total = torch.zeros((), device=batch.device)
    chunks = _micro_batches(len(batch), micro_batch)
    for i, part in enumerate(chunks):
        set_requires_all_reduce(model, i == len(chunks) - 1)
        loss = -_logps(model, ids[part], labels[part]).sum() / max(tokens, 1)
        loss.backward()  # type: ignore[no-untyped-call]
        total += loss.detach()
    return total


def _pair_logps(model: torch.nn.Module, pairs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Summed log-probabilities of the chosen and the rejected completions of ``pairs``."""
    n = len(pairs)
    ids = torch.cat([pairs[:, 0], pairs[:, 2]])
    labels = torch.cat([pairs[:, 1], pairs[:, 3]])
    summed = _logps(model, ids, labels).sum(dim=1)
    return summed[:n], summed[n:]


def dpo_reference(
    model: torch.nn.Module,
    examples: DpoExamples,
    dp_rank: int,
    dp_world: int,
    micro_batch: int,
    device: torch.device,
) -> torch.Tensor:
    """``(n, 2)``: the summed log-probabilities of every pair's chosen and rejected completion
    under ``model`` as it is (the reference policy), the same on every rank. Rank ``r`` scores
    pairs ``r, r + dp, …``; every rank runs the same number of forwards."""
    n = len(examples.pairs)
    mine = list(range(dp_rank, n, dp_world))
    per_rank = -(-n // dp_world)
    forwards = -(-per_rank // micro_batch)
    out = torch.zeros(n, 2, dtype=torch.float64, device=device)
    model.train(False)
    with torch.no_grad():
        for b in range(forwards):
            index = mine[b * micro_batch : (b + 1) * micro_batch]
            batch = examples.pairs[index or [0]].to(device)
            chosen, rejected = _pair_logps(model, batch)
            if index:
                out[index, 0] = chosen.double()
                out[index, 1] = rejected.double()
    model.train()
    # Peers of one data-parallel rank (tensor parallel) scored the same pairs.
    counts = torch.zeros(n, dtype=torch.float64, device=device)
    counts[mine] = 1.0
    dist.all_reduce(out)
    dist.all_reduce(counts)
    return (out / counts.clamp(min=1)[:, None]).cpu()


def dpo_step(
    model: torch.nn.Module,
    batch: torch.Tensor,
    reference: torch.Tensor,
    beta: float,
    micro_batch: int,
    rpo_alpha: float = 0.0,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Backward of the rank's DPO pairs ``(m, 4, seq_len)`` against their reference
    log-probabilities ``(m, 2)``: the mean pair loss, plus ``rpo_alpha`` × the chosen
    completion's per-token negative log-likelihood (RPO; 0: plain DPO). Returns it (detached)
    and the rank's mean reward margin, preference accuracy and chosen per-token negative
    log-likelihood (plain DPO's known failure is that one rising)."""
    m = len(batch)
    pairs = max(1, micro_batch // 2)
    total = torch.zeros((), device=batch.device)
    margins: list[float] = []
    nlls: list[float] = []
    chunks = _micro_batches(m, pairs)
    for i, part in enumerate(chunks):
        set_requires_all_reduce(model, i == len(chunks) - 1)
        chosen, rejected = _pair_logps(model, batch[part])
        ref = reference[part].to(chosen.device, torch.float32)
        # Position t holds the log-probability of label t + 1: the first label is never scored.
        tokens = (batch[part][:, 1, 1:] != IGNORE_INDEX).sum(dim=1).clamp(min=1)
        per_pair = dpo_loss(
            chosen,
            rejected,
            ref[:, 0],
            ref[:, 1],
            beta,
            rpo_alpha=rpo_alpha,
            chosen_tokens=tokens.to(chosen.device),
        )
        loss = per_pair.sum() / m
        loss.backward()  # type: ignore[no-untyped-call]
        total += loss.detach()
        margin = beta * ((chosen - ref[:, 0]) - (rejected - ref[:, 1]))
        margins += margin.detach().cpu().tolist()
        nlls += (-chosen.detach() / tokens.to(chosen.device)).cpu().tolist()
    return total, {
        "dpo_margin": sum(margins) / len(margins),
        "dpo_accuracy": sum(1.0 for x in margins if x > 0) / len(margins),
        "dpo_chosen_nll": sum(nlls) / len(nlls),
    }


@dataclass(frozen=True)
class Sample:
    prompt: list[int]
    completion: list[int]
    truncated: bool
    reward: float
    old_logps: tuple[float, ...] | None = None
    """Log-probability of each completion token under the policy that generated it (set by
    the separate rollout worker: the ``old`` policy of the clipped ratio); ``None``: the
    trainer's own current policy generated it."""


@dataclass(frozen=True)
class Group:
    prompt_index: int
    samples: tuple[Sample, ...]
    filler: bool = False
    """An uninformative group that only fills the batch (dynamic sampling ran out of rounds):
    its samples carry no loss."""

    @property
    def rewards(self) -> list[float]:
        return [s.reward for s in self.samples]


Round = Callable[[int, int], list[Group]]
"""``(step, round)`` → every data-parallel rank's groups of that generation round, in rank
order."""


@dataclass
class RlvrStep:
    """One RLVR step: the rollouts of its batch (dynamic sampling included) and the policy
    gradient step on them."""

    recipe: RlvrRecipe
    tokenizer: Tokenizer
    rows: list[Row]
    """The prompts (``prompt``, ``answer``)."""
    eos: int
    seed: int
    stage_index: int
    dp_rank: int
    dp_world: int
    groups_per_rank: int
    micro_batch: int
    device: torch.device
    _order: PackedData = field(init=False, repr=False)
    _prompt_ids: list[list[int]] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._order = PackedData(torch.arange(len(self.rows)), self.seed, self.stage_index)
        self._prompt_ids = [
            e.ids for e in self.tokenizer.encode_batch([r.get("prompt") for r in self.rows])
        ]

    def groups(self, model: torch.nn.Module, step: int, round_: int, dp_rank: int) -> list[Group]:
        """Data-parallel rank ``dp_rank``'s groups of one generation round: its prompts of the
        stage's order, sampled with the generator seeded by (run, stage, step, round, rank) —
        the same whichever process generates them."""
        recipe, dapo = self.recipe, self.recipe.dapo
        rounds = dapo.max_generation_rounds
        index = [
            int(i)
            for i in self._order.batch(
                step * rounds + round_, dp_rank, self.dp_world, self.groups_per_rank
            )
        ]
        size = recipe.group_size
        prompts = [self._prompt_ids[i] for i in index for _ in range(size)]
        generator = torch.Generator().manual_seed(
            (
                (self.seed * 1_000_003 + self.stage_index * 10_007 + step * 101 + round_) * 1009
                + dp_rank
            )
            % (2**63)
        )
        completions = sample_completions(
            model,
            prompts,
            max_new=dapo.overlong.max_tokens,
            eos=self.eos,
            generator=generator,
            device=self.device,
            temperature=recipe.temperature,
        )
        groups = []
        for g, row_index in enumerate(index):
            row = self.rows[row_index]
            samples = []
            for c in completions[g * size : (g + 1) * size]:
                text = self.tokenizer.decode(c.tokens[:-1] if not c.truncated else c.tokens)
                reward = sample_reward(
                    list(recipe.rewards), row.get("prompt"), text, row.get("answer")
                ) + overlong_penalty(
                    len(c.tokens), dapo.overlong.max_tokens, dapo.overlong.soft_tokens
                )
                samples.append(Sample(self._prompt_ids[row_index], c.tokens, c.truncated, reward))
            groups.append(Group(row_index, tuple(samples)))
        return groups

    def gathered_round(self, model: torch.nn.Module) -> Round:
        """The synchronous loop's rounds: every rank of the world generates its own groups with
        the sharded model, in lockstep, and gathers everyone's (the same list on every rank)."""

        def round_fn(step: int, round_: int) -> list[Group]:
            groups = self.groups(model, step, round_, self.dp_rank)
            gathered: list[Any] = [None] * dist.get_world_size()
            dist.all_gather_object(gathered, (self.dp_rank, groups))
            seen: dict[int, list[Group]] = {}
            for rank, theirs in gathered:
                seen.setdefault(rank, theirs)  # tensor-parallel peers drew the same groups
            return [g for rank in sorted(seen) for g in seen[rank]]

        return round_fn

    def rollout(self, round_fn: Round, step: int) -> tuple[list[Group], dict[str, float]]:
        """The step's batch of groups (every rank's, in data-parallel rank order) and its
        rollout figures. When the generation rounds run out, the informative groups found and
        uninformative fillers (:attr:`Group.filler`; none informative: the step is skipped by
        the trainer). The same on every rank."""
        wanted = self.groups_per_rank * self.dp_world
        generated: list[Group] = []
        rounds = [0]

        def generate(_missing: int) -> list[Group]:
            groups = round_fn(step, rounds[0])
            rounds[0] += 1
            generated.extend(groups)
            return groups

        if self.recipe.dapo.dynamic_sampling:
            filled = DynamicSampler(wanted, self.recipe.dapo.max_generation_rounds).fill(
                generate, lambda g: g.rewards
            )
            informative = len(filled.groups)
            kept = filled.groups + [replace(g, filler=True) for g in filled.filler]
        else:
            kept = generate(wanted)[:wanted]
            informative = len(kept)
        samples = [s for g in generated for s in g.samples]
        figures = {
            "reward_mean": sum(s.reward for s in samples) / len(samples),
            "kept_group_fraction": informative / len(generated),
            "generation_rounds": float(rounds[0]),
            "response_length": sum(len(s.completion) for s in samples) / len(samples),
            "truncated_fraction": sum(s.truncated for s in samples) / len(samples),
            "informative_groups": float(informative),
            # Every sampled reward at the top (1: each reward is in [0, 1], shaping only
            # subtracts): the policy solves every prompt it was given this step.
            "solved_fraction": sum(s.reward >= 1.0 for s in samples) / len(samples),
        }
        return kept, figures

    def _tensors(self, samples: list[Sample]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Ids, labels (the completions of untruncated samples) and the loss mask of the
        step's samples, right-padded to the longest."""
        width = max(len(s.prompt) + len(s.completion) for s in samples)
        ids = torch.full((len(samples), width), self.eos, dtype=torch.long)
        labels = torch.full((len(samples), width), IGNORE_INDEX, dtype=torch.long)
        for i, s in enumerate(samples):
            seq = s.prompt + s.completion
            ids[i, : len(seq)] = torch.tensor(seq)
            if not s.truncated:  # DAPO: a truncated completion is not learned from
                labels[i, len(s.prompt) : len(seq)] = torch.tensor(s.completion)
        mask = torch.zeros(len(samples), width)
        mask[:, :-1] = (labels[:, 1:] != IGNORE_INDEX).float()
        return ids, labels, mask

    def with_old_logps(self, model: torch.nn.Module, groups: list[Group]) -> list[Group]:
        """``groups`` with each sample's completion log-probabilities under ``model`` (the
        generating policy), scored in micro-batches as the trainer scores them."""
        samples = [s for g in groups for s in g.samples]
        ids, labels, _ = self._tensors(samples)
        scored: list[Sample] = []
        model.train(False)
        with torch.no_grad():
            for part in _micro_batches(len(ids), self.micro_batch):
                logps = _logps(
                    model,
                    ids[part].to(self.device),
                    labels[part].to(self.device),
                    self.recipe.temperature,
                )
                for s, row in zip(samples[part], logps.cpu(), strict=True):
                    lo = len(s.prompt) - 1
                    values = row[lo : lo + len(s.completion)].tolist()
                    scored.append(replace(s, old_logps=tuple(values)))
        it = iter(scored)
        return [replace(g, samples=tuple(next(it) for _ in g.samples)) for g in groups]

    def train(self, model: torch.nn.Module, groups: list[Group]) -> torch.Tensor:
        """The clipped policy-gradient step on the rank's share of ``groups``: backward of
        every micro-batch; returns the rank's loss (detached). The ratio's old policy is each
        sample's generating policy where it carries its log-probabilities, else the current
        one (on-policy: ratio 1)."""
        recipe, dapo = self.recipe, self.recipe.dapo
        size = recipe.group_size
        rewards = torch.tensor([r for g in groups for r in g.rewards], dtype=torch.float32)
        advantages = group_advantages(rewards, size)
        samples = [s for g in groups for s in g.samples]
        ids, labels, mask = self._tensors(samples)
        filler = torch.tensor([g.filler for g in groups for _ in g.samples], dtype=torch.bool)
        mask[filler] = 0.0  # a group that only fills the batch teaches nothing
        old = None
        if any(s.old_logps is not None for s in samples):
            old = torch.zeros(ids.shape)
            for i, s in enumerate(samples):
                assert s.old_logps is not None
                lo = len(s.prompt) - 1
                old[i, lo : lo + len(s.completion)] = torch.tensor(s.old_logps)
        # Token-level: every counted token of the step, on every rank, weighs the same (the
        # data-parallel gradient average divides by the world once more: hence ÷ dp).
        normaliser = max(float(mask.sum()), 1.0) / self.dp_world if dapo.token_level_loss else None
        lo = self.dp_rank * self.groups_per_rank * size
        mine = slice(lo, lo + self.groups_per_rank * size)
        ids, labels, mask, advantages = ids[mine], labels[mine], mask[mine], advantages[mine]
        old = old[mine] if old is not None else None
        chunks = _micro_batches(len(ids), self.micro_batch)
        total = torch.zeros((), device=self.device)
        for i, part in enumerate(chunks):
            set_requires_all_reduce(model, i == len(chunks) - 1)
            logps = _logps(
                model, ids[part].to(self.device), labels[part].to(self.device), recipe.temperature
            )
            loss = dapo_policy_loss(
                logps,
                old[part].to(self.device) if old is not None else logps.detach(),
                advantages[part].to(self.device),
                mask[part].to(self.device),
                clip_low=dapo.clip_low,
                clip_high=dapo.clip_high,
                normaliser=normaliser,
            )
            if normaliser is None:
                loss = loss / len(chunks)
            loss.backward()  # type: ignore[no-untyped-call]
            total += loss.detach()
        return total
