"""Manifest validation bench: CPU time of ``parse_manifest`` (size bound → JSON → secret scan →
schema → cross-field checks, the work of one ``POST /v1/plans``) on worst-case inputs, as a
ratio to the demo recipe's manifest measured in the same run (DESIGN §9: ratios, never timed
tests).

Inputs:

- ``demo``: the bytes ``ito manifest init --recipe demo`` writes (the baseline);
- ``worst valid``: every bounded list at its bound, every data reference decontaminated against
  every eval suite (the cross-field check that was quadratic), within the size bound (256 KiB);
- ``anchor-heavy valid``: valid, the size bound of long data URIs holding every literal anchor
  of the credential expressions (so every expression runs) over a run of one letter;
- documents of the size bound aimed at the secret scan, refused or not: one long string, many
  short strings, many keys, credential prefixes repeated (``sk-``, ``eyJ``, ``://``, ``a://``
  — the shapes that made regular expressions backtrack), random-looking base64 runs (the
  entropy test), and deep nesting.

Each figure is the median ``time.process_time()`` of ``--reps`` calls in this process, after
one warm-up call. The scan alone (``scan_document`` on the parsed document) is shown beside.

A last table times :func:`scan_text` (the scan of CLI and MCP arguments) on ¼, ½ and all of the size
bound in anchor-heavy text: the ratios show it linear.

Usage: ``.venv/bin/python bench/manifest_validation.py [--reps 5]``; prints a table, then one
JSON line with every figure.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import string
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from ito.core.errors import ItoError
from ito.core.manifest import MANIFEST_MAX_BYTES, parse_manifest
from ito.core.secret_scan import scan_document, scan_text
from tests.core.manifest_worst_case import (
    anchor_heavy_manifest,
    recipe_manifest,
    worst_case_manifest,
)

MIB = MANIFEST_MAX_BYTES - 64  # room for the JSON around the payload


def _one_string(fill: str) -> bytes:
    return json.dumps({"k": (fill * (MIB // len(fill)))[: MIB - 16]}).encode()


def _strings(size: int) -> bytes:
    rng = random.Random(1)
    words = [
        "".join(rng.choice(string.ascii_lowercase) for _ in range(size))
        for _ in range(MIB // (size + 4))
    ]
    return json.dumps({"k": words}).encode()


def _keys() -> bytes:
    return json.dumps({f"k{i}": 0 for i in range(MIB // 14)}).encode()


def _random_runs() -> bytes:
    # Runs that pass every cheap filter of the entropy test (mixed classes, many distinct
    # characters) but stay under the limit: each must be judged in full.
    rng = random.Random(2)
    alphabet = string.ascii_letters + string.digits
    runs = []
    while sum(map(len, runs)) + len(runs) < MIB - 4096:
        head = "".join(rng.sample(alphabet, 23))
        runs.append(head + head[:7])
    return json.dumps({"k": " ".join(runs)}).encode()


def _deep() -> bytes:
    return b"[" * 100_000 + b"]" * 100_000


INPUTS: dict[str, Callable[[], bytes]] = {
    "demo": lambda: recipe_manifest("demo"),
    "worst valid": worst_case_manifest,
    "anchor-heavy valid": anchor_heavy_manifest,
    "1 string of 'a'": lambda: _one_string("a"),
    "'sk-' repeated": lambda: _one_string("sk-"),
    "'eyJ' repeated": lambda: _one_string("eyJ"),
    "'a://' repeated": lambda: _one_string("a://"),
    "'//a' repeated": lambda: _one_string("//a"),
    "8-char strings": lambda: _strings(8),
    "50-char strings": lambda: _strings(50),
    "many keys": _keys,
    "random-looking runs": _random_runs,
    "deep nesting": _deep,
}


def _cpu(call: Callable[[], object], reps: int) -> float:
    call()
    samples = []
    for _ in range(reps):
        start = time.process_time()
        call()
        samples.append(time.process_time() - start)
    return statistics.median(samples)


def _parse(raw: bytes) -> str:
    try:
        parse_manifest(raw)
    except ItoError as exc:
        return exc.code
    return "valid"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()

    rows = []
    baseline = None
    for name, build in INPUTS.items():
        raw = build()
        outcome = _parse(raw)
        parse_s = _cpu(lambda raw=raw: _parse(raw), args.reps)
        try:
            document = json.loads(raw)
        except (RecursionError, ValueError):
            scan_s = None
        else:
            scan_s = _cpu(lambda document=document: scan_document(document), args.reps)
        baseline = baseline or parse_s
        rows.append(
            {
                "input": name,
                "bytes": len(raw),
                "outcome": outcome,
                "parse_ms": round(parse_s * 1000, 2),
                "scan_ms": None if scan_s is None else round(scan_s * 1000, 2),
                "ratio_to_demo": round(parse_s / baseline, 1),
            }
        )

    header = (
        f"{'input':<22} {'bytes':>9} {'outcome':<26} {'parse ms':>9} {'scan ms':>8} {'× demo':>8}"
    )
    print("parse_manifest CPU time (median of --reps), ratio to the demo manifest")
    print(header)
    print("-" * len(header))
    for r in rows:
        scan = "-" if r["scan_ms"] is None else f"{r['scan_ms']:.2f}"
        print(
            f"{r['input']:<22} {r['bytes']:>9,} {r['outcome']:<26} {r['parse_ms']:>9.2f} "
            f"{scan:>8} {r['ratio_to_demo']:>8.1f}"
        )
    worst = max(rows[1:], key=lambda r: r["parse_ms"])
    print(
        f"worst: {worst['input']} at {worst['parse_ms']} ms CPU "
        f"({worst['ratio_to_demo']}× the demo manifest)"
    )

    uri = json.loads(anchor_heavy_manifest())["data"][-1]["uri"]
    linear = []
    for size in (MIB // 4, MIB // 2, MIB):
        text = (uri * (size // len(uri) + 1))[:size]
        linear.append(
            {
                "bytes": size,
                "scan_text_ms": round(_cpu(lambda text=text: scan_text(text), args.reps) * 1000, 2),
            }
        )
    print()
    print("scan_text (CLI/MCP arguments) on anchor-heavy text")
    for row in linear:
        print(
            f"{row['bytes']:>9,} bytes {row['scan_text_ms']:>9.2f} ms "
            f"{row['scan_text_ms'] / linear[0]['scan_text_ms']:>6.2f}× the ¼-bound figure"
        )
    print(json.dumps({"bench": "manifest_validation", "rows": rows, "scan_text": linear}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
