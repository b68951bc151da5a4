"""GPU throughput bench: the engine's training step on this machine's GPUs, with the planner's
layout, measured against what the planner predicts (issue 9, item 6).

One command on a GPU box: ``.venv/bin/python bench/mfu.py [--size 1b] [--steps N]``. Without
``--size`` it runs ``1b`` and then ``8b`` if the planner says ``8b`` fits this machine (a refused
size is reported with the planner's reasons, not run). On a machine without CUDA it says so in
one line and exits 0.

What it does, per size:

1. **Plan.** The planner (:func:`ito.core.planner.plan`) is asked about the size at ``--seq-len``
   on this node: the accelerator is the CUDA device name mapped to :mod:`ito.core.hardware`'s
   names (:func:`~ito.core.hardware.device_matches`; ``--gpu`` overrides), one node of
   ``torch.cuda.device_count()`` GPUs, the node's own fabric (``nvlink``: nothing crosses
   nodes), ``compile=False`` (the engine runs eager, so the prediction is for eager), the global
   batch left to the planner unless ``--global-batch-tokens`` is given. A plan refused only for
   waste (e.g. a booking larger than the model needs) is planned again with
   ``allow_wasteful`` and its warnings printed: the bench measures what the GPUs do.
2. **Train.** ``torchrun --standalone --nproc-per-node=<GPUs>`` runs this file as a worker per
   GPU (NCCL): the engine's own pieces build and step the model exactly as a run with that plan
   would — :class:`~ito.pipeline.layout.EngineLayout` from the plan's
   :class:`~ito.core.run_spec.LayoutSpec`, :func:`~ito.pipeline.layout.build_mesh`,
   :func:`~ito.pipeline.model.build_model` (meta device, tensor parallel, activation
   checkpointing, FSDP2 with the plan's bf16 ``MixedPrecisionPolicy``, deterministic init),
   the 1F1B :class:`~ito.pipeline.pipeline_stages.PipelineRunner` when ``pp > 1``, gradient
   accumulation, :func:`~ito.pipeline.parallelize.clip_grad_norm`, AdamW. The tokens are
   random ids (throughput does not depend on their values; no tokenizer, no data files, no
   checkpoints, no events). ``--warmup`` steps run first (allocator, NCCL communicators, cuBLAS
   heuristics), then ``--steps`` steps are timed between two ``torch.cuda.synchronize`` calls
   and barriers.
3. **Report.** Measured: tokens/s (tokens of the timed steps ÷ their wall time), MFU (the same
   FLOPs per token as the planner, ``ModelSize.flops_per_token``: 6·N + 12·L·h·s, over the
   accelerator's dense bf16 peak from :mod:`ito.core.hardware` times the GPUs), step time, and
   ``torch.cuda.max_memory_allocated`` / ``max_memory_reserved`` (the largest over the ranks,
   over the whole run). Predicted (labelled so): the planner's tokens/s, MFU, step time and
   per-GPU peak allocated memory (``MemoryBreakdown.peak_allocated``, what
   ``max_memory_allocated`` should show) and its total with the runtime reserve. Each measured
   figure is printed beside its prediction with the ratio measured ÷ predicted.

It prints a table per size and, last, one JSON line. Every process it starts is killed in
``finally``.

``--cpu-check`` runs the same code path on this machine's CPU (gloo, 2 processes, the
planner's ``cpu`` stand-in, ``tiny`` by default) to check the bench itself where no GPU is; its
figures say nothing about a GPU and no MFU or GPU memory is printed for it.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

DEFAULT_SIZES = ("1b", "8b")
SEED = 1234
RUN_TIMEOUT_S = 1800.0
CPU_CHECK_PROCS = 2


# ---------------------------------------------------------------------------------------------
# Planning (driver side; pure)


def accelerator_for(device_name: str) -> str | None:
    """The :data:`ito.core.hardware.ACCELERATORS` name of a CUDA device name, if any."""
    from ito.core.hardware import ACCELERATORS, device_matches

    for name, accel in ACCELERATORS.items():
        if accel.compute_capability is not None and device_matches(name, device_name):
            return name
    return None


def parse_pins(pins: list[str]) -> dict[str, object]:
    """``KEY=VALUE`` pins (``tp=2``, ``activation_checkpointing=full``) as a mapping for
    :meth:`ito.core.planner.Parallelism.from_mapping`."""
    found: dict[str, object] = {}
    for pin in pins:
        key, _, value = pin.partition("=")
        found[key] = int(value) if value.isdigit() else value
    return found


def make_plan(
    size: str,
    seq_len: int,
    gpu: str,
    gpus: int,
    global_batch_tokens: int | None,
    pins: dict[str, object],
) -> tuple[Any, list[str]]:
    """The planner's plan for ``size`` on one node of ``gpus`` ``gpu`` s (choices in ``pins``
    validated instead of chosen), and notes; raises :class:`~ito.core.planner.PlanRefused`
    when it cannot run."""
    from ito.core.hardware import ACCELERATORS, FABRIC_LINKS
    from ito.core.model_sizes import SIZES
    from ito.core.planner import ModelShape, Parallelism, PlannerInput, PlanRefused, plan

    def ask(allow_wasteful: bool) -> Any:
        return plan(
            PlannerInput(
                model=ModelShape.from_size(SIZES[size]),
                seq_len=seq_len,
                accelerator=ACCELERATORS[gpu],
                nodes=1,
                gpus_per_node=gpus,
                fabric=FABRIC_LINKS["nvlink"],
                global_batch_tokens=global_batch_tokens,
                pinned=Parallelism.from_mapping(pins),
                compile=False,  # the engine runs eager
                allow_wasteful=allow_wasteful,
            )
        )

    try:
        return ask(False), []
    except PlanRefused as refused:
        if not all(r.code.wasteful for r in refused.reasons):
            raise
        result = ask(True)
        return result, [f"planned with allow_wasteful: {r.code.value}" for r in refused.reasons]


# ---------------------------------------------------------------------------------------------
# The worker (runs under torchrun, one process per GPU)


def worker(job_path: Path, out_path: Path) -> None:
    import os

    import torch
    import torch.distributed as dist

    from ito.core.model_sizes import SIZES
    from ito.core.run_spec import LayoutSpec
    from ito.pipeline.grad_accum import accumulate
    from ito.pipeline.layout import EngineLayout, build_mesh
    from ito.pipeline.model import build_model, build_optimizer
    from ito.pipeline.parallelize import clip_grad_norm
    from ito.pipeline.pipeline_stages import PipelineRunner
    from ito.pipeline.train import MAX_GRAD_NORM

    job = json.loads(job_path.read_text(encoding="utf-8"))
    cuda = job["device"] == "cuda"
    if cuda:
        local_rank = int(os.environ["LOCAL_RANK"])
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
        dist.init_process_group("nccl", device_id=device)
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    size = SIZES[job["size"]]
    seq_len = int(job["seq_len"])
    layout = EngineLayout.from_spec(LayoutSpec.model_validate(job["layout"]), world)
    mesh = build_mesh(device.type, layout)
    model = build_model(size, SEED, mesh, layout, device)
    pipeline = PipelineRunner(model, mesh, layout, device) if layout.pp > 1 else None
    optimizer = build_optimizer(model, size.name)
    dp_rank, dp = layout.dp_coordinates(mesh)
    per_rank = layout.sequences_per_rank
    step_tokens = per_rank * dp * seq_len

    # A few distinct batches of random token ids per data-parallel rank, made before the clock
    # starts; tensor-parallel and pipeline peers of one data-parallel rank get the same ones.
    gen = torch.Generator(device="cpu").manual_seed(SEED + dp_rank)
    batches = [
        torch.randint(0, size.vocab, (per_rank, seq_len), generator=gen).to(device)
        for _ in range(4)
    ]

    def step(batch: torch.Tensor) -> torch.Tensor:
        if pipeline is not None:
            loss = pipeline.train_step(batch)
        else:
            loss = accumulate(model, batch, layout)
        clip_grad_norm(
            list(model.parameters()),
            MAX_GRAD_NORM,
            pipeline.group if pipeline is not None else None,
        )
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss.detach()

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize(device)
        dist.barrier()

    warmup, steps = int(job["warmup"]), int(job["steps"])
    for k in range(warmup):
        step(batches[k % len(batches)])
    sync()
    start = time.perf_counter()
    losses = [step(batches[(warmup + k) % len(batches)]) for k in range(steps)]
    sync()
    seconds = time.perf_counter() - start

    loss_sum = torch.stack(losses).float()
    dist.all_reduce(loss_sum)
    mean_losses = loss_sum / (world // layout.pp)  # only the last pipeline stage holds a loss
    memory = torch.zeros(2, dtype=torch.float64, device=device)
    if cuda:
        memory[0] = torch.cuda.max_memory_allocated(device)
        memory[1] = torch.cuda.max_memory_reserved(device)
    dist.all_reduce(memory, op=dist.ReduceOp.MAX)
    if rank == 0:
        out_path.write_text(
            json.dumps(
                {
                    "world": world,
                    "mesh": layout.degrees,
                    "steps": steps,
                    "warmup": warmup,
                    "step_tokens": step_tokens,
                    "seconds": seconds,
                    "losses": mean_losses.tolist(),
                    "max_memory_allocated": int(memory[0]) if cuda else None,
                    "max_memory_reserved": int(memory[1]) if cuda else None,
                }
            ),
            encoding="utf-8",
        )
    dist.destroy_process_group()


# ---------------------------------------------------------------------------------------------
# The driver


def ratio(measured: float | None, predicted: float | None) -> float | None:
    if measured is None or not predicted:
        return None
    return measured / predicted


def report(
    size: str, gpu: str, gpus: int, seq_len: int, result: Any, got: dict[str, Any], cpu: bool
) -> dict[str, Any]:
    """The table of one size; returns its JSON summary."""
    from _common import rnd, table
    from ito.core.hardware import ACCELERATORS
    from ito.core.model_sizes import SIZES

    gib = float(1 << 30)
    tokens_per_s = got["steps"] * got["step_tokens"] / got["seconds"]
    step_s = got["seconds"] / got["steps"]
    t, mem = result.time, result.memory
    mfu = None
    if not cpu:
        peak = ACCELERATORS[gpu].peak_bf16_flops * gpus
        mfu = SIZES[size].flops_per_token(seq_len) * tokens_per_s / peak
    alloc = got["max_memory_allocated"]
    reserved = got["max_memory_reserved"]
    rows: list[list[Any]] = [
        ["tokens/s", tokens_per_s, t.tokens_per_second, ratio(tokens_per_s, t.tokens_per_second)],
        ["step time (s)", step_s, t.step_seconds, ratio(step_s, t.step_seconds)],
        ["MFU", mfu, t.mfu, ratio(mfu, t.mfu)],
        [
            "peak allocated per GPU (GiB)",
            None if alloc is None else alloc / gib,
            mem.peak_allocated / gib,
            ratio(alloc, mem.peak_allocated),
        ],
        [
            "reserved / total per GPU (GiB)",
            None if reserved is None else reserved / gib,
            mem.total / gib,
            None,
        ],
    ]
    title = (
        f"{size} on {gpus} × {gpu}: {result.layout.describe()}, grad_accum {result.grad_accum}, "
        f"pp_microbatches {result.pp_microbatches}, seq {seq_len}, "
        f"{got['step_tokens']:,} tokens/step, {result.param_dtype} params / "
        f"{result.reduce_dtype} reduce, eager; {got['steps']} timed steps after "
        f"{got['warmup']} warm-up"
    )
    print(table(title, ["figure", "measured", "predicted (planner)", "measured ÷ predicted"], rows))
    print(
        "  measured MFU = (6·N + 12·L·h·s) × tokens/s ÷ (dense bf16 peak × GPUs); "
        "reserved vs the planner's total (with its runtime reserve) is for reading, "
        "not a like-for-like ratio"
    )
    losses = got["losses"]
    print(f"  loss (random tokens) first {losses[0]:.3f}, last {losses[-1]:.3f}")
    return {
        "size": size,
        "gpu": gpu,
        "gpus": gpus,
        "seq_len": seq_len,
        "mesh": got["mesh"],
        "micro_batch": result.micro_batch,
        "grad_accum": result.grad_accum,
        "pp_microbatches": result.pp_microbatches,
        "activation_checkpointing": result.activation_checkpointing,
        "step_tokens": got["step_tokens"],
        "steps": got["steps"],
        "warmup": got["warmup"],
        "measured": {
            "tokens_per_s": rnd(tokens_per_s, 1),
            "step_seconds": rnd(step_s, 5),
            "mfu": rnd(mfu),
            "max_memory_allocated": alloc,
            "max_memory_reserved": reserved,
        },
        "predicted": {
            "tokens_per_s": rnd(t.tokens_per_second, 1),
            "step_seconds": rnd(t.step_seconds, 5),
            "mfu": rnd(t.mfu),
            "peak_allocated": mem.peak_allocated,
            "total": mem.total,
        },
        "ratio": {
            "tokens_per_s": rnd(ratio(tokens_per_s, t.tokens_per_second)),
            "mfu": rnd(ratio(mfu, t.mfu)),
            "memory_allocated": rnd(ratio(alloc, mem.peak_allocated)),
        },
        "first_loss": losses[0],
        "last_loss": losses[-1],
    }


def run_size(
    size: str,
    args: argparse.Namespace,
    gpu: str,
    gpus: int,
    tmp: Path,
    procs: Any,
) -> dict[str, Any]:
    """Plan, train and report one size; a refused plan is reported, not run."""
    from _common import child_env, torchrun
    from ito.core.planner import PlanRefused
    from ito.core.run_plan import layout_spec

    try:
        result, notes = make_plan(
            size, args.seq_len, gpu, gpus, args.global_batch_tokens, parse_pins(args.pin)
        )
    except PlanRefused as refused:
        print(f"{size}: not run, the planner refuses it on {gpus} × {gpu}:")
        for reason in refused.reasons:
            print(f"  - {reason.code.value}: {reason.message}")
        return {"size": size, "ran": False, "plan_refused": [r.code.value for r in refused.reasons]}
    for note in notes:
        print(f"{size}: {note}")
    job_dir = tmp / size
    job_dir.mkdir()
    job = {
        "size": size,
        "seq_len": args.seq_len,
        "layout": layout_spec(result).model_dump(),
        "device": "cpu" if args.cpu_check else "cuda",
        "warmup": args.warmup,
        "steps": args.steps,
    }
    (job_dir / "job.json").write_text(json.dumps(job), encoding="utf-8")
    out = job_dir / "out.json"
    argv = torchrun(
        gpus,
        str(Path(__file__).resolve()),
        "--role",
        "worker",
        "--job",
        str(job_dir / "job.json"),
        "--out",
        str(out),
    )
    print(f"{size}: training {args.warmup} + {args.steps} steps on {gpus} process(es)…", flush=True)
    log_path = job_dir / "torchrun.log"
    with log_path.open("wb") as log:
        proc = procs.start(argv, cwd=job_dir, env=child_env(), stdout=log, stderr=log)
    try:
        rc = proc.wait(timeout=RUN_TIMEOUT_S)
    except Exception:
        procs.kill_tree(proc)
        raise
    if rc != 0 or not out.exists():
        tail = log_path.read_text(errors="replace")[-4000:]
        print(f"{size}: the training processes exited with {rc}:\n{tail}")
        return {"size": size, "ran": False, "exit_code": rc}
    got = json.loads(out.read_text(encoding="utf-8"))
    summary = report(size, gpu, gpus, args.seq_len, result, got, args.cpu_check)
    return summary | {
        "ran": True,
        "warnings": [w.code.value for w in result.warnings],
        "notes": notes,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--role", choices=["driver", "worker"], default="driver", help=argparse.SUPPRESS
    )
    parser.add_argument("--job", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    parser.add_argument(
        "--size",
        action="append",
        help="model size from ito.core.model_sizes (repeatable; default: 1b, then 8b if the "
        "planner says it fits)",
    )
    parser.add_argument("--steps", type=int, default=20, help="timed training steps")
    parser.add_argument("--warmup", type=int, default=5, help="untimed steps before them")
    parser.add_argument("--seq-len", type=int, default=4096, help="tokens per sequence")
    parser.add_argument(
        "--global-batch-tokens",
        type=int,
        default=None,
        help="tokens per optimizer step (default: the planner sizes it)",
    )
    parser.add_argument(
        "--gpu",
        default=None,
        help="accelerator name from ito.core.hardware (default: from the CUDA device name)",
    )
    parser.add_argument(
        "--pin",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a layout choice the planner validates instead of choosing (tp=2, pp=2, "
        "micro_batch=4, activation_checkpointing=full, …; repeatable)",
    )
    parser.add_argument(
        "--cpu-check",
        action="store_true",
        help="run the same code path on the CPU (gloo, 2 processes, the cpu stand-in) to check "
        "the bench where no GPU is; says nothing about a GPU",
    )
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory")
    args = parser.parse_args(argv)
    from ito.pipeline.process_exit import leave

    if args.role == "worker":
        worker(args.job, args.out)
        leave(0)

    import torch

    from _common import Processes, exit_on_sigterm

    if args.cpu_check:
        gpu, gpus = "cpu", CPU_CHECK_PROCS
        sizes = args.size or ["tiny"]
        if args.seq_len == parser.get_default("seq_len"):
            args.seq_len = 128
        print("CPU check of the bench's code path (gloo): no figure below is a GPU measurement")
    else:
        if not torch.cuda.is_available():
            print(
                "mfu: no CUDA device on this machine; this bench measures GPU training only, "
                "nothing run"
            )
            return 0
        gpus = torch.cuda.device_count()
        names = sorted({torch.cuda.get_device_name(i) for i in range(gpus)})
        found = {accelerator_for(name) for name in names}
        chosen: str | None = args.gpu or (found.pop() if len(found) == 1 else None)
        if chosen is None:
            print(
                f"mfu: cannot map the CUDA devices {names} to one accelerator of "
                "ito.core.hardware; pass --gpu NAME"
            )
            return 2
        gpu = chosen
        sizes = args.size or list(DEFAULT_SIZES)
        print(f"{gpus} × {names[0]} (planned as {gpu}), NCCL, one node (fabric: nvlink)")

    exit_on_sigterm()
    tmp = Path(tempfile.mkdtemp(prefix="ito-bench-mfu-"))
    procs = Processes(str(tmp))
    try:
        results = []
        for size in sizes:
            results.append(run_size(size, args, gpu, gpus, tmp, procs))
            print()
        print(
            json.dumps(
                {
                    "bench": "mfu",
                    "cpu_check": args.cpu_check,
                    "accelerator": gpu,
                    "gpus": gpus,
                    "torch": torch.__version__,
                    "results": results,
                }
            )
        )
        # A size the planner refuses is an answer; a size whose run crashed is a failure.
        crashed = any("exit_code" in r for r in results)
        return 0 if any(r["ran"] for r in results) and not crashed else 1
    finally:
        procs.kill_all()
        if args.keep:
            print(f"kept {tmp}", file=sys.stderr)
        else:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
