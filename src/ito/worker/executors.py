"""Executors start the pipeline on the booked hardware and can stop it (DESIGN §7.1).

``local`` runs ``torchrun --nproc-per-node=<booked GPUs per node>`` on this host, in its own
session. torchrun starts its workers in sessions of their own, so killing torchrun's process group
does not reach them: :meth:`LocalExecutor.kill` walks the process tree under torchrun (``/proc``)
and kills every descendant by PID, then torchrun itself.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Protocol

__all__ = ["Executor", "LaunchSpec", "LocalExecutor", "descendants"]


@dataclass(frozen=True)
class LaunchSpec:
    run_id: str
    attempt: int
    spec_path: Path
    workdir: Path
    nodes: int
    gpus_per_node: int
    max_restarts: int = 2


class Executor(Protocol):
    def start(self, launch: LaunchSpec) -> None: ...
    def poll(self) -> int | None: ...
    def kill(self) -> None: ...


def descendants(pid: int) -> list[int]:
    """Every live descendant of ``pid`` (Linux ``/proc``), deepest last."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as handle:
                stat = handle.read()
        except OSError:
            continue
        # The command name is in parentheses and may contain spaces: split after it.
        fields = stat[stat.rfind(")") + 2:].split()
        children.setdefault(int(fields[1]), []).append(int(entry))
    found: list[int] = []
    frontier = [pid]
    while frontier:
        current = frontier.pop()
        for child in children.get(current, []):
            found.append(child)
            frontier.append(child)
    return found


class LocalExecutor:
    """torchrun on this host; one node, ``gpus_per_node`` processes (gloo on CPU)."""

    def __init__(self) -> None:
        self.process: subprocess.Popen[bytes] | None = None
        self.log_file: BinaryIO | None = None

    def command(self, launch: LaunchSpec) -> list[str]:
        torchrun = str(Path(sys.executable).parent / "torchrun")
        return [torchrun, "--standalone", f"--nproc-per-node={launch.gpus_per_node}",
                f"--max-restarts={launch.max_restarts}",
                "-m", "ito.pipeline.run", "--spec", str(launch.spec_path)]

    def start(self, launch: LaunchSpec) -> None:
        log_path = launch.workdir / f"torchrun-attempt-{launch.attempt}.log"
        self.log_file = log_path.open("ab")
        env = {k: v for k, v in os.environ.items() if not k.startswith("ITO_")}
        env["OMP_NUM_THREADS"] = env.get("OMP_NUM_THREADS", "1")
        self.process = subprocess.Popen(self.command(launch), cwd=launch.workdir, env=env,
                                        stdout=self.log_file, stderr=subprocess.STDOUT,
                                        start_new_session=True)

    def poll(self) -> int | None:
        assert self.process is not None
        return self.process.poll()

    def kill(self) -> None:
        if self.process is None or self.process.poll() is not None:
            self._close()
            return
        for pid in reversed(descendants(self.process.pid)):
            _signal(pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=30)
        self._close()

    def _close(self) -> None:
        if self.log_file is not None:
            self.log_file.close()
            self.log_file = None


def _signal(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, sig)
