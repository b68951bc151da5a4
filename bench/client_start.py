"""How long an agent waits for the client: wall time of ``ito --version`` and
``ito capabilities --json``, each started as a fresh process, against ``python -c pass`` (the
interpreter's own start) measured in the same run. Targets (issue 27): each ≤ 0.2 s at the
10th percentile on a 2-core machine.

``python bench/client_start.py [--runs 30] [--bin DIR]`` (``--bin``: another environment's
``bin``, e.g. one where only the client is installed).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

TARGET_S = 0.2


def _times(argv: list[str], runs: int) -> list[float]:
    out = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
        out.append(time.perf_counter() - start)
    return sorted(out)


def _p10(times: list[float]) -> float:
    return statistics.quantiles(times, n=10)[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--bin", type=Path, default=Path(sys.executable).parent)
    args = parser.parse_args()
    python = str(args.bin / "python")
    ito = str(args.bin / "ito")
    baseline = _times([python, "-c", "pass"], args.runs)
    result: dict[str, object] = {"python_start_p10_s": round(_p10(baseline), 4)}
    for name, argv in (
        ("ito_version", [ito, "--version"]),
        ("ito_capabilities", [ito, "capabilities", "--json"]),
    ):
        times = _times(argv, args.runs)
        p10 = _p10(times)
        result[name] = {
            "p10_s": round(p10, 4),
            "median_s": round(statistics.median(times), 4),
            "ratio_to_python_start": round(p10 / _p10(baseline), 2),
            "meets_target": p10 <= TARGET_S,
        }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
