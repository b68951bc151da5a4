"""The run's tokenizer: the one the manifest names, or byte-level BPE trained on the run's data.

Nothing is downloaded. Data preparation (:mod:`ito.pipeline.data_prep`) either reads the
``tokenizer.json`` the manifest names (``model.tokenizer``, checked against its sha256) or
trains one on the training split of the curriculum's data, writes it to
``<workdir>/prepared/tokenizer.json`` and records its digest in the provenance report bound to
the run; the engine tokenizes with that file, so a resumed attempt, or one prepared again on
another worker, tokenizes exactly as the first did (training is deterministic for the same texts
and vocabulary). Byte-level BPE (Radford et al. 2019, GPT-2 §2.2) never meets an unknown
character.

An engine started without data preparation trains the same tokenizer itself into the checkpoint
directory (:func:`build_tokenizer`), and every later attempt loads that file.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from ito.core.errors import ItoError

__all__ = [
    "EOS",
    "TOKENIZER_FILE",
    "build_tokenizer",
    "check_tokenizer",
    "load_tokenizer",
    "tokenizer_bytes",
    "train_tokenizer",
    "vocab_size",
]

EOS = "<|endoftext|>"
"""Separates documents when they are packed into sequences."""
TOKENIZER_FILE = "tokenizer.json"
TRAIN_CHARS_LIMIT = 64 * 1024 * 1024
"""Characters of training text the BPE trainer sees at most (the first ones, in data order)."""


def train_tokenizer(texts: Iterable[str], vocab_size: int) -> Tokenizer:
    """Byte-level BPE trained on ``texts`` (deterministic for the same texts and vocabulary).
    Its vocabulary may end below ``vocab_size`` when the texts hold too few merges."""
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
    return tokenizer


def tokenizer_bytes(tokenizer: Tokenizer) -> bytes:
    """The ``tokenizer.json`` bytes of ``tokenizer``: what :meth:`Tokenizer.save` writes."""
    return tokenizer.to_str(pretty=True).encode()


def build_tokenizer(texts: Iterable[str], vocab_size: int, out_dir: Path) -> Tokenizer:
    """Train on ``texts`` and save to ``out_dir/tokenizer.json`` (atomically)."""
    tokenizer = train_tokenizer(texts, vocab_size)
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp = out_dir / f".{TOKENIZER_FILE}.{os.getpid()}.tmp"
    tokenizer.save(str(tmp))
    os.replace(tmp, out_dir / TOKENIZER_FILE)
    return tokenizer


def load_tokenizer(out_dir: Path) -> Tokenizer:
    return Tokenizer.from_file(str(out_dir / TOKENIZER_FILE))


def vocab_size(tokenizer: Tokenizer) -> int:
    """Embedding rows the tokenizer's ids need: its largest id (added tokens included) + 1."""
    return max(tokenizer.get_vocab(with_added_tokens=True).values(), default=-1) + 1


def check_tokenizer(raw: bytes, model_vocab: int) -> Tokenizer:
    """The tokenizer in ``raw`` (``tokenizer.json`` bytes), or ``tokenizer_invalid``: not a
    tokenizer (``not_a_tokenizer``), an id the model's ``model_vocab`` embedding rows cannot
    hold (``vocab_too_large``; a smaller vocabulary leaves rows unused, as a BPE trained on
    little text does), or no :data:`EOS` to separate packed documents (``no_eos``)."""
    try:
        tokenizer = Tokenizer.from_str(raw.decode("utf-8"))
    except Exception:  # the tokenizers library raises plain Exception on any malformed file
        raise ItoError(
            "tokenizer_invalid",
            "the tokenizer file is not a Hugging Face tokenizers tokenizer.json",
            reason="not_a_tokenizer",
        ) from None
    vocab = vocab_size(tokenizer)
    if vocab > model_vocab:
        raise ItoError(
            "tokenizer_invalid",
            f"the tokenizer's vocabulary ({vocab}) is larger than the model's ({model_vocab})",
            reason="vocab_too_large",
            vocab=vocab,
            model_vocab=model_vocab,
        )
    if tokenizer.token_to_id(EOS) is None:
        raise ItoError(
            "tokenizer_invalid",
            f"the tokenizer has no {EOS} token to separate packed documents",
            reason="no_eos",
        )
    return tokenizer


def _bounded(texts: Iterable[str]) -> Iterable[str]:
    seen = 0
    for text in texts:
        if seen >= TRAIN_CHARS_LIMIT:
            return
        seen += len(text)
        yield text
