"""The data-preparation provenance report as it crosses processes (DESIGN §7.4).

Data preparation writes ``provenance.json`` beside its shards; the worker uploads those exact
bytes, the server binds their digest to the run (once: a later upload must carry the same
digest) and serves the report to the run's tenant; training refuses a shard whose digest is not
the report's. This module holds what every side shares: the report's model (validated where it
enters), its digest, and the checks the server makes before binding it — that it describes this
run's manifest (the same data ids and input digests, the tokenizer the manifest names or one
trained on the data) and that its contamination is within the manifest's data policy.

The report is a pure function of the input bytes and the preparation parameters (no timings,
no paths of the machine that made it), so a preparation repeated on another worker after a
lost node reproduces the bound bytes exactly.
"""

from __future__ import annotations

import hashlib
import json
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ito.core.errors import ItoError
from ito.core.text import unsafe_json_paths

__all__ = [
    "PROVENANCE_MAX_BYTES",
    "PROVENANCE_SCHEMA",
    "ProvenanceCounts",
    "ProvenanceDataset",
    "ProvenanceEval",
    "ProvenanceReport",
    "ProvenanceTokenizer",
    "contamination_over",
    "parse_provenance",
    "provenance_digest",
    "unbound_data",
    "unbound_tokenizer",
]

PROVENANCE_SCHEMA = "ito.data_prep.provenance.v1"
PROVENANCE_MAX_BYTES = 2 << 20
"""Largest report accepted (its base64 fits well inside the server's request bound)."""

_Hex = Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]
_Count = Annotated[int, Field(ge=0, le=2**53)]
_Id = Annotated[str, Field(min_length=1, max_length=128)]


class _Part(BaseModel):
    # A newer preparation may add fields; every field read here is checked.
    model_config = ConfigDict(extra="allow", frozen=True)


class ProvenanceCounts(_Part):
    input: _Count
    empty_removed: _Count
    exact_dupes_removed: _Count
    near_dupes_removed: _Count
    contaminated_removed: _Count
    output: _Count


class ProvenanceDataset(_Part):
    id: _Id
    role: Annotated[str, Field(min_length=1, max_length=32)]
    uri: Annotated[str, Field(min_length=1, max_length=4096)]
    input_sha256: _Hex
    counts: ProvenanceCounts
    shard: Annotated[str, Field(min_length=1, max_length=256)]
    output_sha256: _Hex
    output_bytes: _Count


class ProvenanceEval(_Part):
    id: _Id
    items: _Count
    contaminated: _Count
    fraction: Annotated[float, Field(ge=0, le=1, allow_inf_nan=False)]


class ProvenanceTokenizer(_Part):
    source: Literal["trained", "manifest"]
    """``manifest``: the file ``model.tokenizer`` names; ``trained``: BPE trained on the run's
    training data."""
    sha256: _Hex
    """Digest of the tokenizer file written beside the shards (the one training reads)."""
    vocab: Annotated[int, Field(ge=1, le=2**24)]
    """Embedding rows its ids need (largest id + 1)."""


class ProvenanceReport(_Part):
    """What ``provenance.json`` holds (written by :mod:`ito.pipeline.data_prep`)."""

    schema_: Literal["ito.data_prep.provenance.v1"] = Field(alias="schema")
    manifest_name: Annotated[str, Field(max_length=256)]
    parameters: dict[str, Any]
    datasets: Annotated[list[ProvenanceDataset], Field(max_length=1024)]
    evals: Annotated[list[ProvenanceEval], Field(max_length=1024)]
    eval_contaminated_fraction: Annotated[float, Field(ge=0, le=1, allow_inf_nan=False)]
    tokenizer: ProvenanceTokenizer | None = None
    """The tokenizer prepared with the shards (absent from a report of an earlier version)."""

    def shard_digests(self) -> dict[str, str]:
        """Data id → the hex sha256 of its prepared shard."""
        return {d.id: d.output_sha256 for d in self.datasets}


MAX_DEPTH = 16
"""The deepest nesting a report may have (a real one is 4 levels deep)."""


def json_depth(value: object) -> int:
    """How deeply ``value`` (parsed JSON) nests lists and objects, without recursion."""
    deepest = 0
    stack: list[tuple[object, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        deepest = max(deepest, depth)
        if isinstance(item, dict):
            stack.extend((child, depth + 1) for child in item.values())
        elif isinstance(item, list):
            stack.extend((child, depth + 1) for child in item)
    return deepest


def provenance_digest(raw: bytes) -> str:
    return "sha256:" + hashlib.sha256(raw).hexdigest()


def parse_provenance(raw: bytes) -> ProvenanceReport:
    """The report in ``raw``, or ``invalid_arguments`` naming what is wrong (never its text)."""
    if len(raw) > PROVENANCE_MAX_BYTES:
        raise ItoError("request_too_large", max_bytes=PROVENANCE_MAX_BYTES)
    try:
        document = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise ItoError("invalid_arguments", "the provenance report is not UTF-8 JSON") from None
    if json_depth(document) > MAX_DEPTH:
        raise ItoError(
            "invalid_arguments", f"the provenance report nests deeper than {MAX_DEPTH} levels"
        )
    # It arrived base64-encoded, past the request's text guard: the same rule applies to
    # every string in it before it is stored (and shown on the run's page).
    unsafe = unsafe_json_paths(document)
    if unsafe:
        raise ItoError(
            "invalid_arguments",
            "the provenance report carries a control, bidirectional override or other refused "
            "character",
            location="body",
            paths=unsafe,
        )
    try:
        report = ProvenanceReport.model_validate(document)
    except ValidationError as exc:
        where = ".".join(str(p) for p in exc.errors()[0]["loc"]) or "$"
        raise ItoError(
            "invalid_arguments", f"the provenance report is malformed at {where}"
        ) from None
    ids = [d.id for d in report.datasets]
    if len(set(ids)) != len(ids):
        raise ItoError("invalid_arguments", "the provenance report names a data set twice")
    for data in report.datasets:
        c = data.counts
        removed = c.empty_removed + c.exact_dupes_removed + c.near_dupes_removed
        if c.input != removed + c.contaminated_removed + c.output:
            raise ItoError(
                "invalid_arguments",
                f"the provenance report's counts of {data.id!r} do not add up",
            )
    return report


def unbound_data(report: ProvenanceReport, data: dict[str, str]) -> list[str]:
    """Data ids where the report and the manifest (id → input hex sha256) disagree: a data set
    missing on either side, or prepared from other bytes than the manifest names."""
    seen = {d.id: d.input_sha256 for d in report.datasets}
    ids = sorted(set(seen) | set(data))
    return [i for i in ids if seen.get(i) != data.get(i)]


def unbound_tokenizer(report: ProvenanceReport, named_sha256: str | None) -> bool:
    """Whether the report's tokenizer is not the one the manifest asks for: the file
    ``model.tokenizer`` names (its hex sha256 ``named_sha256``), or one trained on the run's data
    when it names none. A report without a tokenizer (of an earlier preparation) fits only a
    manifest that names none."""
    listed = report.tokenizer
    if named_sha256 is None:
        return listed is not None and listed.source != "trained"
    return listed is None or listed.source != "manifest" or listed.sha256 != named_sha256


def contamination_over(report: ProvenanceReport, limit: float) -> list[str]:
    """Eval ids whose contaminated fraction exceeds ``limit`` (the manifest's
    ``data_policy.max_contamination``), recomputed from the counts, not trusted from the
    report's own fraction."""
    return [e.id for e in report.evals if e.items and e.contaminated / e.items > limit + 1e-12]
