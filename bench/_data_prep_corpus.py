"""The synthetic corpus of ``bench/data_prep.py``: documents, planted near duplicates and planted
eval passages, with the truth of what was planted.

Every word is a run of lowercase ASCII letters and documents are those words joined by single
spaces, so the project's tokens (whitespace words for near deduplication, ``\\w+`` runs and
punctuation marks for decontamination), datatrove's whitespace tokenizer and NFKC normalisation
all see the same words, and normalisation changes no text.

- **unique** documents: 400–600 words drawn from a Zipf-like vocabulary of synthetic words.
- **near-duplicate clusters**: an original and one or two copies, each copy the original with
  words substituted at random positions until the Jaccard similarity of the two documents'
  3-word shingle sets is within ``[JACCARD_LOW, JACCARD_HIGH]`` (measured here, exactly). A copy
  always comes after its original in the file.
- **contaminated** documents: a unique document with a window of 13 or more consecutive words of
  one eval passage inserted at a random word position.
- **near misses**: a unique document with a window of exactly 12 consecutive words of an eval
  passage inserted, the words on either side differing from the passage's own neighbours: a
  13-gram decontamination must not flag it.

The eval set is ``eval.jsonl``: rows of ``{"text": passage}`` of 30–60 words. The training file
``train.jsonl`` holds ``{"id": ..., "text": ...}`` rows (the project reads ``text`` only,
datatrove takes ``id`` as the document id). ``truth.json`` holds the planted structure.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

SHINGLE_WORDS = 3
JACCARD_LOW = 0.85
JACCARD_HIGH = 0.95
NGRAM = 13
VOCABULARY = 30_000
_SYLLABLES = [c + v for c in "bcdfghjklmnprstvwz" for v in "aeiou"]


@dataclass(frozen=True)
class CorpusShape:
    docs: int
    """Training documents in all (originals, copies, contaminated and near misses included)."""
    copy_fraction: float
    """Share of the documents that are planted near-duplicate copies."""
    contaminated: int
    near_misses: int
    eval_items: int
    seed: int = 0

    @classmethod
    def scaled(cls, docs: int, seed: int = 0) -> CorpusShape:
        """10 % copies, 1 % contaminated, 1 % near misses, one eval passage per 40 documents
        (for 20,000 documents: 2,000 copies, 200 + 200 planted passages, 500 eval items)."""
        return cls(
            docs=docs,
            copy_fraction=0.1,
            contaminated=max(5, docs // 100),
            near_misses=max(5, docs // 100),
            eval_items=max(20, docs // 40),
            seed=seed,
        )


def _vocabulary(rng: np.random.RandomState) -> list[str]:
    words: set[str] = set()
    ordered: list[str] = []
    while len(ordered) < VOCABULARY:
        n = int(rng.randint(1, 5))
        word = "".join(_SYLLABLES[i] for i in rng.randint(0, len(_SYLLABLES), n))
        if word not in words:
            words.add(word)
            ordered.append(word)
    return ordered


def shingles(words: list[str]) -> set[tuple[str, ...]]:
    k = SHINGLE_WORDS
    if len(words) <= k:
        return {tuple(words)} if words else set()
    return {tuple(words[i : i + k]) for i in range(len(words) - k + 1)}


def jaccard(a: list[str], b: list[str]) -> float:
    sa, sb = shingles(a), shingles(b)
    return len(sa & sb) / len(sa | sb)


class _Words:
    def __init__(self, rng: np.random.RandomState) -> None:
        self.rng = rng
        self.vocab = _vocabulary(rng)
        ranks = np.arange(1, VOCABULARY + 1, dtype=np.float64)
        weights = 1.0 / (ranks + 2.7)
        self.p = weights / weights.sum()

    def draw(self, n: int) -> list[str]:
        return [self.vocab[i] for i in self.rng.choice(VOCABULARY, size=n, p=self.p)]

    def document(self) -> list[str]:
        return self.draw(int(self.rng.randint(400, 601)))


def _near_copy(words: _Words, original: list[str]) -> tuple[list[str], float]:
    rng = words.rng
    target = rng.uniform(JACCARD_LOW + 0.01, JACCARD_HIGH - 0.01)
    s = len(original) - SHINGLE_WORDS + 1
    m = max(1, round(s * (1 - target) / (SHINGLE_WORDS * (1 + target))))
    for _ in range(50):
        copy = list(original)
        for pos in rng.choice(len(original), size=m, replace=False):
            while True:
                (word,) = words.draw(1)
                if word != original[pos]:
                    break
            copy[pos] = word
        j = jaccard(original, copy)
        if JACCARD_LOW <= j <= JACCARD_HIGH:
            return copy, j
        m = m + 1 if j > JACCARD_HIGH else max(1, m - 1)
    raise RuntimeError("no copy within the Jaccard range")


def _insert(rng: np.random.RandomState, doc: list[str], window: list[str]) -> list[str]:
    at = int(rng.randint(1, len(doc)))
    return doc[:at] + window + doc[at:]


def make_corpus(out: Path, shape: CorpusShape) -> dict[str, Any]:
    """Write ``train.jsonl``, ``eval.jsonl`` and ``truth.json`` into ``out``; returns the
    truth."""
    rng = np.random.RandomState(shape.seed)
    words = _Words(rng)
    passages = [words.draw(int(rng.randint(30, 61))) for _ in range(shape.eval_items)]

    copies = int(shape.docs * shape.copy_fraction)
    # Clusters of one original and one copy, or two copies for every third cluster.
    sizes: list[int] = []
    left = copies
    while left > 0:
        c = 2 if len(sizes) % 3 == 2 and left >= 2 else 1
        sizes.append(c)
        left -= c
    specials = shape.contaminated + shape.near_misses
    plain = shape.docs - copies - len(sizes) - specials
    if plain < 0:
        raise ValueError(f"{shape.docs} documents are too few for the planted ones")

    # Documents in file order: each entry (kind, words, extra). Originals are placed in the
    # first half, their copies after them.
    docs: list[tuple[str, list[str], dict[str, Any]]] = []
    for _ in range(plain):
        docs.append(("unique", words.document(), {}))
    for i in range(shape.contaminated):
        item = i % shape.eval_items
        passage = passages[item]
        length = int(rng.randint(NGRAM, len(passage) + 1))
        start = int(rng.randint(0, len(passage) - length + 1))
        docs.append(
            (
                "contaminated",
                _insert(rng, words.document(), passage[start : start + length]),
                {"item": item},
            )
        )
    for i in range(shape.near_misses):
        item = (i * 7 + 3) % shape.eval_items
        passage = passages[item]
        start = int(rng.randint(1, len(passage) - NGRAM))
        window = passage[start : start + NGRAM - 1]
        doc = words.document()
        at = int(rng.randint(1, len(doc) - 1))
        # The neighbours must not extend the window to a 13-gram of the passage.
        while doc[at - 1] == passage[start - 1]:
            doc[at - 1] = words.draw(1)[0]
        while doc[at] == passage[start + NGRAM - 1]:
            doc[at] = words.draw(1)[0]
        docs.append(("near_miss", doc[:at] + window + doc[at:], {"item": item}))
    order = list(rng.permutation(len(docs)))
    docs = [docs[i] for i in order]

    clusters: list[dict[str, Any]] = []
    for cluster, size in enumerate(sizes):
        original = words.document()
        # The original somewhere in the first half of what is there so far, its copies later.
        at = int(rng.randint(0, len(docs) // 2 + 1))
        docs.insert(at, ("original", original, {"cluster": cluster}))
        jaccards = []
        for _ in range(size):
            copy, j = _near_copy(words, original)
            jaccards.append(round(j, 4))
            later = int(rng.randint(at + 1, len(docs) + 1))
            docs.insert(later, ("copy", copy, {"cluster": cluster, "jaccard": j}))
        clusters.append({"size": size + 1, "jaccard_to_original": jaccards})

    out.mkdir(parents=True, exist_ok=True)
    truth_docs: dict[str, dict[str, Any]] = {}
    cluster_members: list[list[str]] = [[] for _ in sizes]
    with (out / "train.jsonl").open("w", encoding="utf-8") as f:
        for n, (kind, doc_words, extra) in enumerate(docs):
            doc_id = f"d{n:07d}"
            f.write(json.dumps({"id": doc_id, "text": " ".join(doc_words)}) + "\n")
            truth_docs[doc_id] = {
                "kind": kind,
                **{k: v for k, v in extra.items() if k != "jaccard"},
            }
            if "cluster" in extra:
                cluster_members[extra["cluster"]].append(doc_id)
    with (out / "eval.jsonl").open("w", encoding="utf-8") as f:
        for passage in passages:
            f.write(json.dumps({"text": " ".join(passage)}) + "\n")
    for cluster, members in zip(clusters, cluster_members, strict=True):
        cluster["members"] = members
    all_j = [j for c in clusters for j in c["jaccard_to_original"]]
    truth = {
        "docs": truth_docs,
        "clusters": clusters,
        "counts": {
            "docs": len(docs),
            "words": sum(len(d[1]) for d in docs),
            "clusters": len(clusters),
            "copies": copies,
            "contaminated": shape.contaminated,
            "near_misses": shape.near_misses,
            "eval_items": shape.eval_items,
        },
        "copy_jaccard": {"min": min(all_j), "max": max(all_j)} if all_j else None,
    }
    (out / "truth.json").write_text(json.dumps(truth), encoding="utf-8")
    return truth
