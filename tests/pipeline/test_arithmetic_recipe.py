"""The arithmetic recipes' post-training rows tokenize as the text they were cut from: each
prompt's tokens are a prefix of the joined prompt + completion's, so SFT learns completions in
the tokens pre-training showed the model (and the engine never falls back to tokenizing a
completion on its own)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ito.pipeline.tokenizer import train_tokenizer
from ito.recipes import build_recipe


def _rows(content: bytes) -> list[dict[str, str]]:
    return [json.loads(line) for line in content.splitlines() if line.strip()]


@pytest.mark.parametrize("name", ["post", "demo"])
def test_every_sft_and_preference_row_splits_on_a_token_boundary(tmp_path: Path, name: str) -> None:
    recipe = build_recipe(name, str(tmp_path))
    web = [row["text"] for row in _rows(recipe.files["web.jsonl"])]
    tokenizer = train_tokenizer(web, 512)
    pairs = [
        (row["prompt"], row["completion"])
        for fname in ("web-sft.jsonl", "arith-sft.jsonl")
        for row in _rows(recipe.files[fname])
    ]
    pairs += [
        (row["prompt"], row[key])
        for row in _rows(recipe.files["arith-prefs.jsonl"])
        for key in ("chosen", "rejected")
    ]
    assert len(pairs) > 1000
    web_text = "\n".join(web)
    for prompt, completion in pairs:
        context = tokenizer.encode(prompt).ids
        whole = tokenizer.encode(prompt + completion).ids
        assert whole[: len(context)] == context, (prompt, completion)
        assert len(whole) > len(context)
    # The web rows are cut from training documents: the joined text is a document's start.
    for row in _rows(recipe.files["web-sft.jsonl"]):
        assert row["prompt"] + row["completion"] in web_text
