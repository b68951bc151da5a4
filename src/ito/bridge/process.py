"""Running the canonical client as a bounded child process.

``shell=False`` always; a new session so that a timeout or an output overflow kills the
client and anything it started; a deadline on the whole call; a byte bound on each of stdout
and stderr (ECC's ``maxBuffer``, 10 MiB). Output is either buffered and handed back (so a
refused call leaves stdout clean for one envelope) or streamed as it arrives (device login and
followed logs must show their lines before the call ends — ECC inherits stdio for login).
The child's end is observed through a pidfd where the OS has one, so a grandchild that keeps
the pipes open (a browser opened by ``login``) cannot hold the bridge until its deadline.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import BinaryIO

__all__ = ["MAX_OUTPUT_BYTES", "Outcome", "run_bounded"]

MAX_OUTPUT_BYTES = 10 * 1024 * 1024
_CHUNK = 64 * 1024


@dataclass
class Outcome:
    """How a bounded call ended."""

    returncode: int | None
    """The child's exit status (negative: killed by that signal); None when the bridge
    stopped it."""
    stdout: bytes = b""
    """Buffered stdout (empty when streamed)."""
    stderr: bytes = b""
    """Buffered stderr (empty when streamed)."""
    timed_out: bool = False
    overflowed: bool = False
    """A stream passed the byte bound; what was buffered was discarded."""


@dataclass
class _Streams:
    stream: bool
    max_bytes: int
    counts: dict[str, int] = field(default_factory=lambda: {"stdout": 0, "stderr": 0})
    chunks: dict[str, list[bytes]] = field(default_factory=lambda: {"stdout": [], "stderr": []})

    def take(self, name: str, chunk: bytes) -> bool:
        """Account for ``chunk``; False once the bound is passed."""
        self.counts[name] += len(chunk)
        if self.counts[name] > self.max_bytes:
            return False
        if self.stream:
            sink: BinaryIO = sys.stdout.buffer if name == "stdout" else sys.stderr.buffer
            with contextlib.suppress(BrokenPipeError):
                sink.write(chunk)
                sink.flush()
        else:
            self.chunks[name].append(chunk)
        return True


def run_bounded(
    argv: list[str],
    env: dict[str, str],
    *,
    timeout: float,
    max_bytes: int = MAX_OUTPUT_BYTES,
    stream: bool = False,
    inherit_stdin: bool = False,
) -> Outcome:
    """Run ``argv`` (no shell) with exactly ``env``; never longer than ``timeout`` seconds."""
    process = subprocess.Popen(
        argv,
        env=env,
        shell=False,
        close_fds=True,
        start_new_session=True,
        stdin=None if inherit_stdin else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        return _supervise(
            process, _Streams(stream=stream, max_bytes=max_bytes), time.monotonic() + timeout
        )
    finally:
        if process.poll() is None:
            _kill(process)
        for pipe in (process.stdout, process.stderr):
            if pipe is not None:
                pipe.close()


def _supervise(process: subprocess.Popen[bytes], streams: _Streams, deadline: float) -> Outcome:
    assert process.stdout is not None and process.stderr is not None
    selector = selectors.DefaultSelector()
    pipes = {process.stdout.fileno(): "stdout", process.stderr.fileno(): "stderr"}
    for fd, name in pipes.items():
        os.set_blocking(fd, False)
        selector.register(fd, selectors.EVENT_READ, name)
    pidfd = _pidfd(process.pid)
    if pidfd is not None:
        selector.register(pidfd, selectors.EVENT_READ, "exit")
    try:
        exited = False
        while pipes and not exited:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                _kill(process)
                return Outcome(None, timed_out=True)
            for key, _ in selector.select(remaining):
                if key.data == "exit":
                    exited = True
                    continue
                fd = int(key.fd)
                if not _read(fd, key.data, streams, pipes, selector, drain=False):
                    _kill(process)
                    return Outcome(None, overflowed=True)
        for fd, name in list(pipes.items()):  # the child ended: take what it left behind
            if not _read(fd, name, streams, pipes, selector, drain=True):
                return Outcome(process.wait(), overflowed=True)
    finally:
        selector.close()
        if pidfd is not None:
            os.close(pidfd)
    try:
        returncode = process.wait(timeout=max(deadline - time.monotonic(), 0.0))
    except subprocess.TimeoutExpired:
        _kill(process)
        return Outcome(None, timed_out=True)
    return Outcome(
        returncode, b"".join(streams.chunks["stdout"]), b"".join(streams.chunks["stderr"])
    )


def _read(
    fd: int,
    name: str,
    streams: _Streams,
    pipes: dict[int, str],
    selector: selectors.BaseSelector,
    *,
    drain: bool,
) -> bool:
    """Read what ``fd`` has now (all of it when ``drain``); False on overflow."""
    while True:
        try:
            chunk = os.read(fd, _CHUNK)
        except BlockingIOError:
            return True
        if not chunk:
            selector.unregister(fd)
            del pipes[fd]
            return True
        if not streams.take(name, chunk):
            return False
        if not drain:
            return True


def _pidfd(pid: int) -> int | None:
    opener = getattr(os, "pidfd_open", None)
    if opener is None:
        return None
    try:
        return int(opener(pid))
    except OSError:
        return None


def _kill(process: subprocess.Popen[bytes]) -> None:
    """Kill the client and everything in its session, then reap it."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError):
        process.kill()
    process.wait()
