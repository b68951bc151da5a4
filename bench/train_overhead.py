"""Training overhead bench: tokens/s of the engine's pretrain stage ÷ a plain PyTorch loop.

Two layouts, each compared with a plain loop doing the same parallelism (``--layouts``):

- ``fsdp`` — the engine's default layout (FSDP2, ``dp_shard=2``), described below;
- ``tp`` — the engine with a planned ``tp=2`` layout (run spec ``layout``: ``tp=2,
  dp_shard=1``, no activation checkpointing) against a plain loop that splits the same model
  with the engine's own tensor-parallel plan (``ito.pipeline.parallelize.tensor_parallel``:
  DTensor ``parallelize_module``, q, k, v, gate, up column-wise, o and down row-wise, with
  sequence parallel — norms and residual stream sharded along the sequence, all-gathered into
  attention and the MLP, reduce-scattered out of o and down) and nothing else (no FSDP),
  starting from the same values (the engine's deterministic initialisation), both
  tensor-parallel ranks reading the same batch, ``torch.optim.AdamW`` with the engine's
  hyper-parameters and ``get_total_norm`` clipping over every gradient. What the engine adds
  around the plan — its chunked loss, the hook that keeps each gradient laid out as its
  parameter (without it the embedding's gradient comes out whole and the norms' as partial
  sums, which plain AdamW redistributes op by op), its AdamW and clipping on the local
  shards — is the engine's, on its side of the ratio.

Each layout prints its own tables; a last table puts the ratios side by side.

Both sides run under ``torchrun --standalone --nproc-per-node=2`` (gloo, one OpenMP thread per
process) with the same FSDP2 model — ``ito.pipeline.model.build_model`` from the same
``ito.core.model_sizes`` entry and the same seed (derived from the same run id), each decoder
layer and the root ``fully_shard``-ed over the 2-rank mesh — the same packed sequences in the same
order (the recipe's ``web`` data, its training split, packed by ``ito.pipeline.data.pack`` with
the same tokenizer file, batches from ``PackedData.batch``), the same micro-batch (``MICRO_BATCH``
sequences per rank per step), the same number of steps and the same math: AdamW
(``build_optimizer``), warmup + cosine (``build_scheduler``), gradient clipping at
``MAX_GRAD_NORM``.

- **engine**: ``torchrun -m ito.pipeline.run --spec spec.json`` with the ``demo`` recipe's
  manifest limited to its ``pretrain`` stage (its token budget set to ``--steps`` steps),
  checkpointing at the manifest's interval
  (``checkpoint.every_steps``; async DCP with its commit) and writing its events file, exactly as
  the worker launches it.
- **baseline**: this file run by torchrun as a worker (``--role baseline``): a plain loop —
  batch, forward, backward, ``clip_grad_norm_``, ``optimizer.step``, ``zero_grad``,
  ``scheduler.step`` — with no events, no metric all-reduce, no checkpoints.

What is timed. Process start-up (interpreter, imports, process group, FSDP wrapping) and
tokenizer training are excluded from both: the bench trains the tokenizer once before anything
is timed and puts it where the engine looks for it (the engine then only loads it, as the
baseline does), and the clocks start at the training loop. Two figures per side:

- **loop wall**: end-to-end wall time of the N training steps — engine: from its ``stage
  started`` event (emitted right before its first step) to its last step's ``metric`` event;
  baseline: from right before its first step to right after its last. The engine's window holds
  everything it does between steps (events, ``poll``, the in-window checkpoint saves and their
  staging waits); the stage's final checkpoint is saved after the last step, overlapping the
  stage's eval, and is outside the window (its ``blocking_seconds`` is reported).
- **step time**: the engine's own per-step ``step_seconds`` / ``tokens_per_s`` events against
  the baseline's per-step timings (rank 0): total tokens ÷ summed step time, and the median.
- **CPU time** over the loop-wall window, both ranks, all threads (the engine's checkpoint
  staging and upload threads included) — engine: read from ``/proc`` as its events appear;
  baseline: ``time.process_time()`` summed over the ranks. Tokens per CPU-second is the figure
  least moved by other work on a shared machine.

``ratio`` = engine tokens/s ÷ baseline tokens/s. Each round runs the two sides back to back (the
order flipping each round, so drift in the machine's load does not favour one side); the
headline is the median over rounds of each round's ratio, and the goal (≥ 0.95) is judged on the
loop-wall ratio (the stricter one). The machine's load average is printed: on a shared 2-CPU
host other work moves single rounds by tens of percent. As a check that both trained the same
thing, the engine's per-step losses (mean over ranks) are compared with the baseline's.

It prints a table and, last, one JSON line. Loopback only (torchrun ``--standalone``); every
process it starts is killed in ``finally``.

Usage: ``.venv/bin/python bench/train_overhead.py [--steps 300] [--repeats 3] [--size tiny]``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from ito.core.run_plan import SEQUENCES_PER_RANK  # the engine's MICRO_BATCH

NPROC = 2
RUN_ID = "bench-train-overhead"
STEP_TIMEOUT_S = 600.0
POLL_S = 0.02
"""How often the engine's CPU watcher reads its events file and ``/proc``."""


@dataclass(frozen=True)
class BenchLayout:
    title: str
    spec: dict[str, Any] | None
    """The run spec's ``layout`` (``None``: the engine's default, FSDP over every rank)."""
    dp: int
    """Data-parallel ranks: each reads its own batches."""


LAYOUTS: dict[str, BenchLayout] = {
    "fsdp": BenchLayout("FSDP2 dp_shard=2", None, NPROC),
    "tp": BenchLayout(
        "tensor parallel tp=2",
        {"dp_shard": 1, "tp": NPROC, "micro_batch": SEQUENCES_PER_RANK},
        1,
    ),
}
"""The layouts compared, each engine against a plain loop doing the same parallelism."""


# ---------------------------------------------------------------------------------------------
# The baseline worker (runs under torchrun)


def tensor_parallel_baseline(
    size: Any, seed: int, world: int, spec: Any
) -> tuple[Any, Any, Callable[[], Any]]:
    """The plain PyTorch tensor-parallel model over all ``world`` ranks: the Llama decoder
    built on ``meta`` and split by the engine's own tensor-parallel plan
    (``ito.pipeline.parallelize.tensor_parallel``: DTensor ``parallelize_module`` with
    Megatron's split — q, k, v, gate, up column-wise, o and down row-wise — and sequence
    parallel between the blocks: the norms and the residual stream on ``1/tp`` of the tokens,
    all-gathered into attention and the MLP, reduce-scattered out of o and down; the embedding
    and head split by vocabulary, the logits gathered whole), materialised with the engine's
    deterministic initialisation (so both sides start from the same values and their losses
    compare). No FSDP, no activation checkpointing (the bench's layout has none). AdamW with
    the engine's hyper-parameters, in two parameter groups (the DTensor weights and any plain
    ones: ``foreach`` kernels do not mix the two), and gradient clipping over both kinds of
    gradient. Returns the model, the optimizer and the clipping call."""
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor.experimental import implicit_replication
    from transformers import LlamaForCausalLM

    from ito.pipeline.model import BETAS, PEAK_LR, WEIGHT_DECAY, llama_config
    from ito.pipeline.parallelize import initialize, tensor_parallel
    from ito.pipeline.train import MAX_GRAD_NORM

    tp_mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("tp",))
    with torch.device("meta"):
        model = LlamaForCausalLM(llama_config(size))
    tensor_parallel(model, tp_mesh)  # the engine's plan, sequence parallel included
    initialize(model, seed, torch.device("cpu"))
    params = list(model.parameters())
    sharded = [p for p in params if isinstance(p, DTensor)]
    whole = [p for p in params if not isinstance(p, DTensor)]
    groups: list[dict[str, Any]] = [{"params": g} for g in (sharded, whole) if g]
    optimizer = torch.optim.AdamW(
        groups,
        lr=PEAK_LR[spec.manifest.model.size],
        betas=BETAS,
        weight_decay=WEIGHT_DECAY,
        foreach=True,
    )

    def clip() -> Any:
        grads = [p.grad for p in params if p.grad is not None]
        tp_norm: Any = torch.nn.utils.get_total_norm([g for g in grads if isinstance(g, DTensor)])
        plain = [g for g in grads if not isinstance(g, DTensor)]
        norms = torch.stack([tp_norm.full_tensor(), torch.nn.utils.get_total_norm(plain)])
        total = torch.linalg.vector_norm(norms)
        with implicit_replication():
            torch.nn.utils.clip_grads_with_norm_(grads, MAX_GRAD_NORM, total)
        return total

    return model, optimizer, clip


def baseline_worker(spec_path: Path, out_path: Path) -> None:
    import torch
    import torch.distributed as dist

    from ito.core.model_sizes import SIZES
    from ito.pipeline.data import PackedData, pack, read_documents, seed_from, split_heldout
    from ito.pipeline.layout import EngineLayout, build_mesh
    from ito.pipeline.model import build_model, build_optimizer, build_scheduler
    from ito.pipeline.spec import load_spec
    from ito.pipeline.tokenizer import load_tokenizer
    from ito.pipeline.train import MAX_GRAD_NORM, MICRO_BATCH

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    spec = load_spec(spec_path)
    stage = next(s for s in spec.manifest.curriculum if s.stage == spec.stages[0])
    stage_index = spec.manifest.curriculum.index(stage)
    size = SIZES[spec.manifest.model.size]
    seed = seed_from(spec.run_id)
    refs = spec.manifest.data_by_id()
    docs = [
        d
        for i in stage.data
        for d in split_heldout(read_documents(refs[i], spec.workdir), refs[i].role)[0]
    ]
    tokenizer = load_tokenizer(spec.checkpoint_dir)
    data = PackedData(pack(tokenizer, docs, stage.seq_len), seed, stage_index)
    if spec.layout is None:
        layout = EngineLayout.default(world)
        model = build_model(size, seed, build_mesh("cpu", layout), layout, torch.device("cpu"))
        optimizer = build_optimizer(model, spec.manifest.model.size)
        # A list, not model.parameters(): a generator would be spent after the first call,
        # and every later step would clip nothing.
        clip: Callable[[], Any] = partial(
            torch.nn.utils.clip_grad_norm_, list(model.parameters()), MAX_GRAD_NORM
        )
        dp_rank, dp = rank, world
    else:
        assert spec.layout.tp == world, "the tp baseline is pure tensor parallel"
        model, optimizer, clip = tensor_parallel_baseline(size, seed, world, spec)
        dp_rank, dp = 0, 1  # every tensor-parallel rank reads the same batch
    step_tokens = MICRO_BATCH * dp * stage.seq_len
    steps = max(1, stage.tokens // step_tokens)
    if spec.max_steps_per_stage is not None:
        steps = min(steps, spec.max_steps_per_stage)
    scheduler = build_scheduler(optimizer, steps)

    losses: list[torch.Tensor] = []
    step_seconds: list[float] = []
    dist.barrier()
    cpu_start = time.process_time()
    loop_start = time.time()
    for k in range(steps):
        start = time.perf_counter()
        batch = data.batch(k, dp_rank, dp, MICRO_BATCH)
        loss = model(input_ids=batch, labels=batch).loss
        loss.backward()
        clip()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        scheduler.step()
        losses.append(loss.detach())
        step_seconds.append(time.perf_counter() - start)
    loop_end = time.time()
    cpu = torch.tensor([time.process_time() - cpu_start], dtype=torch.float64)

    dist.all_reduce(cpu)
    mean_losses = torch.stack(losses).float()
    dist.all_reduce(mean_losses)
    mean_losses /= world
    if rank == 0:
        out_path.write_text(
            json.dumps(
                {
                    "steps": steps,
                    "step_tokens": step_tokens,
                    "loop_start": loop_start,
                    "loop_end": loop_end,
                    "step_seconds": step_seconds,
                    "cpu_seconds": float(cpu[0]),
                    "losses": mean_losses.tolist(),
                }
            ),
            encoding="utf-8",
        )
    dist.destroy_process_group()


# ---------------------------------------------------------------------------------------------
# The driver


def summarise_engine(events: list[dict[str, Any]]) -> dict[str, Any]:
    started = next(e for e in events if e["type"] == "stage" and e["status"] == "started")
    # Training steps' metrics; the eval batteries' (step 0, the stage's end) carry no timing.
    metrics = [e for e in events if e["type"] == "metric" and "step_seconds" in e["values"]]
    checkpoints = [e for e in events if e["type"] == "checkpoint"]
    last_ts = metrics[-1]["ts"]
    in_window = [c for c in checkpoints if c["step"] < metrics[-1]["step"]]
    return {
        "steps": len(metrics),
        "loop_seconds": last_ts - started["ts"],
        "step_seconds": [m["values"]["step_seconds"] for m in metrics],
        "tokens_per_s": [m["values"]["tokens_per_s"] for m in metrics],
        "losses": [m["values"]["loss"] for m in metrics],
        "checkpoints": len(checkpoints),
        "checkpoints_in_window": len(in_window),
        "blocking_in_window": sum(c.get("blocking_seconds", 0.0) for c in in_window),
        "final_blocking": checkpoints[-1].get("blocking_seconds") if checkpoints else None,
        "checkpoint_bytes": checkpoints[-1]["bytes"] if checkpoints else None,
    }


class CpuWatch(threading.Thread):
    """CPU seconds (all threads of both ranks) the engine spends between its ``stage started``
    event and its last step's ``metric`` event, read from ``/proc`` as the events appear (the
    engine cannot be instrumented from outside). It polls every ``POLL_S``: the lag is at most
    that (well under 1 % of the window), and the watcher, which only the engine's side has,
    takes next to no CPU from the two ranks on a 2-CPU machine (polling every 2 ms took a few
    percent of a CPU)."""

    def __init__(self, proc: Any, events_path: Path, steps: int) -> None:
        super().__init__(daemon=True)
        self.proc, self.events_path, self.steps = proc, events_path, steps
        self.start_cpu: float | None = None
        self.cpu: float | None = None

    def ranks(self) -> list[int]:
        from _common import cmdline, descendants

        return [
            p
            for p in descendants(self.proc.pid)
            if "ito.pipeline.run" in (argv := cmdline(p)) and not any("torchrun" in a for a in argv)
        ]

    def run(self) -> None:
        from _common import cpu_seconds

        offset, partial, ranks = 0, b"", []
        while self.proc.poll() is None and self.cpu is None:
            if len(ranks) < NPROC:
                ranks = self.ranks()
            try:
                with self.events_path.open("rb") as handle:
                    handle.seek(offset)
                    chunk = handle.read()
            except FileNotFoundError:
                chunk = b""
            offset += len(chunk)
            *lines, partial = (partial + chunk).split(b"\n")
            for line in lines:
                event = json.loads(line)
                if len(ranks) < NPROC:
                    continue
                if event["type"] == "stage" and event["status"] == "started":
                    self.start_cpu = sum(cpu_seconds(p) or 0.0 for p in ranks)
                elif (
                    event["type"] == "metric"
                    and "step_seconds" in event["values"]
                    and event["step"] == self.steps
                    and self.start_cpu is not None
                ):
                    self.cpu = sum(cpu_seconds(p) or 0.0 for p in ranks) - self.start_cpu
            time.sleep(POLL_S)


def figures(
    kind: str, step_tokens: int, loop_seconds: float, step_seconds: list[float], cpu: float | None
) -> dict[str, Any]:
    from _common import median

    n = len(step_seconds)
    return {
        "kind": kind,
        "steps": n,
        "loop_seconds": loop_seconds,
        "loop_tokens_per_s": n * step_tokens / loop_seconds,
        "tokens_per_cpu_s": n * step_tokens / cpu if cpu else None,
        "step_tokens_per_s": n * step_tokens / sum(step_seconds),
        "median_step_tokens_per_s": step_tokens / (median(step_seconds) or float("nan")),
    }


def run_side(
    kind: str,
    rnd_dir: Path,
    spec: dict[str, Any],
    tokenizer: Path,
    step_tokens: int,
    steps: int,
    procs: Any,
    env: dict[str, str],
) -> dict[str, Any]:
    from _common import read_events, torchrun

    rnd_dir.mkdir(parents=True)
    ckpt = rnd_dir / "checkpoints"
    ckpt.mkdir()
    shutil.copy(tokenizer, ckpt / tokenizer.name)
    spec = spec | {
        "workdir": str(rnd_dir / "work"),
        "checkpoint_dir": str(ckpt),
        "events_path": str(rnd_dir / "events.jsonl"),
    }
    (rnd_dir / "work").mkdir()
    spec_path = rnd_dir / "spec.json"
    spec_path.write_text(json.dumps(spec), encoding="utf-8")
    out = rnd_dir / "baseline.json"
    if kind == "engine":
        argv = torchrun(NPROC, "-m", "ito.pipeline.run", "--spec", str(spec_path))
    else:
        argv = torchrun(
            NPROC,
            str(Path(__file__).resolve()),
            "--role",
            "baseline",
            "--spec",
            str(spec_path),
            "--out",
            str(out),
        )
    log = (rnd_dir / "torchrun.log").open("wb")
    started = time.monotonic()
    proc = procs.start(argv, cwd=rnd_dir, env=env, stdout=log, stderr=log)
    log.close()
    watch = CpuWatch(proc, rnd_dir / "events.jsonl", steps)
    if kind == "engine":
        watch.start()
    try:
        rc = proc.wait(timeout=STEP_TIMEOUT_S)
    except Exception:
        procs.kill_tree(proc)
        raise
    process_seconds = time.monotonic() - started
    if rc != 0:
        tail = (rnd_dir / "torchrun.log").read_text(errors="replace")[-3000:]
        raise RuntimeError(f"{kind} exited with {rc}:\n{tail}")
    if kind == "engine":
        ev = summarise_engine(read_events(rnd_dir / "events.jsonl"))
        watch.join(timeout=10)
        result = figures("engine", step_tokens, ev["loop_seconds"], ev["step_seconds"], watch.cpu)
        result |= {
            k: ev[k]
            for k in (
                "checkpoints",
                "checkpoints_in_window",
                "blocking_in_window",
                "final_blocking",
                "checkpoint_bytes",
            )
        }
        result["losses"] = ev["losses"]
    else:
        doc = json.loads(out.read_text(encoding="utf-8"))
        result = figures(
            "baseline",
            doc["step_tokens"],
            doc["loop_end"] - doc["loop_start"],
            doc["step_seconds"],
            doc["cpu_seconds"],
        )
        result["losses"] = doc["losses"]
    result["process_seconds"] = process_seconds
    return result


def measure_layout(
    args: argparse.Namespace,
    name: str,
    tmp: Path,
    base_spec: dict[str, Any],
    tokenizer: Path,
    every: int,
    procs: Any,
    env: dict[str, str],
) -> dict[str, Any]:
    """``--repeats`` rounds of engine and baseline on one layout; prints its tables and
    returns its summary."""
    from _common import median, rnd, table
    from ito.pipeline.train import MICRO_BATCH

    layout = LAYOUTS[name]
    manifest = json.loads(json.dumps(base_spec["manifest"]))
    stage = manifest["curriculum"][0]
    step_tokens = MICRO_BATCH * layout.dp * stage["seq_len"]
    stage["tokens"] = args.steps * step_tokens
    spec = base_spec | {"manifest": manifest, "layout": layout.spec}
    load_start = os.getloadavg()
    results: list[dict[str, Any]] = []
    print(
        f"layout {name} ({LAYOUTS[name].title}): model {args.size}, {NPROC} ranks (gloo), "
        f"micro-batch {MICRO_BATCH} × "
        f"seq {stage['seq_len']} per rank, {args.steps} steps, checkpoint every "
        f"{every} steps; {args.repeats} round(s)",
        flush=True,
    )
    for r in range(args.repeats):
        order = ("baseline", "engine") if r % 2 == 0 else ("engine", "baseline")
        for kind in order:
            res = run_side(
                kind,
                tmp / f"{name}-round{r}-{kind}",
                spec,
                tokenizer,
                step_tokens,
                args.steps,
                procs,
                env,
            )
            res["round"] = r
            results.append(res)
            print(
                f"  round {r} {kind:8s}: loop {res['loop_seconds']:.2f} s, "
                f"{res['loop_tokens_per_s']:,.0f} tok/s (process "
                f"{res['process_seconds']:.1f} s)",
                flush=True,
            )

    def med(kind: str, key: str) -> float | None:
        return median([x[key] for x in results if x["kind"] == kind and x[key] is not None])

    engine = {
        k: med("engine", k)
        for k in (
            "loop_seconds",
            "loop_tokens_per_s",
            "step_tokens_per_s",
            "median_step_tokens_per_s",
            "tokens_per_cpu_s",
        )
    }
    base = {k: med("baseline", k) for k in engine}
    of_medians = engine["loop_tokens_per_s"] / base["loop_tokens_per_s"]  # type: ignore[operator]
    ratio_step = engine["step_tokens_per_s"] / base["step_tokens_per_s"]  # type: ignore[operator]
    ratio_median = (
        engine["median_step_tokens_per_s"]  # type: ignore[operator]
        / base["median_step_tokens_per_s"]
    )
    eng_runs = [x for x in results if x["kind"] == "engine"]
    base_runs = [x for x in results if x["kind"] == "baseline"]
    loss_diff = max(
        abs(a - b)
        for e in eng_runs
        for b_run in base_runs
        for a, b in zip(e["losses"], b_run["losses"], strict=True)
    )
    rows = [
        [
            "loop wall (s)",
            engine["loop_seconds"],
            base["loop_seconds"],
            engine["loop_seconds"] / base["loop_seconds"],
        ],  # type: ignore[operator]
        [
            "tokens/s, loop wall",
            engine["loop_tokens_per_s"],
            base["loop_tokens_per_s"],
            of_medians,
        ],
        [
            "tokens/s, Σ step time",
            engine["step_tokens_per_s"],
            base["step_tokens_per_s"],
            ratio_step,
        ],
        [
            "tokens/s, median step",
            engine["median_step_tokens_per_s"],
            base["median_step_tokens_per_s"],
            ratio_median,
        ],
        [
            "tokens per CPU-second",
            engine["tokens_per_cpu_s"],
            base["tokens_per_cpu_s"],
            (engine["tokens_per_cpu_s"] / base["tokens_per_cpu_s"])  # type: ignore[operator]
            if engine["tokens_per_cpu_s"] and base["tokens_per_cpu_s"]
            else None,
        ],
    ]
    print()
    print(table("medians over rounds", ["figure", "engine", "baseline", "engine ÷ base"], rows))
    print()
    paired = []
    for r in range(args.repeats):
        e = next(x for x in results if x["kind"] == "engine" and x["round"] == r)
        b = next(x for x in results if x["kind"] == "baseline" and x["round"] == r)
        paired.append(
            {
                "round": r,
                "first": "baseline" if r % 2 == 0 else "engine",
                "loop": e["loop_tokens_per_s"] / b["loop_tokens_per_s"],
                "step": e["step_tokens_per_s"] / b["step_tokens_per_s"],
                "median_step": e["median_step_tokens_per_s"] / b["median_step_tokens_per_s"],
                "cpu": e["tokens_per_cpu_s"] / b["tokens_per_cpu_s"]
                if e["tokens_per_cpu_s"] and b["tokens_per_cpu_s"]
                else None,
            }
        )
    print(
        table(
            "engine ÷ baseline per round (back-to-back pair)",
            ["round", "first", "loop wall", "Σ step time", "median step", "per CPU-second"],
            [
                [p["round"], p["first"], p["loop"], p["step"], p["median_step"], p["cpu"]]
                for p in paired
            ],
        )
    )
    ratio_loop = median([p["loop"] for p in paired])
    ratio_step = median([p["step"] for p in paired])
    ratio_median = median([p["median_step"] for p in paired])
    ratio_cpu = median([p["cpu"] for p in paired if p["cpu"] is not None])
    load = os.getloadavg()
    print(
        f"load average at the end {load[0]:.2f} / {load[1]:.2f} / {load[2]:.2f} on "
        f"{os.cpu_count()} CPUs (at the start {load_start[0]:.2f}): other work on the "
        "machine shows up as spread between rounds"
    )
    print()
    ck = eng_runs[-1]
    print(
        f"engine checkpoints per run: {ck['checkpoints']} ({ck['checkpoints_in_window']} "
        f"inside the timed loop, blocking {ck['blocking_in_window']:.3f} s in all; final "
        f"one blocked {ck['final_blocking']} s), {ck['checkpoint_bytes']:,} bytes each"
    )
    print(
        f"max |loss(engine) − loss(baseline)| over {args.steps} steps: {loss_diff:.2e} "
        "(same model, data and order)"
    )
    met = ratio_loop >= 0.95  # type: ignore[operator]
    print(
        f"ratio (loop wall, median of the rounds' pairs) {ratio_loop:.3f} — goal ≥ 0.95 "
        f"{'met' if met else 'NOT met'}; per-step ratio {ratio_step:.3f} (engine's "
        f"step_seconds events vs the loop's own); ratio of medians {of_medians:.3f}; "
        f"tokens per CPU-second ratio {ratio_cpu:.3f} (least sensitive to other load)"
    )
    summary = {
        "bench": "train_overhead",
        "size": args.size,
        "world": NPROC,
        "backend": "gloo",
        "layout": name,
        "layout_spec": LAYOUTS[name].spec,
        "micro_batch": MICRO_BATCH,
        "seq_len": stage["seq_len"],
        "steps": args.steps,
        "checkpoint_every_steps": every,
        "repeats": args.repeats,
        "engine": {k: rnd(v, 3) for k, v in engine.items()},
        "baseline": {k: rnd(v, 3) for k, v in base.items()},
        "ratio_loop_wall": rnd(ratio_loop),
        "ratio_step_time": rnd(ratio_step),
        "ratio_median_step": rnd(ratio_median),
        "ratio_of_medians_loop_wall": rnd(of_medians),
        "ratio_tokens_per_cpu_s": rnd(ratio_cpu),
        "goal": 0.95,
        "goal_met": met,
        "per_round_ratios": [
            {k: rnd(v) if isinstance(v, float) else v for k, v in p.items()} for p in paired
        ],
        "loadavg_start": [round(x, 2) for x in load_start],
        "loadavg_end": [round(x, 2) for x in load],
        "engine_checkpoints_in_window": ck["checkpoints_in_window"],
        "engine_blocking_seconds_in_window": rnd(ck["blocking_in_window"]),
        "max_loss_diff": loss_diff,
        "rounds": [
            {k: (rnd(v, 3) if isinstance(v, float) else v) for k, v in x.items() if k != "losses"}
            for x in results
        ],
    }
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--role", choices=["driver", "baseline"], default="driver", help=argparse.SUPPRESS
    )
    parser.add_argument("--spec", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    parser.add_argument(
        "--steps",
        type=int,
        default=300,
        help="training steps per side (the demo recipe's pretrain stage is 390 "
        "steps of 2×4×128 tokens)",
    )
    parser.add_argument("--repeats", type=int, default=3, help="rounds of engine + baseline")
    parser.add_argument("--size", default="tiny", help="model size from ito.core.model_sizes")
    parser.add_argument(
        "--every-steps",
        type=int,
        default=None,
        help="checkpoint interval (default: the demo manifest's)",
    )
    parser.add_argument(
        "--layouts",
        type=lambda text: [x for x in text.split(",") if x],
        default=list(LAYOUTS),
        help=f"comma-separated layouts to compare, of {', '.join(LAYOUTS)} (default: all)",
    )
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory")
    args = parser.parse_args(argv)
    if args.role == "baseline":
        baseline_worker(args.spec, args.out)
        # Its figures are written and its process group destroyed (see process_exit).
        from ito.pipeline.process_exit import leave

        leave(0)

    from _common import (
        Processes,
        child_env,
        exit_on_sigterm,
        table,
        write_demo_recipe,
    )
    from ito.pipeline.data import read_documents, split_heldout
    from ito.pipeline.spec import load_spec
    from ito.pipeline.tokenizer import TOKENIZER_FILE, build_tokenizer

    exit_on_sigterm()
    tmp = Path(tempfile.mkdtemp(prefix="ito-bench-overhead-"))
    procs = Processes(str(tmp))
    try:
        manifest = write_demo_recipe(tmp / "data")
        manifest["model"]["size"] = args.size
        if args.every_steps:
            manifest["checkpoint"]["every_steps"] = args.every_steps
        every = manifest["checkpoint"]["every_steps"]
        spec: dict[str, Any] = {
            "run_id": RUN_ID,
            "attempt": 1,
            "manifest": manifest,
            "stages": ["pretrain"],
            "max_steps_per_stage": None,
            "fail_at": None,
            "loss_spike_at": None,
            "workdir": str(tmp / "work"),
            "checkpoint_dir": str(tmp / "tokenizer"),
            "events_path": str(tmp / "unused.jsonl"),
        }

        # The tokenizer, trained once here exactly as the engine's rank 0 would (same texts,
        # same vocabulary), so neither side's timing holds it.
        (tmp / "work").mkdir()
        (tmp / "spec.json").write_text(json.dumps(spec), encoding="utf-8")
        parsed = load_spec(tmp / "spec.json")
        refs = parsed.manifest.data_by_id()
        ids = list(dict.fromkeys(d for s in parsed.manifest.curriculum for d in s.data))
        texts = [
            t
            for i in ids
            for t in split_heldout(read_documents(refs[i], parsed.workdir), refs[i].role)[0]
        ]
        from ito.core.model_sizes import SIZES

        build_tokenizer(texts, SIZES[args.size].vocab, tmp / "tokenizer")
        tokenizer = tmp / "tokenizer" / TOKENIZER_FILE

        env = child_env()
        summaries = {
            name: measure_layout(args, name, tmp, spec, tokenizer, every, procs, env)
            for name in args.layouts
        }
        print()
        print(
            table(
                "engine ÷ plain loop by layout (median of the rounds' back-to-back pairs)",
                ["layout", "loop wall", "Σ step time", "median step", "per CPU-second", "goal"],
                [
                    [
                        f"{name} ({LAYOUTS[name].title})",
                        x["ratio_loop_wall"],
                        x["ratio_step_time"],
                        x["ratio_median_step"],
                        x["ratio_tokens_per_cpu_s"],
                        x["goal_met"],
                    ]
                    for name, x in summaries.items()
                ],
            )
        )
        first = summaries[args.layouts[0]]
        print(
            json.dumps(
                {
                    "bench": "train_overhead",
                    "size": args.size,
                    "world": NPROC,
                    "backend": "gloo",
                    "steps": args.steps,
                    "repeats": args.repeats,
                    "goal": 0.95,
                    "goal_met": all(x["goal_met"] for x in summaries.values()),
                    "ratio_loop_wall": first["ratio_loop_wall"],
                    "ratios_loop_wall": {n: x["ratio_loop_wall"] for n, x in summaries.items()},
                    "layouts": summaries,
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
