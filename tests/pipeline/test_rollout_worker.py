"""The rollout worker's weight assembly: the shards the trainer ranks publish, joined back into
the whole model (the end-to-end path — publish under torchrun, assemble in the worker, the same
losses as the synchronous loop — is in ``test_post_training_engine``)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, cast

import pytest
import torch

from ito.core.errors import ItoError
from ito.pipeline.rollout_standby import Standby
from ito.pipeline.rollout_worker import RolloutClient, WorkerConfig, assemble
from ito.pipeline.run import _early_standby

if TYPE_CHECKING:
    from ito.pipeline.post_training import RlvrStep


def test_shards_of_uneven_sizes_and_replicated_parameters_assemble_into_the_whole_model(
    tmp_path: Path,
) -> None:
    # FSDP2 splits dim 0 as torch.chunk does: 5 rows over 2 ranks are 3 + 2; 1 row over 2
    # ranks leaves rank 1 an empty shard.
    whole = {
        "w": torch.arange(20.0).reshape(5, 4),
        "one": torch.ones(1, 3),
        "cols": torch.arange(6.0).reshape(2, 3),
        "norm": torch.full((4,), 2.0),
    }
    world = 2
    for rank in range(world):
        shards: dict[str, tuple[torch.Tensor, int | None, tuple[int, ...]]] = {}
        for name in ("w", "one"):
            chunks = list(torch.chunk(whole[name], world, dim=0))
            chunks += [whole[name][:0]] * (world - len(chunks))
            shards[name] = (chunks[rank].clone(), 0, tuple(whole[name].shape))
        shards["cols"] = (
            torch.chunk(whole["cols"], world, dim=1)[rank].clone(),
            1,
            tuple(whole["cols"].shape),
        )
        shards["norm"] = (whole["norm"].clone(), None, tuple(whole["norm"].shape))
        torch.save(shards, tmp_path / f"rank{rank}.pt")
    state = assemble(tmp_path, world)
    assert set(state) == set(whole)
    for name, value in whole.items():
        assert torch.equal(state[name], value), name


CONFIG = WorkerConfig(
    rlvr=cast("RlvrStep", None),
    size="tiny",
    rope_base=10_000.0,
    world=2,
    first=0,
    end=1,
    lookahead=0,
    max_staleness=0,
)
"""A stage's configuration for tests of the trainer's side alone (no worker reads it)."""


def test_a_worker_that_failed_ends_the_trainers_wait_with_its_code(tmp_path: Path) -> None:
    """A rank without the worker's process (rank 1) learns of its failure from the error
    file the worker leaves, instead of waiting for a batch that never comes."""
    client = RolloutClient(tmp_path, CONFIG, rank=1)
    (tmp_path / "error").write_text("Traceback: the worker fell over")
    with pytest.raises(ItoError) as caught:
        client._wait(tmp_path / "batch-0-0.pt")
    assert caught.value.code == "rollout_worker_failed"


def test_an_error_the_worker_left_in_its_lobby_ends_the_wait_too(tmp_path: Path) -> None:
    """A worker that failed before it was handed its stage (while importing in the lobby)
    leaves its error in the lobby, beside the stage's directory."""
    stage = tmp_path / "lobby" / "5"
    stage.mkdir(parents=True)
    client = RolloutClient(stage, CONFIG, rank=1)
    (tmp_path / "lobby" / "error").write_text("Traceback: no transformers")
    with pytest.raises(ItoError) as caught:
        client._wait(stage / "batch-0-0.pt")
    assert caught.value.code == "rollout_worker_failed"
    assert caught.value.message is not None and "no transformers" in caught.value.message


def _exited(pid: int) -> bool:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return True
    return "\nState:\tZ" in status


def test_a_standby_worker_waits_in_its_lobby_and_leaves_nothing_when_closed(
    tmp_path: Path,
) -> None:
    earlier = tmp_path / "rollout" / "1-0" / "4"
    earlier.mkdir(parents=True)  # a crashed world's stage directory
    standby = Standby.start(tmp_path / "rollout" / "2-0")
    assert not earlier.exists()
    assert standby.proc.poll() is None
    standby.close()
    assert standby.proc.returncode == 0
    assert not (tmp_path / "rollout").exists()


def test_a_standby_worker_whose_parent_is_gone_exits(tmp_path: Path) -> None:
    """Rank 0 killed while the worker waits for RLVR: the worker does not outlive it."""
    script = (
        "import sys; from pathlib import Path; "
        "from ito.pipeline.rollout_standby import Standby; "
        "print(Standby.start(Path(sys.argv[1])).proc.pid)"
    )
    out = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path / "rollout" / "1-0")],
        check=True,
        capture_output=True,
        text=True,
    )
    pid = int(out.stdout)
    deadline = time.monotonic() + 120
    while not _exited(pid):
        assert time.monotonic() < deadline, "the orphaned standby worker is still running"
        time.sleep(0.05)


def _spec_doc(tmp_path: Path, *, stages: list[str], staleness: int, hook: bool | None) -> Path:
    doc = {
        "attempt": 2,
        "workdir": str(tmp_path / "work"),
        "stages": stages,
        "rollout_worker": hook,
        "manifest": {"post_training": {"rlvr": {"max_staleness": staleness}}},
    }
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(doc))
    return path


@pytest.mark.parametrize(
    ("stages", "staleness", "hook", "rank", "started"),
    [
        (["sft", "rlvr"], 1, None, "0", True),
        (["sft", "rlvr"], 0, True, "0", True),  # the test hook forces the worker
        (["sft", "rlvr"], 0, None, "0", False),  # on-policy: the synchronous loop
        (["sft", "rlvr"], 2, False, "0", False),
        (["sft"], 1, None, "0", False),  # no RLVR stage in this run
        (["sft", "rlvr"], 1, None, "1", False),  # only rank 0 starts it
    ],
)
def test_the_entry_point_starts_the_worker_early_only_where_rlvr_will_use_it(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    stages: list[str],
    staleness: int,
    hook: bool | None,
    rank: str,
    started: bool,
) -> None:
    monkeypatch.setenv("RANK", rank)
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "3")
    standby = _early_standby(_spec_doc(tmp_path, stages=stages, staleness=staleness, hook=hook))
    assert (standby is not None) == started
    if standby is not None:
        assert standby.lobby == tmp_path / "work" / "rollout" / "2-3"
        standby.close()
        assert standby.proc.returncode == 0
    assert not (tmp_path / "work" / "rollout").exists()


def test_a_spec_the_entry_point_cannot_read_starts_no_worker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RANK", "0")
    (tmp_path / "spec.json").write_text("{not json")
    assert _early_standby(tmp_path / "spec.json") is None
    assert _early_standby(tmp_path / "missing.json") is None
