"""N-gram decontamination of training text against eval items (DESIGN §7.4).

A training text is contaminated by an eval item when they share a word n-gram (n = 13 by default,
GPT-3 paper, Brown et al. 2020, appendix C). Tokens are casefolded runs of word characters, and
each other non-space character is a token of its own, so neither case nor spacing around
punctuation hides an overlap: ``"503+511=1014"`` (an eval row's prompt joined to its answer,
:mod:`ito.data.rows`), ``"503+511= 1014"`` and ``"503 + 511 = 1014"`` are the same five
tokens. An eval item shorter than n tokens has no n-gram; it is then matched whole — its token
sequence appearing contiguously in the training text — so that short items are still protected.

Matching is exact: a window of a training text matches a pattern only when their tokens are
equal. To find the few windows worth comparing, :class:`EvalIndex` hashes every window with numpy
(a polynomial of random 64-bit values of its tokens, from prefix sums) and looks the hash up in a
bitmap of the patterns' hashes; a window holding a token of no eval item is skipped outright. A
hash collision only costs one comparison more.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from itertools import repeat

import numpy as np
import numpy.typing as npt

__all__ = ["DEFAULT_NGRAM", "EvalIndex", "match_tokens", "ngrams"]

DEFAULT_NGRAM = 13
_TOKEN = re.compile(r"\w+|[^\w\s]")
_BASE = 0x9E3779B97F4A7C15
"""Odd base of the window polynomial (invertible modulo 2^64)."""
_MIN_BITMAP_BITS = 16
_MAX_BITMAP_BITS = 26
_BITMAP_LOAD = 64
"""Bitmap slots per pattern: about one window in 64 of a text made only of eval tokens is
compared for nothing."""

_U64 = npt.NDArray[np.uint64]


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
        # Token → id ≥ 1 (0: a token of no eval item) → a fixed random 64-bit value. The values
        # only choose which windows are compared, so any values give the same matches.
        self._ids: dict[str, int] = {}
        for table in self._patterns.values():
            for gram in table:
                for token in gram:
                    self._ids.setdefault(token, len(self._ids) + 1)
        rng = np.random.default_rng(0)
        self._values: _U64 = rng.integers(
            0, 1 << 64, size=len(self._ids) + 1, dtype=np.uint64, endpoint=False
        )
        self._powers: _U64 = np.ones(1, dtype=np.uint64)
        self._inverse_powers: _U64 = np.ones(1, dtype=np.uint64)
        count = sum(len(table) for table in self._patterns.values())
        self._bits = min(
            _MAX_BITMAP_BITS, max(_MIN_BITMAP_BITS, (count * _BITMAP_LOAD).bit_length())
        )
        self._shift = np.uint64(64 - self._bits)
        self._bitmaps: dict[int, npt.NDArray[np.bool_]] = {}
        for length, table in self._patterns.items():
            ids = np.array([[self._ids[t] for t in gram] for gram in table], dtype=np.intp)
            hashes = (self._values[ids] * self._power_table(length)[0][:length]).sum(
                axis=1, dtype=np.uint64
            )
            bitmap = np.zeros(1 << self._bits, dtype=np.bool_)
            bitmap[hashes >> self._shift] = True
            self._bitmaps[length] = bitmap

    def _power_table(self, size: int) -> tuple[_U64, _U64]:
        """``base^i`` and ``base^-i`` modulo 2^64 for ``i < size`` (at least)."""
        if len(self._powers) < size:
            size = max(size, 2 * len(self._powers))
            self._powers = _geometric(_BASE, size)
            self._inverse_powers = _geometric(pow(_BASE, -1, 1 << 64), size)
        return self._powers, self._inverse_powers

    def matches(self, text: str) -> set[int]:
        """Indices of the eval items ``text`` overlaps."""
        found: set[int] = set()
        if not self._lengths:
            return found
        tokens = match_tokens(text)
        size = len(tokens)
        if size < self._lengths[0]:
            return found
        ids = np.fromiter(map(self._ids.get, tokens, repeat(0)), dtype=np.intp, count=size)
        powers, inverse = self._power_table(size)
        # prefix[i] = Σ_{j<i} value(token j)·base^j, so a window's Σ value·base^(offset) is
        # (prefix[end] − prefix[start])·base^−start.
        prefix = np.zeros(size + 1, dtype=np.uint64)
        np.cumsum(self._values[ids] * powers[:size], out=prefix[1:])
        unknown = ids == 0
        unknown_before = np.concatenate(([0], np.cumsum(unknown))) if unknown.any() else None
        for length in self._lengths:
            if length > size:
                break
            windows = size - length + 1
            hashes = (prefix[length:] - prefix[:windows]) * inverse[:windows]
            hit = self._bitmaps[length][hashes >> self._shift]
            if unknown_before is not None:
                hit &= unknown_before[length:] == unknown_before[:windows]
            table = self._patterns[length]
            for start in np.flatnonzero(hit).tolist():
                items = table.get(tuple(tokens[start : start + length]))
                if items is not None:
                    found.update(items)
        return found


def _geometric(base: int, size: int) -> _U64:
    """``base^i`` modulo 2^64 for ``i < size``."""
    factors = np.full(size, base, dtype=np.uint64)
    factors[0] = 1
    return np.cumprod(factors, dtype=np.uint64)
