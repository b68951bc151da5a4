"""Exact and near-duplicate detection over normalised rows (DESIGN §7.4).

Exact duplicates are rows whose canonical JSON is byte-identical. Near duplicates are found with
MinHash LSH (Broder 1997; Leskovec, Rajaraman & Ullman, *Mining of Massive Datasets* ch. 3) over
sets of word shingles: a document is dropped when an *earlier kept* document's shingle set has a
Jaccard similarity at or above the threshold. LSH only proposes candidates; every candidate is
checked against the exact Jaccard of the two shingle sets, so no document is dropped below the
threshold. The bands are chosen for recall (:func:`lsh_bands`): a pair at the threshold is
proposed with probability ≥ 0.99, a pair above it more surely still. Everything is seeded: the
same input always keeps the same rows.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from datasketch import MinHash, MinHashLSH  # type: ignore[import-untyped]

__all__ = [
    "NearDedup",
    "exact_duplicates",
    "exact_key",
    "jaccard",
    "lsh_bands",
    "near_duplicates",
    "word_shingles",
]


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
    return frozenset(" ".join(words[i : i + k]) for i in range(len(words) - k + 1))


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
    for rows in range(num_perm // 2, 0, -1):  # datasketch needs at least two bands
        bands = num_perm // rows
        if 1.0 - (1.0 - threshold**rows) ** bands >= recall:
            return bands, rows
    return num_perm, 1


def near_duplicates(texts: Sequence[str], settings: NearDedup) -> list[int]:
    """Indices of texts that are near duplicates of an earlier kept text, in input order."""
    shingles = [word_shingles(text, settings.shingle_words) for text in texts]
    # Sorted so the sketch never depends on set iteration order (string hashing is salted).
    sketches = MinHash.bulk(
        [sorted(s.encode() for s in sh) for sh in shingles],
        num_perm=settings.num_perm,
        seed=settings.seed,
        scheme="affine32",
    )
    bands = lsh_bands(settings.threshold, settings.num_perm)
    lsh = MinHashLSH(num_perm=settings.num_perm, params=bands)
    dupes = []
    for i, sketch in enumerate(sketches):
        candidates = sorted(lsh.query(sketch))
        if any(jaccard(shingles[i], shingles[j]) >= settings.threshold for j in candidates):
            dupes.append(i)
        else:
            lsh.insert(i, sketch)
    return dupes
