"""Helpers shared by the runtime benches (``train_overhead``, ``checkpoint``, ``recovery``).

Process hygiene: every process a bench starts is registered in a :class:`Processes` set, which
kills, in ``finally``, each registered process's whole tree (walked through ``/proc`` while the
parent lives) and then every process whose command line carries the bench's own temporary
directory (torchrun starts its workers in sessions of their own, so a worker whose torchrun
already died is no longer under it). Everything is killed by PID.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ito.worker.executors import descendants

BIN = Path(sys.executable).parent
TORCHRUN = str(BIN / "torchrun")
BENCH_DIR = Path(__file__).resolve().parent


# ---------------------------------------------------------------------------------------------
# Processes


def pids_matching(token: str) -> list[int]:
    """PIDs (other than this process) whose command line contains ``token``."""
    found = []
    me = os.getpid()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as handle:
                cmdline = handle.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if token in cmdline:
            found.append(int(entry))
    return found


def cmdline(pid: int) -> list[str]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            return [p.decode(errors="replace") for p in handle.read().split(b"\0") if p]
    except OSError:
        return []


def environ(pid: int) -> dict[str, str]:
    try:
        with open(f"/proc/{pid}/environ", "rb") as handle:
            items = handle.read().split(b"\0")
    except OSError:
        return {}
    env = {}
    for item in items:
        key, _, value = item.partition(b"=")
        if key:
            env[key.decode(errors="replace")] = value.decode(errors="replace")
    return env


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of every thread of ``pid`` so far (``/proc/<pid>/stat``)."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            stat = handle.read()
    except OSError:
        return None
    fields = stat[stat.rfind(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def kill_pid(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, signal.SIGKILL)


class Processes:
    """The processes a bench started; :meth:`kill_all` stops every one of them by PID."""

    def __init__(self, token: str) -> None:
        self.token = token
        """A string (the bench's temporary directory) in the command line of every child."""
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self, argv: list[str], **kwargs: Any) -> subprocess.Popen[bytes]:
        kwargs.setdefault("start_new_session", True)
        proc = subprocess.Popen(argv, **kwargs)
        self.procs.append(proc)
        return proc

    def kill_tree(self, proc: subprocess.Popen[bytes]) -> None:
        for pid in [*reversed(descendants(proc.pid)), proc.pid]:
            kill_pid(pid)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=30)

    def kill_all(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                self.kill_tree(proc)
        for _ in range(3):
            stray = pids_matching(self.token)
            if not stray:
                break
            for pid in stray:
                kill_pid(pid)
            time.sleep(0.2)
        for proc in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)


def exit_on_sigterm() -> None:
    """Turn SIGTERM into ``SystemExit`` so the caller's ``finally`` still stops its processes."""

    def handler(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, handler)


def child_env(**extra: str) -> dict[str, str]:
    """The environment for child processes: no ``ITO_*`` from the caller, one OpenMP thread
    per process (what the local executor sets), no proxies for loopback."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ITO_")}
    env["OMP_NUM_THREADS"] = env.get("OMP_NUM_THREADS", "1")
    env["NO_PROXY"] = env["no_proxy"] = "127.0.0.1,localhost"
    env |= extra
    return env


def torchrun(nproc: int, *args: str, max_restarts: int = 0) -> list[str]:
    return [
        TORCHRUN,
        "--standalone",
        f"--nproc-per-node={nproc}",
        f"--max-restarts={max_restarts}",
        *args,
    ]


# ---------------------------------------------------------------------------------------------
# Events and figures


def read_events(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    events = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            with contextlib.suppress(ValueError):
                events.append(json.loads(line))
    return events


def median(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None


def rnd(value: float | None, digits: int = 4) -> float | None:
    return None if value is None else round(value, digits)


def fmt(value: Any, digits: int = 3) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "NO"
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def table(title: str, headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    cells = [[str(h) for h in headers], *[[fmt(c) for c in row] for row in rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = [
        title,
        "  ".join(h.ljust(w) for h, w in zip(cells[0], widths, strict=True)),
        "  ".join("-" * w for w in widths),
    ]
    for row in cells[1:]:
        lines.append(
            "  ".join(
                c.rjust(w) if i else c.ljust(w)
                for i, (c, w) in enumerate(zip(row, widths, strict=True))
            )
        )
    return "\n".join(lines)


def goal(value: float | None, target: float, *, at_least: bool) -> bool | None:
    if value is None:
        return None
    return value >= target if at_least else value <= target


def write_demo_recipe(out_dir: Path, recipe: str = "demo") -> dict[str, Any]:
    """Write a named recipe's data files into ``out_dir``; returns its manifest document."""
    from ito.recipes import build_recipe

    out_dir.mkdir(parents=True, exist_ok=True)
    built = build_recipe(recipe, str(out_dir))
    for name, content in built.files.items():
        (out_dir / name).write_bytes(content)
    return built.manifest
