"""The eval batteries measured directly, in one process (a one-rank gloo group): exact match by
greedy generation rises once a tiny model is trained on the arithmetic items; multiple choice
picks the option the model finds more likely; batched generation equals one-by-one."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from transformers import LlamaForCausalLM

from ito.core.model_sizes import SIZES
from ito.pipeline.batteries import EvalContext, exact_match, greedy_continuations, multiple_choice
from ito.pipeline.data import pack
from ito.pipeline.loss import use_chunked_loss
from ito.pipeline.model import llama_config
from ito.pipeline.rows import Row, read_rows
from ito.pipeline.tokenizer import build_tokenizer
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
