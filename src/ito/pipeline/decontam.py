"""N-gram decontamination of training text against eval items (DESIGN §7.4).

A training text is contaminated by an eval item when they share a word n-gram (n = 13 by default,
GPT-3 paper, Brown et al. 2020, appendix C). Tokens are casefolded runs of word characters, and
each other non-space character is a token of its own, so neither case nor spacing around
punctuation hides an overlap: ``"503+511=1014"`` (an eval row's prompt joined to its answer,
:mod:`ito.pipeline.rows`), ``"503+511= 1014"`` and ``"503 + 511 = 1014"`` are the same five
tokens. An eval item shorter than n tokens has no n-gram; it is then matched whole — its token
sequence appearing contiguously in the training text — so that short items are still protected.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

__all__ = ["DEFAULT_NGRAM", "EvalIndex", "match_tokens", "ngrams"]

DEFAULT_NGRAM = 13
_TOKEN = re.compile(r"\w+|[^\w\s]")


def match_tokens(text: str) -> list[str]:
    """The tokens overlap is measured over: casefolded words, and punctuation marks each on
    their own."""
    return _TOKEN.findall(text.casefold())


def ngrams(tokens: Sequence[str], n: int) -> set[tuple[str, ...]]:
    """Every contiguous ``n``-token window; empty when there are fewer than ``n`` tokens."""
    return {tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1)}


class EvalIndex:
    """The eval items' n-grams (and the whole of each short item), for lookup by training text."""

    def __init__(self, items: Sequence[str], n: int) -> None:
        if n < 1:
            raise ValueError("n must be ≥ 1")
        self.n = n
        self.size = len(items)
        # pattern length → pattern → indices of the eval items it belongs to
        self._patterns: dict[int, dict[tuple[str, ...], list[int]]] = {}
        for index, item in enumerate(items):
            tokens = match_tokens(item)
            if not tokens:
                continue
            grams = ngrams(tokens, n) if len(tokens) >= n else {tuple(tokens)}
            for gram in grams:
                self._patterns.setdefault(len(gram), {}).setdefault(gram, []).append(index)
        self._lengths = sorted(self._patterns)
        # Most positions of a training text start no pattern at all; a set of first tokens
        # rejects them with one lookup instead of one per pattern length.
        self._first = {gram[0] for table in self._patterns.values() for gram in table}

    def matches(self, text: str) -> set[int]:
        """Indices of the eval items ``text`` overlaps."""
        tokens = match_tokens(text)
        found: set[int] = set()
        first, patterns = self._first, self._patterns
        for i, token in enumerate(tokens):
            if token not in first:
                continue
            for length in self._lengths:
                hit = patterns[length].get(tuple(tokens[i : i + length]))
                if hit is not None:
                    found.update(hit)
        return found
