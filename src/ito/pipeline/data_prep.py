"""Data preparation (DESIGN §7.4): verify, normalise, deduplicate, decontaminate, write.

:func:`prepare_data` runs on rank 0 before training. For every data reference of the manifest it
reads the bytes, checks them against the manifest's sha256, reads its rows (JSONL or Parquet, as
:mod:`ito.data.rows` defines them for the data's role) and normalises their fields; then it
removes exact duplicates in every data set, every training row that overlaps an item of the
manifest's eval data (:mod:`ito.data.decontam`), and near duplicates in every training data
set — in that order. It writes one prepared shard per data set, the run's tokenizer and a
provenance report to ``<workdir>/prepared/``.

The tokenizer (:mod:`ito.pipeline.tokenizer`) is the ``tokenizer.json`` the manifest names
(``model.tokenizer``): read before any data, its bytes checked against the manifest's sha256
and its vocabulary against the model's, then copied as it is. Without one, a byte-level BPE is
trained on the training split of the curriculum's prepared data (what training reads), with the
model's vocabulary. The report records where it came from, its digest and its vocabulary;
training refuses a tokenizer file whose digest is not the report's.

Guarantees:

* Every check happens before anything is written: a digest mismatch, an unreadable file, a row
  that does not fit its role (``data_invalid``), a licence outside the policy, contamination
  above ``data_policy.max_contamination`` or a tokenizer that does not match the manifest or fit
  the model (``tokenizer_invalid``) refuses with an :class:`ItoError` and leaves the work
  directory untouched.
* Each file is written to a temporary name and renamed into place. ``provenance.json`` is removed
  first and written last, so its presence means every shard it lists, and the tokenizer, is
  complete; the output digests it records are those of the bytes written.
* The output depends only on the input bytes and the parameters: rows keep their input order and
  are serialised as canonical JSON of their role's fields only, and the tokenizer's training is
  deterministic, so two runs give byte-identical shards, tokenizers and reports, and a Parquet
  file gives the same shard as the JSONL file of its rows.
* Deduplication and decontamination compare :attr:`Row.text <ito.data.rows.Row.text>`, the
  text training and evaluation read from the shard.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import stat
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import unquote, urlsplit

from ito.core.errors import ErrorCode, ItoError
from ito.core.model_sizes import SIZES
from ito.core.provenance import PROVENANCE_SCHEMA
from ito.core.revisions import storage_parts
from ito.data.decontam import DEFAULT_NGRAM, EvalIndex
from ito.data.heldout import split_heldout
from ito.data.rows import Row, data_format, normalise_text, read_rows, rows_to_jsonl
from ito.pipeline.dedup import NearDedup, exact_duplicates, near_duplicates
from ito.pipeline.storage_fs import StoragePath, proven_dir
from ito.pipeline.tokenizer import (
    TOKENIZER_FILE,
    check_tokenizer,
    tokenizer_bytes,
    train_tokenizer,
    vocab_size,
)

if TYPE_CHECKING:
    from tokenizers import Tokenizer

    from ito.core.manifest import DataRef, Manifest

__all__ = [
    "PREPARED_DIR",
    "PROVENANCE_FILE",
    "PROVENANCE_SCHEMA",
    "BookingStorage",
    "DatasetReport",
    "EvalContamination",
    "NearDedup",
    "PrepReport",
    "TokenizerReport",
    "named_tokenizer",
    "normalise_text",
    "prepare_data",
    "prepared_dir",
    "shard_path",
]

PREPARED_DIR = "prepared"
MAX_DATA_FILE_BYTES = 2 << 30
"""Largest data file one preparation reads (it is held in memory to be hashed and parsed)."""
MAX_TOKENIZER_FILE_BYTES = 256 << 20
"""Largest tokenizer file read (Llama 3's ``tokenizer.json`` is 9 MB)."""
PROVENANCE_FILE = "provenance.json"
MAX_MATCHES_LISTED = 1000
"""Contaminated eval items listed by name in the report, per eval set (all are counted)."""


# --- pure helpers -----------------------------------------------------------------------------


def prepared_dir(workdir: Path) -> Path:
    return workdir / PREPARED_DIR


def shard_path(workdir: Path, data_id: str) -> Path:
    return prepared_dir(workdir) / f"{data_id}.jsonl"


# --- the report -------------------------------------------------------------------------------


@dataclass(frozen=True)
class DatasetReport:
    """What preparation did to one data set. ``input_rows`` equals the sum of the removals and
    ``output_rows``."""

    id: str
    role: str
    uri: str
    input_sha256: str
    """Digest of the input bytes, verified equal to the manifest's."""
    input_format: str
    """``jsonl`` or ``parquet`` (told by the bytes, not the name)."""
    input_rows: int
    empty_removed: int
    """Rows one of whose fields is empty after normalisation."""
    exact_dupes_removed: int
    near_dupes_removed: int
    """Always 0 for eval data, which is not near-deduplicated."""
    contaminated_removed: int
    """Rows removed for overlapping an eval item; always 0 for eval data."""
    output_rows: int
    shard: str
    """File name of the prepared shard inside ``prepared/``."""
    output_sha256: str
    output_bytes: int
    ngram: int | None
    """N-gram size this data was decontaminated with; ``None`` for eval data."""
    decontaminated_against: tuple[str, ...]
    """Eval data ids this data was checked against."""
    declared_report_sha256: str | None
    """The manifest's digest of the decontamination report the human reviewed, if any."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "role": self.role,
            "uri": self.uri,
            "input_sha256": self.input_sha256,
            "input_format": self.input_format,
            "counts": {
                "input": self.input_rows,
                "empty_removed": self.empty_removed,
                "exact_dupes_removed": self.exact_dupes_removed,
                "near_dupes_removed": self.near_dupes_removed,
                "contaminated_removed": self.contaminated_removed,
                "output": self.output_rows,
            },
            "shard": self.shard,
            "output_sha256": self.output_sha256,
            "output_bytes": self.output_bytes,
            "ngram": self.ngram,
            "decontaminated_against": list(self.decontaminated_against),
            "declared_report_sha256": self.declared_report_sha256,
        }


@dataclass(frozen=True)
class EvalContamination:
    """How many items of one eval data set were found in the training data as supplied."""

    id: str
    items: int
    contaminated: int
    matched: tuple[dict[str, Any], ...] = ()
    """Each contaminated item (at most :data:`MAX_MATCHES_LISTED`): its position in the eval
    set (0-based, after exact deduplication), the sha256 of its text, and how many rows of
    each training data set it was found in (those rows were removed)."""

    @property
    def fraction(self) -> float:
        return self.contaminated / self.items if self.items else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "items": self.items,
            "contaminated": self.contaminated,
            "fraction": self.fraction,
            "matched": list(self.matched),
            "matched_listed_all": len(self.matched) == self.contaminated,
        }


@dataclass(frozen=True)
class TokenizerReport:
    """The tokenizer prepared with the shards (``prepared/tokenizer.json``)."""

    source: Literal["trained", "manifest"]
    """``manifest``: the file ``model.tokenizer`` names; ``trained``: trained here."""
    sha256: str
    """Digest of the file written (for ``manifest``, verified equal to the manifest's)."""
    vocab: int
    """Embedding rows its ids need (largest id + 1), at most the model's vocabulary."""

    def to_dict(self) -> dict[str, Any]:
        return {"source": self.source, "sha256": self.sha256, "vocab": self.vocab}


@dataclass(frozen=True)
class PrepReport:
    """The provenance report; :meth:`to_dict` is exactly what ``provenance.json`` holds."""

    manifest_name: str
    near_dedup: NearDedup
    ngram_override: int | None
    """The n forced on every data set by the caller, or ``None`` (each data's own n)."""
    max_contamination: float
    datasets: tuple[DatasetReport, ...]
    evals: tuple[EvalContamination, ...]
    tokenizer: TokenizerReport
    schema: str = field(default=PROVENANCE_SCHEMA)

    @property
    def eval_contaminated_fraction(self) -> float:
        """Contaminated eval items over all eval items (each eval set is also held to the
        policy on its own)."""
        items = sum(e.items for e in self.evals)
        return sum(e.contaminated for e in self.evals) / items if items else 0.0

    def dataset(self, data_id: str) -> DatasetReport:
        return next(d for d in self.datasets if d.id == data_id)

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": self.schema,
            "manifest_name": self.manifest_name,
            "parameters": {
                "normalisation": {
                    "unicode": "NFKC",
                    "whitespace": "collapsed",
                    "strip": True,
                    "fields": "the fields of the data's role; a prompt keeps one trailing "
                    "space, an answer one leading space",
                },
                "rows": "ito.data.rows: text = the role's fields joined, other fields dropped",
                "exact_dedup": {
                    "key": "sha256 of the normalised row's fields as canonical JSON",
                    "scope": "each data set",
                },
                "near_dedup": {**self.near_dedup.to_dict(), "scope": "each training data set"},
                "decontamination": {
                    "method": "ngram",
                    "default_n": DEFAULT_NGRAM,
                    "n_override": self.ngram_override,
                    "tokens": "casefolded word runs; each punctuation mark one token",
                    "short_items": "eval items shorter than n tokens are matched whole",
                    "against": "every eval data set of the manifest",
                },
                "max_contamination": self.max_contamination,
            },
            "datasets": [d.to_dict() for d in self.datasets],
            "evals": [e.to_dict() for e in self.evals],
            "eval_contaminated_fraction": self.eval_contaminated_fraction,
            "tokenizer": self.tokenizer.to_dict(),
        }


# --- preparation ------------------------------------------------------------------------------


@dataclass
class _Loaded:
    ref: DataRef
    rows: list[Row]
    input_format: str
    input_rows: int
    empty_removed: int
    exact_dupes_removed: int
    near_dupes_removed: int = 0
    contaminated_removed: int = 0


@dataclass(frozen=True)
class BookingStorage:
    """The booking's storage as the manifest's ``file://`` URIs name it and as it lies on this
    host: data and tokenizer files are read by walking down from ``root``, one directory at a
    time, never following a link (:mod:`ito.pipeline.storage_fs`)."""

    uri: str
    """The booking's storage URI (``file://…``)."""
    root: Path
    """That root, resolved on this host."""


def prepare_data(
    manifest: Manifest,
    workdir: Path,
    *,
    storage: BookingStorage | None = None,
    ngram: int | None = None,
    near_dedup: NearDedup | None = None,
) -> PrepReport:
    """Prepare every data set of ``manifest`` into ``<workdir>/prepared/`` (see module doc).

    ``ngram`` forces one n-gram size on every data set instead of each data's
    ``decontamination.n`` (13 where it has none). Refuses with ``data_policy_violation`` (reason
    ``license``, ``unreadable``, ``sha256_mismatch`` or ``contamination``), ``data_invalid`` (a
    row that does not fit its role), ``tokenizer_invalid`` (:func:`named_tokenizer`) or
    ``capability_unavailable`` (a URI scheme other than ``file://``; refused at plan already,
    :mod:`ito.core.runtime_support`), having written nothing.

    With ``storage`` (what a worker passes), every file is reached from the booking's root
    without following a link: a file outside it, or behind a link inside it, is
    ``data_policy_violation`` (``tokenizer_invalid``) with reason ``outside_booking_storage`` or
    ``link_in_path``, and is never opened.
    """
    if ngram is not None and ngram < 1:
        raise ValueError("ngram must be ≥ 1")
    settings = near_dedup if near_dedup is not None else NearDedup()
    policy = manifest.data_policy
    for ref in manifest.data:
        if ref.license not in policy.allowed_licenses:
            raise ItoError(
                "data_policy_violation",
                f"data {ref.id!r} has a licence outside the data policy",
                reason="license",
                data_id=ref.id,
                license=ref.license,
            )
    # The named tokenizer first: a wrong one refuses before any data is read or tokenized.
    named = named_tokenizer(manifest, storage)
    loaded = [_load(ref, storage) for ref in manifest.data]

    eval_sets = [d for d in loaded if d.ref.role == "eval"]
    eval_ids = tuple(d.ref.id for d in eval_sets)
    eval_texts = [row.text for d in eval_sets for row in d.rows]
    eval_owner = [d.ref.id for d in eval_sets for _ in d.rows]
    indices: dict[int, EvalIndex] = {}
    contaminated_items: set[int] = set()
    found_in: dict[int, dict[str, int]] = {}
    """Eval item (global position) → training data id → rows it was found in."""
    ngram_of: dict[str, int] = {}

    for data in loaded:
        if data.ref.role == "eval":
            continue
        texts = [row.text for row in data.rows]
        deco = data.ref.decontamination
        n = ngram if ngram is not None else (deco.n if deco is not None else DEFAULT_NGRAM)
        ngram_of[data.ref.id] = n
        index = indices.get(n)
        if index is None:
            index = indices[n] = EvalIndex(eval_texts, n)
        # Decontamination comes before near-deduplication: every near duplicate is measured
        # for the policy, and a clean row is never dropped as the near duplicate of a row that
        # is itself removed.
        hits = [index.matches(text) for text in texts]
        for found in hits:
            contaminated_items |= found
            for item in found:
                where = found_in.setdefault(item, {})
                where[data.ref.id] = where.get(data.ref.id, 0) + 1
        clean = [i for i, found in enumerate(hits) if not found]
        data.contaminated_removed = len(texts) - len(clean)
        near = set(near_duplicates([texts[i] for i in clean], settings))
        data.near_dupes_removed = len(near)
        data.rows = [data.rows[i] for k, i in enumerate(clean) if k not in near]

    first_of = {}
    position = 0
    for d in eval_sets:
        first_of[d.ref.id] = position
        position += len(d.rows)
    evals = tuple(
        EvalContamination(
            id=d.ref.id,
            items=len(d.rows),
            contaminated=sum(1 for i in contaminated_items if eval_owner[i] == d.ref.id),
            matched=tuple(
                {
                    "item": i - first_of[d.ref.id],
                    "item_sha256": hashlib.sha256(eval_texts[i].encode()).hexdigest(),
                    "found_in": dict(sorted(found_in[i].items())),
                }
                for i in sorted(contaminated_items)
                if eval_owner[i] == d.ref.id
            )[:MAX_MATCHES_LISTED],
        )
        for d in eval_sets
    )
    for e in evals:
        if e.fraction > policy.max_contamination:
            raise ItoError(
                "data_policy_violation",
                f"{e.contaminated} of {e.items} items of eval data {e.id!r} were found "
                "in the training data",
                reason="contamination",
                data_id=e.id,
                fraction=e.fraction,
                max_contamination=policy.max_contamination,
            )

    shards = {d.ref.id: rows_to_jsonl(d.rows) for d in loaded}
    tokenizer, tokenizer_report = (
        _trained_tokenizer(manifest, shards) if named is None else _copied(*named)
    )
    report = PrepReport(
        manifest_name=manifest.name,
        near_dedup=settings,
        ngram_override=ngram,
        max_contamination=policy.max_contamination,
        datasets=tuple(
            _dataset_report(d, shards[d.ref.id], ngram_of.get(d.ref.id), eval_ids) for d in loaded
        ),
        evals=evals,
        tokenizer=tokenizer_report,
    )
    _write(workdir, shards, tokenizer, report)
    return report


def named_tokenizer(
    manifest: Manifest, storage: BookingStorage | None = None
) -> tuple[bytes, Tokenizer] | None:
    """The bytes of the tokenizer ``model.tokenizer`` names and the tokenizer they hold
    (``None`` when it names none). Refused with ``tokenizer_invalid`` when they are unreadable
    (``unreadable``, ``not_regular_file``, ``too_large``), not the manifest's sha256
    (``sha256_mismatch``), not a ``tokenizer.json``, or do not fit the model's vocabulary
    (:func:`ito.pipeline.tokenizer.check_tokenizer`); ``capability_unavailable`` for a URI
    scheme other than ``file://``."""
    ref = manifest.model.tokenizer
    if ref is None:
        return None
    raw = _read_local(
        ref.uri, "the tokenizer", "tokenizer_invalid", MAX_TOKENIZER_FILE_BYTES, storage
    )
    digest = hashlib.sha256(raw).hexdigest()
    if digest != ref.sha256:
        raise ItoError(
            "tokenizer_invalid",
            "the bytes of the tokenizer do not match the manifest's sha256",
            reason="sha256_mismatch",
            expected=ref.sha256,
            actual=digest,
        )
    return raw, check_tokenizer(raw, SIZES[manifest.model.size].vocab)


def _copied(raw: bytes, tokenizer: Tokenizer) -> tuple[bytes, TokenizerReport]:
    digest = hashlib.sha256(raw).hexdigest()
    return raw, TokenizerReport(source="manifest", sha256=digest, vocab=vocab_size(tokenizer))


def _trained_tokenizer(
    manifest: Manifest, shards: dict[str, bytes]
) -> tuple[bytes, TokenizerReport]:
    """BPE trained on the training split of the curriculum's data, read back from the shards
    exactly as training reads them, in the curriculum's order."""
    refs = manifest.data_by_id()
    ids = dict.fromkeys(d for stage in manifest.curriculum for d in stage.data)
    texts = (
        text
        for i in ids
        for text in split_heldout(
            [row.text for row in read_rows(shards[i], refs[i].role, data_id=i)], refs[i].role
        )[0]
    )
    raw = tokenizer_bytes(train_tokenizer(texts, SIZES[manifest.model.size].vocab))
    # Read back as training will: the bytes written are the ones whose ids were counted.
    vocab = vocab_size(check_tokenizer(raw, SIZES[manifest.model.size].vocab))
    return raw, TokenizerReport(
        source="trained", sha256=hashlib.sha256(raw).hexdigest(), vocab=vocab
    )


def _dataset_report(
    data: _Loaded, shard: bytes, n: int | None, eval_ids: tuple[str, ...]
) -> DatasetReport:
    ref = data.ref
    is_eval = ref.role == "eval"
    report = DatasetReport(
        id=ref.id,
        role=ref.role,
        uri=ref.uri,
        input_sha256=ref.sha256,
        input_format=data.input_format,
        input_rows=data.input_rows,
        empty_removed=data.empty_removed,
        exact_dupes_removed=data.exact_dupes_removed,
        near_dupes_removed=data.near_dupes_removed,
        contaminated_removed=data.contaminated_removed,
        output_rows=len(data.rows),
        shard=f"{ref.id}.jsonl",
        output_sha256=hashlib.sha256(shard).hexdigest(),
        output_bytes=len(shard),
        ngram=n,
        decontaminated_against=() if is_eval else eval_ids,
        declared_report_sha256=(
            ref.decontamination.report_sha256 if ref.decontamination is not None else None
        ),
    )
    assert report.input_rows == (
        report.empty_removed
        + report.exact_dupes_removed
        + report.near_dupes_removed
        + report.contaminated_removed
        + report.output_rows
    )
    return report


def _load(ref: DataRef, storage: BookingStorage | None) -> _Loaded:
    raw = _read(ref, storage)
    digest = hashlib.sha256(raw).hexdigest()
    if digest != ref.sha256:
        raise ItoError(
            "data_policy_violation",
            f"the bytes of data {ref.id!r} do not match the manifest's sha256",
            reason="sha256_mismatch",
            data_id=ref.id,
            expected=ref.sha256,
            actual=digest,
        )
    rows = read_rows(raw, ref.role, data_id=ref.id)
    normalised = [row.normalised() for row in rows]
    non_empty = [row for row in normalised if not row.is_blank]
    dupes = set(exact_duplicates([row.to_dict() for row in non_empty]))
    return _Loaded(
        ref=ref,
        rows=[r for i, r in enumerate(non_empty) if i not in dupes],
        input_format=data_format(raw),
        input_rows=len(rows),
        empty_removed=len(normalised) - len(non_empty),
        exact_dupes_removed=len(dupes),
    )


def _read(ref: DataRef, storage: BookingStorage | None) -> bytes:
    return _read_local(
        ref.uri,
        f"data {ref.id!r}",
        "data_policy_violation",
        MAX_DATA_FILE_BYTES,
        storage,
        data_id=ref.id,
    )


def _read_local(
    uri: str,
    what: str,
    code: ErrorCode,
    max_bytes: int,
    storage: BookingStorage | None = None,
    **details: Any,
) -> bytes:
    """The bytes of the local file ``uri`` names (``file://`` or, for a tokenizer, an absolute
    path); ``code`` with a ``reason`` when it cannot be read. With ``storage``, reached from
    its root without following a link (:func:`_read_in_storage`)."""
    parts = urlsplit(uri)
    if uri.startswith("/"):
        path = uri
    elif parts.scheme != "file":
        raise ItoError(
            "capability_unavailable",
            f"{what}: only file:// URIs can be read by this runtime",
            reason="uri_scheme",
            scheme=parts.scheme,
            **details,
        )
    else:
        path = unquote(parts.path)
        if parts.netloc not in ("", "localhost") or not os.path.isabs(path):
            raise ItoError(
                code,
                f"{what}: a file URI must name an absolute local path",
                reason="unreadable",
                **details,
            )
    if storage is not None:
        return _read_in_storage(path, storage, what, code, max_bytes, details)
    try:
        # Never a device, FIFO or socket (``/dev/zero`` never ends, a FIFO never answers), and
        # never more than the bound: the whole file is held to be hashed and parsed.
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        with os.fdopen(fd, "rb") as handle:
            info = os.fstat(handle.fileno())
            if not stat.S_ISREG(info.st_mode):
                raise ItoError(
                    code, f"{what} is not a regular file", reason="not_regular_file", **details
                )
            if info.st_size > max_bytes:
                raise _too_large(code, what, max_bytes, details)
            raw = handle.read(max_bytes + 1)
    except OSError as exc:
        raise ItoError(
            code,
            f"{what} cannot be read ({exc.strerror or type(exc).__name__})",
            reason="unreadable",
            **details,
        ) from None
    if len(raw) > max_bytes:  # it grew while being read
        raise _too_large(code, what, max_bytes, details)
    return raw


def _read_in_storage(
    path: str,
    storage: BookingStorage,
    what: str,
    code: ErrorCode,
    max_bytes: int,
    details: dict[str, Any],
) -> bytes:
    """The bytes of ``path``, a file below the booking's storage, read through the proven
    directory that holds it (a regular file, no link on the way, never waited on, bounded)."""
    try:
        parts = storage_parts(path, storage.uri)
    except ItoError:
        raise ItoError(
            code,
            f"{what} is outside the booking's storage",
            reason="outside_booking_storage",
            **details,
        ) from None
    try:
        with proven_dir(StoragePath(storage.root, parts[:-1])) as directory:
            return directory.read_bounded(parts[-1], max_bytes)
    except ItoError:  # a link or a non-directory on the way down
        raise _behind_link(code, what, details) from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # the file itself is a link
            raise _behind_link(code, what, details) from None
        raise _unreadable_in_storage(exc, code, what, max_bytes, details) from None


def _behind_link(code: ErrorCode, what: str, details: dict[str, Any]) -> ItoError:
    return ItoError(
        code,
        f"{what} is reached through a link or a non-directory inside the booking's storage",
        reason="link_in_path",
        **details,
    )


def _unreadable_in_storage(
    exc: OSError, code: ErrorCode, what: str, max_bytes: int, details: dict[str, Any]
) -> ItoError:
    if exc.errno == errno.EFBIG:
        return _too_large(code, what, max_bytes, details)
    if exc.errno == errno.EINVAL:
        return ItoError(code, f"{what} is not a regular file", reason="not_regular_file", **details)
    return ItoError(
        code,
        f"{what} cannot be read ({exc.strerror or type(exc).__name__})",
        reason="unreadable",
        **details,
    )


def _too_large(code: ErrorCode, what: str, max_bytes: int, details: dict[str, Any]) -> ItoError:
    return ItoError(
        code,
        f"{what} is larger than {max_bytes} bytes",
        reason="too_large",
        max_bytes=max_bytes,
        **details,
    )


def _write(workdir: Path, shards: dict[str, bytes], tokenizer: bytes, report: PrepReport) -> None:
    out = prepared_dir(workdir)
    out.mkdir(parents=True, exist_ok=True)
    provenance = out / PROVENANCE_FILE
    provenance.unlink(missing_ok=True)
    for data_id, data in shards.items():
        _atomic_write(shard_path(workdir, data_id), data)
    _atomic_write(out / TOKENIZER_FILE, tokenizer)
    text = json.dumps(report.to_dict(), indent=2, sort_keys=True, ensure_ascii=False) + "\n"
    _atomic_write(provenance, text.encode())
    _fsync_dir(out)


def _atomic_write(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
