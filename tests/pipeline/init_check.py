"""Run under ``torchrun`` by :mod:`tests.pipeline.test_layouts`: builds the tiny model on the
``meta`` device under the layout given on the command line (``dp_shard=1 tp=2 …``), initialises
it from a seed, and checks every parameter and buffer it holds, gathered whole, against
``torch.manual_seed(seed); LlamaForCausalLM(config)`` built eagerly on CPU (the engine's
initialisation before layouts). Exits 0 when every value is equal, 1 naming the first that is
not."""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor
from transformers import LlamaForCausalLM

from ito.core.model_sizes import SIZES
from ito.core.run_spec import LayoutSpec
from ito.pipeline.layout import EngineLayout, build_mesh
from ito.pipeline.model import build_model, llama_config
from ito.pipeline.process_exit import leave

SEED = 1234


def main(argv: list[str]) -> int:
    dist.init_process_group("gloo")
    fields = {key: int(value) for key, value in (arg.split("=") for arg in argv)}
    layout = EngineLayout.from_spec(LayoutSpec(**fields), dist.get_world_size())  # type: ignore[arg-type]
    size = SIZES["tiny"]
    model = build_model(size, SEED, build_mesh("cpu", layout), layout, torch.device("cpu"))
    torch.manual_seed(SEED)
    eager = LlamaForCausalLM(llama_config(size))
    status = 0
    compared = 0
    built = dict(model.named_parameters()) | dict(model.named_buffers())
    for name, expected in [*eager.named_parameters(), *eager.named_buffers()]:
        if name not in built:
            if layout.pp == 1:  # without a pipeline every rank holds every name
                print(f"rank {dist.get_rank()}: {name} missing from the built model")
                status = 1
            continue  # another pipeline stage holds it
        compared += 1
        value = built[name]
        whole = value.full_tensor() if isinstance(value, DTensor) else value
        if not torch.equal(whole, expected):
            print(f"rank {dist.get_rank()}: {name} differs from the eager initialisation")
            status = 1
            break
    if compared == 0:
        print(f"rank {dist.get_rank()}: nothing compared")
        status = 1
    dist.destroy_process_group()
    return status


if __name__ == "__main__":
    leave(main(sys.argv[1:]))
