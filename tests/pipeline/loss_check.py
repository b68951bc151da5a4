"""Run under ``torchrun`` by :mod:`tests.pipeline.test_loss`: one forward and backward of the
tiny model laid out as the command line says (``dp_shard=2``, ``tp=2``, ``pp=2 …``; fp32), its
chunked loss cut into chunks of ``CHUNK`` tokens — fewer than a micro-batch holds and not
dividing it, so several chunks, their recomputation and a short last one run under FSDP2,
tensor parallel and the pipeline schedule — against Hugging Face's unchunked loss of the same
model built eagerly on one process. Every rank reads the same batch, so the data-parallel mean
of the gradients is the one process's gradient. Exits 0 when the loss and every gradient this
rank holds (gathered whole) match and each is held as its parameter is laid out, 1 naming the
first that does not."""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor
from transformers import LlamaForCausalLM

from ito.core.model_sizes import SIZES
from ito.core.run_spec import LayoutSpec
from ito.pipeline.layout import EngineLayout, build_mesh
from ito.pipeline.loss import use_chunked_loss
from ito.pipeline.model import build_model, llama_config
from ito.pipeline.pipeline_stages import PipelineRunner
from ito.pipeline.process_exit import leave

SEED = 1234
SEQ_LEN = 40
CHUNK = 13


def main(argv: list[str]) -> int:
    dist.init_process_group("gloo")
    fields = {k: int(v) if v.isdigit() else v for k, v in (arg.split("=") for arg in argv)}
    layout = EngineLayout.from_spec(LayoutSpec(**fields), dist.get_world_size())  # type: ignore[arg-type]
    size = SIZES["tiny"]
    device = torch.device("cpu")
    model = build_model(size, SEED, build_mesh("cpu", layout), layout, device)
    torch.manual_seed(SEED)
    eager = LlamaForCausalLM(llama_config(size))
    batch = torch.randint(
        0,
        size.vocab,
        (layout.sequences_per_rank, SEQ_LEN),
        generator=torch.Generator().manual_seed(0),
    )
    expected = eager(input_ids=batch, labels=batch).loss
    expected.backward()
    if layout.pp > 1:
        pipeline = PipelineRunner(model, build_mesh("cpu", layout), layout, device, CHUNK)
        loss = pipeline.train_step(batch)
        check_loss = pipeline.last
    else:
        use_chunked_loss(model, CHUNK)
        loss = model(input_ids=batch, labels=batch).loss
        loss.backward()
        check_loss = True
    rank = dist.get_rank()
    status = 0
    if check_loss and not torch.allclose(loss.detach(), expected.detach(), rtol=1e-6, atol=1e-6):
        print(f"rank {rank}: loss {loss.item()} != {expected.item()}")
        status = 1
    eager_grads = {name: p.grad for name, p in eager.named_parameters()}
    compared = 0
    for name, param in model.named_parameters():
        grad = param.grad
        if grad is None:
            print(f"rank {rank}: {name} has no gradient")
            status = 1
            break
        if isinstance(param, DTensor) and (
            not isinstance(grad, DTensor) or grad.placements != param.placements
        ):
            # The gradient held between steps is the parameter's shard (what the planner
            # counts), with or without FSDP2.
            held = getattr(grad, "placements", None)
            print(f"rank {rank}: gradient of {name} is held as {held}, not {param.placements}")
            status = 1
            break
        whole = grad.full_tensor() if isinstance(grad, DTensor) else grad
        reference = eager_grads[name]
        assert reference is not None
        compared += 1
        if not torch.allclose(whole, reference, rtol=1e-4, atol=1e-6):
            print(f"rank {rank}: gradient of {name} differs from the unchunked one")
            status = 1
            break
    if compared == 0:
        print(f"rank {rank}: nothing compared")
        status = 1
    dist.destroy_process_group()
    return status


if __name__ == "__main__":
    leave(main(sys.argv[1:]))
