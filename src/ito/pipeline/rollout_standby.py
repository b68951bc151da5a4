"""RLVR's rollout worker started ahead of its stage (:mod:`ito.pipeline.rollout_worker`).

Torch-free, so the engine's entry point can start it before importing torch: the worker's own
start-up (the interpreter, torch, transformers' model code: seconds) then overlaps the
trainer's, and the stages before RLVR, instead of delaying RLVR's first step.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

__all__ = ["POLL_S", "Standby", "lobby_path", "stop_worker", "touch"]

POLL_S = 0.002
"""How often the worker and the trainer look for each other's files."""


def lobby_path(workdir: Path, attempt: int) -> Path:
    """The directory of this attempt's and torchrun restart's rollout worker."""
    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    return workdir / "rollout" / f"{attempt}-{restart}"


def touch(path: Path) -> None:
    """Create the empty file ``path`` atomically (a temporary name, renamed)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(b"")
    os.replace(tmp, path)


def stop_worker(proc: subprocess.Popen[bytes], stop: Path) -> None:
    """Ask the worker to end (the file ``stop``, which it polls for) and wait for it; killed
    if it has not ended within a minute."""
    touch(stop)
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@dataclass
class Standby:
    """A worker process started before its stage (rank 0): it imports and waits in ``lobby``
    until :meth:`ito.pipeline.rollout_worker.RolloutClient.start` assigns it a stage, so its
    start-up (the interpreter, torch, transformers: seconds) overlaps whatever the run does
    before RLVR instead of delaying RLVR's first step. It serves one stage, exits on
    ``lobby/stop`` or when its parent is gone, and costs an idle process until then."""

    lobby: Path
    proc: subprocess.Popen[bytes]

    @classmethod
    def start(cls, lobby: Path) -> Standby:
        """Clear every earlier lobby beside ``lobby`` (a worker of a crashed world that has
        not exited yet then writes nowhere a new one reads) and start a worker waiting in
        it."""
        shutil.rmtree(lobby.parent, ignore_errors=True)
        lobby.mkdir(parents=True)
        proc = subprocess.Popen(
            [sys.executable, "-m", "ito.pipeline.rollout_worker", str(lobby), str(os.getpid())],
            env={**os.environ, "OMP_NUM_THREADS": "1"},
        )
        return cls(lobby, proc)

    def close(self) -> None:
        """Stop the worker if it is still waiting (a stage it serves is stopped by its
        client) and remove the lobby."""
        if self.proc.poll() is None:
            stop_worker(self.proc, self.lobby / "stop")
        shutil.rmtree(self.lobby, ignore_errors=True)
        with contextlib.suppress(OSError):
            self.lobby.parent.rmdir()
