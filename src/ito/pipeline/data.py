"""Training data for a curriculum stage: documents → held-out split → packed sequences → batches.

Guarantees:

- The held-out split is a pure function of each document's bytes (a digest bucket), so every
  stage that trains on a data id skips exactly the documents every eval on that id uses
  (:mod:`ito.data.heldout`).
- The order is a pure function of (seed, stage index, epoch): the batch of stage step ``k`` on
  rank ``r`` is computed, never iterated to, so the data position of a checkpoint is the step.
- Raw files are read only from ``file://`` URIs and must match the manifest's sha256; a file
  that data preparation wrote to ``<workdir>/prepared/<id>.jsonl`` is used in its place, and the
  tokenizer it wrote beside them is used only with the digest its report lists.
- A document is :attr:`Row.text <ito.data.rows.Row.text>` of a row read by
  :func:`ito.data.rows.read_rows`: the same text data preparation deduplicated and
  decontaminated.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote, urlparse

import torch
from tokenizers import Tokenizer

from ito.core.manifest import DataRef
from ito.data.heldout import HELDOUT_EVERY, split_heldout
from ito.data.rows import Row, read_rows

__all__ = [
    "HELDOUT_EVERY",
    "PackedData",
    "check_shard",
    "prepared_tokenizer",
    "read_data_rows",
    "read_documents",
    "seed_from",
    "split_heldout",
]


def seed_from(run_id: str) -> int:
    return int.from_bytes(hashlib.sha256(run_id.encode()).digest()[:8], "big") % (2**62)


def read_documents(ref: DataRef, workdir: Path, provenance_sha256: str | None = None) -> list[str]:
    """The documents of ``ref`` (:attr:`Row.text` of :func:`read_data_rows`)."""
    return [row.text for row in read_data_rows(ref, workdir, provenance_sha256)]


def read_data_rows(ref: DataRef, workdir: Path, provenance_sha256: str | None = None) -> list[Row]:
    """The rows of ``ref``: its prepared shard when data preparation wrote one — checked
    against the provenance report bound to the run when ``provenance_sha256`` is given — else
    the raw file (checked against the manifest's digest)."""
    prepared = workdir / "prepared" / f"{ref.id}.jsonl"
    if prepared.exists():
        raw = prepared.read_bytes()
        if provenance_sha256 is not None:
            check_shard(workdir, ref.id, raw, provenance_sha256)
    else:
        uri = urlparse(ref.uri)
        if uri.scheme != "file":
            raise ValueError(
                f"data {ref.id!r}: only file:// URIs are readable here, not {uri.scheme}://"
            )
        raw = Path(unquote(uri.path)).read_bytes()
        if hashlib.sha256(raw).hexdigest() != ref.sha256:
            raise ValueError(f"data {ref.id!r}: the file's sha256 does not match the manifest")
    return read_rows(raw, ref.role, data_id=ref.id)


def check_shard(workdir: Path, data_id: str, raw: bytes, provenance_sha256: str) -> None:
    """Refuse (``provenance_mismatch``) a prepared shard unless ``provenance.json`` is the
    report bound to the run and lists exactly these bytes' digest for ``data_id``."""
    from ito.core.errors import ItoError
    from ito.core.provenance import parse_provenance

    report_raw = _bound_report(workdir, provenance_sha256)
    expected = parse_provenance(report_raw).shard_digests().get(data_id)
    if expected != hashlib.sha256(raw).hexdigest():
        raise ItoError(
            "provenance_mismatch",
            f"the prepared shard of {data_id!r} is not the one the bound report lists",
            data_id=data_id,
        )


def prepared_tokenizer(
    workdir: Path, provenance_sha256: str | None, model_vocab: int
) -> Tokenizer | None:
    """The tokenizer data preparation wrote to ``<workdir>/prepared/``; ``None`` when there was
    no preparation, or its report names no tokenizer (a report of an earlier version).

    Refuses (``provenance_mismatch``) a file whose digest is not the one the report lists — a
    tokenizer swapped after preparation — and, when ``provenance_sha256`` is given, a report
    that is not the one bound to the run; ``tokenizer_invalid`` if the file does not fit the
    model (:func:`ito.pipeline.tokenizer.check_tokenizer`)."""
    from ito.core.errors import ItoError
    from ito.core.provenance import parse_provenance
    from ito.pipeline.tokenizer import TOKENIZER_FILE, check_tokenizer

    if not (workdir / "prepared" / "provenance.json").exists():
        return None
    report_raw = _bound_report(workdir, provenance_sha256)
    listed = parse_provenance(report_raw).tokenizer
    if listed is None:
        return None
    try:
        raw = (workdir / "prepared" / TOKENIZER_FILE).read_bytes()
    except FileNotFoundError:
        raw = None
    if raw is None or hashlib.sha256(raw).hexdigest() != listed.sha256:
        raise ItoError(
            "provenance_mismatch",
            "the prepared tokenizer is not the one the provenance report lists",
            expected=listed.sha256,
            actual=None if raw is None else hashlib.sha256(raw).hexdigest(),
        )
    return check_tokenizer(raw, model_vocab)


def _bound_report(workdir: Path, provenance_sha256: str | None) -> bytes:
    """The bytes of ``provenance.json``, refused (``provenance_mismatch``) unless they are the
    report bound to the run (when ``provenance_sha256`` says which that is)."""
    from ito.core.errors import ItoError
    from ito.core.provenance import provenance_digest

    report_raw = (workdir / "prepared" / "provenance.json").read_bytes()
    if provenance_sha256 is not None and provenance_digest(report_raw) != provenance_sha256:
        raise ItoError(
            "provenance_mismatch",
            "provenance.json is not the report bound to the run",
            bound=provenance_sha256,
        )
    return report_raw


def pack(tokenizer: Tokenizer, docs: Sequence[str], seq_len: int) -> torch.Tensor:
    """Concatenate the documents, each followed by EOS, into rows of ``seq_len`` tokens; the
    tail that does not fill a row is dropped."""
    eos = tokenizer.token_to_id("<|endoftext|>")
    if eos is None:
        raise ValueError("the tokenizer has no end-of-text token")
    stream: list[int] = []
    for encoding in tokenizer.encode_batch(list(docs)):
        stream.extend(encoding.ids)
        stream.append(eos)
    rows = len(stream) // seq_len
    if rows == 0:
        raise ValueError(
            f"the data holds {len(stream)} tokens, fewer than one sequence of {seq_len}"
        )
    return torch.tensor(stream[: rows * seq_len], dtype=torch.long).view(rows, seq_len)


@dataclass
class PackedData:
    """Packed sequences of one stage and the seeded order they are visited in."""

    sequences: torch.Tensor
    seed: int
    stage_index: int
    _orders: dict[int, torch.Tensor] = field(default_factory=dict, repr=False)

    def _order(self, epoch: int) -> torch.Tensor:
        if epoch not in self._orders:
            generator = torch.Generator().manual_seed(
                (self.seed * 1_000_003 + self.stage_index * 10_007 + epoch) % (2**63)
            )
            self._orders[epoch] = torch.randperm(len(self.sequences), generator=generator)
            for old in [e for e in self._orders if e < epoch - 1]:
                del self._orders[old]  # steps only move forward; these are never read again
        return self._orders[epoch]

    def batch(self, stage_step: int, rank: int, world: int, micro_batch: int) -> torch.Tensor:
        """The ``micro_batch`` sequences rank ``rank`` trains on at ``stage_step`` (0-based)."""
        n = len(self.sequences)
        start = stage_step * micro_batch * world + rank * micro_batch
        index = [int(self._order(p // n)[p % n]) for p in range(start, start + micro_batch)]
        return self.sequences[index]
