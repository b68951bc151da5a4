"""A test-only replica trainer: per-step fault tolerance across replica groups with torchft on a
plain (unsharded) model, run by :mod:`tests.pipeline.ft_replica`. It shows torchft's guarantee in
isolation; the runtime's own replica groups are :mod:`ito.pipeline.replicas` inside the pretrain
engine (DESIGN §7.3).

Each replica group trains a full copy of the model. Every step it joins a quorum through the
torchft lighthouse, averages its gradients with the replicas that are alive (``Manager.allreduce``
on a reconfigurable gloo group) and steps the optimizer only if ``Manager.should_commit()`` says
the step was clean. A replica that dies mid-step makes its peers' allreduce fail: they discard that
step, the lighthouse drops the dead replica once its heartbeats stop, and the survivors go on in a
smaller quorum. A replica that (re)starts behind the others is healed by torchft before its first
step: the state-dict callbacks below ship model and optimizer from a live peer over HTTP.

What torchft guarantees, and the tests assert: after every committed step all participating
replicas hold bit-identical parameters (same state, same averaged gradients, same optimizer).
The learning rate is a function of the committed step, so it needs no state of its own.

torchft's ``DistributedDataParallel`` wrapper is not used: on this torch it crashed the survivor
of a kill (``assert fut._fut``); the explicit ``Manager`` path below does not.
"""

from __future__ import annotations

import hashlib
import os
import signal
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import torch

from ito.core.model_sizes import ModelSize, model_size

if TYPE_CHECKING:
    from transformers import LlamaForCausalLM

__all__ = ["ReplicaSettings", "ReplicaTrainer", "StepRecord", "synthetic_batch"]

MAX_GRAD_NORM = 1.0
"""As in the pretrain engine (:mod:`ito.pipeline.train`)."""


@dataclass(frozen=True)
class ReplicaSettings:
    replica_id: int
    """This replica group's index; also the suffix torchft reads its global rank from."""
    lighthouse: str
    """The lighthouse's ``http://host:port``."""
    steps: int
    """Train until this many steps are committed (the count is shared: a healed replica jumps to
    its peers' step)."""
    host: str = field(default_factory=socket.gethostname)
    """Name peers reach this replica's manager, store and checkpoint server by."""
    size: str = "tiny"
    """Row of :data:`ito.core.model_sizes.SIZES`."""
    seq_len: int = 64
    batch_size: int = 4
    """Sequences per replica per step."""
    seed: int = 0
    """Model init and data seed; identical on every replica."""
    timeout_s: float = 10.0
    """Bound on a collective, a ``should_commit`` round and a checkpoint fetch from a peer."""
    quorum_timeout_s: float = 30.0
    max_retries: int = 20
    """Consecutive discarded steps before the replica gives up (raises)."""
    min_step_seconds: float = 0.0
    """Pace steps to at least this long, standing in for a real model's step time."""
    kill_at: int | None = None
    """Fault injection: SIGKILL this process mid-step (after backward, before the allreduce)
    while attempting this step."""

    def __post_init__(self) -> None:
        if self.steps < 1:
            raise ValueError("steps: must be at least 1")
        if self.replica_id < 0:
            raise ValueError("replica_id: must be non-negative")


@dataclass(frozen=True)
class StepRecord:
    step: int
    """The step this attempt commits (1-based); a discarded attempt is retried with the same."""
    loss: float
    """This replica's loss on its own batch."""
    mean_loss: float | None
    """Loss averaged over the participants (same on all of them); None when discarded."""
    participants: int
    committed: bool
    grad_norm: float | None
    params: str
    """Digest of the parameters after the step: equal across replicas after a committed step."""
    seconds: float


def build_llama(size: ModelSize, seed: int) -> LlamaForCausalLM:
    """The engine's architecture (:func:`ito.pipeline.model.build_model`) without FSDP: a replica
    group here is one process holding the whole model."""
    from transformers import LlamaForCausalLM

    from ito.pipeline.model import llama_config

    torch.manual_seed(seed)
    return LlamaForCausalLM(llama_config(size))


def synthetic_batch(
    seed: int, replica_id: int, step: int, batch_size: int, seq_len: int, vocab: int
) -> torch.Tensor:
    """Learnable token sequences (arithmetic progressions mod ``vocab``), a pure function of
    (seed, replica, step): a retried step sees the same batch, each replica its own shard."""
    key = hashlib.sha256(f"{seed}/{replica_id}/{step}".encode()).digest()
    gen = torch.Generator().manual_seed(int.from_bytes(key[:8], "big") % (2**62))
    start = torch.randint(0, vocab, (batch_size, 1), generator=gen)
    stride = torch.randint(1, 8, (batch_size, 1), generator=gen)
    return (start + stride * torch.arange(seq_len + 1)) % vocab


def params_digest(model: torch.nn.Module) -> str:
    digest = hashlib.sha256()
    for p in model.parameters():
        digest.update(p.detach().contiguous().numpy().tobytes())
    return digest.hexdigest()[:16]


class ReplicaTrainer:
    """The training loop of one replica group (a single process), driven by a torchft Manager."""

    def __init__(
        self,
        settings: ReplicaSettings,
        *,
        on_step: Callable[[StepRecord], None] | None = None,
        on_recovered: Callable[[int, float], None] | None = None,
    ) -> None:
        from torchft import Manager, ProcessGroupGloo

        self.settings = settings
        self.size = model_size(settings.size)
        self._on_step = on_step
        self._on_recovered = on_recovered
        self.recoveries = 0
        """How many times torchft loaded this replica's state from a peer."""
        timeout = timedelta(seconds=settings.timeout_s)
        # A one-process replica group still needs its own store: torchft keeps the manager's
        # address in it, and peers rendezvous through the quorum leader's.
        self._store = torch.distributed.TCPStore(  # type: ignore[attr-defined]
            host_name=settings.host, port=0, is_master=True, wait_for_workers=False
        )
        self.manager: Any = Manager(
            pg=ProcessGroupGloo(timeout=timeout),
            min_replica_size=1,
            load_state_dict=self._load_state_dict,
            state_dict=self._state_dict,
            use_async_quorum=False,  # heal before the forward pass, then take part in the step
            timeout=timeout,
            quorum_timeout=timedelta(seconds=settings.quorum_timeout_s),
            connect_timeout=timeout,
            rank=0,
            world_size=1,
            store_addr=settings.host,
            store_port=self._store.port,
            lighthouse_addr=settings.lighthouse,
            hostname=settings.host,
            replica_id=f"ito_replica_{settings.replica_id}",
            max_retries=settings.max_retries,
        )
        # The Manager heartbeats to the lighthouse from here on. Only now the slow part of
        # start-up (importing transformers, building the model): the lighthouse forms no quorum
        # while a heartbeating replica has not asked to join (its majority rule), so replica
        # groups started together take their first step together.
        from ito.pipeline.model import PEAK_LR, build_optimizer, lr_factor

        self._peak_lr = PEAK_LR[settings.size]
        self._lr_factor = lr_factor
        self.model = build_llama(self.size, settings.seed)
        self.optimizer = build_optimizer(self.model, settings.size)

    def _state_dict(self) -> dict[str, Any]:
        return {"model": self.model.state_dict(), "optim": self.optimizer.state_dict()}

    def _load_state_dict(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optim"])
        self.recoveries += 1

    def train(self) -> int:
        """Run until ``settings.steps`` are committed; returns the committed step count."""
        s = self.settings
        try:
            while int(self.manager.current_step()) < s.steps:
                self.step()
        finally:
            self.manager.shutdown(wait=False)
        return int(self.manager.current_step())

    def step(self) -> StepRecord:
        s = self.settings
        started = time.monotonic()
        recoveries = self.recoveries
        self.optimizer.zero_grad()
        self.manager.start_quorum()  # synchronous: heals this replica from a peer if behind
        step = int(self.manager.current_step()) + 1
        if self.recoveries != recoveries and self._on_recovered is not None:
            self._on_recovered(step - 1, time.monotonic() - started)

        tokens = synthetic_batch(
            s.seed, s.replica_id, step, s.batch_size, s.seq_len, self.size.vocab
        )
        loss = self.model(input_ids=tokens, labels=tokens).loss
        loss.backward()
        if s.kill_at == step:
            os.kill(os.getpid(), signal.SIGKILL)

        # One flat buffer: every gradient and the loss, averaged over the participants at once.
        params = [p for p in self.model.parameters() if p.requires_grad]
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        flat = torch.cat([g.reshape(-1) for g in grads] + [loss.detach().reshape(1)])
        self.manager.allreduce(flat).wait()  # a failure is recorded by the manager, not raised
        committed = bool(self.manager.should_commit())

        grad_norm: float | None = None
        mean_loss: float | None = None
        if committed:
            offset = 0
            for p, g in zip(params, grads, strict=True):
                p.grad = flat[offset : offset + g.numel()].view_as(p)
                offset += g.numel()
            mean_loss = float(flat[-1])
            grad_norm = float(torch.nn.utils.clip_grad_norm_(params, MAX_GRAD_NORM))
            for group in self.optimizer.param_groups:
                group["lr"] = self._peak_lr * self._lr_factor(step - 1, s.steps)
            self.optimizer.step()

        record = StepRecord(
            step=step,
            loss=float(loss.detach()),
            mean_loss=mean_loss,
            participants=int(self.manager.num_participants()),
            committed=committed,
            grad_norm=grad_norm,
            params=params_digest(self.model),
            seconds=time.monotonic() - started,
        )
        if self._on_step is not None:
            self._on_step(record)
        remaining = s.min_step_seconds - (time.monotonic() - started)
        if remaining > 0:
            time.sleep(remaining)
        return record
