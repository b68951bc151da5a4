"""RLVR's separate rollout worker with bounded staleness (DESIGN §7.6, issue 11 item 4).

The worker is its own process (``python -m ito.pipeline.rollout_worker LOBBY``), started by the
trainer's rank 0 when the run starts (:class:`Standby`: it imports and waits in
``LOBBY`` = ``<workdir>/rollout/<attempt>-<restart>``, so its start-up overlaps the stages
before RLVR), handed the RLVR stage when it starts (``LOBBY/assign`` names the stage's
directory ``DIR`` = ``LOBBY/<stage>``) and stopped when it ends. It holds an unsharded copy
of the policy and a policy **version**; everything between it and the trainer goes through files
under ``DIR``, each written to a temporary name and renamed:

- ``config.pt`` — what the worker needs: the stage's :class:`RlvrStep` (prompts, order, seeds,
  recipe), the model size, RoPE base, first position and how far it may run ahead.
- ``v<version>/rank<r>.pt`` then ``v<version>/READY`` — weights published by the trainer: each
  rank writes the local shards of its DTensor parameters (no rank gathers the model), and rank 0
  marks the version ready once every rank has written. The worker assembles the shards into its
  own copy and deletes the versions older than the one it loaded (its samples carry their
  generating policy's log-probabilities, so nothing needs an old version afterwards).
- ``want-<position>-<attempt>`` — the trainer asks for the batch of a step position.
- ``batch-<position>-<attempt>.pt`` — a step's batch, generated exactly as the synchronous loop
  generates it (same prompts, same per-(step, round, data-parallel rank) seeded generators and
  per-rank batches), every sample tagged with the version that generated it and its
  log-probabilities under it; or the :class:`ItoError` that ended its dynamic sampling.
- ``stop`` — the trainer is done with the stage; ``error`` — the worker failed (its traceback).

Version ``v`` is the policy after the stage's step position ``v``: the trainer publishes ``v``
before it asks for batch ``v``, and consumes batch ``p`` at version ``p`` (lag = ``p`` − the
batch's version). The worker serves requests first; otherwise it generates ahead with its newest
version, up to ``lookahead`` positions past the last request. The default lookahead is
``max_staleness``: the trainer publishes version ``p`` before it asks for batch ``p``, so a batch
started further ahead is certain to pass the bound when consumed (measured: with one more, that
batch was dropped at nearly every step). The trainer's
:class:`~ito.core.rl_batches.StalenessGate` is what guarantees the bound whatever the worker
does (a test hook sets a deeper lookahead to exercise it): it drops a batch whose lag passes
``max_staleness``, counts it, and asks for the same position again (attempt + 1), which the
worker generates with the version the trainer published last — so a consumed batch of lag 0 is
exactly the synchronous loop's.

Where it runs: CPU layouts with FSDP over one mesh dimension in fp32 (no tensor or pipeline
parallelism, no replica groups: the worker's copy computes as the trainer does);
:func:`worker_supported` says so, and the engine falls back to the synchronous loop elsewhere
with a warning. The files assume the trainer's ranks share the workdir's file system (one
node).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from ito.core.errors import ItoError
from ito.core.rl_batches import StalenessGate
from ito.pipeline.replicas import local
from ito.pipeline.rollout_standby import POLL_S, Standby, stop_worker, touch

if TYPE_CHECKING:
    from ito.pipeline.layout import EngineLayout
    from ito.pipeline.post_training import Group, RlvrStep

__all__ = ["RolloutClient", "Standby", "assemble", "publish_weights", "worker_supported"]

WAIT_S = 600.0
"""Longest the trainer waits for one batch before it declares the worker failed."""


def worker_supported(layout: EngineLayout, device: torch.device, replicated: bool) -> bool:
    """Whether the separate worker can serve this layout (see the module docstring)."""
    return (
        device.type == "cpu"
        and layout.tp == 1
        and layout.pp == 1
        and layout.cp == 1
        and layout.dp_replicate == 1
        and layout.param_dtype == torch.float32
        and not replicated
    )


def _atomic_save(obj: object, path: Path) -> None:
    tmp = path.with_name(path.name + ".tmp")
    torch.save(obj, tmp)
    os.replace(tmp, path)


def publish_weights(model: torch.nn.Module, root: Path, version: int) -> None:
    """Every rank of the world writes its local shards of ``model`` as ``version``; rank 0
    marks it ``READY`` once all have (collective)."""
    rank = dist.get_rank()
    directory = root / f"v{version}"
    directory.mkdir(parents=True, exist_ok=True)
    shards = {}
    for name, param in model.named_parameters():
        placements = getattr(param, "placements", None)
        dims = [p.dim for p in placements if p.is_shard()] if placements is not None else []
        shards[name] = (
            local(param.detach()).clone(),
            dims[0] if dims else None,
            tuple(param.shape),
        )
    _atomic_save(shards, directory / f"rank{rank}.pt")
    dist.barrier()
    if rank == 0:
        touch(directory / "READY")


def assemble(directory: Path, world: int) -> dict[str, torch.Tensor]:
    """The whole state dict of a published version: each parameter's rank shards joined along
    its sharded dimension in rank order (FSDP2's even chunks), trimmed to its global shape."""
    parts = [torch.load(directory / f"rank{r}.pt", weights_only=True) for r in range(world)]
    state = {}
    for name, (first, dim, shape) in parts[0].items():
        if dim is None:
            state[name] = first
            continue
        whole = torch.cat([p[name][0] for p in parts], dim=dim)
        state[name] = whole.narrow(dim, 0, shape[dim])
    return state


@dataclass(frozen=True)
class WorkerConfig:
    rlvr: RlvrStep
    size: str
    rope_base: float
    world: int
    """Trainer ranks that publish shards."""
    first: int
    """First step position of the stage (a resumed stage starts past 0)."""
    end: int
    """Position past the stage's last."""
    lookahead: int
    max_staleness: int


# ---- trainer side -----------------------------------------------------------------------------


class RolloutClient:
    """The trainer's end: every rank publishes and reads; rank 0 also starts, asks and stops."""

    def __init__(self, root: Path, config: WorkerConfig, rank: int) -> None:
        self.root = root
        self.config = config
        self.rank = rank
        self.proc: subprocess.Popen[bytes] | None = None
        self.gate = StalenessGate(config.max_staleness)

    def start(self, standby: Standby | None = None) -> None:
        """Rank 0 hands the stage to a worker (collective): ``standby``, the one started with
        the run, or one it starts now. The stage's directory is inside the attempt's and
        restart's own lobby, and whatever earlier ones left beside it is removed: a worker of a
        crashed world that has not exited yet writes nowhere a new one reads."""
        if self.rank == 0:
            if standby is None or standby.proc.poll() is not None:
                standby = Standby.start(self.root.parent)
            self.root.mkdir(parents=True)
            _atomic_save(self.config, self.root / "config.pt")
            tmp = standby.lobby / "assign.tmp"
            tmp.write_text(self.root.name)
            os.replace(tmp, standby.lobby / "assign")
            self.proc = standby.proc
        dist.barrier()

    def stop(self, *, abandon: bool = False) -> None:
        """Asks the worker to end, waits for it and removes the directory (rank 0, once every
        rank has read its batches; a no-op on the other ranks). ``abandon`` (the stage failed):
        kill it instead, at once — the other ranks are failing too, and torchrun stops rank 0
        when the first of them exits, so rank 0 must reach its final event without waiting for
        a worker in the middle of a batch."""
        if self.proc is None:
            return
        if abandon:
            self.proc.kill()
            self.proc.wait()
        else:
            stop_worker(self.proc, self.root / "stop")
        self.proc = None
        shutil.rmtree(self.root.parent, ignore_errors=True)
        with contextlib.suppress(OSError):
            self.root.parent.parent.rmdir()

    def batch(self, model: torch.nn.Module, position: int) -> tuple[list[Group], dict[str, float]]:
        """Publish the policy as version ``position``, then the batch of ``position`` whose lag
        is within bounds (stale ones dropped and asked for again) and its figures: the rollout
        figures and the staleness ones (``rollout_lag_<n>`` samples offered at lag n,
        ``rollout_dropped`` samples dropped, ``rollout_lag_max`` of those consumed)."""
        publish_weights(model, self.root, position)
        gate = StalenessGate(self.config.max_staleness)
        attempt = 0
        while True:
            if self.rank == 0:
                touch(self.root / f"want-{position}-{attempt}")
            found = self._wait(self.root / f"batch-{position}-{attempt}.pt")
            if isinstance(found, dict) and "code" in found:
                raise ItoError(found["code"], found["message"], **found["details"])
            version, groups, figures = found
            samples = sum(len(g.samples) for g in groups)
            admitted = [gate.admit(version, position) for _ in range(samples)]
            if all(admitted):
                break
            attempt += 1
        lag = position - version
        if lag == 0:
            # Generated by the current policy itself: ratio 1, as in the synchronous loop.
            groups = [
                replace(g, samples=tuple(replace(s, old_logps=None) for s in g.samples))
                for g in groups
            ]
        self.gate.dropped += gate.dropped
        self.gate.lags.update(gate.lags)
        out = dict(figures)
        out.update({f"rollout_lag_{n}": float(c) for n, c in sorted(gate.lags.items())})
        out["rollout_dropped"] = float(gate.dropped)
        out["rollout_lag_max"] = float(lag)
        return groups, out

    def _wait(self, path: Path) -> Any:
        deadline = time.monotonic() + WAIT_S
        while not path.exists():
            errors = [p for p in (self.root / "error", self.root.parent / "error") if p.exists()]
            failed = errors or (self.proc is not None and self.proc.poll() is not None)
            if failed or time.monotonic() > deadline:
                raise ItoError(
                    "rollout_worker_failed",
                    errors[0].read_text()[-2000:] if errors else None,
                    waited_for=path.name,
                )
            time.sleep(POLL_S)
        return torch.load(path, weights_only=False)


# ---- worker side ------------------------------------------------------------------------------


class _Worker:
    def __init__(self, root: Path, config: WorkerConfig, parent: int) -> None:
        from transformers import LlamaForCausalLM

        from ito.core.model_sizes import SIZES
        from ito.pipeline.loss import use_chunked_loss
        from ito.pipeline.model import llama_config, set_rope_base

        self.root = root
        self.config = config
        self.model = LlamaForCausalLM(llama_config(SIZES[config.size]))
        use_chunked_loss(self.model)
        set_rope_base(self.model, config.rope_base)
        self.version = -1
        self.parent = parent

    def _newest(self) -> int:
        versions = [
            int(m.group(1))
            for p in self.root.iterdir()
            if (m := re.fullmatch(r"v(\d+)", p.name)) and (p / "READY").exists()
        ]
        return max(versions, default=-1)

    def _load_newest(self) -> None:
        newest = self._newest()
        if newest > self.version:
            state = assemble(self.root / f"v{newest}", self.config.world)
            self.model.load_state_dict(state)
            self.version = newest
            for p in self.root.iterdir():
                m = re.fullmatch(r"v(\d+)", p.name)
                if m and int(m.group(1)) < newest:
                    shutil.rmtree(p, ignore_errors=True)

    def _requests(self) -> tuple[int, int] | None:
        wants = [
            (int(m.group(1)), int(m.group(2)))
            for p in self.root.iterdir()
            if (m := re.fullmatch(r"want-(\d+)-(\d+)", p.name))
        ]
        return max(wants, default=None)

    def _generate(self, position: int, attempt: int) -> None:
        self._load_newest()
        rlvr = self.config.rlvr
        version = self.version

        def round_fn(step: int, round_: int) -> list[Group]:
            return [
                g for d in range(rlvr.dp_world) for g in rlvr.groups(self.model, step, round_, d)
            ]

        try:
            groups, figures = rlvr.rollout(round_fn, position)
        except ItoError as exc:
            out: object = {"code": exc.code, "message": exc.message, "details": exc.details}
        else:
            out = (version, rlvr.with_old_logps(self.model, groups), figures)
        _atomic_save(out, self.root / f"batch-{position}-{attempt}.pt")

    def run(self) -> None:
        done: set[tuple[int, int]] = set()
        ahead = self.config.first
        while not (self.root / "stop").exists():
            if os.getppid() != self.parent:
                return  # the trainer's rank 0 is gone
            request = self._requests()
            if request is not None and request not in done:
                self._generate(*request)
                done.add(request)
                ahead = max(ahead, request[0] + 1)
                continue
            last = request[0] if request is not None else self.config.first - 1
            if (
                self._newest() >= 0
                and ahead < self.config.end
                and ahead <= last + self.config.lookahead
            ):
                self._generate(ahead, 0)
                done.add((ahead, 0))
                ahead += 1
                continue
            time.sleep(POLL_S)


def _assigned(lobby: Path, parent: int) -> Path | None:
    """Wait in ``lobby`` for the stage directory :meth:`RolloutClient.start` assigns;
    ``None`` when told to stop or when ``parent``, the process that started this one, is
    gone (checked by pid: it may be gone before this process could ask for its parent)."""
    while not (lobby / "stop").exists():
        assign = lobby / "assign"
        if assign.exists():
            return lobby / assign.read_text()
        if os.getppid() != parent:
            return None
        time.sleep(POLL_S)
    return None


def main(argv: list[str] | None = None) -> int:
    args = argv or sys.argv[1:]
    lobby, parent = Path(args[0]), int(args[1])
    root = lobby
    try:
        torch.set_num_threads(1)
        # Imported while waiting, not when the stage starts (seconds: the model's module
        # alone is most of them).
        import transformers.models.llama.modeling_llama  # noqa: F401

        import ito.pipeline.loss
        import ito.pipeline.model
        import ito.pipeline.post_training  # noqa: F401

        found = _assigned(lobby, parent)
        if found is None:
            return 0
        root = found
        config: WorkerConfig = torch.load(root / "config.pt", weights_only=False)
        _Worker(root, config, parent).run()
    except Exception:
        (root / "error").write_text(traceback.format_exc())
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
