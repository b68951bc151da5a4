"""Entry point of the pretrain engine: ``torchrun … -m ito.pipeline.run --spec /abs/spec.json``.

Exit status 0 means the run reached an end the events describe (``done`` with ``succeeded``,
``gate_failed``, or ``failed`` with a registered, non-retryable code); anything else is a crash,
which torchrun may answer with a restart that resumes from the newest committed checkpoint. On
CPU the process group is gloo; with CUDA it is NCCL for the tensors and gloo beside it
(checkpoint uploads need a CPU backend).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import traceback
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING

from ito.pipeline.rollout_standby import Standby, lobby_path

if TYPE_CHECKING:
    from ito.core.errors import ItoError
    from ito.pipeline.events import EventWriter

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ito.pipeline.run")
    parser.add_argument("--spec", required=True, type=Path, help="absolute path of spec.json")
    parser.add_argument(
        "--replica-id",
        type=int,
        default=None,
        help="this world's replica group (runs with several replica groups)",
    )
    parser.add_argument("--lighthouse", default=None, help="the torchft lighthouse's URL")
    args = parser.parse_args(argv)
    standby = _early_standby(args.spec)

    import torch
    import torch.distributed as dist

    from ito.core.errors import ItoError
    from ito.pipeline.accelerator import accelerator_problem
    from ito.pipeline.events import EventWriter
    from ito.pipeline.spec import Replica, load_spec
    from ito.pipeline.train import Trainer

    spec = load_spec(args.spec)
    groups = spec.manifest.resources.replica_groups
    if groups > 1 or args.replica_id is not None:
        if args.replica_id is None or args.lighthouse is None or not 0 <= args.replica_id < groups:
            parser.error(
                f"this run has {groups} replica group(s): pass --replica-id in "
                f"[0, {groups}) and --lighthouse"
            )
        spec = dataclasses.replace(spec, replica=Replica(args.replica_id, groups, args.lighthouse))
    # Before any device is touched: a GPU booking whose GPUs this process does not see fails
    # ``accelerator_unavailable`` (below, once every rank has said), never trains on CPU.
    problem = accelerator_problem(spec.accelerator)
    # A ``cpu`` stand-in booking trains exactly its stored plan — fp32 on the CPU — even on a
    # host that has CUDA (whose devices its ranks were never given).
    stand_in = spec.accelerator is not None and spec.accelerator.gpu == "cpu"
    if torch.cuda.is_available() and problem is None and not stand_in:
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
        _init_process_group("cpu:gloo,cuda:nccl")
    else:
        device = torch.device("cpu")
        _init_process_group("gloo")
    ckpt_group = dist.new_group(backend="gloo")
    events = EventWriter(spec.events_path, enabled=dist.get_rank() == 0)
    # Every rank learns every rank's answer, so all stop together, before any training step.
    problems: list[str | None] = [None] * dist.get_world_size()
    dist.all_gather_object(problems, problem, group=ckpt_group)
    refused = [(rank, why) for rank, why in enumerate(problems) if why is not None]
    if refused:
        rank, why = refused[0]
        reason = f"rank {rank}: {why}"
        events.log("error", reason)
        # A clean end the events describe (exit 0): torchrun must not restart it, the worker
        # fails the run with the code.
        events.emit("done", status="failed", code="accelerator_unavailable", reason=reason[:500])
        events.close()
        dist.destroy_process_group()
        return 0
    try:
        restarts = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
        if restarts:
            # torchrun restarted the ranks after a failure: an interruption the desk must see.
            events.emit("restart", restarts=restarts)
        events.log(
            "info",
            f"run {spec.run_id} attempt {spec.attempt}: "
            f"{dist.get_world_size()} ranks on {device.type}, "
            f"stages {', '.join(spec.stages)}",
        )
        Trainer(spec, events, device, ckpt_group, standby).run()
    except ItoError as exc:
        if exc.retryable:
            events.log("error", traceback.format_exc(limit=20))
            raise  # a transient condition: torchrun's restart may get past it
        # A registered, non-retryable outcome (a data or revision error, the rewards giving
        # nothing to learn from, the checkpoint storage failing its proof on disk) is the same
        # on a second try: the run ends once, with its code, never restarted, never counted as
        # an interruption (DESIGN §7.3). Whichever rank found it says so — rank 0 through its
        # writer, the others by appending the same ``done`` line (whole lines, O_APPEND) — and
        # leaves cleanly; the worker stops the rest of the job on reading it.
        events.log("error", f"rank {dist.get_rank()}: {exc.code}: {exc.message}"[:3000])
        _final_event(spec.events_path, events, exc)
        return 0
    except BaseException:
        events.log("error", traceback.format_exc(limit=20))
        raise
    finally:
        events.close()
    dist.destroy_process_group()
    return 0


def _final_event(path: Path, events: EventWriter, exc: ItoError) -> None:
    """The run's ``done`` event for a coded, non-retryable error, from whichever rank found it."""
    from ito.pipeline.events import EventWriter as Writer

    fields = {"status": "failed", "code": exc.code, "reason": exc.message[:500]}
    if events.enabled:
        events.emit("done", **fields)
        return
    own = Writer(path, enabled=True)
    try:
        own.emit("done", **fields)
    finally:
        own.close()


def _early_standby(spec_path: Path) -> Standby | None:
    """Rank 0 starts RLVR's rollout worker first thing, before torch is imported, when the
    spec's RLVR stage asks for one (``rollout_worker``, or by default ``max_staleness`` ≥ 1):
    its start-up then overlaps the trainer's own. A guess from the raw spec, for speed only —
    the engine decides (its layout may not be one the worker serves) and closes it if not; a
    spec that does not load leaves it to exit with this process."""
    if os.environ.get("RANK", "0") != "0":
        return None
    try:
        doc = json.loads(spec_path.read_text())
        rlvr = doc["manifest"]["post_training"]["rlvr"]
        wanted = doc.get("rollout_worker")
        if wanted is None:
            wanted = rlvr["max_staleness"] > 0
        if "rlvr" not in doc["stages"] or not wanted:
            return None
        return Standby.start(lobby_path(Path(doc["workdir"]), int(doc["attempt"])))
    except (OSError, ValueError, KeyError, TypeError):
        return None  # load_spec says what is wrong


def _init_process_group(backend: str) -> None:
    """``init_process_group`` from torchrun's environment, isolated from earlier restarts.

    torchrun (c10d rendezvous, torch 2.13) shares one TCPStore between all restarts of a worker
    group, so a restarted rank can read the previous generation's gloo/NCCL addresses and fail
    to connect (pytorch/pytorch#135712). On one node every worker of a generation sees the same
    ``TORCHELASTIC_RESTART_COUNT``, so a store prefix of it isolates the generations; across
    nodes the counts can differ, and the launcher must set ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``
    (each rendezvous round then gets a fresh store).
    """
    import torch.distributed as dist

    timeout = timedelta(minutes=10)
    shared = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    single_node = os.environ.get("LOCAL_WORLD_SIZE") == os.environ.get("WORLD_SIZE")
    if not (shared and single_node):
        dist.init_process_group(backend, timeout=timeout)
        return
    store = dist.TCPStore(  # type: ignore[attr-defined]
        os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False, timeout=timeout
    )
    generation = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    isolated = dist.PrefixStore(f"ito/gen{generation}", store)  # type: ignore[attr-defined]
    dist.init_process_group(
        backend,
        store=isolated,
        rank=int(os.environ["RANK"]),
        world_size=int(os.environ["WORLD_SIZE"]),
        timeout=timeout,
    )


if __name__ == "__main__":
    # The guard matters: DCP's process-based async helpers start with "spawn" and re-import
    # the entry module. A rank that returns has written its events: it leaves without the
    # interpreter's teardown, which now and then aborts a finished gloo process (process_exit).
    from ito.pipeline.process_exit import leave

    leave(main())
