"""Fake canonical clients for the ``ecc ito`` bridge tests: process-boundary probes, as in ECC's
``makeItoProbe``. Each is a real executable script (mode 0755, an absolute ``#!`` interpreter)
that appends its argv, environment and resolved path to a log — one log for the capability
probe, one for every other call — and then behaves as configured. None contacts anything.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from ito.client.capabilities import capabilities
from ito.client.cli import app as ito_app
from tests.support import BIN, Result

ECC = str(BIN / "ecc")

_SCRIPT = """#!{python}
import json, os, signal, sys, threading
CONFIG = json.loads({config!r})
argv = sys.argv[1:]
record = json.dumps({{"argv": argv, "env": dict(os.environ),
                     "exe": os.path.realpath(sys.argv[0])}})
if [a for a in argv if a != "--json"][:1] == ["capabilities"]:
    with open(CONFIG["probe_log"], "a") as log:
        log.write(record + "\\n")
    if CONFIG["probe_hang"]:
        threading.Event().wait()
    sys.stdout.write(CONFIG["probe_stdout"])
    sys.exit(CONFIG["probe_exit"])
with open(CONFIG["log"], "a") as log:
    log.write(record + "\\n")
sys.stdout.write(CONFIG["stdout"].replace("{{argv}}", "|".join(argv)))
sys.stdout.flush()
sys.stderr.write(CONFIG["stderr"])
sys.stderr.flush()
if CONFIG["flood"]:
    sys.stdout.write("x" * CONFIG["flood"])
    sys.stdout.flush()
if CONFIG["wait_stdin"]:
    sys.stdin.readline()
if CONFIG["hang"]:
    threading.Event().wait()
if CONFIG["kill_self"]:
    os.kill(os.getpid(), signal.SIGKILL)
sys.exit(CONFIG["exit"])
"""


def envelope(commands: list[dict[str, str]], **data: Any) -> dict[str, Any]:
    """A capability envelope in the shape ``ito capabilities --json`` prints."""
    body = capabilities(ito_app)
    body["commands"] = commands
    body |= data
    return {
        "ok": True,
        "live_api_contacted": False,
        "notice": "capabilities of this client; nothing was sent",
        "data": body,
    }


def all_supported() -> list[dict[str, str]]:
    """The real client's contract with every command marked supported."""
    commands = cast("list[dict[str, str]]", copy.deepcopy(capabilities(ito_app)["commands"]))
    for command in commands:
        command["availability"] = "supported"
    return commands


def with_change(name: str, **fields: str) -> list[dict[str, str]]:
    commands = all_supported()
    for command in commands:
        if command["name"] == name:
            command |= fields
    return commands


@dataclass
class FakeClient:
    path: Path
    log: Path
    probe_log: Path

    def calls(self) -> list[dict[str, Any]]:
        return _records(self.log)

    def probes(self) -> list[dict[str, Any]]:
        return _records(self.probe_log)


def _records(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines()]


def make_fake(
    directory: Path,
    *,
    probe: dict[str, Any] | str | None = None,
    probe_exit: int = 0,
    probe_hang: bool = False,
    exit_code: int = 0,
    stdout: str = "fake-client:{argv}\n",
    stderr: str = "fake-client-stderr\n",
    flood: int = 0,
    hang: bool = False,
    wait_stdin: bool = False,
    kill_self: bool = False,
    name: str = "ito",
    mode: int = 0o755,
) -> FakeClient:
    """Write a fake client at ``directory/name``. ``probe``: the capability output (an
    envelope dict, raw text, or None for every command supported)."""
    directory.mkdir(parents=True, exist_ok=True)
    log, probe_log = directory / f"{name}.calls.jsonl", directory / f"{name}.probes.jsonl"
    if probe is None:
        probe = envelope(all_supported())
    config = {
        "log": str(log),
        "probe_log": str(probe_log),
        "probe_stdout": probe if isinstance(probe, str) else json.dumps(probe) + "\n",
        "probe_exit": probe_exit,
        "probe_hang": probe_hang,
        "exit": exit_code,
        "stdout": stdout,
        "stderr": stderr,
        "flood": flood,
        "hang": hang,
        "wait_stdin": wait_stdin,
        "kill_self": kill_self,
    }
    path = directory / name
    path.write_text(_SCRIPT.format(python=sys.executable, config=json.dumps(config)))
    path.chmod(mode)
    return FakeClient(path=path, log=log, probe_log=probe_log)


def make_decoy(directory: Path, name: str = "ito", shebang: str = "#!/bin/sh") -> Path:
    """An executable that, if anything ever runs it, leaves ``directory/STOLEN`` with the
    environment it was given. Returns the marker's path."""
    directory.mkdir(parents=True, exist_ok=True)
    marker = directory / "STOLEN"
    script = directory / name
    script.write_text(f'{shebang}\nenv > "{marker}"\n')
    script.chmod(0o755)
    return marker


def base_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """A plain user environment for the bridge: nothing of ours unless given."""
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(tmp_path),
        "LANG": "C.UTF-8",
    }
    env |= extra
    return env


def ecc(
    args: list[str], env: dict[str, str], cwd: Path | None = None, timeout: float = 60.0
) -> Result:
    """Run ``ecc`` as a subprocess; the envelope is parsed when stdout is one JSON document."""
    proc = subprocess.run(
        [ECC, *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False
    )
    try:
        parsed = json.loads(proc.stdout)
    except ValueError:
        parsed = None
    return Result(
        proc.returncode, parsed if isinstance(parsed, dict) else None, proc.stdout, proc.stderr
    )
