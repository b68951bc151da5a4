"""A stage's final weights as a Hugging Face directory (DESIGN §7.6 export).

At the end of every stage, once its last checkpoint is committed, the engine writes the model as
``transformers`` reads it — ``config.json`` (the Llama architecture, with the RoPE base the stage
trained with, and the tokenizer's end-of-text as its only special token: ``LlamaConfig``'s
defaults name ids 1 and 2, ordinary tokens of our tokenizers, and ``generate`` would stop at
them), ``generation_config.json`` (generation stops at end-of-text, as the engine's batteries and
rollouts do), ``model.safetensors`` (every parameter, in the dtype it is trained in) and the
run's tokenizer (``tokenizer.json`` with a ``tokenizer_config.json`` naming the end-of-text
token) — to ``exports/<stage>/step_<step>/`` in the run's checkpoint storage, through the proven
directory. ``AutoModelForCausalLM.from_pretrained`` loads it with nothing of this package.

The whole model is gathered to rank 0's CPU memory to be written as one file
(``get_model_state_dict`` with ``full_state_dict`` and ``cpu_offload``: FSDP2 and tensor-parallel
shards are all-gathered one parameter at a time, only rank 0 keeps them); under pipeline
parallelism each rank's stage is gathered so and sent to rank 0 over the CPU group. The
directory is written under a temporary name and renamed once complete: an export that exists is
whole. Checkpoint pruning (``keep_last``) never touches it; cleanup removes it with the rest of
the run's storage.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist
from safetensors.torch import save as safetensors_bytes
from tokenizers import Tokenizer
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from transformers import GenerationConfig

from ito.core.model_sizes import ModelSize
from ito.pipeline.model import llama_config
from ito.pipeline.storage_fs import StoragePath, proven_dir
from ito.pipeline.tokenizer import EOS

__all__ = ["EXPORTS_DIR", "Export", "export_model"]

EXPORTS_DIR = "exports"
WEIGHTS_FILE = "model.safetensors"


@dataclass(frozen=True)
class Export:
    """What rank 0 wrote."""

    stage: str
    step: int
    path: str
    """The export directory's real location."""
    bytes: int
    sha256: str
    """sha256 of ``model.safetensors``."""
    seconds: float


def _full_state(
    model: torch.nn.Module, pipelined: bool, group: dist.ProcessGroup
) -> dict[str, torch.Tensor]:
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    if not pipelined:
        state = get_model_state_dict(model, options=options)
        return {k: v for k, v in state.items() if isinstance(v, torch.Tensor)}
    # Each pipeline stage holds its own layers under the whole model's names: every rank
    # gathers its stage whole (cpu_offload keeps tensors on the global rank 0 only, so the
    # stage is gathered without it and moved to the CPU here), and rank 0 merges them.
    state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
    mine = {k: v.detach().cpu() for k, v in state.items() if isinstance(v, torch.Tensor)}
    parts: list[dict[str, torch.Tensor] | None] = [None] * dist.get_world_size(group)
    dist.gather_object(mine, parts if dist.get_rank() == 0 else None, dst=0, group=group)
    merged: dict[str, torch.Tensor] = {}
    for part in parts:
        merged.update(part or {})
    return merged


def export_model(
    *,
    model: torch.nn.Module,
    size: ModelSize,
    rope_base: float,
    tokenizer: Tokenizer,
    storage: StoragePath,
    stage: str,
    step: int,
    pipelined: bool,
    group: dist.ProcessGroup,
) -> Export | None:
    """Write the export of ``stage`` at ``step``; every rank calls it (the gather is
    collective). Rank 0 returns what it wrote, the others ``None``."""
    start = time.perf_counter()
    state = _full_state(model, pipelined, group)
    result: Export | None = None
    if dist.get_rank() == 0:
        config = llama_config(size)
        config.rope_parameters = {**dict(config.rope_parameters or {}), "rope_theta": rope_base}
        config.architectures = ["LlamaForCausalLM"]
        eos = tokenizer.token_to_id(EOS)
        if eos is None:  # data preparation refuses such a tokenizer (``no_eos``)
            raise ValueError(f"the run's tokenizer has no {EOS} token")
        config.eos_token_id, config.bos_token_id, config.pad_token_id = eos, None, None
        dtypes = {t.dtype for t in state.values()}
        if len(dtypes) == 1:
            config.dtype = str(dtypes.pop()).removeprefix("torch.")
        weights = safetensors_bytes(
            {k: v.contiguous() for k, v in sorted(state.items())}, metadata={"format": "pt"}
        )
        files = {
            "config.json": config.to_json_string(use_diff=False).encode(),
            "generation_config.json": GenerationConfig(  # type: ignore[no-untyped-call]
                eos_token_id=eos, pad_token_id=eos
            )
            .to_json_string(use_diff=True)
            .encode(),
            WEIGHTS_FILE: weights,
            "tokenizer.json": tokenizer.to_str().encode(),
            "tokenizer_config.json": json.dumps(
                {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": EOS}, indent=2
            ).encode(),
        }
        name = f"step_{step:08d}"
        tmp = f".{name}.tmp"
        with proven_dir(storage.child(EXPORTS_DIR, stage), create=True) as parent:
            # A torn export of a crashed attempt, or this step's export from an attempt that
            # had written it already (the same weights): written again whole.
            parent.remove(tmp)
            with parent.subdir(tmp, create=True, new=True) as out:
                for file, data in files.items():
                    out.write_new(file, data)
            parent.remove(name)
            parent.replace(tmp, name)
            path = str(parent.real / name)
        result = Export(
            stage=stage,
            step=step,
            path=path,
            bytes=sum(len(data) for data in files.values()),
            sha256=hashlib.sha256(weights).hexdigest(),
            seconds=time.perf_counter() - start,
        )
    dist.barrier(group=group)
    return result
