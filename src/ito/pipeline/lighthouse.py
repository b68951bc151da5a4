"""The torchft lighthouse as a subprocess (torch-free: the worker starts it for a run with
several replica groups, and the fault-tolerance tests start it directly)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

__all__ = ["Lighthouse"]

RUN_JOIN_TIMEOUT_MS = 60_000
"""For a run's replica groups: a live group is waited for (it may be evaluating or
checkpointing)..."""
RUN_HEARTBEAT_TIMEOUT_MS = 5_000
"""...a silent one is dropped from the quorum after 5 s."""
_LISTENING = re.compile(r"Lighthouse listening on: \S*:(\d+)")


class Lighthouse:
    """A ``torchft_lighthouse`` subprocess bound to a free loopback port (or ``bind_host``).

    ``min_replicas=1`` lets a lone survivor keep training. ``heartbeat_timeout_ms`` is how long a
    silent replica still counts as alive, and so bounds how soon survivors form a new quorum after a
    kill; ``join_timeout_ms`` is how long a new quorum waits for heartbeating stragglers.
    """

    def __init__(self, process: subprocess.Popen[bytes], address: str, log_path: Path) -> None:
        self.process = process
        self.address = address
        """``http://host:port``, what replicas pass as ``lighthouse_addr``."""
        self.log_path = log_path

    @classmethod
    def start(
        cls,
        log_path: Path,
        *,
        bind_host: str = "127.0.0.1",
        min_replicas: int = 1,
        join_timeout_ms: int = 1000,
        heartbeat_timeout_ms: int = 1000,
        quorum_tick_ms: int = 50,
        start_timeout_s: float = 30.0,
    ) -> Lighthouse:
        exe = Path(sys.executable).with_name("torchft_lighthouse")
        command = str(exe) if exe.exists() else shutil.which("torchft_lighthouse")
        if command is None:
            raise FileNotFoundError("torchft_lighthouse (pip install torchft==0.2.0)")
        log = log_path.open("wb")
        try:
            process = subprocess.Popen(
                [
                    command,
                    "--bind",
                    f"{bind_host}:0",
                    "--min_replicas",
                    str(min_replicas),
                    "--join_timeout_ms",
                    str(join_timeout_ms),
                    "--heartbeat_timeout_ms",
                    str(heartbeat_timeout_ms),
                    "--quorum_tick_ms",
                    str(quorum_tick_ms),
                ],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        finally:
            log.close()
        # Port 0 lets the kernel pick; the lighthouse logs the port it got.
        deadline = time.monotonic() + start_timeout_s
        while time.monotonic() < deadline:
            found = _LISTENING.search(log_path.read_text(errors="replace"))
            if found:
                return cls(process, f"http://{bind_host}:{found.group(1)}", log_path)
            if process.poll() is not None:
                break
            time.sleep(0.02)
        process.kill()
        process.wait()
        raise RuntimeError(f"lighthouse did not start: {log_path.read_text(errors='replace')}")

    def stop(self, timeout_s: float = 10.0) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def __enter__(self) -> Lighthouse:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
