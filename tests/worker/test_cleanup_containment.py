"""A cleanup whose way into the booking's storage runs through a symbolic link deletes nothing
and does not stop the worker from leasing (DESIGN §5.9, §7.3). The runtime tests drive cleanup
through the real API; here the API is a recording stand-in, because what is under test is what
the worker does on disk."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

from ito.core.worker_messages import CleanupJob
from ito.worker.api import WorkerApi
from ito.worker.executors import Executor
from ito.worker.loop import WorkerLoop

RUN = "run_abcdefghijklmnopqrstuvwx"


class RecordingApi:
    """Hands out one cleanup job and records what the worker reports and asks for."""

    def __init__(self, job: dict[str, Any]) -> None:
        self.job = job
        self.cleaned_calls: list[tuple[str, int, list[str]]] = []
        self.leases = 0

    def cleanups(self) -> list[CleanupJob]:
        return [CleanupJob.model_validate(self.job)]

    def cleaned(self, run_id: str, bytes_freed: int, paths: list[str]) -> None:
        self.cleaned_calls.append((run_id, bytes_freed, paths))

    def lease(self) -> dict[str, Any] | None:
        self.leases += 1
        return None


def _no_executor() -> Executor:
    raise AssertionError("nothing is leased in these tests")


def test_a_link_on_the_way_to_a_run_directory_refuses_its_cleanup_and_deletes_nothing(
    tmp_path: Path,
) -> None:
    outside = tmp_path / "outside"
    (outside / RUN / "pretrain").mkdir(parents=True)
    (outside / RUN / "pretrain" / "precious.bin").write_bytes(b"\x01" * 512)
    storage = tmp_path / "storage"
    storage.mkdir()
    (storage / "runs").symlink_to(outside)  # storage/runs/<run> is outside/<run> by name
    home = tmp_path / "home"
    (home / "work" / RUN).mkdir(parents=True)
    api = RecordingApi(
        {
            "run_id": RUN,
            "checkpoint_uri": f"file://{storage}/runs/{RUN}",
            "storage_uri": f"file://{storage}",
        }
    )
    loop = WorkerLoop(cast(WorkerApi, api), home, _no_executor)

    assert loop.tick() is False
    assert loop.tick() is False  # retried every round, refused every round

    assert (outside / RUN / "pretrain" / "precious.bin").read_bytes() == b"\x01" * 512
    assert api.cleaned_calls == []
    assert api.leases == 2  # leasing went on
    assert (home / "work" / RUN).is_dir()


def test_a_run_directory_with_links_inside_is_cleaned_without_following_them(
    tmp_path: Path,
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "precious.bin").write_bytes(b"\x01" * 512)
    storage = tmp_path / "storage"
    run_dir = storage / "runs" / RUN
    (run_dir / "pretrain").mkdir(parents=True)
    (run_dir / "pretrain" / "shard.bin").write_bytes(b"\x00" * 100)
    (run_dir / "pretrain" / "step_00000001").symlink_to(outside)
    (run_dir / "tokenizer.json").symlink_to(outside / "precious.bin")
    home = tmp_path / "home"
    (home / "work" / RUN).mkdir(parents=True)
    (home / "work" / RUN / "spec-1.json").write_bytes(b"{}")
    api = RecordingApi(
        {
            "run_id": RUN,
            "checkpoint_uri": f"file://{storage}/runs/{RUN}",
            "storage_uri": f"file://{storage}",
        }
    )

    assert WorkerLoop(cast(WorkerApi, api), home, _no_executor).tick() is True

    assert api.cleaned_calls == [(RUN, 102, [str(run_dir), str(home / "work" / RUN)])]
    assert not run_dir.exists() and not (home / "work" / RUN).exists()
    assert (outside / "precious.bin").read_bytes() == b"\x01" * 512
