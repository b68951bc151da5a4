"""The run's tokenizer: byte-level BPE trained locally on the run's own training data.

Nothing is downloaded. Rank 0 trains it once, writes ``tokenizer.json`` into the checkpoint
directory (atomically), and every later attempt loads that file, so a resumed run tokenises
exactly as the interrupted one did. Byte-level BPE (Radford et al. 2019, GPT-2 §2.2) never
meets an unknown character.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

__all__ = ["EOS", "TOKENIZER_FILE", "build_tokenizer", "load_tokenizer"]

EOS = "<|endoftext|>"
"""Separates documents when they are packed into sequences."""
TOKENIZER_FILE = "tokenizer.json"
TRAIN_CHARS_LIMIT = 64 * 1024 * 1024
"""Characters of training text the BPE trainer sees at most (the first ones, in data order)."""


def build_tokenizer(texts: Iterable[str], vocab_size: int, out_dir: Path) -> Tokenizer:
    """Train on ``texts`` (deterministic for the same texts and vocabulary) and save."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(_bounded(texts), trainer=trainer)
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp = out_dir / f".{TOKENIZER_FILE}.{os.getpid()}.tmp"
    tokenizer.save(str(tmp))
    os.replace(tmp, out_dir / TOKENIZER_FILE)
    return tokenizer


def load_tokenizer(out_dir: Path) -> Tokenizer:
    return Tokenizer.from_file(str(out_dir / TOKENIZER_FILE))


def _bounded(texts: Iterable[str]) -> Iterable[str]:
    seen = 0
    for text in texts:
        if seen >= TRAIN_CHARS_LIMIT:
            return
        seen += len(text)
        yield text
