"""Forward and backward of one step's batch in ``grad_accum`` micro-batches.

Shared by the engine's training step and the ladder's proxy runs, so a proxy trains exactly as
the run would under the same layout.
"""

from __future__ import annotations

import torch
from torch import nn

from ito.pipeline.layout import EngineLayout
from ito.pipeline.parallelize import set_requires_all_reduce

__all__ = ["accumulate"]


def accumulate(model: nn.Module, batch: torch.Tensor, layout: EngineLayout) -> torch.Tensor:
    """Backward of every micro-batch of ``batch`` (gradients summed in the parameters); returns
    their mean loss, detached, in fp32."""
    accum = layout.grad_accum
    total = torch.zeros((), device=batch.device)
    for i, micro in enumerate(torch.split(batch, layout.micro_batch)):
        if accum > 1:
            # Each micro-batch's gradients are reduce-scattered at once, so only sharded
            # gradients are kept between micro-batches (what the planner counts); only the
            # replicas' all-reduce (HSDP) waits for the last one.
            set_requires_all_reduce(model, i == accum - 1)
        loss = model(input_ids=micro, labels=micro).loss / accum
        loss.backward()
        total += loss.detach().float()
    return total
