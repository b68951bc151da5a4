"""Adversarial maximal valid manifests, within the manifest size bound (256 KiB). Shared by
``tests/core/test_manifest_bounds.py`` and ``bench/manifest_validation.py``.

- :func:`worst_case_manifest`: every bounded list at (or near) its bound, shaped to stress the
  cross-field checks (every training data reference decontaminated against every eval suite);
- :func:`anchor_heavy_manifest`: aimed at the secret scan instead: long data URIs (free text
  after the scheme) that hold every literal anchor of the credential expressions without being
  a credential, so that every expression runs, over text of one repeated letter (each position
  starts a candidate for the expressions whose literal starts with it)."""

from __future__ import annotations

import hashlib
import json
import tempfile
from typing import Any

from ito.core.manifest import (
    MAX_BATTERIES,
    MAX_DATA_REFS,
    MAX_EVALS_PER_BATTERY,
    MAX_IDS_PER_LIST,
    MAX_SUITES,
)
from ito.recipes import build_recipe

__all__ = ["anchor_heavy_manifest", "recipe_manifest", "worst_case_manifest"]


def recipe_manifest(recipe: str = "demo") -> bytes:
    """The bytes ``ito manifest init --recipe <recipe>`` writes."""
    with tempfile.TemporaryDirectory() as directory:
        return json.dumps(build_recipe(recipe, directory).manifest, indent=2).encode() + b"\n"


def worst_case_manifest() -> bytes:
    with tempfile.TemporaryDirectory() as directory:
        doc: dict[str, Any] = json.loads(json.dumps(build_recipe("test", directory).manifest))
    digest = hashlib.sha256(b"x").hexdigest()
    kept = doc["data"]
    original_evals = [d["id"] for d in kept if d["role"] == "eval"]
    evals = [
        {
            "id": f"e{i}",
            "uri": f"file:///d/e{i}",
            "sha256": digest,
            "role": "eval",
            "license": "mit",
        }
        for i in range(MAX_SUITES - len(original_evals))
    ]
    suites = original_evals + [e["id"] for e in evals]
    n_train = MAX_DATA_REFS - len(kept) - len(evals)
    train = [
        {
            "id": f"t{i}",
            "uri": f"file:///d/t{i}",
            "sha256": digest,
            "role": "pretrain",
            "license": "mit",
            "decontamination": {
                "eval_suites": suites,
                "method": "ngram",
                "n": 13,
                "report_sha256": digest,
            },
        }
        for i in range(n_train)
    ]
    doc["data"] = kept + evals + train
    train_ids = [t["id"] for t in train]
    for stage in doc["curriculum"]:
        stage["data"] = (train_ids * 2)[:MAX_IDS_PER_LIST]
    battery = [
        {"eval": "exact_match", "data": suites[i % len(suites)], "min": 0.5}
        for i in range(MAX_EVALS_PER_BATTERY)
    ]
    names = set(doc["eval_batteries"])
    doc["eval_batteries"] |= {f"b{i}": battery for i in range(MAX_BATTERIES - len(names))}
    return json.dumps(doc, separators=(",", ":")).encode()


def anchor_heavy_manifest() -> bytes:
    from ito.core.manifest import MANIFEST_MAX_BYTES
    from ito.core.secret_detectors import _ANCHORS
    from ito.core.secret_scan import _VALUE_PATTERNS, scan_document

    with tempfile.TemporaryDirectory() as directory:
        doc: dict[str, Any] = json.loads(json.dumps(build_recipe("test", directory).manifest))
    anchors = sorted(
        {a for *_, group in _VALUE_PATTERNS for a in group}
        | {a for group in _ANCHORS.values() for a in group}
        | {"basic"}
    )
    # Each anchor alone between spaces; drop the few that make a credential shape followed by
    # the next word.
    words = [a for a in anchors if not scan_document({"u": f"file:///{a} {'a' * 40}"})]
    tail = " ".join(words)
    digest = hashlib.sha256(b"x").hexdigest()
    base = len(json.dumps(doc, separators=(",", ":")))
    # Eval refs only (no decontamination needed): each {"id","uri","sha256","role","license"}.
    overhead = 130
    count = min(
        MAX_DATA_REFS - len(doc["data"]), (MANIFEST_MAX_BYTES - base - 64) // (2048 + overhead)
    )
    fill = 2048 - len("file:///") - len(tail) - 1
    uri = "file:///" + "a" * fill + "/" + tail
    doc["data"] += [
        {"id": f"x{i}", "uri": uri, "sha256": digest, "role": "eval", "license": "mit"}
        for i in range(count)
    ]
    return json.dumps(doc, separators=(",", ":")).encode()
