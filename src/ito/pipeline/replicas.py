"""Per-step fault tolerance across the replica groups of one run, with torchft (DESIGN §7.3).

A run with ``resources.replica_groups = R > 1`` is R torchrun worlds. Inside a world the model is
sharded with FSDP2 as in any run; across worlds every rank averages its gradient shards with the
same rank of the other groups through a torchft :class:`~torchft.Manager` (HSDP's replicate
dimension, made elastic):

* each step starts with a quorum through the lighthouse; a group that is behind (it was
  restarted) is healed before the step from a live peer: model, optimizer and the trainer's
  position are copied rank to rank over torchft's HTTP transport;
* the gradient all-reduce runs on a reconfigurable gloo group; if a peer dies mid-step the
  all-reduce fails, ``should_commit`` is false everywhere, the step is discarded and retried
  with the survivors; nothing half-averaged is ever applied.

Local shards, not DTensors, cross the wire: rank r of every group holds the same shard layout, so
shards are interchangeable rank to rank. The group that is rank 0 of the quorum (the *leader*)
writes the run's events and checkpoints; the others train the same steps silently.
"""

from __future__ import annotations

import socket
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

__all__ = ["ReplicaSync", "local", "to_local_tree"]

TIMEOUT_S = 30.0
"""Bound on one cross-replica collective, a commit vote and a heal."""
QUORUM_TIMEOUT_S = 120.0
"""Bound on forming a quorum (a peer may be evaluating or checkpointing meanwhile)."""
MAX_RETRIES = 50
"""Consecutive discarded steps before a group gives up (its torchrun then restarts it)."""


def local(tensor: torch.Tensor) -> torch.Tensor:
    """The local shard of a DTensor, or the tensor itself."""
    to_local = getattr(tensor, "to_local", None)
    return to_local() if callable(to_local) else tensor


def to_local_tree(value: Any) -> Any:
    """A state-dict tree with every DTensor replaced by a copy of its local shard."""
    if isinstance(value, torch.Tensor):
        return local(value).detach().clone()
    if isinstance(value, dict):
        return {k: to_local_tree(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(to_local_tree(v) for v in value)
    return value


class ReplicaSync:
    """One rank's torchft Manager and the few operations the trainer needs of it."""

    def __init__(
        self,
        *,
        replica_id: int,
        lighthouse: str,
        group: dist.ProcessGroup,
        state_dict: Callable[[], dict[str, Any]],
        load_state_dict: Callable[[dict[str, Any]], None],
    ) -> None:
        from torchft import Manager, ProcessGroupGloo

        self.replica_id = replica_id
        rank, world = dist.get_rank(group), dist.get_world_size(group)
        host = socket.gethostname()
        # The group's ranks find their manager through a store of their own (torchrun's store
        # outlives restarts and would hand a restarted group its previous life's address).
        self._store: Any = None
        where: list[Any] = [None]
        if rank == 0:
            self._store = dist.TCPStore(  # type: ignore[attr-defined]
                host_name=host, port=0, is_master=True, wait_for_workers=False
            )
            where = [(host, int(self._store.port))]
        dist.broadcast_object_list(where, src=0, group=group)
        store_host, store_port = where[0]
        self._load = load_state_dict
        self.healed = 0
        """How many times torchft loaded this rank's state from a peer."""
        timeout = timedelta(seconds=TIMEOUT_S)
        self.manager: Any = Manager(
            pg=ProcessGroupGloo(timeout=timeout),
            min_replica_size=1,
            load_state_dict=self._on_heal,
            state_dict=state_dict,
            use_async_quorum=False,  # heal before the step's forward pass
            timeout=timeout,
            quorum_timeout=timedelta(seconds=QUORUM_TIMEOUT_S),
            connect_timeout=timeout,
            rank=rank,
            world_size=world,
            store_addr=store_host,
            store_port=store_port,
            lighthouse_addr=lighthouse,
            hostname=host,
            replica_id=f"ito_replica_{replica_id}",
            max_retries=MAX_RETRIES,
        )

    def _on_heal(self, state: dict[str, Any]) -> None:
        self._load(state)
        self.healed += 1

    def set_step(self, step: int) -> None:
        """After loading a checkpoint: the committed step count the quorum compares."""
        self.manager.load_state_dict({"step": step, "batches_committed": step})

    @property
    def step(self) -> int:
        return int(self.manager.current_step())

    def start_step(self) -> bool:
        """Join this step's quorum; True if this rank was healed from a peer meanwhile."""
        before = self.healed
        self.manager.start_quorum()
        return self.healed != before

    @property
    def leader(self) -> bool:
        return bool(self.manager.participating_rank() == 0)

    @property
    def participants(self) -> int:
        return int(self.manager.num_participants())

    def average(self, tensors: list[torch.Tensor]) -> bool:
        """Average ``tensors`` in place over the participating groups (one flat all-reduce) if
        the step commits everywhere; returns whether it did (if not, they are unchanged)."""
        flat = torch.cat([t.reshape(-1).float() for t in tensors])
        self.manager.allreduce(flat).wait()  # a failure is recorded, then voted on
        if not self.manager.should_commit():
            return False
        offset = 0
        for t in tensors:
            t.copy_(flat[offset : offset + t.numel()].view_as(t).to(t.dtype))
            offset += t.numel()
        return True

    def shutdown(self) -> None:
        self.manager.shutdown(wait=False)
