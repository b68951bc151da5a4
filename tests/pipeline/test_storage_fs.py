"""Checkpoint storage is proven inside the booking's storage on disk, at every use: no symbolic
link anywhere from the root down, writes through the proven directory, deletes that never follow
a link (DESIGN §5.8 gate 5, §7.3)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from ito.core.errors import ItoError
from ito.pipeline.checkpoint import COMMIT, committed_checkpoints, remove_uncommitted
from ito.pipeline.storage_fs import StoragePath, open_proven, proven_dir, remove_tree


def _code(fn: Callable[[], object]) -> str:
    with pytest.raises(ItoError) as info:
        fn()
    return info.value.code


def _snapshot(top: Path) -> dict[str, bytes | None]:
    """Every entry under ``top`` (links as themselves) with the bytes of its regular files."""
    found: dict[str, bytes | None] = {}
    for base, dirs, files in os.walk(top):
        for name in dirs + files:
            path = Path(base, name)
            found[str(path.relative_to(top))] = (
                path.read_bytes() if path.is_file() and not path.is_symlink() else None
            )
    return found


@pytest.fixture
def layout(tmp_path: Path) -> tuple[Path, Path]:
    """A booking root ``storage`` with ``runs/run_x/pretrain`` in it, and an ``outside``
    directory holding a file nobody may touch."""
    root = tmp_path / "storage"
    (root / "runs" / "run_x" / "pretrain").mkdir(parents=True)
    outside = tmp_path / "outside"
    (outside / "pretrain").mkdir(parents=True)
    (outside / "precious.txt").write_text("keep me")
    (outside / "pretrain" / "precious.bin").write_bytes(b"\x00" * 16)
    return root, outside


RUN_DIR = ("runs", "run_x")


@pytest.mark.parametrize("depth", [1, 2, 3], ids=["runs", "run-dir", "stage"])
def test_a_symlink_at_any_depth_below_the_root_is_refused_and_nothing_is_created(
    layout: tuple[Path, Path], depth: int
) -> None:
    root, outside = layout
    parts = ("runs", "run_x", "pretrain")
    linked = root.joinpath(*parts[:depth])
    before = _snapshot(outside)
    os.rename(linked, linked.with_name(linked.name + ".moved"))
    linked.symlink_to(outside if depth < 3 else outside / "pretrain")
    where = StoragePath(root, (*parts, "step_00000001"))

    assert _code(lambda: open_proven(where, create=True)) == "checkpoint_storage_invalid"
    assert _code(lambda: open_proven(where)) == "checkpoint_storage_invalid"
    assert (
        _code(lambda: remove_tree(StoragePath(root, parts[: depth + 1])))
        == "checkpoint_storage_invalid"
    )
    assert _snapshot(outside) == before


def test_a_symlinked_root_is_refused(layout: tuple[Path, Path], tmp_path: Path) -> None:
    root, _ = layout
    link = tmp_path / "storage-link"
    link.symlink_to(root)
    assert (
        _code(lambda: open_proven(StoragePath(link, RUN_DIR), create=True))
        == "checkpoint_storage_invalid"
    )
    assert _code(lambda: remove_tree(StoragePath(link, RUN_DIR))) == "checkpoint_storage_invalid"
    assert (root / "runs" / "run_x" / "pretrain").is_dir()


def test_a_dangling_link_is_refused_and_never_made_into_a_directory(
    layout: tuple[Path, Path], tmp_path: Path
) -> None:
    root, _ = layout
    target = tmp_path / "not-yet"
    (root / "runs" / "run_y").symlink_to(target)
    where = StoragePath(root, ("runs", "run_y", "pretrain"))
    assert _code(lambda: open_proven(where, create=True)) == "checkpoint_storage_invalid"
    assert not target.exists()


def test_a_file_where_a_directory_belongs_is_refused(layout: tuple[Path, Path]) -> None:
    root, _ = layout
    (root / "runs" / "run_z").write_text("not a directory")
    assert (
        _code(lambda: open_proven(StoragePath(root, ("runs", "run_z")), create=True))
        == "checkpoint_storage_invalid"
    )


def test_a_proven_directory_reports_its_real_location_and_creates_what_is_missing(
    tmp_path: Path,
) -> None:
    real_parent = tmp_path / "real"
    real_parent.mkdir()
    (tmp_path / "alias").symlink_to(real_parent)  # above the root: the operator's layout
    where = StoragePath(tmp_path / "alias" / "storage", ("runs", "run_x"))
    with proven_dir(where, create=True) as proven:
        assert proven.real == real_parent / "storage" / "runs" / "run_x"
        assert os.path.samestat(os.stat(proven.handle), os.stat(proven.real))
    assert (real_parent / "storage" / "runs" / "run_x").stat().st_mode & 0o777 == 0o700


def test_a_link_swapped_in_after_the_proof_redirects_nothing_and_the_next_use_is_refused(
    layout: tuple[Path, Path],
) -> None:
    root, outside = layout
    before = _snapshot(outside)
    where = StoragePath(root, ("runs", "run_x", "pretrain"))
    with proven_dir(where) as proven:
        # Between the proof and the write, the run's directory becomes a link to outside.
        run_dir = root / "runs" / "run_x"
        os.rename(run_dir, root / "runs" / "moved")
        run_dir.symlink_to(outside)
        proven.write_new("written.bin", b"data")
        (proven.handle / "through-handle.bin").write_bytes(b"data")  # how DCP writes
    assert _snapshot(outside) == before
    assert (root / "runs" / "moved" / "pretrain" / "written.bin").read_bytes() == b"data"
    assert (root / "runs" / "moved" / "pretrain" / "through-handle.bin").exists()
    assert _code(lambda: open_proven(where)) == "checkpoint_storage_invalid"


def test_write_new_never_follows_a_link_at_the_file_name(layout: tuple[Path, Path]) -> None:
    root, outside = layout
    (root / "runs" / "run_x" / "pretrain" / "COMMIT").symlink_to(outside / "precious.txt")
    with (
        proven_dir(StoragePath(root, ("runs", "run_x", "pretrain"))) as proven,
        pytest.raises(FileExistsError),
    ):
        proven.write_new("COMMIT", b"{}")
    assert (outside / "precious.txt").read_text() == "keep me"


def test_deleting_a_tree_unlinks_links_inside_it_and_leaves_their_targets(
    layout: tuple[Path, Path],
) -> None:
    root, outside = layout
    before = _snapshot(outside)
    run_dir = root / "runs" / "run_x"
    (run_dir / "pretrain" / "data.bin").write_bytes(b"1234")
    (run_dir / "pretrain" / "to-outside").symlink_to(outside)
    (run_dir / "file-link").symlink_to(outside / "precious.txt")

    removed = remove_tree(StoragePath(root, RUN_DIR))

    assert removed is not None and removed == (4, run_dir)
    assert not run_dir.exists() and (root / "runs").is_dir()
    assert _snapshot(outside) == before
    assert remove_tree(StoragePath(root, RUN_DIR)) is None  # already gone: nothing to do
    assert _code(lambda: remove_tree(StoragePath(root))) == "checkpoint_storage_invalid"


def test_a_link_in_place_of_a_stage_or_step_is_neither_listed_nor_pruned(
    layout: tuple[Path, Path],
) -> None:
    root, outside = layout
    run_dir = root / "runs" / "run_x"
    fake = outside / "pretrain" / "step_00000002"
    fake.mkdir()
    (fake / COMMIT).write_text('{"step": 2, "stage": "pretrain"}')
    uncommitted = outside / "pretrain" / "step_00000001"
    uncommitted.mkdir()
    (uncommitted / "shard").write_text("an uncommitted step, as remove_uncommitted sees one")
    (run_dir / "pretrain" / "step_00000002").symlink_to(fake)
    (run_dir / "long_context").symlink_to(outside / "pretrain")
    before = _snapshot(outside)

    assert committed_checkpoints(StoragePath(root, RUN_DIR)) == []
    assert remove_uncommitted(StoragePath(root, RUN_DIR)) == []
    assert _snapshot(outside) == before
