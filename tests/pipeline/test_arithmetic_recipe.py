"""The arithmetic recipes' post-training rows tokenize as the text they were cut from: each
prompt's tokens are a prefix of the joined prompt + completion's, so SFT learns completions in
the tokens pre-training showed the model (and the engine never falls back to tokenizing a
completion on its own, :func:`ito.pipeline.post_training.sft_examples`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ito.core.model_sizes import SIZES
from ito.data.heldout import split_heldout
from ito.data.rows import Row, read_rows
from ito.pipeline.tokenizer import train_tokenizer
from ito.recipes import build_recipe


@pytest.mark.parametrize("name", ["post", "demo"])
def test_every_sft_and_preference_row_splits_on_a_token_boundary(tmp_path: Path, name: str) -> None:
    recipe = build_recipe(name, str(tmp_path))

    def rows(fname: str, role: str) -> list[Row]:
        return read_rows(recipe.files[fname], role, data_id=fname)

    # As data preparation trains it: on the training split of the curriculum's data, in order
    # (here from the raw files, before deduplication, which drops nothing from these).
    texts = [
        text
        for fname, role in (("web.jsonl", "pretrain"), ("arith-mid.jsonl", "midtrain"))
        for text in split_heldout([row.text for row in rows(fname, role)], role)[0]
    ]
    tokenizer = train_tokenizer(texts, SIZES[recipe.manifest["model"]["size"]].vocab)
    pairs = [
        (row.get("prompt"), row.get("completion"))
        for fname in ("web-sft.jsonl", "arith-sft.jsonl")
        for row in rows(fname, "sft")
    ]
    pairs += [
        (row.get("prompt"), row.get(key))
        for row in rows("arith-prefs.jsonl", "dpo")
        for key in ("chosen", "rejected")
    ]
    assert len(pairs) > 1000
    for prompt, completion in pairs:
        context = tokenizer.encode(prompt).ids
        whole = tokenizer.encode(prompt + completion).ids
        assert whole[: len(context)] == context, (prompt, completion)
        assert len(whole) > len(context)
    # The web rows are cut from training documents: the joined text is a document's start.
    web = "\n".join(row.text for row in rows("web.jsonl", "pretrain"))
    for row in rows("web-sft.jsonl", "sft"):
        assert row.get("prompt") + row.get("completion") in web
