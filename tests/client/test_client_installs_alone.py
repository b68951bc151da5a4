"""``pip install ito-training`` is the client alone: ``ito``, ``ito-mcp`` and ``ecc`` without
torch, torchft, transformers, the server's libraries or the worker's. The project is installed
(not editable, no extras) into a fresh virtual environment, and its commands run there — local
ones and one against a real server — while ``import torch`` fails in it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import Tenant

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
ABSENT = ("torch", "torchft", "transformers", "tokenizers", "fastapi", "sqlalchemy", "pyarrow")


@pytest.fixture(scope="module")
def client_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    venv = tmp_path_factory.mktemp("client-venv") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    installed = subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", str(ROOT)],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert installed.returncode == 0, installed.stdout[-3000:] + installed.stderr[-3000:]
    return venv


def _run(venv: Path, *argv: str, env: dict[str, str] | None = None) -> dict[str, object]:
    proc = subprocess.run(
        [str(venv / "bin" / argv[0]), *argv[1:], "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    envelope: dict[str, object] = json.loads(proc.stdout)
    return envelope


def test_the_heavy_libraries_are_not_installed(client_venv: Path) -> None:
    python = str(client_venv / "bin" / "python")
    for module in ABSENT:
        found = subprocess.run(
            [python, "-c", f"import {module}"], capture_output=True, timeout=60, check=False
        )
        assert found.returncode != 0, f"{module} is installed with the client"


def test_the_client_commands_run_without_them(client_venv: Path, tenant: Tenant) -> None:
    version = subprocess.run(
        [str(client_venv / "bin" / "ito"), "--version"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert version.stdout.startswith("ito ")
    contract = _run(client_venv, "ito", "capabilities")
    assert contract["ok"] is True
    assert isinstance(contract["data"], dict) and contract["data"]["commands"]
    out = tenant.workdir / "storage" / "manifests" / "alone"
    made = _run(client_venv, "ito", "manifest", "init", "--recipe", "test", "--out", str(out))
    assert made["ok"] is True and (out / "manifest.json").is_file()
    # The same manifest, planned against a real server by the client installed alone.
    planned = _run(
        client_venv,
        "ito",
        "plan",
        "--booking",
        tenant.booking(),
        "--manifest",
        str(out / "manifest.json"),
        env=tenant.env(tenant.requester_key),
    )
    assert planned["ok"] is True and planned["live_api_contacted"] is True
    mcp = subprocess.run(
        [str(client_venv / "bin" / "python"), "-c", "import ito.mcp.server, ito.bridge.ecc"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert mcp.returncode == 0, mcp.stderr[-2000:]
