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

A live section (skipped with ``--no-live``) measures the whole request instead: a real
``ito-server`` on SQLite (loopback, no worker) answers ``POST /v1/plans`` for the demo, worst valid
and anchor-heavy manifests — each of ``--live-reps`` requests a distinct document (its ``name``
changed, so the server's per-process parse cache never answers), server CPU read from ``/proc``
over the whole batch and divided by its count (``/proc`` counts in 10 ms ticks: one request
alone is below its resolution). Then another tenant's booking read: its latency alone, and while
twelve worst-valid plans arrive at once (the hostile review's scenario).

A last table times :func:`scan_text` (the scan of CLI and MCP arguments) on ¼, ½ and all of the size
bound in anchor-heavy text: the ratios show it linear.

Usage: ``.venv/bin/python bench/manifest_validation.py [--reps 5]``; prints a table, then one
JSON line with every figure.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import random
import statistics
import string
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

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


def _distinct(raw: bytes, count: int, tag: str) -> list[bytes]:
    document = json.loads(raw)
    bodies = []
    for i in range(count):
        document["name"] = f"{tag}-{i}"
        bodies.append(json.dumps(document, separators=(",", ":")).encode())
    return bodies


def _live(reps: int) -> dict[str, Any]:
    """The whole ``POST /v1/plans`` on a live server (see the module docstring)."""
    import httpx

    from tests.support import make_tenant, start_server, stop_server

    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp) / "home"
        home.mkdir(mode=0o700)
        server = start_server(f"sqlite:///{home / 'ito.db'}", home)
        try:
            planner = make_tenant(server, Path(tmp) / "a", "planner")
            reader = make_tenant(server, Path(tmp) / "b", "reader")
            pid = server.process.pid

            def plan(client: httpx.Client, body: bytes) -> None:
                response = client.post(
                    f"{server.url}/v1/plans",
                    content=body,
                    params={"booking_id": planner.booking_id},
                    headers={
                        "authorization": f"Bearer {planner.requester_key}",
                        "content-type": "application/json",
                    },
                    timeout=120,
                )
                assert response.status_code == 200 and response.json()["ok"], response.text[:300]

            def read(client: httpx.Client) -> float:
                start = time.perf_counter()
                response = client.get(
                    f"{server.url}/v1/bookings/{reader.booking_id}",
                    headers={"authorization": f"Bearer {reader.requester_key}"},
                    timeout=120,
                )
                assert response.status_code == 200, response.text[:300]
                return time.perf_counter() - start

            rows = []
            with httpx.Client() as client:
                for label, raw in (
                    ("demo", recipe_manifest("demo")),
                    ("worst valid", worst_case_manifest()),
                    ("anchor-heavy valid", anchor_heavy_manifest()),
                ):
                    plan(client, raw)  # warm-up
                    bodies = _distinct(raw, reps, label.split()[0])
                    before = _proc_cpu(pid)
                    for body in bodies:
                        plan(client, body)
                    per_request = (_proc_cpu(pid) - before) / len(bodies)
                    rows.append(
                        {"input": label, "bytes": len(raw), "server_cpu_ms": per_request * 1000}
                    )
                quiet = [read(client) for _ in range(20)]

            bodies = _distinct(worst_case_manifest(), 12, "burst")
            loaded: list[float] = []
            with httpx.Client() as reads:

                def reading() -> None:
                    while len(loaded) < 20:
                        loaded.append(read(reads))

                with concurrent.futures.ThreadPoolExecutor(13) as pool:
                    clients = [httpx.Client() for _ in bodies]
                    try:
                        reader_done = pool.submit(reading)
                        burst = [
                            pool.submit(plan, c, b) for c, b in zip(clients, bodies, strict=True)
                        ]
                        for future in [*burst, reader_done]:
                            future.result()
                    finally:
                        for c in clients:
                            c.close()
        finally:
            stop_server(server)
    return {
        "plans": rows,
        "read_quiet_ms": {"median": statistics.median(quiet) * 1000, "max": max(quiet) * 1000},
        "read_under_12_plans_ms": {
            "median": statistics.median(loaded) * 1000,
            "max": max(loaded) * 1000,
        },
    }


def _proc_cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--live-reps", type=int, default=24)
    parser.add_argument("--no-live", action="store_true", help="skip the live server section")
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
    live = None if args.no_live else _live(args.live_reps)
    if live is not None:
        print()
        print("live server: CPU per POST /v1/plans (a distinct document each), ratio to demo")
        demo_ms = live["plans"][0]["server_cpu_ms"]
        for row in live["plans"]:
            print(
                f"{row['input']:<22} {row['bytes']:>9,} bytes {row['server_cpu_ms']:>8.1f} ms "
                f"{row['server_cpu_ms'] / demo_ms:>6.1f}× demo"
            )
        quiet, loaded = live["read_quiet_ms"], live["read_under_12_plans_ms"]
        print(
            f"another tenant's booking read: alone median {quiet['median']:.1f} ms, "
            f"max {quiet['max']:.1f} ms; during 12 worst-valid plans at once median "
            f"{loaded['median']:.1f} ms, max {loaded['max']:.1f} ms"
        )
    print(
        json.dumps(
            {"bench": "manifest_validation", "rows": rows, "scan_text": linear, "live": live}
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
