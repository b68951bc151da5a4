"""RLVR bench: the separate rollout worker (``max_staleness`` 1) against the synchronous loop.

For each seed (the run id, which seeds the model, the data order and the sampling), the ``post``
recipe's chain pretrain → SFT → DPO runs once (``--steps`` steps a stage, ``--nproc`` gloo
processes); its checkpoints are then copied twice and each copy resumes into the RLVR stage for
``--steps`` steps (its token budget raised so the cap decides), exactly as the engine runs it:

- **sync**: the synchronous loop (spec hook ``rollout_worker: false``, ``max_staleness`` 0):
  every step generates its groups with the sharded model on the trainer ranks, then trains.
- **async**: the separate rollout worker (``rollout_worker: true``, ``max_staleness`` 1): one
  more process generating ahead while the ranks train (:mod:`ito.pipeline.rollout_worker`).

Figures, per seed and as the median over seeds:

- **speed-up** = sync RLVR wall ÷ async RLVR wall, the wall being from the stage's ``stage
  started`` event to its last step's ``metric`` event. The engine starts the worker with the
  run (:class:`ito.pipeline.rollout_worker.Standby`), so its start-up (interpreter, torch,
  transformers) overlaps the trainer's own before the stage: what is left of it in the window
  is the first batch, which nothing can overlap;
- **process speed-up**: the same for the whole torchrun process, launch to exit (start-up,
  resuming the checkpoint, the stage, the final evaluation and export — the same work both
  ways), so no cost of the separation can hide outside the window;
- **steady speed-up**: the same from the first step's ``metric`` event on (the first batch
  left out), and **worker start** = the async first step's wait for its batch − the sync
  first step's generation (what the standby's start-up did not hide, plus the first load).
  The steady figure can pass the ideal below: the worker generates on an unsharded copy, with
  none of the all-gathers every forward of the sharded model makes in the synchronous loop;
- **ideal** = (T_gen + T_train) ÷ max(T_gen, T_train) from the sync run (T_gen: the steps'
  ``rollout_seconds``, T_train: the rest of their ``step_seconds``) — the speed-up of a perfect
  overlap on free hardware; **overlap** = speed-up ÷ ideal;
- **final reward**: the mean ``reward_mean`` of the last three steps, sync and async, and their
  difference (async batches are up to one version old). The ``post`` recipe's chain is too
  short for the model to learn sums (the reward stays near the overlong floor, −1): the gap
  says the curves agree, not that RLVR learns (the demo shows that).

The issue's goals (≥ 1.3× faster, ≥ 80 % of the ideal, reward within 0.05) are printed against
the figures, never asserted. With ``--nproc 2`` on a 2-core machine the worker has no core of
its own and the honest speed-up is below 1. Each process it starts is killed by PID in
``finally``.

Usage: ``.venv/bin/python bench/rl_async.py [--steps 30] [--seeds 3] [--nproc 1]
[--group-size 64]``. With one trainer process the worker has the second core of a 2-core
machine: the only setting here where generating and training can really overlap. A group of
64 samples makes a step of ~80 ms; the recipe's 8 makes one of ~20 ms, where the files'
exchange (a few ms a step: publishing, polling, loading) is a large share.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import (
    Processes,
    child_env,
    exit_on_sigterm,
    read_events,
    rnd,
    table,
    torchrun,
    write_demo_recipe,
)

PREP = ["pretrain", "sft", "dpo"]
DEADLINE_S = 1800


def _spec(
    root: Path, run_id: str, steps: int, stages: list[str], group_size: int, **extra: Any
) -> Path:
    manifest = write_demo_recipe(root / "data", "post")
    staleness = extra.pop("max_staleness", 0)
    manifest["post_training"]["rlvr"]["max_staleness"] = staleness
    manifest["post_training"]["rlvr"]["group_size"] = group_size
    # The recipe's RLVR budget is a few steps; the bench's stage runs ``steps`` (the cap).
    manifest["post_training"]["rlvr"]["max_tokens"] = 10**9
    spec = {
        "run_id": run_id,
        "attempt": 1,
        "manifest": manifest,
        "workdir": str(root / "work"),
        "checkpoint_dir": str(root / "ckpt"),
        "events_path": str(root / "events.jsonl"),
        "stages": stages,
        "max_steps_per_stage": steps,
        **extra,
    }
    path = root / "spec.json"
    path.write_text(json.dumps(spec))
    return path


def _run(procs: Processes, spec: Path, nproc: int) -> float:
    """Run ``spec`` under torchrun; returns the seconds from launch to exit."""
    began = time.perf_counter()
    proc = procs.start(
        torchrun(nproc, "-m", "ito.pipeline.run", "--spec", str(spec)),
        env=child_env(),
        stdout=(spec.parent / "torchrun.log").open("wb"),
        stderr=subprocess.STDOUT,
    )
    if proc.wait(timeout=DEADLINE_S) != 0:
        raise SystemExit(f"torchrun failed: see {spec.parent / 'torchrun.log'}")
    return time.perf_counter() - began


def _rlvr_figures(root: Path) -> dict[str, float]:
    evs = read_events(root / "events.jsonl")
    (start,) = [e for e in evs if e["type"] == "stage" and e["stage"] == "rlvr" and "steps" in e]
    steps = [
        e
        for e in evs
        if e["type"] == "metric" and e.get("stage") == "rlvr" and "loss" in e["values"]
    ]
    if not steps:
        raise SystemExit(f"no RLVR step in {root}")
    gen = sum(e["values"]["rollout_seconds"] for e in steps)
    total = sum(e["values"]["step_seconds"] for e in steps)
    return {
        "wall": steps[-1]["ts"] - start["ts"],
        "steady": steps[-1]["ts"] - steps[0]["ts"],
        "first_wait": steps[0]["values"]["rollout_seconds"],
        "t_gen": gen,
        "t_train": total - gen,
        "reward": statistics.mean(e["values"]["reward_mean"] for e in steps[-3:]),
        "dropped": sum(e["values"].get("rollout_dropped", 0.0) for e in steps),
        "lag_max": max(e["values"].get("rollout_lag_max", 0.0) for e in steps),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=30, help="steps of every stage")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument(
        "--nproc",
        type=int,
        default=1,
        help="trainer processes; 1 leaves the second core of a 2-core machine to the worker",
    )
    parser.add_argument(
        "--group-size",
        type=int,
        default=64,
        help="RLVR samples per prompt, and per step (the recipe's 8 makes a step of ~20 ms, "
        "where the file exchange's few ms are a large share)",
    )
    args = parser.parse_args(argv)
    exit_on_sigterm()
    tmp = Path(tempfile.mkdtemp(prefix="ito-bench-rl-async-"))
    procs = Processes(str(tmp))
    rows = []
    try:
        for seed in range(args.seeds):
            run_id = f"bench-rl-{seed}"
            prep = tmp / f"seed{seed}-prep"
            _run(procs, _spec(prep, run_id, args.steps, PREP, args.group_size), args.nproc)
            found: dict[str, dict[str, float]] = {}
            for name, worker, staleness in (("sync", False, 0), ("async", True, 1)):
                root = tmp / f"seed{seed}-{name}"
                shutil.copytree(prep / "ckpt", root / "ckpt")
                spec = _spec(
                    root,
                    run_id,
                    args.steps,
                    [*PREP, "rlvr"],
                    args.group_size,
                    rollout_worker=worker,
                    max_staleness=staleness,
                )
                process_wall = _run(procs, spec, args.nproc)
                found[name] = {**_rlvr_figures(root), "process_wall": process_wall}
            sync, async_ = found["sync"], found["async"]
            ideal = (sync["t_gen"] + sync["t_train"]) / max(sync["t_gen"], sync["t_train"])
            speedup = sync["wall"] / async_["wall"]
            rows.append(
                {
                    "seed": seed,
                    "sync_wall_s": sync["wall"],
                    "async_wall_s": async_["wall"],
                    "speedup": speedup,
                    "steady_speedup": sync["steady"] / async_["steady"],
                    "process_speedup": sync["process_wall"] / async_["process_wall"],
                    "worker_start_s": async_["first_wait"] - sync["first_wait"],
                    "ideal": ideal,
                    "overlap": speedup / ideal,
                    "t_gen_s": sync["t_gen"],
                    "t_train_s": sync["t_train"],
                    "sync_reward": sync["reward"],
                    "async_reward": async_["reward"],
                    "reward_gap": async_["reward"] - sync["reward"],
                    "async_dropped": async_["dropped"],
                    "async_lag_max": async_["lag_max"],
                }
            )
    finally:
        procs.kill_all()
        shutil.rmtree(tmp, ignore_errors=True)
    headers = list(rows[0])
    print(table("per seed", headers, [[r[h] for h in headers] for r in rows]))
    summary = {h: rnd(statistics.median(r[h] for r in rows)) for h in headers if h != "seed"}
    summary["sync_reward"] = rnd(statistics.mean(r["sync_reward"] for r in rows))
    summary["async_reward"] = rnd(statistics.mean(r["async_reward"] for r in rows))
    summary["reward_gap"] = rnd(statistics.mean(r["reward_gap"] for r in rows))
    goals = [
        ["speed-up ≥ 1.3×", summary["speedup"], (summary["speedup"] or 0) >= 1.3],
        ["≥ 80 % of ideal overlap", summary["overlap"], (summary["overlap"] or 0) >= 0.8],
        ["|reward gap| ≤ 0.05", summary["reward_gap"], abs(summary["reward_gap"] or 0) <= 0.05],
    ]
    print()
    print(table("goals (median over seeds; rewards: mean)", ["goal", "value", "met"], goals))
    print(
        "\nnote: the overlap needs a core (or accelerator) of the worker's own: with --nproc 2 "
        "on a 2-core machine the worker competes with both trainer ranks and the speed-up falls "
        "below 1. The process speed-up counts the worker's start-up, which here (a run resumed "
        "straight into RLVR) only the trainer's own start-up can hide."
    )
    print(
        json.dumps(
            {
                "bench": "rl_async",
                "steps": args.steps,
                "seeds": args.seeds,
                "nproc": args.nproc,
                "group_size": args.group_size,
                **summary,
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
