"""The eval batteries measured directly, in one process (a one-rank gloo group): exact match by
greedy generation rises once a tiny model is trained on the arithmetic items; multiple choice
picks the option the model finds more likely; batched generation equals one-by-one."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
from transformers import LlamaForCausalLM

from ito.core.model_sizes import SIZES
from ito.data.rows import Row, read_rows
from ito.pipeline import batteries
from ito.pipeline.batteries import (
    EvalContext,
    exact_match,
    greedy_continuations,
    multiple_choice,
    sampled_exact_match,
)
from ito.pipeline.data import pack
from ito.pipeline.loss import use_chunked_loss
from ito.pipeline.model import llama_config
from ito.pipeline.tokenizer import EOS, build_tokenizer
from ito.recipes import build_recipe

TRAIN_STEPS = 300


@pytest.fixture(scope="module")
def group() -> Iterator[None]:
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)  # type: ignore[attr-defined]
    try:
        yield
    finally:
        dist.destroy_process_group()


def _items(tmp_path: Path) -> tuple[list[str], list[Row]]:
    recipe = build_recipe("test", str(tmp_path))
    sft = read_rows(recipe.files["arith-sft.jsonl"], "sft", data_id="arith-sft")
    # One-digit and two-digit first operands in turn: every batch mixes prompt lengths.
    short = [r for r in sft if len(r.get("prompt")) < 5]
    long = [r for r in sft if len(r.get("prompt")) >= 5]
    mixed = [r for pair in zip(short, long, strict=False) for r in pair]
    items = [
        Row("eval", (("prompt", r.get("prompt")), ("answer", r.get("completion"))))
        for r in mixed[:64]
    ]
    return [r.text for r in sft], items


def _context(model: torch.nn.Module, tokenizer: object, rows: list[Row]) -> EvalContext:
    return EvalContext(
        model=model,
        tokenizer=tokenizer,  # type: ignore[arg-type]
        device=torch.device("cpu"),
        dp_rank=0,
        dp_world=1,
        micro_batch=4,
        heldout=lambda _: [],
        rows=lambda _: rows,
    )


def _model(seed: int) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    model = LlamaForCausalLM(llama_config(SIZES["tiny"]))
    use_chunked_loss(model)
    return model


def test_exact_match_rises_after_sft_like_training_on_the_arithmetic_items(
    group: None, tmp_path: Path
) -> None:
    texts, items = _items(tmp_path)
    tokenizer = build_tokenizer(texts, SIZES["tiny"].vocab, tmp_path / "tok")
    model = _model(0)
    ctx = _context(model, tokenizer, items)
    prompts = [tokenizer.encode(r.get("prompt")).ids for r in items[:7]]
    prompts.append(tokenizer.encode("so " + items[7].get("prompt")).ids)
    assert len({len(p) for p in prompts}) > 1, "the batch must mix prompt lengths"
    batched = greedy_continuations(ctx, prompts, 4)
    assert batched == [greedy_continuations(ctx, [p], 4)[0] for p in prompts]

    before = exact_match(ctx, "arith", 64)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    data = pack(tokenizer, texts, 32)
    generator = torch.Generator().manual_seed(0)
    for _ in range(TRAIN_STEPS):
        batch = data[torch.randint(0, len(data), (16,), generator=generator)]
        model(input_ids=batch, labels=batch).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    after = exact_match(ctx, "arith", 64)
    print(f"exact match on 64 arithmetic items: {before:.3f} before, {after:.3f} after")
    assert before == 0.0 and after >= 0.1


def test_multiple_choice_picks_the_option_the_model_finds_more_likely(
    group: None, tmp_path: Path
) -> None:
    texts = ["the sky is blue ."] * 50 + ["grass is green ."] * 50
    tokenizer = build_tokenizer(texts, SIZES["tiny"].vocab, tmp_path / "tok")
    model = _model(1)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    data = pack(tokenizer, texts, 16)
    for _ in range(60):
        model(input_ids=data, labels=data).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    raw = (
        b'{"prompt": "the sky is", "options": [" green .", " blue ."], "answer": " blue ."}\n'
        b'{"prompt": "grass is", "options": [" green .", " blue ."], "answer": " green ."}\n'
    )
    right = read_rows(raw, "eval", data_id="colours")
    assert multiple_choice(_context(model, tokenizer, right), "colours", 16) == 1.0
    wrong = [
        Row(r.role, (("prompt", r.get("prompt")), ("answer", o)), r.options)
        for r in right
        for o in r.options
        if o != r.get("answer")
    ]
    assert multiple_choice(_context(model, tokenizer, wrong), "colours", 16) == 0.0


class _Choices(torch.nn.Module):
    """A model of known distributions: after the prompt's last token ``=`` it says `` x``,
    `` y`` or `` z`` with probabilities ``probs`` (sharpened by ``scale``), after any of them
    end-of-text for sure; the same whatever the batch or the padding."""

    def __init__(
        self, vocab: int, eq: int, choices: list[int], probs: list[float], eos: int, scale: float
    ) -> None:
        super().__init__()
        self.vocab, self.eq, self.eos = vocab, eq, eos
        self.choices, self.scale = choices, scale
        self.logp = torch.log(torch.tensor(probs))

    def forward(self, input_ids: torch.Tensor, **_: object) -> SimpleNamespace:
        logits = torch.full((*input_ids.shape, self.vocab), -1e9)
        after_eq = input_ids == self.eq
        for k, choice in enumerate(self.choices):
            logits[..., choice] = torch.where(after_eq, self.logp[k] * self.scale, -1e9)
        logits[..., self.eos] = torch.where(after_eq, -1e9, 0.0)
        return SimpleNamespace(logits=logits)


def _choices_context(tmp_path: Path, scale: float) -> EvalContext:
    texts = ["a = x", "a = y", "a = z"] * 30
    tokenizer = build_tokenizer(texts, SIZES["tiny"].vocab, tmp_path / "tok")
    (eq,) = tokenizer.encode(" =").ids
    choices = [tokenizer.encode(f" {c}").ids for c in "xyz"]
    assert all(len(c) == 1 for c in choices)
    eos = tokenizer.token_to_id(EOS)
    assert eos is not None
    model = _Choices(
        tokenizer.get_vocab_size(), eq, [c[0] for c in choices], [0.5, 0.3, 0.2], eos, scale
    )
    return _context(model, tokenizer, [])


def _items_answering(answers: str) -> list[Row]:
    return [Row("eval", (("prompt", "a ="), ("answer", a))) for a in answers]


def test_sampled_exact_match_counts_samples_in_proportion_to_the_models_probabilities(
    group: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ctx = _choices_context(tmp_path, scale=1.0)
    for answer, p in (("x", 0.5), ("y", 0.3), ("z", 0.2)):
        ctx.rows = lambda _, a=answer: _items_answering(a * 100)  # type: ignore[misc]
        measured = sampled_exact_match(ctx, "choices", 16)
        # 1,600 draws: a standard error of at most 0.0125.
        assert abs(measured - p) < 0.05, (answer, measured)
    # Greedy decoding sees only the mode.
    ctx.rows = lambda _: _items_answering("z" * 100)
    assert exact_match(ctx, "choices", 16) == 0.0
    # The same items are drawn the same: one item per forward, or a rank's share at a time,
    # counts the same hits.
    ctx.rows = lambda _: _items_answering("xyz" * 33)
    whole = sampled_exact_match(ctx, "choices", 16)
    monkeypatch.setattr(batteries, "ITEM_BATCH", batteries.SAMPLES)
    assert sampled_exact_match(ctx, "choices", 16) == whole
    shares = []
    for rank in range(3):
        ctx.dp_rank, ctx.dp_world = rank, 3
        shares.append(sampled_exact_match(ctx, "choices", 16) * 33)
    assert math.isclose(sum(shares), whole * 99, abs_tol=1e-9)


def test_sampled_exact_match_of_a_sharp_model_is_its_greedy_exact_match(
    group: None, tmp_path: Path
) -> None:
    ctx = _choices_context(tmp_path, scale=1e4)
    ctx.rows = lambda _: _items_answering("x" * 30 + "y" * 10)
    assert sampled_exact_match(ctx, "choices", 16) == exact_match(ctx, "choices", 16) == 0.75
