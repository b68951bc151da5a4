"""Checkpoint bench: training-blocking time of the engine's async DCP saves ÷ a synchronous
``dcp.save`` of the same state, and checkpoint bandwidth ÷ a raw sequential write.

Under ``torchrun --standalone --nproc-per-node=2`` (gloo), each rank builds the engine's model
(``ito.pipeline.model.build_model``, default size ``150m`` from ``ito.core.model_sizes``: 134M
parameters, FSDP2 ``fully_shard`` per decoder layer and at the root) and its AdamW, takes one
training step so the optimizer state exists (model + two moments ≈ 1.6 GB in all, half per
rank), then, ``--reps`` times, in this order:

1. **sync**: ``dcp.save`` of the state the engine checkpoints (``get_state_dict`` of model and
   optimizer, the trainer record, the rank's RNG record) on the checkpoint gloo group. Training
   is blocked for the whole call, which is also the writing time.
2. **async (engine)**: the engine's own saver, ``ito.pipeline.checkpoint.Checkpointer`` (async
   DCP with a ``DefaultStager`` staging in a background thread), driven in the engine's order:
   ``save()``, the next step's forward and backward (overlapping staging and upload),
   ``wait_staging()`` right before ``optimizer.step()``, then ``finish()`` (upload done, COMMIT
   written). Training-blocking time = the ``save()`` call + the ``wait_staging()`` wait (the
   engine's ``blocking_seconds``). Writing time = the engine's ``seconds`` (from ``save()`` to
   upload done), bandwidth = committed bytes ÷ that, as telemetry computes it. On CPU the step's
   compute competes with staging and upload for the same cores, so this bandwidth is reported
   but not judged;
2b. the same saver with nothing running beside it (``save()`` then ``finish()``): the saver's
   own writing speed (staging included), the figure the bandwidth goal is judged on; here
   ``wait_staging()`` is called at once, so its blocking is the worst case (a next step shorter
   than staging), reported beside the engine-order figure.
3. **async (default options)**, context only (``--no-default-async`` skips it):
   ``dcp.async_save`` without a stager, which copies the state before returning.
4. **raw** (rank 0, the other rank waiting): ``os.write`` of as many bytes as the sync
   checkpoint holds, in 64 MiB chunks of random bytes, then ``fsync``, into the same directory
   (same filesystem) — the sequential-write ceiling.

Blocking is the slower rank's (training waits for both); each figure is the median over the
repetitions, after one unrecorded warm-up round of every path. Goals: blocking async ÷ sync
≤ 0.2; bandwidth ÷ raw ≥ 0.5. The disk's speed varies from one write to the next (page cache,
the virtual disk's host), so single repetitions spread; the medians are the figures. It prints
tables and, last, one JSON line. Loopback only; every process it starts is killed in
``finally``.

Usage: ``.venv/bin/python bench/checkpoint.py [--size 150m] [--reps 3]``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

NPROC = 2
CHUNK = 64 << 20
RUN_TIMEOUT_S = 900.0


def dir_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def raw_write(directory: Path, nbytes: int, chunk: bytes) -> float:
    """Seconds to write ``nbytes`` sequentially with ``os.write`` and ``fsync`` them."""
    path = directory / "raw.bin"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        start = time.perf_counter()
        left = nbytes
        while left > 0:
            left -= os.write(fd, chunk[: min(left, len(chunk))])
        os.fsync(fd)
        seconds = time.perf_counter() - start
    finally:
        os.close(fd)
        path.unlink()
    return seconds


# ---------------------------------------------------------------------------------------------
# The worker (runs under torchrun)


def worker(out_dir: Path, size_name: str, reps: int, default_async: bool) -> None:
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    from ito.core.model_sizes import SIZES
    from ito.pipeline.checkpoint import Checkpointer, rng_record
    from ito.pipeline.data import seed_from
    from ito.pipeline.events import EventWriter
    from ito.pipeline.layout import EngineLayout, build_mesh
    from ito.pipeline.model import build_model, build_optimizer

    dist.init_process_group("gloo")
    group = dist.new_group(backend="gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    size = SIZES[size_name]
    layout = EngineLayout.default(world)
    mesh = build_mesh("cpu", layout)
    model = build_model(size, seed_from("bench-checkpoint"), mesh, layout, torch.device("cpu"))
    optimizer = build_optimizer(model, size_name)
    generator = torch.Generator().manual_seed(rank)

    def forward_backward() -> float:
        start = time.perf_counter()
        batch = torch.randint(0, size.vocab, (1, 64), generator=generator)
        model(input_ids=batch, labels=batch).loss.backward()
        return time.perf_counter() - start

    forward_backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    params = sum(p.numel() for p in model.parameters())  # DTensor numel is the global size

    def state(step: int) -> dict[str, Any]:
        model_sd, optim_sd = get_state_dict(model, optimizer)
        return {
            "model": model_sd,
            "optim": optim_sd,
            "trainer": json.dumps({"step": step}).encode(),
            f"rng_rank{rank}": rng_record(),
        }

    events = EventWriter(out_dir / "events.jsonl", enabled=rank == 0)
    checkpointer = Checkpointer(out_dir / "async", 1, events, group)
    chunk = os.urandom(CHUNK) if rank == 0 else b""
    rows: list[dict[str, Any]] = []
    for rep in range(-1, reps):  # rep -1 warms every path up and is not recorded
        row: dict[str, Any] = {"rep": rep}
        # 1. synchronous dcp.save
        path = out_dir / "sync" / f"rep{rep}"
        dist.barrier()
        start = time.perf_counter()
        dcp.save(state(rep), checkpoint_id=str(path), process_group=group)
        row["sync_seconds"] = time.perf_counter() - start
        dist.barrier()
        if rank == 0:
            row["sync_bytes"] = dir_bytes(path)
            shutil.rmtree(path)
        # 2. the engine's async saver, in the engine's order
        dist.barrier()
        start = time.perf_counter()
        checkpointer.save(
            stage="pretrain",
            step=rep + 1,
            tokens_seen=0,
            model=model,
            optimizer=optimizer,
            trainer={"step": rep + 1},
        )
        row["async_call"] = time.perf_counter() - start
        row["overlapped_compute"] = forward_backward()
        start = time.perf_counter()
        checkpointer.wait_staging()
        row["async_wait_staging"] = time.perf_counter() - start
        row["async_blocking"] = row["async_call"] + row["async_wait_staging"]
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        start = time.perf_counter()
        checkpointer.finish()
        row["async_finish_wait"] = time.perf_counter() - start
        # 2b. the same saver with nothing else running: its own writing speed
        dist.barrier()
        start = time.perf_counter()
        checkpointer.save(
            stage="pretrain",
            step=1000 + rep,
            tokens_seen=0,
            model=model,
            optimizer=optimizer,
            trainer={"step": 1000 + rep},
        )
        checkpointer.wait_staging()
        row["staging_at_once"] = time.perf_counter() - start
        checkpointer.finish()
        # 3. async_save with default options (copies before returning)
        if default_async:
            path = out_dir / "default" / f"rep{rep}"
            dist.barrier()
            start = time.perf_counter()
            future = dcp.async_save(state(rep), checkpoint_id=str(path), process_group=group)
            row["default_async_blocking"] = time.perf_counter() - start
            future.result()
            row["default_async_seconds"] = time.perf_counter() - start
            dist.barrier()
            if rank == 0:
                shutil.rmtree(path)
        # 4. raw sequential write of the same number of bytes, same filesystem
        dist.barrier()
        if rank == 0:
            row["raw_seconds"] = raw_write(out_dir, row["sync_bytes"], chunk)
        dist.barrier()
        if rep >= 0:
            rows.append(row)
    checkpointer.close()
    events.close()
    gathered: list[list[dict[str, Any]] | None] = [None] * world
    dist.all_gather_object(gathered, rows)
    if rank == 0:
        (out_dir / "result.json").write_text(
            json.dumps({"parameters": params, "ranks": gathered}), encoding="utf-8"
        )
    dist.destroy_process_group()


# ---------------------------------------------------------------------------------------------
# The driver


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--role", choices=["driver", "worker"], default="driver", help=argparse.SUPPRESS
    )
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--size", default="150m", help="model size from ito.core.model_sizes")
    parser.add_argument("--reps", type=int, default=3, help="repetitions (median reported)")
    parser.add_argument(
        "--no-default-async",
        dest="default_async",
        action="store_false",
        help="skip the default-options async_save row",
    )
    parser.add_argument(
        "--dir",
        type=Path,
        default=None,
        help="parent of the temporary directory (the filesystem under test)",
    )
    args = parser.parse_args(argv)
    from ito.pipeline.process_exit import leave

    if args.role == "worker":
        worker(args.out, args.size, args.reps, args.default_async)
        leave(0)

    from _common import (
        Processes,
        child_env,
        exit_on_sigterm,
        goal,
        median,
        read_events,
        rnd,
        table,
        torchrun,
    )

    exit_on_sigterm()
    tmp = Path(tempfile.mkdtemp(prefix="ito-bench-ckpt-", dir=args.dir))
    procs = Processes(str(tmp))
    try:
        argv_ = torchrun(
            NPROC,
            str(Path(__file__).resolve()),
            "--role",
            "worker",
            "--out",
            str(tmp),
            "--size",
            args.size,
            "--reps",
            str(args.reps),
            *([] if args.default_async else ["--no-default-async"]),
        )
        print(
            f"model {args.size}, {NPROC} ranks (gloo, FSDP2), {args.reps} repetitions, "
            f"directory {tmp}",
            flush=True,
        )
        log = (tmp / "torchrun.log").open("wb")
        proc = procs.start(argv_, cwd=tmp, env=child_env(), stdout=log, stderr=log)
        log.close()
        rc = proc.wait(timeout=RUN_TIMEOUT_S)
        if rc != 0:
            tail = (tmp / "torchrun.log").read_text(errors="replace")[-4000:]
            print(tail, file=sys.stderr)
            raise SystemExit(f"the torchrun worker exited with {rc}")
        result = json.loads((tmp / "result.json").read_text(encoding="utf-8"))
        ranks: list[list[dict[str, Any]]] = result["ranks"]
        ckpts = [e for e in read_events(tmp / "events.jsonl") if e["type"] == "checkpoint"]

        per_rep = []
        for rep in range(args.reps):
            rows = [r[rep] for r in ranks]
            lead = rows[0]
            ck = next(c for c in ckpts if c["step"] == rep + 1)
            idle = next(c for c in ckpts if c["step"] == 1000 + rep)

            def worst(key: str, rows: list[dict[str, Any]] = rows) -> float | None:
                values = [r[key] for r in rows if key in r]
                return max(values) if values else None

            per_rep.append(
                {
                    "rep": rep,
                    "sync_blocking": worst("sync_seconds"),
                    "async_blocking": worst("async_blocking"),
                    "async_call": worst("async_call"),
                    "async_wait_staging": worst("async_wait_staging"),
                    "engine_blocking_seconds": ck.get("blocking_seconds"),
                    "overlapped_compute": worst("overlapped_compute"),
                    "staging_at_once": worst("staging_at_once"),
                    "default_async_blocking": worst("default_async_blocking"),
                    "sync_bytes": lead["sync_bytes"],
                    "async_bytes": ck["bytes"],
                    "async_seconds": ck["seconds"],
                    "raw_seconds": lead["raw_seconds"],
                    "idle_seconds": idle["seconds"],
                    "idle_bytes": idle["bytes"],
                    "sync_bw": lead["sync_bytes"] / worst("sync_seconds"),  # type: ignore[operator]
                    "async_bw": ck["bytes"] / ck["seconds"],
                    "idle_bw": idle["bytes"] / idle["seconds"],
                    "raw_bw": lead["sync_bytes"] / lead["raw_seconds"],
                    "default_async_seconds": worst("default_async_seconds"),
                }
            )

        def med(key: str) -> float | None:
            return median([r[key] for r in per_rep if r[key] is not None])

        m = {k: med(k) for k in per_rep[0] if k != "rep"}
        blocking_ratio = m["async_blocking"] / m["sync_blocking"]  # type: ignore[operator]
        worst_ratio = m["staging_at_once"] / m["sync_blocking"]  # type: ignore[operator]
        bw_ratio = m["idle_bw"] / m["raw_bw"]  # type: ignore[operator]
        contended_ratio = m["async_bw"] / m["raw_bw"]  # type: ignore[operator]
        sync_bw_ratio = m["sync_bw"] / m["raw_bw"]  # type: ignore[operator]
        mb = 1e6
        rows_ = [
            [
                "sync dcp.save",
                m["sync_blocking"],
                m["sync_blocking"],
                m["sync_bytes"],
                m["sync_bw"] / mb,
            ],  # type: ignore[operator]
            [
                "async, engine saver, engine order",
                m["async_blocking"],
                m["async_seconds"],
                m["async_bytes"],
                m["async_bw"] / mb,
            ],  # type: ignore[operator]
            [
                "async, engine saver, nothing else *",
                m["staging_at_once"],
                m["idle_seconds"],
                m["idle_bytes"],
                m["idle_bw"] / mb,
            ],  # type: ignore[operator]
        ]
        if args.default_async:
            rows_.append(
                [
                    "async_save, default options",
                    m["default_async_blocking"],
                    m["default_async_seconds"],
                    None,
                    None,
                ]
            )
        rows_.append(
            ["raw os.write + fsync", None, m["raw_seconds"], m["sync_bytes"], m["raw_bw"] / mb]
        )  # type: ignore[operator]
        print()
        print(
            table(
                f"medians over {args.reps} repetitions ({result['parameters']:,} parameters)",
                ["save", "blocking s", "writing s", "bytes", "MB/s"],
                rows_,
            )
        )
        print(
            "* blocking there = save() + wait_staging() called at once: the worst case, a "
            "next step shorter than staging"
        )
        print()
        print(
            table(
                "per repetition",
                [
                    "rep",
                    "sync block s",
                    "async block s",
                    "save() s",
                    "wait_staging s",
                    "overlapped fwd+bwd s",
                    "async MB/s (engine order)",
                    "async MB/s (alone)",
                    "sync MB/s",
                    "raw MB/s",
                ],
                [
                    [
                        r["rep"],
                        r["sync_blocking"],
                        r["async_blocking"],
                        r["async_call"],
                        r["async_wait_staging"],
                        r["overlapped_compute"],
                        r["async_bw"] / mb,
                        r["idle_bw"] / mb,
                        r["sync_bw"] / mb,
                        r["raw_bw"] / mb,
                    ]
                    for r in per_rep
                ],
            )
        )
        print()
        block_ok = goal(blocking_ratio, 0.2, at_least=False)
        bw_ok = goal(bw_ratio, 0.5, at_least=True)
        print(
            f"blocking async ÷ sync   {blocking_ratio:.4f}  (goal ≤ 0.2: "
            f"{'met' if block_ok else 'NOT met'}); worst case (wait_staging at once) "
            f"{worst_ratio:.4f}"
        )
        print(
            f"bandwidth async ÷ raw   {bw_ratio:.3f}  (goal ≥ 0.5: "
            f"{'met' if bw_ok else 'NOT met'}); while a training step competes for the "
            f"CPUs {contended_ratio:.3f}; sync dcp.save ÷ raw {sync_bw_ratio:.3f}"
        )
        summary = {
            "bench": "checkpoint",
            "size": args.size,
            "parameters": result["parameters"],
            "world": NPROC,
            "backend": "gloo",
            "sharding": "fsdp2",
            "reps": args.reps,
            "medians": {k: rnd(v, 6) for k, v in m.items()},
            "ratio_blocking_async_vs_sync": rnd(blocking_ratio, 5),
            "goal_blocking": 0.2,
            "goal_blocking_met": block_ok,
            "ratio_blocking_worst_case_vs_sync": rnd(worst_ratio, 5),
            "ratio_bandwidth_vs_raw": rnd(bw_ratio),
            "ratio_bandwidth_vs_raw_during_training_step": rnd(contended_ratio),
            "goal_bandwidth": 0.5,
            "goal_bandwidth_met": bw_ok,
            "ratio_sync_bandwidth_vs_raw": rnd(sync_bw_ratio),
            "per_rep": [
                {k: (rnd(v, 6) if isinstance(v, float) else v) for k, v in r.items()}
                for r in per_rep
            ],
        }
        print(json.dumps(summary))
        return 0
    finally:
        procs.kill_all()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
