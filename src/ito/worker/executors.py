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

from ito.core.hardware import ACCELERATORS
from ito.pipeline.lighthouse import RUN_HEARTBEAT_TIMEOUT_MS, RUN_JOIN_TIMEOUT_MS, Lighthouse

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
    replica_groups: int = 1
    """More than one: a torchft lighthouse and one torchrun world per group."""
    gpu: str = "cpu"
    """The booked accelerator (:data:`ito.core.hardware.ACCELERATORS`); a GPU is requested
    from the scheduler, ``cpu`` (the stand-in) is not."""

    @property
    def on_gpu(self) -> bool:
        return ACCELERATORS[self.gpu].compute_capability is not None


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
        fields = stat[stat.rfind(")") + 2 :].split()
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
    """torchrun on this host; one node, ``gpus_per_node`` processes (gloo on CPU).

    With several replica groups: a torchft lighthouse, then one torchrun per group, each with
    ``gpus_per_node / groups`` processes and its own restarts (a restarted group heals from a
    live one). The run is over when every group has exited; it exited 0 if any group did (the
    leader's ``done`` event says how it ended).
    """

    def __init__(self) -> None:
        self.processes: list[subprocess.Popen[bytes]] = []
        self.log_file: BinaryIO | None = None
        self.lighthouse: Lighthouse | None = None

    def command(
        self, launch: LaunchSpec, replica: int | None = None, lighthouse: str | None = None
    ) -> list[str]:
        torchrun = str(Path(sys.executable).parent / "torchrun")
        nproc = launch.gpus_per_node // launch.replica_groups
        command = [
            torchrun,
            "--standalone",
            f"--nproc-per-node={nproc}",
            f"--max-restarts={launch.max_restarts}",
            "-m",
            "ito.pipeline.run",
            "--spec",
            str(launch.spec_path),
        ]
        if replica is not None and lighthouse is not None:
            command += ["--replica-id", str(replica), "--lighthouse", lighthouse]
        return command

    def start(self, launch: LaunchSpec) -> None:
        log_path = launch.workdir / f"torchrun-attempt-{launch.attempt}.log"
        self.log_file = log_path.open("ab")
        env = {k: v for k, v in os.environ.items() if not k.startswith("ITO_")}
        env["OMP_NUM_THREADS"] = env.get("OMP_NUM_THREADS", "1")
        commands = [self.command(launch)]
        if launch.replica_groups > 1:
            self.lighthouse = Lighthouse.start(
                launch.workdir / f"lighthouse-attempt-{launch.attempt}.log",
                join_timeout_ms=RUN_JOIN_TIMEOUT_MS,
                heartbeat_timeout_ms=RUN_HEARTBEAT_TIMEOUT_MS,
            )
            commands = [
                self.command(launch, i, self.lighthouse.address)
                for i in range(launch.replica_groups)
            ]
        for command in commands:
            self.processes.append(
                subprocess.Popen(
                    command,
                    cwd=launch.workdir,
                    env=env,
                    stdout=self.log_file,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )

    def poll(self) -> int | None:
        assert self.processes
        codes = [p.poll() for p in self.processes]
        if any(code is None for code in codes):
            return None
        self._stop_lighthouse()
        return 0 if 0 in codes else next(c for c in codes if c is not None)

    def kill(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                for pid in reversed(descendants(process.pid)):
                    _signal(pid, signal.SIGKILL)
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=30)
        self._stop_lighthouse()
        self._close()

    def _stop_lighthouse(self) -> None:
        if self.lighthouse is not None:
            self.lighthouse.stop()
            self.lighthouse = None

    def _close(self) -> None:
        if self.log_file is not None:
            self.log_file.close()
            self.log_file = None


def _signal(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, sig)
