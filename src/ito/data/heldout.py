"""The held-out split: which documents of a data set training skips so that evals can use them.

A pure function of each document's bytes (a digest bucket), so every stage that trains on a data
id skips exactly the documents every eval on that id uses, and data preparation trains the
tokenizer on exactly the documents training reads. Free of torch: data preparation imports it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

__all__ = ["HELDOUT_EVERY", "split_heldout"]

HELDOUT_EVERY = 20
"""One document in this many (by digest bucket) is held out of training for evaluation."""


def _digest(text: str) -> int:
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big")


def split_heldout(docs: Sequence[str], role: str) -> tuple[list[str], list[str]]:
    """(train, held-out). Eval data is all held out; other data loses one bucket in
    ``HELDOUT_EVERY`` (at least one document when there are two or more)."""
    if role == "eval":
        return [], list(docs)
    heldout = {i for i, d in enumerate(docs) if _digest(d) % HELDOUT_EVERY == 0}
    if not heldout and len(docs) > 1:
        heldout = {min(range(len(docs)), key=lambda i: _digest(docs[i]))}
    held = set(docs[i] for i in heldout)
    return [d for d in docs if d not in held], [d for d in docs if d in held]
