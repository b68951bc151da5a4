"""The ``slurm`` executor: one ``sbatch`` job whose ``srun torchrun`` spans the booked nodes.

The batch script runs on the allocation's first node. It resolves that node's address (the
``NodeAddr`` of the first host in ``SLURM_JOB_NODELIST``), picks a free port there for the c10d
rendezvous, and starts one ``torchrun`` per node with ``srun``; the torchruns meet at that
endpoint under the rendezvous id ``<run_id>-<attempt>``, so a resubmitted attempt never joins a
stale rendezvous.

The job is followed with ``squeue`` while it is queued or running and, once it has left the queue,
with ``scontrol show job -o`` (the cluster keeps finished jobs for ``MinJobAge``) or ``sacct``
(where accounting storage exists). Its final state maps onto an exit code the way a local
process's would: ``COMPLETED`` → 0, ``CANCELLED`` → -15 (as if SIGTERM), anything else that ended
→ the job's exit code, or 1 when Slurm reports 0 for a job that did not complete.

The job's environment is the worker's minus every ``ITO_*`` variable (the worker's credentials
never reach the job), with the worker's virtual environment first on ``PATH``.
"""

from __future__ import annotations

import logging
import os
import re
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ito.core.errors import ItoError
from ito.pipeline.lighthouse import RUN_HEARTBEAT_TIMEOUT_MS, RUN_JOIN_TIMEOUT_MS

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from ito.worker.executors import LaunchSpec

__all__ = ["ACTIVE_STATES", "JobStatus", "SlurmExecutor", "exit_code_for", "job_environment"]

log = logging.getLogger(__name__)

ACTIVE_STATES = frozenset(
    {
        "PENDING",
        "CONFIGURING",
        "RUNNING",
        "COMPLETING",
        "SUSPENDED",
        "REQUEUED",
        "REQUEUE_FED",
        "REQUEUE_HOLD",
        "RESIZING",
        "SIGNALING",
        "STAGE_OUT",
        "STOPPED",
        "RESV_DEL_HOLD",
    }
)
"""Job states in which the job may still run or is still cleaning up its processes."""

CANCELLED_EXIT = -15
"""What a cancelled job maps to: the exit status of a process ended by SIGTERM."""

_COMMAND_TIMEOUT_S = 30.0
"""Ceiling on any one Slurm client command; a controller that does not answer is not waited on."""

_FIELD = re.compile(r"(?:^|\s)(JobState|ExitCode)=(\S+)")


@dataclass(frozen=True)
class JobStatus:
    """A job's state as Slurm reports it."""

    state: str
    """Base state, e.g. ``RUNNING`` or ``CANCELLED`` (sacct's ``CANCELLED by 0`` is cut)."""
    exit_code: int
    """The batch script's exit status (the part of ``ExitCode=A:S`` before the colon)."""
    signal: int = 0
    """The signal that ended it, 0 if none."""

    @property
    def active(self) -> bool:
        return self.state in ACTIVE_STATES


def exit_code_for(status: JobStatus) -> int:
    """The exit code a finished job maps to (see the module docstring)."""
    if status.state == "COMPLETED":
        return 0
    if status.state == "CANCELLED":
        return CANCELLED_EXIT
    return status.exit_code or 1


def job_environment(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The job's environment: ``environ`` without ``ITO_*``, the venv's ``bin`` first on PATH."""
    source = os.environ if environ is None else environ
    env = {k: v for k, v in source.items() if not k.startswith("ITO_")}
    venv_bin = str(Path(sys.executable).parent)
    path = [p for p in env.get("PATH", "").split(os.pathsep) if p and p != venv_bin]
    env["PATH"] = os.pathsep.join([venv_bin, *path])
    env["VIRTUAL_ENV"] = str(Path(sys.executable).parent.parent)
    # torchrun keeps one key store across elastic restarts; restarted ranks on other nodes can
    # read the previous generation's addresses (pytorch/pytorch#135712).
    env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


class SlurmExecutor:
    """Runs the pipeline as one Slurm job of ``launch.nodes`` nodes, one ``torchrun`` each."""

    def __init__(
        self,
        *,
        entry: Sequence[str] = ("-m", "ito.pipeline.run"),
        slurm_conf: Path | None = None,
        kill_timeout_s: float = 60.0,
        poll_interval_s: float = 0.2,
        query_interval_s: float = 0.5,
    ) -> None:
        self.entry = tuple(entry)
        """What ``torchrun`` runs on each rank: ``-m module`` or a script path, then its args."""
        self.slurm_conf = slurm_conf
        """The cluster's slurm.conf; ``None`` uses ``SLURM_CONF`` or Slurm's default."""
        self.kill_timeout_s = kill_timeout_s
        """How long :meth:`kill` waits for the job to leave the running states."""
        self.poll_interval_s = poll_interval_s
        """Pause between two looks at the queue while :meth:`kill` waits."""
        self.query_interval_s = query_interval_s
        """Least time between two queries of the controller; :meth:`poll` answers ``None`` in
        between, so a tight follow loop does not hammer slurmctld (Slurm asks clients not to)."""
        self._next_query = 0.0
        self.job_id: str | None = None
        self.final: JobStatus | None = None
        self._forgotten = False

    # -- what runs ------------------------------------------------------------------------------

    def node_command(self, launch: LaunchSpec) -> str:
        """Shell text ``srun`` runs once per node; ``$SLURM_*`` and ``$RDZV_ENDPOINT`` expand there.

        Tests override this to run something other than ``torchrun`` on each node.
        """
        torchrun = str(Path(sys.executable).parent / "torchrun")
        words = [
            shlex.quote(torchrun),
            '--nnodes="$SLURM_NNODES"',
            '--node-rank="$SLURM_NODEID"',
            f"--nproc-per-node={launch.gpus_per_node}",
            f"--max-restarts={launch.max_restarts}",
            "--rdzv-backend=c10d",
            '--rdzv-endpoint="$RDZV_ENDPOINT"',
            "--rdzv-id=" + shlex.quote(f"{launch.run_id}-{launch.attempt}"),
            *(shlex.quote(word) for word in self.entry),
            "--spec",
            shlex.quote(str(launch.spec_path)),
        ]
        return "exec " + " ".join(words)

    def replica_node_command(self, launch: LaunchSpec) -> str:
        """With one replica group per node: each node is its own ``torchrun`` world (standalone
        rendezvous), replica group ``$SLURM_NODEID``, meeting the others through the lighthouse
        the batch script started."""
        torchrun = str(Path(sys.executable).parent / "torchrun")
        words = [
            shlex.quote(torchrun),
            "--standalone",
            f"--nproc-per-node={launch.gpus_per_node}",
            f"--max-restarts={launch.max_restarts}",
            *(shlex.quote(word) for word in self.entry),
            "--spec",
            shlex.quote(str(launch.spec_path)),
            '--replica-id="$SLURM_NODEID"',
            '--lighthouse="$LIGHTHOUSE"',
        ]
        return "exec " + " ".join(words)

    def batch_script(self, launch: LaunchSpec) -> str:
        """The sbatch script: find the rendezvous endpoint on the first node, srun each node."""
        python = shlex.quote(sys.executable)
        free_port = "import socket; s = socket.socket(); s.bind(('', 0)); print(s.getsockname()[1])"
        if launch.replica_groups > 1:
            lighthouse = shlex.quote(str(Path(sys.executable).parent / "torchft_lighthouse"))
            return "\n".join(
                [
                    "#!/bin/bash",
                    f"# ito run {launch.run_id}, attempt {launch.attempt}, "
                    f"{launch.replica_groups} replica groups; written by SlurmExecutor.",
                    "set -euo pipefail",
                    'head_node=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
                    'head_addr=$(scontrol show node -o "$head_node" '
                    "| sed -n 's/.*NodeAddr=\\([^ ]*\\).*/\\1/p')",
                    f"lighthouse_port=$({python} -c {shlex.quote(free_port)})",
                    f'{lighthouse} --bind "0.0.0.0:$lighthouse_port" --min_replicas 1 '
                    f"--join_timeout_ms {RUN_JOIN_TIMEOUT_MS} "
                    f"--heartbeat_timeout_ms {RUN_HEARTBEAT_TIMEOUT_MS} --quorum_tick_ms 50 "
                    '> "lighthouse-$SLURM_JOB_ID.log" 2>&1 &',
                    "lighthouse_pid=$!",
                    "trap 'kill $lighthouse_pid 2>/dev/null || true' EXIT",
                    'export LIGHTHOUSE="http://${head_addr:-$head_node}:$lighthouse_port"',
                    'echo "lighthouse at $LIGHTHOUSE for $SLURM_NNODES replica groups"',
                    # A group that fails must not take the others down: they go on without it.
                    'srun --nodes="$SLURM_NNODES" --ntasks-per-node=1 --kill-on-bad-exit=0 '
                    + "".join(f"{word} " for word in _step_gpus(launch))
                    + f"bash -c {shlex.quote(self.replica_node_command(launch))}",
                    "",
                ]
            )
        return "\n".join(
            [
                "#!/bin/bash",
                f"# ito run {launch.run_id}, attempt {launch.attempt}; written by SlurmExecutor.",
                "set -euo pipefail",
                'head_node=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
                'head_addr=$(scontrol show node -o "$head_node" '
                "| sed -n 's/.*NodeAddr=\\([^ ]*\\).*/\\1/p')",
                f"head_port=$({python} -c {shlex.quote(free_port)})",
                'export RDZV_ENDPOINT="${head_addr:-$head_node}:$head_port"',
                'echo "rendezvous at $RDZV_ENDPOINT on $SLURM_NNODES nodes"',
                'srun --nodes="$SLURM_NNODES" --ntasks-per-node=1 --kill-on-bad-exit=1 '
                + "".join(f"{word} " for word in _step_gpus(launch))
                + f"bash -c {shlex.quote(self.node_command(launch))}",
                "",
            ]
        )

    def sbatch_arguments(self, launch: LaunchSpec, script: Path) -> list[str]:
        """The ``sbatch`` command line. On a GPU booking it asks for the booked GPUs on every
        node and the nodes to itself (``--exclusive``): a job that did not get them never
        starts, and the engine refuses to train where it does not see them
        (``accelerator_unavailable``)."""
        arguments = [
            "sbatch",
            "--parsable",
            "--no-requeue",
            f"--nodes={launch.nodes}",
            "--ntasks-per-node=1",
        ]
        arguments += _gpu_request(launch)
        arguments += [
            f"--job-name=ito-{launch.run_id}",
            f"--output={launch.workdir}/slurm-%j.out",
            f"--chdir={launch.workdir}",
            str(script),
        ]
        return arguments

    # -- Executor -------------------------------------------------------------------------------

    def start(self, launch: LaunchSpec) -> None:
        if launch.replica_groups > 1 and launch.replica_groups != launch.nodes:
            # Refused before anything is submitted: the run fails with a code, nothing runs.
            raise ItoError(
                "plan_refused",
                "on Slurm each replica group is one node: "
                "replica_groups must equal the booked nodes",
            )
        script = launch.workdir / f"slurm-attempt-{launch.attempt}.sh"
        script.write_text(self.batch_script(launch))
        script.chmod(0o700)
        result = self._slurm(
            *self.sbatch_arguments(launch, script), env=job_environment(self._client_environ())
        )
        if result.returncode != 0:
            raise ItoError(
                "internal_error", "sbatch refused the job: " + _first_line(result.stderr)
            )
        self.job_id = result.stdout.strip().split(";")[0]
        self.final = None
        self._next_query = 0.0
        log.info(
            "submitted run %s attempt %s as Slurm job %s",
            launch.run_id,
            launch.attempt,
            self.job_id,
        )

    def poll(self) -> int | None:
        assert self.job_id is not None, "poll() before start()"
        if self.final is None:
            now = time.monotonic()
            if now < self._next_query:
                return None
            self._next_query = now + self.query_interval_s
            status = self.status()
            if status is None or status.active:
                return None
            self.final = status
        return exit_code_for(self.final)

    def kill(self) -> None:
        if self.job_id is None or self.final is not None:
            return
        result = self._slurm("scancel", self.job_id)
        if result.returncode != 0:
            log.warning("scancel %s: %s", self.job_id, _first_line(result.stderr))
        deadline = time.monotonic() + self.kill_timeout_s
        while time.monotonic() < deadline:
            if self.poll() is not None:
                return
            time.sleep(self.poll_interval_s)
        log.warning(
            "Slurm job %s still not ended %.0f s after scancel", self.job_id, self.kill_timeout_s
        )

    # -- following the job ----------------------------------------------------------------------

    def status(self) -> JobStatus | None:
        """The job's current status, or ``None`` when Slurm cannot say right now."""
        assert self.job_id is not None
        queued = self._slurm("squeue", "-h", "-j", self.job_id, "-o", "%T")
        state = queued.stdout.strip()
        if queued.returncode == 0 and state in ACTIVE_STATES:
            return JobStatus(state, 0)
        # Gone from the queue (or squeue could not say): ask for the finished record.
        found = self._from_scontrol() or self._from_sacct()
        if found is None and self._forgotten:
            # The controller answered that it no longer knows the job and no accounting
            # remembers it: its outcome is lost, which is a failure, never a success.
            log.warning("Slurm job %s is no longer known; treating it as failed", self.job_id)
            return JobStatus("UNKNOWN", 1)
        return found

    def _from_scontrol(self) -> JobStatus | None:
        assert self.job_id is not None
        result = self._slurm("scontrol", "show", "job", "-o", self.job_id)
        self._forgotten = "invalid job id" in result.stderr.lower()
        if result.returncode != 0:
            return None
        fields = dict(_FIELD.findall(result.stdout))
        if "JobState" not in fields:
            return None
        code, _, sig = fields.get("ExitCode", "0:0").partition(":")
        return JobStatus(fields["JobState"], _int(code), _int(sig))

    def _from_sacct(self) -> JobStatus | None:
        assert self.job_id is not None
        result = self._slurm("sacct", "-n", "-X", "-P", "-j", self.job_id, "-o", "State,ExitCode")
        line = _first_line(result.stdout)
        if result.returncode != 0 or "|" not in line:
            return None
        state, _, exit_code = line.partition("|")
        code, _, sig = exit_code.partition(":")
        return JobStatus(state.split()[0], _int(code), _int(sig))

    def _client_environ(self) -> dict[str, str]:
        env = dict(os.environ)
        if self.slurm_conf is not None:
            env["SLURM_CONF"] = str(self.slurm_conf)
        return env

    def _slurm(
        self, *argv: str, env: Mapping[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        try:
            return subprocess.run(
                argv,
                capture_output=True,
                text=True,
                check=False,
                env=dict(env) if env is not None else self._client_environ(),
                timeout=_COMMAND_TIMEOUT_S,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            return subprocess.CompletedProcess(argv, 127, "", f"{argv[0]}: {exc}")


def _gpu_request(launch: LaunchSpec) -> list[str]:
    """The booked GPUs of every node, and the nodes exclusively, on a GPU booking."""
    if not launch.on_gpu:
        return []
    return [f"--gpus-per-node={launch.gpus_per_node}", "--exclusive"]


def _step_gpus(launch: LaunchSpec) -> list[str]:
    """A job step sees only the GPUs it asks for: each node's torchrun asks for all of them."""
    return [f"--gpus-per-node={launch.gpus_per_node}"] if launch.on_gpu else []


def _first_line(text: str) -> str:
    return next((line.strip() for line in text.splitlines() if line.strip()), "")[:500]


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        return 0
