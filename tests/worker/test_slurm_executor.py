"""The Slurm executor against real daemons: a two-node cluster on this host.

``scripts/slurm-cluster`` starts munged, slurmctld and one slurmd per node (``n1``, ``n2``, both at
127.0.0.1) into a temporary directory once per session and stops exactly those daemons at the end.
Both "nodes" are this machine, so the tests prove the Slurm plumbing (sbatch, srun across nodes,
state and exit-code mapping, scancel) and a real rendezvous between the nodes' torchruns, not
network placement. The tests that need the daemons are marked ``slow``; the state mapping and
the generated script are checked without them.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from ito.worker.executors import LaunchSpec
from ito.worker.slurm import (
    CANCELLED_EXIT,
    JobStatus,
    SlurmExecutor,
    exit_code_for,
    job_environment,
)
from tests.worker.slurm_support import Cluster

if TYPE_CHECKING:
    from collections.abc import Callable

JOB_TIMEOUT_S = 60.0


class ShellExecutor(SlurmExecutor):
    """Runs ``script`` on each node instead of torchrun; everything else is the real executor."""

    def __init__(self, script: str, cluster: Cluster) -> None:
        super().__init__(slurm_conf=cluster.conf)
        self.script = script

    def node_command(self, launch: LaunchSpec) -> str:
        return self.script


def launch_in(workdir: Path, *, nodes: int = 2, gpus_per_node: int = 1) -> LaunchSpec:
    spec = workdir / "spec.json"
    spec.write_text("{}")
    return LaunchSpec(
        run_id=f"r{uuid.uuid4().hex[:8]}",
        attempt=1,
        spec_path=spec,
        workdir=workdir,
        nodes=nodes,
        gpus_per_node=gpus_per_node,
    )


def wait_for_exit(executor: SlurmExecutor, timeout_s: float = JOB_TIMEOUT_S) -> int:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        code = executor.poll()
        if code is not None:
            return code
        time.sleep(0.1)
    executor.kill()
    raise AssertionError(f"Slurm job {executor.job_id} did not end within {timeout_s} s")


def wait_until(check: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def pgrep(marker: str) -> list[str]:
    """PIDs of the processes whose command line holds ``marker``."""
    found = subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True, check=False)
    return found.stdout.split()


def job_output(workdir: Path, executor: SlurmExecutor) -> str:
    path = workdir / f"slurm-{executor.job_id}.out"
    return path.read_text() if path.exists() else "(no output file)"


@pytest.mark.slow
def test_two_node_job_runs_once_on_each_node_and_completion_maps_to_zero(
    slurm_cluster: Cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ITO_WORKER_KEY", "must-not-reach-the-job")
    executor = ShellExecutor(
        'echo "$SLURMD_NODENAME" > "node-$SLURM_NODEID.txt"; '
        'env | grep "^ITO_" > "ito-env-$SLURM_NODEID.txt" || true; '
        'echo "$PATH" > "path-$SLURM_NODEID.txt"',
        slurm_cluster,
    )
    executor.start(launch_in(tmp_path))

    assert wait_for_exit(executor) == 0, job_output(tmp_path, executor)
    assert (tmp_path / "node-0.txt").read_text().strip() == "n1"
    assert (tmp_path / "node-1.txt").read_text().strip() == "n2"
    for node in (0, 1):
        assert (tmp_path / f"ito-env-{node}.txt").read_text() == ""
        path = (tmp_path / f"path-{node}.txt").read_text().strip().split(os.pathsep)
        assert path[0] == str(Path(sys.executable).parent)
    assert (tmp_path / "slurm-attempt-1.sh").exists()


@pytest.mark.slow
def test_a_failing_node_command_maps_to_its_nonzero_exit_code(
    slurm_cluster: Cluster, tmp_path: Path
) -> None:
    executor = ShellExecutor('if [ "$SLURM_NODEID" = 1 ]; then exit 3; fi', slurm_cluster)
    executor.start(launch_in(tmp_path))

    assert wait_for_exit(executor) == 3, job_output(tmp_path, executor)
    assert executor.final is not None and executor.final.state == "FAILED"


@pytest.mark.slow
def test_kill_cancels_a_running_job_and_leaves_no_process_of_it(
    slurm_cluster: Cluster, tmp_path: Path
) -> None:
    marker = f"ito-slurm-test-{uuid.uuid4().hex}"
    python = sys.executable
    executor = ShellExecutor(
        f": {marker}; {python} -c 'import os, time\n"
        'open("up-" + os.environ["SLURM_NODEID"], "w").close()\n'
        f"while True: time.sleep(0.1)' {marker} & wait",
        slurm_cluster,
    )
    executor.start(launch_in(tmp_path))

    # Each node runs a bash and its python child (which wrote up-<node>), both named by the
    # marker; srun's command line holds it too.
    wait_until(
        lambda: len(list(tmp_path.glob("up-*"))) == 2 and len(pgrep(marker)) >= 4,
        JOB_TIMEOUT_S,
        "the job's processes on both nodes",
    )
    assert executor.poll() is None

    executor.kill()  # returns once the job is gone (bounded by the executor's own timeouts)
    assert executor.poll() == CANCELLED_EXIT
    assert pgrep(marker) == []


@pytest.mark.slow
def test_kill_reaches_torchrun_workers_that_run_in_sessions_of_their_own(
    slurm_cluster: Cluster, tmp_path: Path
) -> None:
    marker = f"ito-slurm-test-{uuid.uuid4().hex}"
    script = tmp_path / f"{marker}.py"
    script.write_text(
        textwrap.dedent("""
        import os
        import time

        if __name__ == "__main__":
            open(f"up-{os.environ['RANK']}", "w").close()
            while True:
                time.sleep(0.1)
        """)
    )
    executor = SlurmExecutor(entry=(str(script),), slurm_conf=slurm_cluster.conf)
    executor.start(launch_in(tmp_path, nodes=2, gpus_per_node=2))
    wait_until(
        lambda: len(list(tmp_path.glob("up-*"))) == 4,
        JOB_TIMEOUT_S,
        "four torchrun workers on two nodes",
    )
    assert len(pgrep(marker)) >= 6  # srun, two torchruns, two workers under each

    executor.kill()
    assert executor.poll() == CANCELLED_EXIT
    assert pgrep(marker) == []


@pytest.mark.slow
def test_torchrun_rendezvous_spans_both_nodes_and_gloo_all_reduce_sums_every_rank(
    slurm_cluster: Cluster, tmp_path: Path
) -> None:
    script = tmp_path / "all_reduce.py"
    script.write_text(
        textwrap.dedent("""
        import os

        import torch
        import torch.distributed as dist

        if __name__ == "__main__":
            dist.init_process_group("gloo")
            rank, world = dist.get_rank(), dist.get_world_size()
            value = torch.tensor([float(rank + 1)])
            dist.all_reduce(value)
            with open(f"rank-{rank}.txt", "w") as out:
                out.write(f"{world} {value.item()} {os.environ['SLURM_NODEID']}")
            dist.destroy_process_group()
        """)
    )
    executor = SlurmExecutor(entry=(str(script),), slurm_conf=slurm_cluster.conf)
    executor.start(launch_in(tmp_path, nodes=2, gpus_per_node=2))

    assert wait_for_exit(executor, timeout_s=90) == 0, job_output(tmp_path, executor)
    results = [(tmp_path / f"rank-{rank}.txt").read_text().split() for rank in range(4)]
    assert all(world == "4" and float(total) == 10.0 for world, total, _ in results)
    assert sorted(node for _, _, node in results) == ["0", "0", "1", "1"]
    assert "rendezvous at 127.0.0.1:" in job_output(tmp_path, executor)


@pytest.mark.parametrize(
    ("status", "expected"),
    [
        (JobStatus("COMPLETED", 0), 0),
        (JobStatus("FAILED", 3), 3),
        (JobStatus("FAILED", 0, 9), 1),
        (JobStatus("NODE_FAIL", 0), 1),
        (JobStatus("TIMEOUT", 0), 1),
        (JobStatus("OUT_OF_MEMORY", 0, 9), 1),
        (JobStatus("CANCELLED", 0, 15), CANCELLED_EXIT),
        (JobStatus("UNKNOWN", 1), 1),
    ],
)
def test_a_finished_job_state_maps_to_an_exit_code_and_only_completed_is_success(
    status: JobStatus, expected: int
) -> None:
    assert not status.active
    assert exit_code_for(status) == expected


def test_the_job_environment_drops_ito_variables_and_puts_the_venv_first() -> None:
    env = job_environment(
        {"ITO_API_KEY": "secret", "ITO_HOME": "/x", "PATH": "/usr/bin", "HOME": "/root"}
    )
    assert not any(name.startswith("ITO_") for name in env)
    assert env["PATH"].split(os.pathsep) == [str(Path(sys.executable).parent), "/usr/bin"]
    assert env["HOME"] == "/root"


def test_each_node_runs_torchrun_with_the_booked_shape_and_a_per_attempt_rendezvous(
    tmp_path: Path,
) -> None:
    launch = LaunchSpec(
        run_id="run-7",
        attempt=2,
        spec_path=tmp_path / "spec.json",
        workdir=tmp_path,
        nodes=2,
        gpus_per_node=8,
        max_restarts=3,
    )
    script = SlurmExecutor().batch_script(launch)
    torchrun = str(Path(sys.executable).parent / "torchrun")
    for part in (
        torchrun,
        '--nnodes="$SLURM_NNODES"',
        '--node-rank="$SLURM_NODEID"',
        "--nproc-per-node=8",
        "--max-restarts=3",
        "--rdzv-backend=c10d",
        '--rdzv-endpoint="$RDZV_ENDPOINT"',
        "--rdzv-id=run-7-2",
        f"-m ito.pipeline.run --spec {tmp_path / 'spec.json'}",
    ):
        assert part in script
    assert 'srun --nodes="$SLURM_NNODES" --ntasks-per-node=1' in script


def test_a_gpu_booking_asks_slurm_for_its_gpus_on_every_node_and_the_nodes_exclusively(
    tmp_path: Path,
) -> None:
    base = launch_in(tmp_path, nodes=2, gpus_per_node=8)
    executor = SlurmExecutor()
    script = tmp_path / "job.sh"
    gpu = dataclasses.replace(base, gpu="h100")
    arguments = executor.sbatch_arguments(gpu, script)
    assert arguments[0] == "sbatch" and arguments[-1] == str(script)
    assert {"--nodes=2", "--gpus-per-node=8", "--exclusive"} <= set(arguments)
    # Each node's job step asks for the node's GPUs too (a step sees only what it asks for).
    assert 'srun --nodes="$SLURM_NNODES" --ntasks-per-node=1 --kill-on-bad-exit=1 ' in (
        executor.batch_script(gpu)
    )
    assert "--gpus-per-node=8 bash -c" in executor.batch_script(gpu)
    replicas = dataclasses.replace(gpu, replica_groups=2)
    assert "--gpus-per-node=8 bash -c" in executor.batch_script(replicas)

    # The CPU stand-in asks for no GPU and shares its nodes.
    cpu_arguments = executor.sbatch_arguments(base, script)
    assert not [a for a in cpu_arguments if a.startswith("--gpus") or a == "--exclusive"]
    assert "--gpus-per-node" not in executor.batch_script(base)
