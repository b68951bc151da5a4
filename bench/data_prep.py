"""Data-prep bench: documents/s of this project's data preparation ÷ datatrove's MinHash
deduplication + n-gram decontamination on the same synthetic corpus, and how well each finds
what was planted.

The corpus (``bench/_data_prep_corpus.py``, ``--docs`` documents, default 20,000 of 400–600
words): near-duplicate clusters (an original and one or two copies at a Jaccard similarity of
3-word shingles within [0.85, 0.95], 10 % of the documents are copies), documents holding a
window of ≥ 13 words of an eval passage (1 %), near misses holding exactly 12 (1 %), and an eval
set of passages. Every word is lowercase ASCII letters and words are separated by single spaces,
so the project's tokenisation (whitespace words for near dedup, word runs and punctuation marks
for decontamination) and datatrove's — configured with a whitespace word tokenizer and text
simplification reduced to lowercasing and whitespace — see the same words.

- **ours**: ``ito.pipeline.data_prep.prepare_data`` on a manifest with the corpus as one
  ``pretrain`` data set and the passages as an ``eval`` data set: read and verify the sha256,
  parse the rows, normalise (NFKC, whitespace), exact dedup, 13-gram decontamination, MinHash
  near dedup (``NearDedup(threshold=--threshold)``: 128 permutations, 3-word shingles, bands
  from ``lsh_bands``, every candidate checked against the exact Jaccard), write the shard and the
  provenance report.
- **datatrove** (``bench/_data_prep_datatrove.py``, run with the python of a separate virtualenv
  holding ``datatrove``, ``--datatrove-python``): the decontamination index of the passages'
  13-grams, ``MinhashDedupSignature`` → ``MinhashDedupBuckets`` → ``MinhashDedupCluster`` →
  ``MinhashDedupFilter`` and ``NGramsDecontFilter`` → ``JsonlWriter``, with 3-word shingles and
  the same bands × rows as ours (its own hashing: xxhash64 and its 61-bit permutations; no exact
  check — a shared bucket is a duplicate).

Each side runs in a fresh process of its own, one process and one thread at a time (datatrove's
``LocalPipelineExecutor(workers=1)``); its clock covers the work only, not interpreter start or
imports. docs/s = input documents ÷ that wall time. Each round runs the two back to back, the
order flipping each round; the headline ratio is the median over rounds of each round's ratio
(the machine is shared and noisy: its load average is printed). CPU-seconds of each process are
printed beside the wall times.

What was found is scored against the planted truth, for both sides the same way: near-duplicate
**recall** = Σ over clusters of min(removed members, size − 1) ÷ Σ (size − 1) (either side may
keep any one member); **false positives** = documents removed as near duplicates outside any
cluster, plus members removed beyond size − 1; decontamination recall over the contaminated
documents, its false positives (near misses included). Goals: ratio ≥ 1.5; recall ≥ 0.99 and
0 false positives on the planted near duplicates.

It prints tables and, last, one JSON line. ``--ours-only`` skips datatrove (no ratio). Without
datatrove's python the bench says so and exits with status 2.

Usage: ``.venv/bin/python bench/data_prep.py [--docs 20000] [--repeats 3]
[--datatrove-python /work/bench-venv/bin/python] [--ours-only]``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
DATATROVE_PYTHON_ENV = "ITO_BENCH_DATATROVE_PYTHON"
DEFAULT_DATATROVE_PYTHON = "/work/bench-venv/bin/python"
GOAL_RATIO = 1.5
GOAL_RECALL = 0.99
NGRAM = 13
SIDE_TIMEOUT_S = 1800.0


# ---------------------------------------------------------------------------------------------
# Our side (runs in its own process: ``--role ours``)


def manifest_for(corpus: Path) -> dict[str, Any]:
    """The test recipe's manifest reduced to one ``pretrain`` data set (the corpus) and one
    ``eval`` data set (the passages), contamination allowed (the bench plants it)."""
    from ito.recipes import build_recipe

    doc = json.loads(json.dumps(build_recipe("test", str(corpus)).manifest))
    web = next(d for d in doc["data"] if d["role"] == "pretrain")
    heldout = next(d for d in doc["data"] if d["role"] == "eval")
    for ref, name in ((web, "train.jsonl"), (heldout, "eval.jsonl")):
        path = corpus / name
        ref["uri"] = path.as_uri()
        ref["sha256"] = hashlib.sha256(path.read_bytes()).hexdigest()
    web["decontamination"]["n"] = NGRAM
    doc["data"] = [web, heldout]
    doc["curriculum"] = [s for s in doc["curriculum"] if s["data"] == [web["id"]]][:1]
    doc["post_training"] = {}
    doc["eval_batteries"] = {
        name: [e for e in battery if e["data"] == web["id"]]
        for name, battery in doc["eval_batteries"].items()
        if name == doc["curriculum"][0]["battery"]
    }
    doc["data_policy"]["max_contamination"] = 1.0
    return doc


def ours_worker(config_path: Path) -> None:
    from ito.core.manifest import parse_manifest
    from ito.data.decontam import EvalIndex
    from ito.pipeline.data_prep import prepare_data, shard_path
    from ito.pipeline.dedup import NearDedup

    config = json.loads(config_path.read_text(encoding="utf-8"))
    corpus = Path(config["corpus"])
    workdir = Path(config["scratch"])
    manifest = parse_manifest(json.dumps(manifest_for(corpus)).encode())
    settings = NearDedup(threshold=config["threshold"])

    cpu_start = time.process_time()
    start = time.perf_counter()
    report = prepare_data(manifest, workdir, near_dedup=settings)
    seconds = time.perf_counter() - start
    cpu_seconds = time.process_time() - cpu_start

    # Which documents went, and why (outside the clock): the shard holds the kept texts; a
    # removed one is contaminated when it overlaps an eval passage, else a near duplicate (the
    # corpus has no empty rows and no exact duplicates; the report's counts are checked).
    data_id = next(d.id for d in manifest.data if d.role == "pretrain")
    kept = {
        json.loads(line)["text"]
        for line in shard_path(workdir, data_id).read_text(encoding="utf-8").splitlines()
    }
    passages = [
        json.loads(line)["text"]
        for line in (corpus / "eval.jsonl").read_text(encoding="utf-8").splitlines()
    ]
    index = EvalIndex(passages, NGRAM)
    removed_near, removed_decont = [], []
    docs = 0
    for line in (corpus / "train.jsonl").read_text(encoding="utf-8").splitlines():
        row = json.loads(line)
        docs += 1
        if row["text"] in kept:
            continue
        (removed_decont if index.matches(row["text"]) else removed_near).append(row["id"])
    counts = report.dataset(data_id)
    if (counts.contaminated_removed, counts.near_dupes_removed) != (
        len(removed_decont),
        len(removed_near),
    ):
        raise RuntimeError(f"removals do not add up with the report's counts: {counts}")
    result = {
        "seconds": seconds,
        "process_cpu_seconds": cpu_seconds,
        "docs": docs,
        "kept": counts.output_rows,
        "removed_minhash": removed_near,
        "removed_decont": removed_decont,
        "near_dedup": settings.to_dict(),
    }
    Path(config["out"]).write_text(json.dumps(result), encoding="utf-8")


# ---------------------------------------------------------------------------------------------
# Scoring


def score(result: dict[str, Any], truth: dict[str, Any]) -> dict[str, Any]:
    """Recall and false positives of one side's removals against the planted truth."""
    near = set(result["removed_minhash"])
    decont = set(result["removed_decont"])
    members = {m for c in truth["clusters"] for m in c["members"]}
    expected = sum(c["size"] - 1 for c in truth["clusters"])
    found = over = 0
    for cluster in truth["clusters"]:
        removed = sum(1 for m in cluster["members"] if m in near)
        found += min(removed, cluster["size"] - 1)
        over += max(0, removed - (cluster["size"] - 1))
    kinds = truth["docs"]
    contaminated = {d for d, x in kinds.items() if x["kind"] == "contaminated"}
    near_misses = {d for d, x in kinds.items() if x["kind"] == "near_miss"}
    return {
        "near_dup_recall": found / expected if expected else None,
        "near_dup_false_positives": len(near - members) + over,
        "near_dup_removed": len(near),
        "near_dup_expected": expected,
        "decont_recall": len(decont & contaminated) / len(contaminated) if contaminated else None,
        "decont_false_positives": len(decont - contaminated),
        "decont_near_misses_flagged": len(decont & near_misses),
        "decont_removed": len(decont),
        "kept": result["kept"],
    }


# ---------------------------------------------------------------------------------------------
# The driver


def run_side(
    kind: str,
    python: str,
    corpus: Path,
    scratch: Path,
    threshold: float,
    procs: Any,
    env: dict[str, str],
) -> dict[str, Any]:
    """One timed run of one side in a fresh process; returns its figures."""
    from ito.pipeline.dedup import lsh_bands

    scratch.mkdir(parents=True)
    bands, rows = lsh_bands(threshold, 128)
    config = {
        "corpus": str(corpus),
        "scratch": str(scratch / "work"),
        "out": str(scratch / "result.json"),
        "threshold": threshold,
        "shingle_words": 3,
        "bands": bands,
        "rows": rows,
        "seed": 1,
        "ngram": NGRAM,
    }
    (scratch / "config.json").write_text(json.dumps(config), encoding="utf-8")
    script = BENCH / ("data_prep.py" if kind == "ours" else "_data_prep_datatrove.py")
    argv = [python, str(script)]
    argv += ["--role", "ours", "--config"] if kind == "ours" else []
    argv.append(str(scratch / "config.json"))
    with (scratch / "log.txt").open("wb") as log:
        proc = procs.start(argv, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=scratch)
        try:
            rc = proc.wait(timeout=SIDE_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            procs.kill_tree(proc)
            raise RuntimeError(f"{kind} ran past {SIDE_TIMEOUT_S:.0f} s") from None
    if rc != 0:
        tail = (scratch / "log.txt").read_text(errors="replace")[-3000:]
        raise RuntimeError(f"{kind} exited with {rc}:\n{tail}")
    result: dict[str, Any] = json.loads((scratch / "result.json").read_text(encoding="utf-8"))
    shutil.rmtree(scratch / "work", ignore_errors=True)
    result["docs_per_s"] = result["docs"] / result["seconds"]
    result["docs_per_cpu_s"] = result["docs"] / result["process_cpu_seconds"]
    return result


def datatrove_version(python: str) -> str | None:
    done = subprocess.run(
        [python, "-c", "import datatrove, importlib.metadata as m; print(m.version('datatrove'))"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    return done.stdout.strip() if done.returncode == 0 else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--role", choices=["driver", "ours"], default="driver", help=argparse.SUPPRESS
    )
    parser.add_argument("--config", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--docs", type=int, default=20_000, help="documents in the corpus")
    parser.add_argument("--repeats", type=int, default=3, help="rounds of ours + datatrove")
    parser.add_argument(
        "--threshold",
        type=float,
        default=0.8,
        help="near-dedup Jaccard threshold, below the planted copies' 0.85–0.95 (both sides "
        "get the bands lsh_bands chooses for it)",
    )
    parser.add_argument(
        "--datatrove-python",
        default=os.environ.get(DATATROVE_PYTHON_ENV, DEFAULT_DATATROVE_PYTHON),
        help=f"python of a virtualenv with datatrove installed (default: ${DATATROVE_PYTHON_ENV} "
        f"or {DEFAULT_DATATROVE_PYTHON})",
    )
    parser.add_argument(
        "--ours-only", action="store_true", help="run the project's side only (no ratio)"
    )
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory")
    args = parser.parse_args(argv)
    if args.role == "ours":
        ours_worker(args.config)
        return 0

    datatrove_python = None if args.ours_only else args.datatrove_python
    version = None
    if datatrove_python is not None:
        if not Path(datatrove_python).exists():
            print(
                f"datatrove's python {datatrove_python} does not exist: install datatrove in a "
                "virtualenv of its own (python3 -m venv /work/bench-venv && /work/bench-venv/bin/"
                "pip install datatrove==0.10.1 regex tokenizers orjson 'xxhash<4') and pass "
                f"--datatrove-python (or ${DATATROVE_PYTHON_ENV}), or run with --ours-only",
                file=sys.stderr,
            )
            return 2
        version = datatrove_version(datatrove_python)
        if version is None:
            print(f"{datatrove_python} cannot import datatrove", file=sys.stderr)
            return 2

    from _common import Processes, child_env, exit_on_sigterm, median, rnd, table
    from _data_prep_corpus import JACCARD_HIGH, JACCARD_LOW, CorpusShape, make_corpus
    from ito.pipeline.dedup import NearDedup, lsh_bands

    exit_on_sigterm()
    tmp = Path(tempfile.mkdtemp(prefix="ito-bench-data-prep-"))
    procs = Processes(str(tmp))
    try:
        corpus = tmp / "corpus"
        shape = CorpusShape.scaled(args.docs)
        truth = make_corpus(corpus, shape)
        counts = truth["counts"]
        bands, rows = lsh_bands(args.threshold, NearDedup().num_perm)
        print(
            f"corpus: {counts['docs']:,} documents, {counts['words']:,} words "
            f"({(corpus / 'train.jsonl').stat().st_size / 1e6:.1f} MB); {counts['copies']:,} "
            f"near-duplicate copies in {counts['clusters']:,} clusters (Jaccard to their original "
            f"{truth['copy_jaccard']['min']:.3f}–{truth['copy_jaccard']['max']:.3f}, planted "
            f"within {JACCARD_LOW}–{JACCARD_HIGH}); {counts['contaminated']} documents with ≥ "
            f"{NGRAM} words of one of {counts['eval_items']} eval passages, "
            f"{counts['near_misses']} with exactly {NGRAM - 1}",
            flush=True,
        )
        print(
            f"near dedup: 3-word shingles, threshold {args.threshold}, {bands} bands × {rows} "
            f"rows for both; decontamination: {NGRAM}-grams; "
            + (f"datatrove {version} ({datatrove_python})" if version else "ours only"),
            flush=True,
        )
        env = child_env()
        env["PYTHONPATH"] = os.pathsep.join(
            [str(ROOT / "src"), *filter(None, [env.get("PYTHONPATH")])]
        )
        kinds = ["ours"] if datatrove_python is None else ["ours", "datatrove"]
        load_start = os.getloadavg()
        results: list[dict[str, Any]] = []
        for r in range(args.repeats):
            order = kinds if r % 2 == 0 else list(reversed(kinds))
            for kind in order:
                python = sys.executable if kind == "ours" else datatrove_python
                assert python is not None
                res = run_side(
                    kind, python, corpus, tmp / f"round{r}-{kind}", args.threshold, procs, env
                )
                res |= {"kind": kind, "round": r, "score": score(res, truth)}
                results.append(res)
                print(
                    f"  round {r} {kind:9s}: {res['seconds']:6.2f} s, "
                    f"{res['docs_per_s']:8,.0f} docs/s ({res['process_cpu_seconds']:.2f} "
                    "CPU-s)",
                    flush=True,
                )

        def med(kind: str, key: str) -> float | None:
            return median([x[key] for x in results if x["kind"] == kind])

        sides = {
            kind: {k: med(kind, k) for k in ("seconds", "docs_per_s", "docs_per_cpu_s")}
            for kind in kinds
        }
        scores = {kind: next(x["score"] for x in results if x["kind"] == kind) for kind in kinds}
        stable = all(x["score"] == scores[x["kind"]] for x in results)
        print()
        headers = ["figure", *kinds]
        rows_out: list[list[Any]] = [
            ["wall seconds (median)", *[sides[k]["seconds"] for k in kinds]],
            ["docs/s (median)", *[sides[k]["docs_per_s"] for k in kinds]],
            ["docs per CPU-second (median)", *[sides[k]["docs_per_cpu_s"] for k in kinds]],
            ["near-dup recall", *[scores[k]["near_dup_recall"] for k in kinds]],
            ["near-dup false positives", *[scores[k]["near_dup_false_positives"] for k in kinds]],
            ["near dups removed / expected"]
            + [
                f"{scores[k]['near_dup_removed']} / {scores[k]['near_dup_expected']}" for k in kinds
            ],
            ["decontamination recall", *[scores[k]["decont_recall"] for k in kinds]],
            [
                "decontamination false positives",
                *[scores[k]["decont_false_positives"] for k in kinds],
            ],
            ["near misses flagged", *[scores[k]["decont_near_misses_flagged"] for k in kinds]],
            ["documents kept", *[scores[k]["kept"] for k in kinds]],
        ]
        print(table(f"data prep on {counts['docs']:,} documents", headers, rows_out))
        ratio = ratio_cpu = None
        paired: list[dict[str, Any]] = []
        if "datatrove" in kinds:
            for r in range(args.repeats):
                o = next(x for x in results if x["kind"] == "ours" and x["round"] == r)
                d = next(x for x in results if x["kind"] == "datatrove" and x["round"] == r)
                paired.append(
                    {
                        "round": r,
                        "first": "ours" if r % 2 == 0 else "datatrove",
                        "docs_per_s": o["docs_per_s"] / d["docs_per_s"],
                        "docs_per_cpu_s": o["docs_per_cpu_s"] / d["docs_per_cpu_s"],
                    }
                )
            print()
            print(
                table(
                    "ours ÷ datatrove per round (back-to-back pair)",
                    ["round", "first", "docs/s", "docs per CPU-second"],
                    [
                        [p["round"], p["first"], p["docs_per_s"], p["docs_per_cpu_s"]]
                        for p in paired
                    ],
                )
            )
            ratio = median([p["docs_per_s"] for p in paired])
            ratio_cpu = median([p["docs_per_cpu_s"] for p in paired])
        load = os.getloadavg()
        print(
            f"load average at the end {load[0]:.2f} / {load[1]:.2f} / {load[2]:.2f} on "
            f"{os.cpu_count()} CPUs (at the start {load_start[0]:.2f})"
            + ("" if stable else "; WARNING: what was found differed between rounds")
        )
        ours = scores["ours"]
        goals = {
            "ours_near_dup_recall": ours["near_dup_recall"] is not None
            and ours["near_dup_recall"] >= GOAL_RECALL,
            "ours_near_dup_false_positives": ours["near_dup_false_positives"] == 0,
        }
        if ratio is not None:
            goals["ratio"] = ratio >= GOAL_RATIO
            print(
                f"ratio ours ÷ datatrove (docs/s, median of the rounds' pairs) {ratio:.3f} — "
                f"goal ≥ {GOAL_RATIO} {'met' if goals['ratio'] else 'NOT met'}; per CPU-second "
                f"{ratio_cpu:.3f}"
            )
        print(
            f"ours: near-dup recall {ours['near_dup_recall']:.4f} (goal ≥ {GOAL_RECALL}), "
            f"{ours['near_dup_false_positives']} false positives (goal 0)"
            + (
                f"; datatrove: recall {scores['datatrove']['near_dup_recall']:.4f}, "
                f"{scores['datatrove']['near_dup_false_positives']} false positives"
                if "datatrove" in scores
                else ""
            )
        )
        print(
            json.dumps(
                {
                    "bench": "data_prep",
                    "docs": counts["docs"],
                    "words": counts["words"],
                    "repeats": args.repeats,
                    "threshold": args.threshold,
                    "bands": [bands, rows],
                    "ngram": NGRAM,
                    "datatrove_version": version,
                    "ratio_docs_per_s": rnd(ratio),
                    "ratio_docs_per_cpu_s": rnd(ratio_cpu),
                    "goal_ratio": GOAL_RATIO,
                    "goals_met": goals,
                    "sides": {k: {n: rnd(v, 3) for n, v in s.items()} for k, s in sides.items()},
                    "scores": scores,
                    "found_same_every_round": stable,
                    "per_round_ratios": [
                        {k: rnd(v) if isinstance(v, float) else v for k, v in p.items()}
                        for p in paired
                    ],
                    "rounds": [
                        {
                            "kind": x["kind"],
                            "round": x["round"],
                            "seconds": rnd(x["seconds"], 3),
                            "process_cpu_seconds": rnd(x["process_cpu_seconds"], 3),
                            "docs_per_s": rnd(x["docs_per_s"], 1),
                        }
                        for x in results
                    ],
                    "loadavg_start": [round(x, 2) for x in load_start],
                    "loadavg_end": [round(x, 2) for x in load],
                    "corpus": counts,
                }
            )
        )
        return 0
    finally:
        procs.kill_all()
        if args.keep:
            print(f"kept {tmp}", file=sys.stderr)
        else:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
