"""The initial weights a manifest names (``model.revision``, DESIGN §7.6): parsed, and the pure
checks the server and the engine share.

Three forms:

- ``scratch``: the seeded random initialisation.
- ``run:<run_id>@<step>``: the committed checkpoint at global ``step`` of an earlier run of the
  same account. The server resolves it at plan, confirm and create from what the run's worker
  reported (its checkpoint events) and records it on the new run (:class:`InitialWeights`); the
  engine loads the model part of that DCP directory only (fresh optimizer, step 0).
- ``hf:<absolute path>@sha256:<64 hex>``: a local Hugging Face directory (``config.json`` and
  ``model.safetensors``, as :mod:`ito.pipeline.export` writes one) whose ``model.safetensors``
  has that sha256, inside the booking's storage (what its worker can read; the server reads
  nothing outside it, so a manifest cannot probe the server's files). The engine verifies the
  digest and the architecture before step 0 whatever the server could check.

The digest of a ``run:`` checkpoint (:func:`checkpoint_digest`) is the sha256 of its DCP
``.metadata`` followed by its ``COMMIT`` document: both small, written once, and together they
name exactly one committed save (its step, stage, byte count and the shards' layout). The engine
reports it with the checkpoint; the new run carries it; the engine recomputes it before loading.

Every refusal is ``revision_unresolvable`` at ``$.model.revision``, with a ``reason`` word
(another account's run reads exactly as a missing one). Pure: no I/O.
"""

from __future__ import annotations

import hashlib
import posixpath
import re
from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import quote, unquote, urlsplit

from ito.core.errors import ItoError
from ito.core.model_sizes import ModelSize
from ito.core.storage import contained_storage_uri

__all__ = [
    "REVISION_PATH",
    "REVISION_PATTERN",
    "HfRevision",
    "InitialWeights",
    "RunRevision",
    "architecture_mismatch",
    "checkpoint_digest",
    "parse_revision",
    "storage_parts",
    "unresolvable",
]

REVISION_PATH = "$.model.revision"
REVISION_PATTERN = (
    r"^(scratch|run:[A-Za-z0-9_]{1,64}@[0-9]{1,10}|hf:/[\x21-\x7e]{0,2000}@sha256:[0-9a-f]{64})$"
)
"""The shapes the manifest schema admits (:func:`parse_revision` checks the rest)."""

_RUN = re.compile(r"run:(?P<run_id>[A-Za-z0-9_]{1,64})@(?P<step>[0-9]{1,10})")
_HF = re.compile(r"hf:(?P<path>/[\x21-\x7e]*)@sha256:(?P<sha256>[0-9a-f]{64})")
_STEP_MAX = 2**31 - 1


@dataclass(frozen=True)
class RunRevision:
    run_id: str
    step: int


@dataclass(frozen=True)
class HfRevision:
    path: str
    """Absolute, normalised directory on the training node."""
    sha256: str
    """Of its ``model.safetensors``."""


Reason = Literal[
    "malformed",
    "run_not_found",
    "checkpoint_not_committed",
    "checkpoint_deleted",
    "digest_unknown",
    "digest_mismatch",
    "architecture_mismatch",
    "tokenizer_mismatch",
    "outside_booking_storage",
    "weights_unreadable",
]


def unresolvable(reason: Reason, message: str) -> ItoError:
    """The one refusal of this module, at the manifest's ``model.revision``."""
    return ItoError(
        "revision_unresolvable",
        message,
        path=REVISION_PATH,
        reason=reason,
        errors=[{"path": REVISION_PATH, "reason": reason}],
    )


def parse_revision(revision: str) -> RunRevision | HfRevision | None:
    """``None`` for ``scratch``; the named source otherwise, or ``revision_unresolvable``
    (``malformed``) for a path that is not absolute and normalised, or a step out of range."""
    if revision == "scratch":
        return None
    match = _RUN.fullmatch(revision)
    if match is not None:
        step = int(match["step"])
        if step > _STEP_MAX:
            raise unresolvable("malformed", "the revision's step is out of range")
        return RunRevision(match["run_id"], step)
    match = _HF.fullmatch(revision)
    if match is not None:
        path = match["path"]
        if posixpath.normpath(path) != path or path == "/":
            raise unresolvable("malformed", "the directory must be an absolute, normalised path")
        return HfRevision(path, match["sha256"])
    raise unresolvable("malformed", "the revision is scratch, run:<id>@<step> or hf:<dir>@sha256:")


def storage_parts(path: str, storage_uri: str | None) -> tuple[str, ...]:
    """The names from the booking's storage root (a ``file://`` URI) down to the absolute
    ``path``, or ``revision_unresolvable`` (``outside_booking_storage``) when ``path`` is not
    strictly inside it. Decided on the decoded segments as :mod:`ito.core.storage` decides the
    run's own checkpoint storage."""
    if storage_uri:
        try:
            contained_storage_uri("file://" + quote(path, safe="/"), storage_uri)
            root = unquote(urlsplit(storage_uri).path).rstrip("/").split("/")
            names = path.split("/")
            if len(names) > len(root) and names[: len(root)] == root:
                return tuple(names[len(root) :])
        except ItoError:
            pass
    raise unresolvable(
        "outside_booking_storage", "the initial weights are outside the booking's storage"
    )


def checkpoint_digest(metadata: bytes, commit: bytes) -> str:
    """The digest naming one committed checkpoint: sha256 of its ``.metadata`` and ``COMMIT``."""
    h = hashlib.sha256()
    h.update(len(metadata).to_bytes(8, "big"))
    h.update(metadata)
    h.update(commit)
    return h.hexdigest()


def architecture_mismatch(config: dict[str, Any], size: ModelSize) -> str | None:
    """What differs between a Hugging Face ``config.json`` and the manifest's size (``None``:
    the same Llama architecture)."""
    if "LlamaForCausalLM" not in (config.get("architectures") or ["LlamaForCausalLM"]):
        return "architectures"
    if config.get("model_type", "llama") != "llama":
        return "model_type"
    expected = {
        "vocab_size": size.vocab,
        "hidden_size": size.hidden,
        "intermediate_size": size.ffn,
        "num_hidden_layers": size.layers,
        "num_attention_heads": size.heads,
        "num_key_value_heads": size.kv_heads,
    }
    for key, value in expected.items():
        if config.get(key) != value:
            return key
    if config.get("tie_word_embeddings", False):
        return "tie_word_embeddings"
    return None


@dataclass(frozen=True)
class InitialWeights:
    """A resolved revision, as the server records it on the new run (in its stored estimate)
    and the worker turns into the engine's spec."""

    kind: Literal["run", "hf"]
    sha256: str
    """``run``: :func:`checkpoint_digest`; ``hf``: of ``model.safetensors``."""
    revision: str
    """The manifest's ``model.revision``."""
    run_id: str | None = None
    """``run``: the source run."""
    stage: str | None = None
    """``run``: the checkpoint's stage directory."""
    step: int | None = None
    """``run``: the checkpoint's global step."""
    checkpoint_uri: str | None = None
    """``run``: the source run's checkpoint storage (a URI inside the booking's storage)."""
    path: str | None = None
    """``hf``: the directory."""
    verified_by_engine: str | None = None
    """What only the engine verifies, before step 0 (``hf``: the weights' digest, as it reads
    them); the plan and approval page say so."""

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if v is not None}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> InitialWeights:
        return cls(**data)
