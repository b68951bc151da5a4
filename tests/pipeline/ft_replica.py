"""One fault-tolerant replica group, run only by the tests (tests/pipeline/test_fault_tolerance.py):
``python -m tests.pipeline.ft_replica --replica-id N --lighthouse http://host:port --steps S
--out FILE [--kill-at STEP]`` from the repository root.

Trains the tiny Llama on synthetic token batches under a torchft Manager
(:mod:`tests.pipeline.ft_trainer`) and appends one JSON object per line to ``FILE`` through
:class:`~ito.pipeline.events.EventWriter` (every line has ``type`` and ``ts``):

- ``{"type": "started", "replica", "pid"}``
- ``{"type": "recovered", "replica", "step", "seconds"}``: state loaded from a live peer; ``step``
  is the committed step it caught up to, ``seconds`` the quorum round that included the fetch.
- ``{"type": "step", "replica", "step", "loss", "mean_loss", "participants", "committed",
  "grad_norm", "params", "seconds"}`` (:class:`~tests.pipeline.ft_trainer.StepRecord`)
- ``{"type": "finished", "replica", "step"}``

Exit status 0 once ``--steps`` steps are committed. Appending lets a restarted replica write to
the same file as its previous life.
"""

from __future__ import annotations

import argparse
import logging
import os
import socket
import sys
from dataclasses import asdict
from pathlib import Path

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.pipeline.ft_replica")
    parser.add_argument("--replica-id", type=int, required=True)
    parser.add_argument("--lighthouse", required=True, help="the lighthouse's http://host:port")
    parser.add_argument("--steps", type=int, required=True, help="committed steps to train")
    parser.add_argument("--out", type=Path, required=True, help="JSON lines file (appended)")
    parser.add_argument(
        "--kill-at",
        type=int,
        default=None,
        help="fault injection: SIGKILL this process mid-step at this step",
    )
    parser.add_argument("--size", default="tiny")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--timeout-s",
        type=float,
        default=10.0,
        help="bound on a collective, a commit round and a peer checkpoint fetch",
    )
    parser.add_argument(
        "--min-step-seconds",
        type=float,
        default=0.0,
        help="pace steps to at least this long (stands in for a bigger model)",
    )
    parser.add_argument(
        "--host", default=socket.gethostname(), help="name peers reach this replica by"
    )
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--log-level", default="WARNING", help="torchft's log level on stderr")
    args = parser.parse_args(argv)

    logging.basicConfig(
        level=args.log_level.upper(),
        stream=sys.stderr,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
    )
    import torch

    from ito.pipeline.events import EventWriter
    from tests.pipeline.ft_trainer import ReplicaSettings, ReplicaTrainer, StepRecord

    torch.set_num_threads(args.threads)
    settings = ReplicaSettings(
        replica_id=args.replica_id,
        lighthouse=args.lighthouse,
        steps=args.steps,
        host=args.host,
        size=args.size,
        seed=args.seed,
        timeout_s=args.timeout_s,
        min_step_seconds=args.min_step_seconds,
        kill_at=args.kill_at,
    )
    writer = EventWriter(args.out, enabled=True)
    replica = args.replica_id

    def on_step(record: StepRecord) -> None:
        writer.emit("step", replica=replica, **asdict(record))

    def on_recovered(step: int, seconds: float) -> None:
        writer.emit("recovered", replica=replica, step=step, seconds=seconds)

    try:
        writer.emit("started", replica=replica, pid=os.getpid())
        trainer = ReplicaTrainer(settings, on_step=on_step, on_recovered=on_recovered)
        step = trainer.train()
        writer.emit("finished", replica=replica, step=step)
    finally:
        writer.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
