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
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch
import torch.distributed as dist
from safetensors import safe_open
from tokenizers import Tokenizer
from torch.distributed.checkpoint.metadata import TensorStorageMetadata
from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict
from torch.distributed.checkpoint.state_dict_loader import load

from ito.core.errors import ItoError
from ito.core.revisions import architecture_mismatch, unresolvable
from ito.pipeline.dcp_files import VerifiedReader, remove_staged, stage_verified, staging_path
from ito.pipeline.export import EXPORTS_DIR
from ito.pipeline.storage_fs import ProvenDir, StoragePath, open_proven, proven_dir
from ito.pipeline.tokenizer import TOKENIZER_FILE

if TYPE_CHECKING:
    from ito.core.model_sizes import ModelSize
    from ito.core.run_spec import InitialWeightsSpec

__all__ = ["load_initial_weights"]

WEIGHTS_FILE = "model.safetensors"
MAX_CONFIG_BYTES = 1 << 20
MAX_TOKENIZER_BYTES = 64 << 20
_HASH_CHUNK = 1 << 20


def load_initial_weights(
    weights: InitialWeightsSpec,
    model: torch.nn.Module,
    *,
    size: ModelSize,
    tokenizer: Tokenizer,
    storage_root: Path | None,
    workdir: Path,
    group: dist.ProcessGroup,
) -> None:
    """Verify ``weights`` (rank 0, the verdict shared over ``group``) and load them into the
    sharded ``model`` in place; every rank calls it. ``tokenizer``: the run's, which must have
    the vocabulary of the weights' own tokenizer where one is beside them. ``storage_root``:
    the booking's storage, which the directory (checkpoint or Hugging Face) must lie below,
    proven on disk without following a link; ``None`` (the engine run alone, in tests): the
    directory is its own root. ``workdir``: the engine's own directory, where rank 0 copies
    the weights as it verifies them; every rank loads that copy, so the bytes verified are the
    bytes trained (the tenant's files are read once)."""
    where = _location(weights, storage_root)
    verdict: list[object] = [None, None]
    if dist.get_rank() == 0:
        dest = staging_path(workdir, "initial")
        try:
            _verify(weights, where, size, dest)
            _check_tokenizer(weights, where, tokenizer)
            verdict[0] = str(dest)
        except ItoError as exc:
            remove_staged(dest)
            verdict[1] = (str(exc.details.get("reason", "weights_unreadable")), exc.message)
        except Exception:  # safetensors and tokenizers raise bare Exception
            remove_staged(dest)
            # Converted where it enters: every rank must learn the verdict, never wait on it.
            # Their messages may quote the file: never passed on.
            verdict[1] = ("weights_unreadable", "cannot read the initial weights")
    dist.broadcast_object_list(verdict, src=0, group=group)
    failure = cast("tuple[str, str] | None", verdict[1])
    if failure is not None:
        raise unresolvable(failure[0], failure[1])  # type: ignore[arg-type]
    copy = Path(str(verdict[0]))
    try:
        state = get_model_state_dict(model)
        if weights.kind == "run":
            loaded: dict[str, Any] = {"model": state}
            load(loaded, storage_reader=VerifiedReader(copy), process_group=group)
            state = loaded["model"]
        else:
            _read_shards(str(copy / WEIGHTS_FILE), state)
        set_model_state_dict(model, state)
    finally:
        dist.barrier(group=group)
        if dist.get_rank() == 0:
            remove_staged(copy)


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


def _verify(weights: InitialWeightsSpec, where: StoragePath, size: ModelSize, dest: Path) -> None:
    """Copy the weights into ``dest`` (new), verifying them as they are read."""
    expected = _expected_shapes(size)
    if weights.kind == "run":
        try:
            with proven_dir(where) as step_dir:
                stage_verified(step_dir, weights.sha256, dest)
        except FileNotFoundError:
            raise unresolvable(
                "checkpoint_not_committed", "the checkpoint directory has no COMMIT"
            ) from None
        except ItoError as exc:
            reason = str(exc.details.get("reason"))
            if reason == "file_missing":
                raise unresolvable(
                    "checkpoint_not_committed", "the checkpoint directory has no COMMIT"
                ) from None
            if reason in ("digest_mismatch", "checkpoint_tampered"):
                raise unresolvable(
                    "digest_mismatch", "the checkpoint's files are not the recorded ones"
                ) from None
            raise unresolvable("weights_unreadable", exc.message) from None
        saved = VerifiedReader(dest).read_metadata().state_dict_metadata
        shapes = {
            key.removeprefix("model."): tuple(meta.size)
            for key, meta in saved.items()
            if key.startswith("model.") and isinstance(meta, TensorStorageMetadata)
        }
    else:
        with proven_dir(where) as directory:
            config = json.loads(_read_small(directory, "config.json", MAX_CONFIG_BYTES))
            wrong = (
                architecture_mismatch(config, size) if isinstance(config, dict) else "config.json"
            )
            if wrong is not None:
                raise unresolvable(
                    "architecture_mismatch", f"config.json's {wrong} is not the manifest's model's"
                )
            os.mkdir(dest, 0o700)
            if _copy_hashed(directory, dest / WEIGHTS_FILE) != weights.sha256:
                raise unresolvable("digest_mismatch", "model.safetensors does not have that sha256")
        with safe_open(str(dest / WEIGHTS_FILE), framework="pt", device="cpu") as f:
            shapes = {name: tuple(f.get_slice(name).get_shape()) for name in f.keys()}  # noqa: SIM118
    for name, shape in expected.items():
        if shapes.get(name) != shape:
            raise unresolvable(
                "architecture_mismatch",
                f"the weights' {name} is {shapes.get(name)}, the model's is {shape}",
            )


def _open_regular(directory: ProvenDir, name: str) -> int:
    """``name`` in ``directory`` for reading (:meth:`ProvenDir.open_regular`: a FIFO, a device
    or a link is refused before anything waits on it)."""
    try:
        return directory.open_regular(name)
    except FileNotFoundError:
        raise unresolvable("weights_unreadable", f"{name} is missing") from None
    except OSError:
        raise unresolvable("weights_unreadable", f"{name} is not a readable regular file") from None


def _read_small(directory: ProvenDir, name: str, limit: int) -> bytes:
    try:
        return directory.read_bounded(name, limit)
    except FileNotFoundError:
        raise unresolvable("weights_unreadable", f"{name} is missing") from None
    except OSError:
        raise unresolvable(
            "weights_unreadable", f"{name} is not a regular file of at most {limit} bytes"
        ) from None


def _copy_hashed(directory: ProvenDir, dest: Path) -> str:
    """Copy ``model.safetensors`` to ``dest`` (created new), returning the sha256 of what was
    copied: one open and one read of the tenant's file."""
    h = hashlib.sha256()
    out_fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with (
        os.fdopen(_open_regular(directory, WEIGHTS_FILE), "rb") as src,
        os.fdopen(out_fd, "wb") as out,
    ):
        while chunk := src.read(_HASH_CHUNK):
            h.update(chunk)
            out.write(chunk)
    return h.hexdigest()


def _beside_tokenizer(weights: InitialWeightsSpec, where: StoragePath) -> bytes | None:
    """The tokenizer the weights were trained with, where it lies beside them: a Hugging Face
    directory's ``tokenizer.json``; for a checkpoint, the one of its run's newest export
    (``<run storage>/exports/<stage>/step_N/``), the run's tokenizer whichever stage wrote it.
    Read through directories proven from the storage root, a regular file, bounded."""
    if weights.kind == "hf":
        with proven_dir(where) as directory:
            if TOKENIZER_FILE not in directory.entries():
                return None
            return _read_small(directory, TOKENIZER_FILE, MAX_TOKENIZER_BYTES)
    if len(where.parts) < 2:
        return None
    exports = StoragePath(where.root, (*where.parts[:-2], EXPORTS_DIR))
    try:
        top = open_proven(exports)
    except (FileNotFoundError, ItoError):
        return None
    with top:
        candidates = []
        for stage in top.subdirs():
            with top.subdir(stage) as stage_dir:
                candidates += [(name, stage) for name in stage_dir.subdirs()]
        for name, stage in sorted(candidates, reverse=True):
            with top.subdir(stage) as stage_dir, stage_dir.subdir(name) as step_dir:
                if TOKENIZER_FILE in step_dir.entries():
                    return _read_small(step_dir, TOKENIZER_FILE, MAX_TOKENIZER_BYTES)
    return None


def _check_tokenizer(weights: InitialWeightsSpec, where: StoragePath, tokenizer: Tokenizer) -> None:
    """Weights trained with another vocabulary would be read with the wrong token ids: a run
    that would silently learn from garbage is refused instead."""
    beside = _beside_tokenizer(weights, where)
    if beside is None:
        return
    try:
        theirs = Tokenizer.from_str(beside.decode())
    except Exception:  # tokenizers raises bare Exception, quoting the file
        raise unresolvable(
            "tokenizer_mismatch", "the tokenizer beside the weights is unreadable"
        ) from None
    if theirs.get_vocab(with_added_tokens=True) != tokenizer.get_vocab(with_added_tokens=True):
        raise unresolvable(
            "tokenizer_mismatch", "the weights were trained with another tokenizer than the run's"
        )


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
