"""Loading a run's initial weights onto its sharded model before step 0 (DESIGN §7.6).

Called once per run, right after the model is built and only when the run has no checkpoint of
its own to resume (a resumed run continues from its own weights). What to load comes from the
spec (:class:`ito.core.run_spec.InitialWeightsSpec`), resolved by the server; it is verified
here before any rank reads a weight — by rank 0, the verdict broadcast so every rank refuses
alike (``revision_unresolvable``):

- ``run``: a committed DCP checkpoint directory of an earlier run. Its ``COMMIT`` must be
  there and its digest (:func:`ito.core.revisions.checkpoint_digest` of ``.metadata`` and
  ``COMMIT``) the one the server recorded; every parameter of the model must be in its metadata
  with the model's shape. Only the model part is loaded, by DCP on the sharded state dict: each
  rank reads the byte ranges of its own shards (resharded if the earlier run's layout differed).
  The optimizer, scheduler, data position and RNG start fresh: this run's step 0.
- ``hf``: a Hugging Face directory (what :mod:`ito.pipeline.export` writes) below the booking's
  storage, proven on disk like a checkpoint: ``config.json`` must describe the manifest's
  architecture, ``model.safetensors`` (a regular file) must have the recorded
  sha256 and hold every parameter with its shape. Each rank then reads, per parameter, only the
  slice its shard covers (``safe_open(...).get_slice``, at the offsets DTensor computes for the
  local shard), so no rank ever holds the whole model, nor even a whole sharded parameter.

Where the weights' own tokenizer lies beside them (the directory's ``tokenizer.json``; a
checkpoint's run's export), the run's tokenizer must have its vocabulary: the same ids for the
same tokens (``tokenizer_mismatch``).

The names are the model's fully qualified parameter names (``get_model_state_dict``), which
are exactly the export's tensor names and the checkpoint's ``model.`` keys.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from safetensors import safe_open
from tokenizers import Tokenizer
from torch.distributed.checkpoint.filesystem import FileSystemReader
from torch.distributed.checkpoint.metadata import TensorStorageMetadata
from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict
from torch.distributed.checkpoint.state_dict_loader import load

from ito.core.errors import ItoError
from ito.core.revisions import architecture_mismatch, checkpoint_digest, unresolvable
from ito.pipeline.checkpoint import COMMIT, METADATA
from ito.pipeline.export import EXPORTS_DIR
from ito.pipeline.storage_fs import ProvenDir, StoragePath, proven_dir
from ito.pipeline.tokenizer import TOKENIZER_FILE

if TYPE_CHECKING:
    from ito.core.model_sizes import ModelSize
    from ito.core.run_spec import InitialWeightsSpec

__all__ = ["load_initial_weights"]

WEIGHTS_FILE = "model.safetensors"
_HASH_CHUNK = 1 << 20


def load_initial_weights(
    weights: InitialWeightsSpec,
    model: torch.nn.Module,
    *,
    size: ModelSize,
    tokenizer: Tokenizer,
    storage_root: Path | None,
    group: dist.ProcessGroup,
) -> None:
    """Verify ``weights`` (rank 0, the verdict shared over ``group``) and load them into the
    sharded ``model`` in place; every rank calls it. ``tokenizer``: the run's, which must have
    the vocabulary of the weights' own tokenizer where one is beside them. ``storage_root``:
    the booking's storage, which the directory (checkpoint or Hugging Face) must lie below,
    proven on disk without following a link; ``None`` (the engine run alone, in tests): the
    directory is its own root."""
    where = _location(weights, storage_root)
    verdict: list[tuple[str, str] | None] = [None]
    if dist.get_rank() == 0:
        try:
            _verify(weights, where, size)
            _check_tokenizer(weights, tokenizer)
        except ItoError as exc:
            verdict[0] = (str(exc.details.get("reason", "weights_unreadable")), exc.message)
        except Exception as exc:  # safetensors and tokenizers raise bare Exception
            # Converted where it enters: every rank must learn the verdict, never wait on it.
            verdict[0] = ("weights_unreadable", f"cannot read the initial weights: {exc}"[:500])
    dist.broadcast_object_list(verdict, src=0, group=group)
    if verdict[0] is not None:
        reason, message = verdict[0]
        raise unresolvable(reason, message)  # type: ignore[arg-type]
    state = get_model_state_dict(model)
    if weights.kind == "run":
        with proven_dir(where) as step_dir:
            loaded: dict[str, Any] = {"model": state}
            load(loaded, checkpoint_id=str(step_dir.handle), process_group=group)
            state = loaded["model"]
    else:
        with proven_dir(where) as directory:
            _read_shards(_weights_file(directory), state)
    set_model_state_dict(model, state)


def _location(weights: InitialWeightsSpec, storage_root: Path | None) -> StoragePath:
    path = Path(weights.path)
    if storage_root is None:
        return StoragePath(path)
    try:
        parts = path.relative_to(storage_root).parts
    except ValueError:
        raise unresolvable(
            "outside_booking_storage", "the initial weights are outside the booking's storage"
        ) from None
    return StoragePath(storage_root, parts)


def _expected_shapes(size: ModelSize) -> dict[str, tuple[int, ...]]:
    """Every parameter of the whole model of ``size`` and its shape (built on ``meta``)."""
    from transformers import LlamaForCausalLM

    from ito.pipeline.model import llama_config

    with torch.device("meta"):
        whole = LlamaForCausalLM(llama_config(size))
    return {name: tuple(t.shape) for name, t in whole.state_dict().items()}


def _verify(weights: InitialWeightsSpec, where: StoragePath, size: ModelSize) -> None:
    expected = _expected_shapes(size)
    if weights.kind == "run":
        try:
            with proven_dir(where) as step_dir:
                commit = step_dir.read(COMMIT)
                metadata = step_dir.read(METADATA)
                handle = str(step_dir.handle)
                saved = FileSystemReader(handle).read_metadata().state_dict_metadata
        except FileNotFoundError:
            raise unresolvable(
                "checkpoint_not_committed", "the checkpoint directory has no COMMIT"
            ) from None
        if checkpoint_digest(metadata, commit) != weights.sha256:
            raise unresolvable("digest_mismatch", "the checkpoint's digest is not the recorded one")
        shapes = {
            key.removeprefix("model."): tuple(meta.size)
            for key, meta in saved.items()
            if key.startswith("model.") and isinstance(meta, TensorStorageMetadata)
        }
    else:
        with proven_dir(where) as directory:
            config = json.loads(directory.read("config.json"))
            wrong = (
                architecture_mismatch(config, size) if isinstance(config, dict) else "config.json"
            )
            if wrong is not None:
                raise unresolvable(
                    "architecture_mismatch", f"config.json's {wrong} is not the manifest's model's"
                )
            if _sha256(directory) != weights.sha256:
                raise unresolvable("digest_mismatch", "model.safetensors does not have that sha256")
            with safe_open(_weights_file(directory), framework="pt", device="cpu") as f:
                shapes = {name: tuple(f.get_slice(name).get_shape()) for name in f.keys()}  # noqa: SIM118
    for name, shape in expected.items():
        if shapes.get(name) != shape:
            raise unresolvable(
                "architecture_mismatch",
                f"the weights' {name} is {shapes.get(name)}, the model's is {shape}",
            )


def _beside_tokenizer(weights: InitialWeightsSpec) -> Path | None:
    """The tokenizer the weights were trained with, where it lies beside them: a Hugging Face
    directory's ``tokenizer.json``; for a checkpoint, the one of its run's newest export
    (``<run storage>/exports/<stage>/step_N/``), the run's tokenizer whichever stage wrote it."""
    directory = Path(weights.path)
    if weights.kind == "hf":
        found = directory / TOKENIZER_FILE
        return found if found.is_file() else None
    exports = directory.parent.parent / EXPORTS_DIR
    candidates = sorted(
        exports.glob(f"*/step_*/{TOKENIZER_FILE}"), key=lambda p: p.parent.name, reverse=True
    )
    return candidates[0] if candidates else None


def _check_tokenizer(weights: InitialWeightsSpec, tokenizer: Tokenizer) -> None:
    """Weights trained with another vocabulary would be read with the wrong token ids: a run
    that would silently learn from garbage is refused instead."""
    beside = _beside_tokenizer(weights)
    if beside is None:
        return
    theirs = Tokenizer.from_file(str(beside))
    if theirs.get_vocab(with_added_tokens=True) != tokenizer.get_vocab(with_added_tokens=True):
        raise unresolvable(
            "tokenizer_mismatch", "the weights were trained with another tokenizer than the run's"
        )


def _weights_file(directory: ProvenDir) -> str:
    """``model.safetensors`` of the proven directory, for readers that take a path: a regular
    file there (a link in its place is refused), named through the directory's handle."""
    if not stat.S_ISREG(os.lstat(WEIGHTS_FILE, dir_fd=directory.fd).st_mode):
        raise unresolvable("weights_unreadable", "model.safetensors is not a regular file")
    return str(directory.handle / WEIGHTS_FILE)


def _read_shards(file: str, state: dict[str, Any]) -> None:
    """Copy, for each entry of the sharded ``state``, the slice of the file's tensor that this
    rank's shard covers into the shard."""
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    with safe_open(file, framework="pt", device="cpu") as f, torch.no_grad():
        for name, value in state.items():
            if not isinstance(value, torch.Tensor):
                continue
            if isinstance(value, DTensor):
                shape, offset = compute_local_shape_and_global_offset(
                    value.shape, value.device_mesh, value.placements
                )
                local = value.to_local()
                if local.numel() == 0:
                    continue
                index = tuple(slice(o, o + n) for o, n in zip(offset, shape, strict=True))
                local.copy_(f.get_slice(name)[index])
            else:
                value.copy_(f.get_tensor(name))


def _sha256(directory: ProvenDir) -> str:
    h = hashlib.sha256()
    fd = os.open(WEIGHTS_FILE, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=directory.fd)
    with os.fdopen(fd, "rb") as handle:
        while chunk := handle.read(_HASH_CHUNK):
            h.update(chunk)
    return h.hexdigest()
