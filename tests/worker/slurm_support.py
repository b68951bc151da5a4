"""The real two-node Slurm cluster for tests (``scripts/slurm-cluster``), one per session."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CLUSTER_SCRIPT = REPO / "scripts" / "slurm-cluster"


@dataclass(frozen=True)
class Cluster:
    dir: Path
    conf: Path


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    if os.geteuid() != 0:
        pytest.skip("the two-node Slurm cluster needs root (munged, slurmctld, slurmd)")
    if shutil.which("slurmctld") is None and shutil.which("apt-get") is None:
        pytest.skip("Slurm is not installed and apt-get is not available to install it")
    directory = tmp_path_factory.mktemp("slurm")
    # One cluster per pytest-xdist worker (gw0, gw1…), each on ports of its own.
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw")
    port = 17000 + 10 * (int(worker) if worker.isdigit() else 0)
    env = {**os.environ, "ITO_SLURM_CTLD_PORT": str(port)}
    started = subprocess.run(
        [str(CLUSTER_SCRIPT), "start", str(directory)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    try:
        if started.returncode != 0:
            pytest.fail(f"slurm-cluster start failed:\n{started.stdout}\n{started.stderr}")
        yield Cluster(directory, directory / "slurm.conf")
    finally:
        subprocess.run([str(CLUSTER_SCRIPT), "stop", str(directory)], timeout=120, check=False)
