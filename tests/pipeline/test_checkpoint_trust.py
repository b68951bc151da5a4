"""Nothing the engine reads back from the booking's storage is parsed before it is verified, and
nothing it writes there goes through an entry planted in advance (issue 26, items 1, 2 and 4).

Real ``torchrun`` (one gloo process, to keep it short) on the test recipe. A source run commits
checkpoints and records them in its journal; the tenant — anyone who can write the booking's
storage — then plants files. A planted pickle would write a marker file: the marker must never
appear, and every refusal must carry a registered code.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
from pathlib import Path
from typing import Any

import pytest

from ito.core.errors import ItoError
from ito.pipeline.dcp_files import COMMIT, METADATA, ExclusiveFileSystem, load_metadata
from tests.pipeline.test_pretrain_engine import events, make_spec, torchrun

pytestmark = pytest.mark.slow

STEPS = 4
"""Steps of the source run (checkpoints every 2: steps 2 and 4 are kept)."""


class _Planted:
    """Unpickling this runs a command: what a planted ``.metadata`` would do."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return (os.system, (f"touch {self.marker}",))


def _planted_pickle(marker: Path) -> bytes:
    return pickle.dumps(_Planted(marker))


def _spec(root: Path, **overrides: Any) -> Path:
    fields: dict[str, Any] = {
        "stages": ["pretrain"],
        "max_steps_per_stage": STEPS,
        "layout": {"dp_shard": 1},
    }
    return make_spec(root, every_steps=2, **(fields | overrides))


def _run(spec: Path) -> list[dict[str, Any]]:
    """The events this run of the engine wrote (after any already in its journal)."""
    before = len(events(spec.parent)) if (spec.parent / "events.jsonl").exists() else 0
    result = torchrun(spec, nproc=1)
    # A refusal with a code ends the rank cleanly, once: exit 0, no torchrun restart.
    assert result.returncode == 0, result.stdout[-4000:]
    return events(spec.parent)[before:]


def _done(evs: list[dict[str, Any]]) -> dict[str, Any]:
    done = [e for e in evs if e["type"] == "done"]
    assert len(done) == 1, done
    return done[0]


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("source")
    evs = _run(_spec(root))
    assert _done(evs)["status"] == "succeeded"
    return root


def _checkpoint(source: Path, step: int) -> dict[str, Any]:
    (event,) = [e for e in events(source) if e["type"] == "checkpoint" and e["step"] == step]
    return event


def _copy_run(source: Path, dest: Path, *, journal: bool = True) -> None:
    """The source's checkpoints (and, with ``journal``, its events: what the run recorded)
    under ``dest``, for a second attempt of the same run."""
    shutil.copytree(source / "ckpt", dest / "ckpt", symlinks=True)
    if journal:
        shutil.copy(source / "events.jsonl", dest / "events.jsonl")


def test_the_commit_lists_every_file_with_its_size_and_sha256(source: Path) -> None:
    step_dir = Path(_checkpoint(source, STEPS)["path"])
    commit = json.loads((step_dir / COMMIT).read_text())
    on_disk = sorted(p.name for p in step_dir.iterdir() if p.name != COMMIT)
    assert sorted(commit["files"]) == on_disk and METADATA in on_disk
    assert commit["bytes"] == sum(f["bytes"] for f in commit["files"].values())
    # The engine's own metadata goes through the restricted unpickler.
    metadata = load_metadata((step_dir / METADATA).read_bytes())
    assert any(key.startswith("model.") for key in metadata.state_dict_metadata)


def test_a_pickle_naming_anything_else_is_refused_unrun(tmp_path: Path) -> None:
    marker = tmp_path / "marker"
    with pytest.raises(ItoError) as caught:
        load_metadata(_planted_pickle(marker))
    assert caught.value.code == "checkpoint_storage_invalid"
    with pytest.raises(ItoError) as caught:
        load_metadata(b"not a pickle")
    assert caught.value.code == "checkpoint_storage_invalid"
    assert not marker.exists()


def test_writes_never_go_through_an_entry_already_there(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.write_bytes(b"keep")
    (tmp_path / "step").mkdir()
    (tmp_path / "step" / "linked").symlink_to(outside)
    os.link(outside, tmp_path / "step" / "hard")
    fs = ExclusiveFileSystem()
    for name in ("linked", "hard"):
        with pytest.raises(ItoError) as caught, fs.create_stream(tmp_path / "step" / name, "wb"):
            pass
        assert caught.value.code == "checkpoint_storage_invalid"
    with pytest.raises(ItoError), fs.create_stream(tmp_path / "step" / "linked", "rb"):
        pass
    assert outside.read_bytes() == b"keep"


def _weights(source: Path, path: Path | None = None) -> dict[str, Any]:
    ckpt = _checkpoint(source, STEPS)
    return {
        "kind": "run",
        "path": str(path or ckpt["path"]),
        "sha256": ckpt["sha256"],
        "revision": f"run:run_source@{STEPS}",
    }


@pytest.mark.parametrize(
    "planting", ["metadata_pickle", "flipped_shard_byte", "linked_shard", "fifo_shard"]
)
def test_a_run_revision_whose_files_changed_after_the_commit_is_refused_before_any_parse(
    source: Path, tmp_path: Path, planting: str
) -> None:
    marker = tmp_path / "marker"
    copy = tmp_path / "storage" / "theirs"
    shutil.copytree(Path(_checkpoint(source, STEPS)["path"]), copy)
    shard = next(p for p in copy.iterdir() if p.suffix == ".distcp")
    if planting == "metadata_pickle":
        (copy / METADATA).write_bytes(_planted_pickle(marker))
    elif planting == "flipped_shard_byte":
        data = bytearray(shard.read_bytes())
        data[len(data) // 2] ^= 0xFF  # same size, one byte changed
        shard.write_bytes(bytes(data))
    elif planting == "fifo_shard":
        shard.unlink()
        os.mkfifo(shard)  # opened for reading, it would wait for a writer forever
    else:
        outside = tmp_path / "outside.distcp"
        shutil.move(shard, outside)  # the same bytes, reached through a link
        shard.symlink_to(outside)
    evs = _run(_spec(tmp_path / "run", initial_weights=_weights(source, copy)))
    done = _done(evs)
    assert done["status"] == "failed" and done["code"] == "revision_unresolvable"
    assert not [e for e in evs if e["type"] == "metric" and "loss" in e["values"]]
    assert not marker.exists()


def test_a_run_revision_loads_from_the_verified_copy_and_leaves_nothing_behind(
    source: Path, tmp_path: Path
) -> None:
    evs = _run(_spec(tmp_path, max_steps_per_stage=1, initial_weights=_weights(source)))
    assert _done(evs)["status"] in ("succeeded", "gate_failed")
    assert any(e["type"] == "log" and "initial weights loaded" in e["message"] for e in evs)
    assert list((tmp_path / "work" / "verified").iterdir()) == []


def test_a_planted_checkpoint_the_run_never_recorded_is_never_read(
    source: Path, tmp_path: Path
) -> None:
    marker = tmp_path / "marker"
    _copy_run(source, tmp_path)
    planted = tmp_path / "ckpt" / "pretrain" / "step_00000050"
    shutil.copytree(Path(_checkpoint(source, STEPS)["path"]), planted)
    (planted / METADATA).write_bytes(_planted_pickle(marker))
    commit = json.loads((planted / COMMIT).read_text())
    (planted / COMMIT).write_text(json.dumps(commit | {"step": 50}))

    evs = _run(_spec(tmp_path, attempt=1))
    logs = [e["message"] for e in evs if e["type"] == "log"]
    assert any(m.startswith("resumed from") and m.endswith(f"(step {STEPS})") for m in logs)
    assert any("ignored checkpoint pretrain/step 50" in m for m in logs)
    assert _done(evs)["status"] == "succeeded"
    assert not marker.exists()
    assert planted.exists()  # not the run's: left alone, neither read nor pruned


def test_the_servers_list_is_what_a_later_attempt_trusts(source: Path, tmp_path: Path) -> None:
    """A new attempt has a new journal: the checkpoints the server recorded are the ones it
    may resume from; without them its own storage is not trusted."""
    _copy_run(source, tmp_path, journal=False)
    digests = [e["sha256"] for e in events(source) if e["type"] == "checkpoint"]
    evs = _run(_spec(tmp_path, attempt=2, recorded_checkpoints=digests))
    logs = [e["message"] for e in evs if e["type"] == "log"]
    assert any(m.startswith("resumed from") and m.endswith(f"(step {STEPS})") for m in logs)

    other = tmp_path / "unrecorded"
    _copy_run(source, other, journal=False)
    evs = _run(_spec(other, attempt=2))
    logs = [e["message"] for e in evs if e["type"] == "log"]
    assert not any(m.startswith("resumed from") for m in logs)
    assert sum("the run never recorded it" in m for m in logs) == 2


def test_a_shard_of_the_runs_own_checkpoint_changed_after_its_commit_ends_the_run_once(
    source: Path, tmp_path: Path
) -> None:
    _copy_run(source, tmp_path)
    step_dir = tmp_path / "ckpt" / "pretrain" / f"step_{STEPS:08d}"
    shard = next(p for p in step_dir.iterdir() if p.suffix == ".distcp")
    data = bytearray(shard.read_bytes())
    data[-100] ^= 0x01
    shard.write_bytes(bytes(data))
    evs = _run(_spec(tmp_path))
    done = _done(evs)
    assert done["status"] == "failed" and done["code"] == "checkpoint_storage_invalid"
    assert not [e for e in evs if e["type"] == "metric"]


@pytest.mark.parametrize("committed", [True, False])
@pytest.mark.parametrize("link", ["symbolic", "hard"])
def test_a_step_directory_planted_in_advance_is_never_written_through(
    tmp_path: Path, committed: bool, link: str
) -> None:
    outside = tmp_path / "outside"
    outside.write_bytes(b"the tenant's target")
    planted = tmp_path / "ckpt" / "pretrain" / "step_00000002"
    planted.mkdir(parents=True)
    if committed:
        (planted / COMMIT).write_bytes(b"")
    if link == "symbolic":
        (planted / "__0_0.distcp").symlink_to(outside)
    else:
        os.link(outside, planted / "__0_0.distcp")
    evs = _run(_spec(tmp_path))
    done = _done(evs)
    if committed:
        # Something already there where the save would create its directory: refused.
        assert done["status"] == "failed" and done["code"] == "checkpoint_storage_invalid"
    else:
        # An uncommitted leftover is deleted (its links unlinked, never followed) and the save
        # creates its directory anew.
        assert done["status"] == "succeeded"
        step = json.loads((planted / COMMIT).read_text())
        assert not (planted / "__0_0.distcp").is_symlink()
        assert os.stat(planted / "__0_0.distcp").st_nlink == 1
        assert step["files"]["__0_0.distcp"]["bytes"] == (planted / "__0_0.distcp").stat().st_size
    assert outside.read_bytes() == b"the tenant's target"
