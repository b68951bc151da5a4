"""Exact and near-duplicate detection over normalised rows (DESIGN §7.4).

Exact duplicates are rows whose canonical JSON is byte-identical. Near duplicates are found with
MinHash LSH (Broder 1997; Leskovec, Rajaraman & Ullman, *Mining of Massive Datasets* ch. 3) over
sets of word shingles: a document is dropped when an *earlier kept* document's shingle set has a
Jaccard similarity at or above the threshold. LSH only proposes candidates; every candidate is
checked against the exact Jaccard of the two shingle sets, so no document is dropped below the
threshold. The bands are chosen for recall (:func:`lsh_bands`): a pair at the threshold is
proposed with probability ≥ 0.99, a pair above it more surely still. Everything is seeded: the
same input always keeps the same rows.

The sketch (:class:`_Sketcher`) is computed with numpy over all of a document's shingles at
once. Each distinct word is hashed once (BLAKE2b, 64 bits); a shingle's hash is a polynomial of
its words' hashes modulo 2^64, mixed by the MurmurHash3 64-bit finaliser and cut to its high 32
bits; each of the ``num_perm`` permutations is the affine map ``a·h + b mod 2^32`` with ``a``
odd — datasketch's ``affine32`` scheme, with the same parameters drawn from the seed. The
hashes only choose which pairs are *proposed*: a collision can add a candidate (which the exact
check then rejects), never drop a document below the threshold.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from itertools import chain
from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = [
    "SHINGLE_HASH",
    "NearDedup",
    "exact_duplicates",
    "exact_key",
    "jaccard",
    "lsh_bands",
    "near_duplicates",
    "word_shingles",
]

SHINGLE_HASH = "blake2b64_words_poly64_fmix64_high32"
"""How a shingle is hashed before the permutations (recorded in the provenance report): see the
module docstring."""

_U32 = npt.NDArray[np.uint32]
_U64 = npt.NDArray[np.uint64]


@dataclass(frozen=True)
class NearDedup:
    """Settings of near-duplicate removal."""

    threshold: float = 0.9
    """Jaccard similarity of shingle sets at or above which a later document is dropped."""
    shingle_words: int = 3
    """Words per shingle. Three keeps one changed word in a 60-word document above 0.9."""
    num_perm: int = 128
    """MinHash permutations."""
    seed: int = 1
    """Seed of the MinHash permutations."""

    def __post_init__(self) -> None:
        if not 0.0 < self.threshold <= 1.0:
            raise ValueError("near_dedup.threshold must be within (0, 1]")
        if self.shingle_words < 1:
            raise ValueError("near_dedup.shingle_words must be ≥ 1")
        if self.num_perm < 2:
            raise ValueError("near_dedup.num_perm must be ≥ 2")
        if self.seed < 0:
            raise ValueError("near_dedup.seed must be ≥ 0")

    def to_dict(self) -> dict[str, Any]:
        return {
            "method": "minhash_lsh",
            "scheme": "affine32",
            "shingle_hash": SHINGLE_HASH,
            "threshold": self.threshold,
            "shingle_words": self.shingle_words,
            "num_perm": self.num_perm,
            "seed": self.seed,
            "bands": list(lsh_bands(self.threshold, self.num_perm)),
            "verified_with": "exact_jaccard",
        }


def exact_key(row: dict[str, Any]) -> str:
    """sha256 of the row as canonical JSON (sorted keys, no insignificant whitespace)."""
    canonical = json.dumps(row, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def exact_duplicates(rows: Sequence[dict[str, Any]]) -> list[int]:
    """Indices of rows identical to an earlier row."""
    seen: set[str] = set()
    dupes = []
    for i, row in enumerate(rows):
        key = exact_key(row)
        if key in seen:
            dupes.append(i)
        else:
            seen.add(key)
    return dupes


def word_shingles(text: str, k: int) -> frozenset[str]:
    """Contiguous ``k``-word windows of the casefolded text; a shorter text is one shingle."""
    words = text.casefold().split()
    if len(words) <= k:
        return frozenset([" ".join(words)]) if words else frozenset()
    # Shifted copies of the word list, zipped: the shortest (the last) ends the windows.
    return frozenset(map(" ".join, zip(*(words[i:] for i in range(k)), strict=False)))


def jaccard(a: frozenset[str], b: frozenset[str]) -> float:
    if not a and not b:
        return 1.0
    return len(a & b) / len(a | b)


def lsh_bands(threshold: float, num_perm: int, recall: float = 0.99) -> tuple[int, int]:
    """Bands ``b ≥ 2`` and rows per band ``r`` (``b·r ≤ num_perm``) such that a pair at exactly the
    threshold becomes a candidate with probability ≥ ``recall``, as few others as possible.

    A pair of Jaccard ``s`` shares a band with probability ``1 - (1 - s^r)^b`` (*Mining of
    Massive Datasets* §3.4.2). datasketch's own choice balances false positives against false
    negatives and misses ~70 % of pairs at 0.9; here candidates are verified exactly, so false
    positives only cost time and recall is what matters.
    """
    for rows in range(num_perm // 2, 0, -1):  # at least two bands
        bands = num_perm // rows
        if 1.0 - (1.0 - threshold**rows) ** bands >= recall:
            return bands, rows
    return num_perm, 1


_WORD_MULTIPLIER = np.uint64(0x9E3779B97F4A7C15)
"""Odd multiplier of the shingle polynomial (2^64 over the golden ratio)."""
_FMIX64 = (np.uint64(33), np.uint64(0xFF51AFD7ED558CCD), np.uint64(0xC4CEB9FE1A85EC53))
_EMPTY = np.uint32(0xFFFFFFFF)
_CHUNK_DOCS = 256
"""Documents whose words are hashed together (bounds the memory held for signatures)."""


def _fmix64(h: _U64) -> _U64:
    """MurmurHash3's 64-bit finaliser: an avalanching bijection on 64-bit values."""
    shift, m1, m2 = _FMIX64
    h = h ^ (h >> shift)
    h = h * m1
    h = h ^ (h >> shift)
    h = h * m2
    return h ^ (h >> shift)


class _WordHashes(dict[str, int]):
    """Word → its 64-bit BLAKE2b hash (as a signed int, which numpy takes fastest), computed
    once per distinct word."""

    def __missing__(self, word: str) -> int:
        digest = hashlib.blake2b(word.encode("utf-8", "surrogatepass"), digest_size=8).digest()
        value = int.from_bytes(digest, "little", signed=True)
        self[word] = value
        return value


class _Sketcher:
    """MinHash signatures of texts' word-shingle sets (see the module docstring)."""

    def __init__(self, settings: NearDedup) -> None:
        self.k = settings.shingle_words
        # The affine32 parameters exactly as datasketch draws them for this seed.
        gen = np.random.RandomState(settings.seed)
        a = gen.randint(0, 1 << 31, settings.num_perm, dtype=np.uint32) * np.uint32(2) + 1
        b = gen.randint(0, 1 << 32, settings.num_perm, dtype=np.uint32)
        self.a: _U32 = a.astype(np.uint32)
        self.b: _U32 = b
        self.words = _WordHashes()
        self.powers: _U64 = np.array(
            [pow(int(_WORD_MULTIPLIER), e, 1 << 64) for e in range(self.k)], dtype=np.uint64
        )

    def shingle_hashes(self, words: _U64) -> _U32:
        """32-bit hashes of the ``k``-word windows of one text's word hashes (one for the whole
        text when it has at most ``k`` words; none when it has none)."""
        n = len(words)
        if n == 0:
            return np.empty(0, dtype=np.uint32)
        k = min(self.k, n)
        windows = n - k + 1
        poly = words[:windows] * self.powers[k - 1]
        for j in range(1, k):
            poly += words[j : j + windows] * self.powers[k - 1 - j]
        return (_fmix64(poly) >> np.uint64(32)).astype(np.uint32)

    def signatures(self, texts: Sequence[str]) -> Iterator[_U32]:
        """Each text's signature, in order: ``num_perm`` minima of ``a·h + b mod 2^32`` over
        its shingle hashes ``h`` (all ``0xFFFFFFFF`` for a text with no words)."""
        lookup = self.words.__getitem__
        buffer = np.empty((0, len(self.a)), dtype=np.uint32)
        for first in range(0, len(texts), _CHUNK_DOCS):
            split = [text.casefold().split() for text in texts[first : first + _CHUNK_DOCS]]
            flat = np.fromiter(
                map(lookup, chain.from_iterable(split)),
                dtype=np.int64,
                count=sum(map(len, split)),
            ).view(np.uint64)
            offset = 0
            for words in split:
                hashes = self.shingle_hashes(flat[offset : offset + len(words)])
                offset += len(words)
                if len(hashes) == 0:
                    yield np.full(len(self.a), _EMPTY, dtype=np.uint32)
                    continue
                if len(hashes) > len(buffer):
                    buffer = np.empty((max(len(hashes), 2 * len(buffer)), len(self.a)), np.uint32)
                permuted = buffer[: len(hashes)]
                np.multiply(hashes[:, None], self.a, out=permuted)
                permuted += self.b
                yield permuted.min(axis=0)


def near_duplicates(texts: Sequence[str], settings: NearDedup) -> list[int]:
    """Indices of texts that are near duplicates of an earlier kept text, in input order."""
    bands, rows = lsh_bands(settings.threshold, settings.num_perm)
    band_key = np.dtype((np.void, rows * 4))
    tables: list[dict[bytes, list[int]]] = [{} for _ in range(bands)]
    shingles: dict[int, frozenset[str]] = {}

    def shingles_of(i: int) -> frozenset[str]:
        found = shingles.get(i)
        if found is None:
            found = shingles[i] = word_shingles(texts[i], settings.shingle_words)
        return found

    dupes = []
    for i, signature in enumerate(_Sketcher(settings).signatures(texts)):
        keys: list[bytes] = signature[: bands * rows].view(band_key).tolist()
        candidates: set[int] = set()
        for table, key in zip(tables, keys, strict=True):
            found = table.get(key)
            if found is not None:
                candidates.update(found)
        if candidates and any(
            jaccard(shingles_of(i), shingles_of(j)) >= settings.threshold
            for j in sorted(candidates)
        ):
            dupes.append(i)
            shingles.pop(i, None)
            continue
        for table, key in zip(tables, keys, strict=True):
            table.setdefault(key, []).append(i)
    return dupes
