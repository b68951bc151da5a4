"""Run under ``torchrun`` by :mod:`tests.pipeline.test_layouts`: the matmuls the engine's
selective activation checkpointing runs again in the backward, against what the planner
charges for them (:func:`ito.core.planner_time.recomputed_matmul_flops`).

The tiny model is built twice under the layout given on the command line (``dp_shard=1 tp=2``,
``dp_shard=2``), with selective checkpointing and without any; one forward and backward of each
on the same batch, every matmul of the backward counted by its shapes (a dispatch mode that
sees what the checkpoint replays, and not what it serves from its cache). The backward's own
matmuls are the same in both, so what selective runs beyond ``none`` is its recomputation.
Exits 0 when those recomputed matmuls' FLOPs per token (over the whole model, as the planner
counts them) are the planner's figure, 1 printing both and the shapes when they are not."""

from __future__ import annotations

import sys
from collections import Counter
from typing import Any

import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode

from ito.core.model_sizes import SIZES
from ito.core.planner_inputs import Layout, ModelShape
from ito.core.planner_time import recomputed_matmul_flops
from ito.core.run_spec import LayoutSpec
from ito.pipeline.layout import EngineLayout, build_mesh
from ito.pipeline.model import build_model
from ito.pipeline.process_exit import leave

SEED = 1234
SEQ_LEN = 40
"""Two sequences make 80 tokens: no matmul dimension of the tiny model (64, 172) is 80, so a
shape tells a replayed forward matmul from a gradient one where it can."""
MATMULS = (torch.ops.aten.mm.default, torch.ops.aten.addmm.default, torch.ops.aten.bmm.default)

Shapes = tuple[tuple[int, ...], ...]


class CountMatmuls(TorchDispatchMode):  # type: ignore[no-untyped-call]
    """The matmuls dispatched while active, by their operands' (global) shapes."""

    def __init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.seen: Counter[Shapes] = Counter()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if func in MATMULS:
            self.seen[tuple(tuple(a.shape) for a in args if isinstance(a, torch.Tensor))] += 1
        return func(*args, **(kwargs or {}))


def backward_matmuls(fields: dict[str, int], mode: str, batch: torch.Tensor) -> Counter[Shapes]:
    spec = LayoutSpec(**fields, activation_checkpointing=mode)  # type: ignore[arg-type]
    layout = EngineLayout.from_spec(spec, dist.get_world_size())
    model = build_model(SIZES["tiny"], SEED, build_mesh("cpu", layout), layout, torch.device("cpu"))
    model.train()
    loss = model(input_ids=batch, labels=batch).loss
    count = CountMatmuls()
    with count:
        loss.backward()
    return count.seen


def flops(shapes: Shapes) -> int:
    """2·m·k·n of an ``mm``, ``addmm`` (bias first) or ``bmm`` (times its batch)."""
    *batch, m, k = shapes[-2]
    return 2 * m * k * shapes[-1][-1] * (batch[0] if batch else 1)


def main(argv: list[str]) -> int:
    dist.init_process_group("gloo")
    fields = {key: int(value) for key, value in (arg.split("=") for arg in argv)}
    size = SIZES["tiny"]
    batch = torch.randint(0, size.vocab, (2, SEQ_LEN), generator=torch.Generator().manual_seed(0))
    selective = backward_matmuls(fields, "selective", batch)
    plain = backward_matmuls(fields, "none", batch)
    recomputed = selective - plain
    measured = sum(flops(s) * n for s, n in recomputed.items()) / batch.numel()
    planned_layout = Layout(
        dp_replicate=1,
        dp_shard=fields.get("dp_shard", 1),
        tp=fields.get("tp", 1),
        pp=1,
        cp=1,
        micro_batch=2,
        microbatches=1,
        activation_checkpointing="selective",
    )
    planned = recomputed_matmul_flops(ModelShape.from_size(size), planned_layout)
    status = 0
    if plain - selective or measured != planned:
        print(
            f"rank {dist.get_rank()}: {fields} selective recomputes {measured} matmul FLOPs per "
            f"token, the planner charges {planned}; recomputed {dict(recomputed)}, "
            f"missing {dict(plain - selective)}"
        )
        status = 1
    dist.destroy_process_group()
    return status


if __name__ == "__main__":
    leave(main(sys.argv[1:]))
