"""Recovery bench: seconds from a kill to detection and to the first resumed training step, and
goodput with injected failures against a clean run — on a real server, worker and torchrun.

Set-up (all through the real programs, on a temporary SQLite file and ``$ITO_HOME``):
``ito-server migrate`` / ``account create`` / ``key create``, then ``ito-server serve
--no-worker`` on a free loopback port with short lease settings (``ITO_LEASE_TTL_SECONDS``,
``ITO_HEARTBEAT_SECONDS``; ``--lease-ttl`` / ``--heartbeat``), a completed booking (1 node × 2
CPU "GPUs"), a booking-bound worker key, and a separate ``ito-worker --booking B`` process (the
local executor: ``torchrun --nproc-per-node=2``, gloo), so the worker itself can be killed.
The manifest is ``ito manifest init --recipe demo`` (pretrain 400k tokens = 390 steps,
checkpoint every 50 steps, then ``long_context``); runs are created with ``ito confirm`` →
approve → ``ito train``.

1. **clean run**: trained to ``succeeded`` untouched; its telemetry (``GET /v1/telemetry?run_id=``,
   what ``ito telemetry --run`` shows) is the reference.
2. **faulted run**, two faults in sequence (fault injection kills real processes; the spec's
   ``fail_at`` cannot be set through the API):

   a. **kill -9 of a training rank** (rank 1, found with ``pgrep -f <run_id>``, its ``RANK`` read
      from ``/proc``) half an interval after a committed checkpoint. torchrun restarts the
      worker group, which resumes from the last commit: reported are seconds from the kill to
      the engine's ``resumed from`` log line and to the first resumed step (the first ``metric``
      event after the kill in the attempt's events file), and the steps recomputed.
   b. **kill -9 of the worker and its whole process tree** (``ito-worker``, torchrun, the ranks)
      half an interval after the next commit; a new ``ito-worker`` is started at once (a
      restarted worker). Reported: seconds from the kill to detection (the run's ``recovering``
      state event, from the server's lease expiry) and to the first resumed step of the new
      attempt.

Goodput (productive step time that survived ÷ wall time the run held a lease, §7.7) of the
faulted run ÷ the clean run's. The time held includes the outage (the dead attempt's last
heartbeat to the next lease); a second goodput over the run's whole wall time (first lease →
finish) is shown beside it as a cross-check.

Defaults of the service: lease TTL 30 s, heartbeat 5 s, sweep 1 s. Detection takes at most the
TTL plus one sweep, so with defaults about 31 s, and the resume adds the measured restart time —
both far under the 10 and 15 minutes of the seed; the bench prints that projection.

It prints tables and, last, one JSON line. Loopback only; every process it starts (server,
workers, torchrun and its ranks) is killed in ``finally``.

Usage: ``.venv/bin/python bench/recovery.py [--lease-ttl 5] [--heartbeat 1]``.
"""

from __future__ import annotations

import argparse
import json
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx

from _common import (
    BIN,
    Processes,
    child_env,
    cmdline,
    descendants,
    environ,
    exit_on_sigterm,
    kill_pid,
    pids_matching,
    read_events,
    rnd,
    table,
)

DEFAULT_TTL_S = 30.0
DEFAULT_HEARTBEAT_S = 5.0
DEFAULT_SWEEP_S = 1.0
RUN_TIMEOUT_S = 420.0
CLI_TIMEOUT_S = 120.0
TERMINAL = {"succeeded", "failed", "gate_failed", "cancelled"}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_until(predicate: Any, timeout: float, what: str, interval: float = 0.05) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)


def ts(iso: str) -> float:
    return datetime.fromisoformat(iso).timestamp()


class Bench:
    def __init__(self, tmp: Path, procs: Processes, ttl: float, heartbeat: float) -> None:
        self.tmp = tmp
        self.procs = procs
        self.ttl = ttl
        self.heartbeat = heartbeat
        self.url = ""
        self.env: dict[str, str] = {}
        self.keys: dict[str, str] = {}
        self.booking = ""
        self.worker_home = tmp / "worker-home"
        self.http = httpx.Client(timeout=30, trust_env=False)

    # ---- set-up -------------------------------------------------------------------------------

    def cli(self, argv: list[str], env: dict[str, str]) -> dict[str, Any]:
        proc = subprocess.run(
            argv, env=env, capture_output=True, text=True, timeout=CLI_TIMEOUT_S, check=False
        )
        try:
            envelope = json.loads(proc.stdout)
        except ValueError:
            envelope = None
        if proc.returncode != 0 or not envelope or not envelope.get("ok"):
            raise RuntimeError(
                f"{argv[0]} {argv[1]} failed: {proc.stdout[-2000:]}{proc.stderr[-2000:]}"
            )
        return dict(envelope["data"])

    def start_server(self) -> None:
        home = self.tmp / "server-home"
        home.mkdir()
        self.env = child_env(
            ITO_HOME=str(home),
            ITO_DATABASE_URL=f"sqlite:///{self.tmp / 'ito.db'}",
            ITO_PEPPER="bench-" + secrets.token_hex(16),
            ITO_LEASE_TTL_SECONDS=str(self.ttl),
            ITO_HEARTBEAT_SECONDS=str(self.heartbeat),
        )
        server = str(BIN / "ito-server")
        self.cli([server, "migrate", "--json"], self.env)
        self.keys["desk"] = self.cli(
            [server, "key", "create", "--role", "desk", "--json"], self.env
        )["api_key"]
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        log = (self.tmp / "server.log").open("wb")
        proc = self.procs.start(
            [server, "serve", "--host", "127.0.0.1", "--port", str(port), "--no-worker"],
            env=self.env | {"ITO_PUBLIC_URL": self.url},
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()

        def healthy() -> bool:
            if proc.poll() is not None:
                raise RuntimeError(
                    "the server exited: " + (self.tmp / "server.log").read_text()[-3000:]
                )
            try:
                return self.http.get(self.url + "/v1/health", timeout=1).status_code == 200
            except httpx.HTTPError:
                return False

        wait_until(healthy, 60, "the server to be healthy", 0.2)

    def api(self, method: str, path: str, key: str, **kwargs: Any) -> Any:
        response = self.http.request(
            method,
            self.url + path,
            **kwargs,
            headers={"authorization": f"Bearer {self.keys.get(key, key)}"},
        )
        envelope = response.json()
        if not envelope.get("ok"):
            raise RuntimeError(f"{method} {path}: {envelope}")
        return envelope["data"]

    def tenant(self) -> None:
        account = self.api("POST", "/v1/desk/accounts", "desk", json={"name": "bench"})[
            "account_id"
        ]
        for role in ("requester", "approver"):
            self.keys[role] = self.api(
                "POST", "/v1/desk/keys", "desk", json={"account_id": account, "role": role}
            )["api_key"]
        now = datetime.now(UTC)
        self.booking = self.api(
            "POST",
            "/v1/desk/bookings",
            "desk",
            json={
                "account_id": account,
                "gpu": "cpu",
                "nodes": 1,
                "gpus_per_node": 2,
                "region": "local",
                "fabric": "ethernet",
                "start": (now - timedelta(hours=1)).isoformat(),
                "end": (now + timedelta(days=1)).isoformat(),
                "rate_usd_per_gpu_hour": 0.5,
                "storage_uri": f"file://{self.tmp / 'storage'}",
                "storage_quota_gb": 20.0,
                "state": "completed",
            },
        )["booking_id"]
        self.keys["worker"] = self.api(
            "POST",
            "/v1/desk/keys",
            "desk",
            json={"account_id": account, "role": "worker", "booking_id": self.booking},
        )["api_key"]

    def client_env(self, key: str | None) -> dict[str, str]:
        env = child_env(ITO_API_URL=self.url, ITO_HOME=str(self.tmp / "client-home"))
        if key:
            env["ITO_API_KEY"] = self.keys[key]
        return env

    def manifest(self, tokens: int | None) -> Path:
        out = self.tmp / "manifest"
        self.cli(
            [str(BIN / "ito"), "manifest", "init", "--recipe", "demo", "--out", str(out), "--json"],
            self.client_env(None),
        )
        path = out / "manifest.json"
        if tokens:
            document = json.loads(path.read_text())
            document["curriculum"][0]["tokens"] = tokens
            path.write_text(json.dumps(document, indent=2))
        return path

    def create_run(self, manifest: Path, key: str) -> str:
        ito = str(BIN / "ito")
        env = self.client_env("requester")
        ref = self.cli(
            [
                ito,
                "confirm",
                "--action",
                "train",
                "--booking",
                self.booking,
                "--manifest",
                str(manifest),
                "--json",
            ],
            env,
        )["confirmation_ref"]
        self.api("POST", f"/v1/confirmations/{ref}/approve", "approver")
        return str(
            self.cli(
                [
                    ito,
                    "train",
                    "--booking",
                    self.booking,
                    "--manifest",
                    str(manifest),
                    "--confirmation-ref",
                    ref,
                    "--idempotency-key",
                    key,
                    "--json",
                ],
                env,
            )["run_id"]
        )

    def start_worker(self, name: str) -> subprocess.Popen[bytes]:
        env = child_env(
            ITO_API_URL=self.url, ITO_API_KEY=self.keys["worker"], ITO_HOME=str(self.worker_home)
        )
        log = (self.tmp / f"{name}.log").open("wb")
        proc = self.procs.start(
            [str(BIN / "ito-worker"), "--booking", self.booking, "--poll-seconds", "0.5"],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()
        return proc

    # ---- observation --------------------------------------------------------------------------

    def run(self, run_id: str) -> dict[str, Any]:
        return dict(self.api("GET", f"/v1/runs/{run_id}", "requester"))

    def telemetry(self, run_id: str) -> dict[str, Any]:
        return dict(self.api("GET", "/v1/telemetry", "requester", params={"run_id": run_id}))

    def wait_terminal(self, run_id: str) -> dict[str, Any]:
        return dict(
            wait_until(
                lambda: (r := self.run(run_id))["state"] in TERMINAL and r,
                RUN_TIMEOUT_S,
                f"run {run_id} to finish",
                0.5,
            )
        )

    def events_path(self, run_id: str, attempt: int) -> Path:
        return (
            self.worker_home / "worker" / self.booking / "work" / run_id / f"events-{attempt}.jsonl"
        )

    def metrics(self, run_id: str, attempt: int) -> list[dict[str, Any]]:
        return [e for e in read_events(self.events_path(run_id, attempt)) if e["type"] == "metric"]

    def wait_mid_interval(
        self, run_id: str, attempt: int, after_step: int, every: int
    ) -> tuple[int, int]:
        """Wait for a committed checkpoint past ``after_step`` and half an interval of steps
        after it; returns (checkpoint step, current step)."""

        def ready() -> tuple[int, int] | None:
            events = read_events(self.events_path(run_id, attempt))
            ckpts = [
                e["step"]
                for e in events
                if e["type"] == "checkpoint" and e["step"] > after_step and e["stage"] == "pretrain"
            ]
            steps = [e["step"] for e in events if e["type"] == "metric"]
            if ckpts and steps and steps[-1] >= ckpts[0] + every // 2:
                return ckpts[0], steps[-1]
            return None

        return wait_until(ready, RUN_TIMEOUT_S, "a checkpoint and half an interval", 0.02)

    # ---- faults ---------------------------------------------------------------------------------

    def rank_pid(self, run_id: str, rank: int) -> int:
        def find() -> int | None:
            for pid in pids_matching(run_id):
                argv = cmdline(pid)
                if (
                    "ito.pipeline.run" in argv
                    and not any("torchrun" in a for a in argv)
                    and environ(pid).get("RANK") == str(rank)
                ):
                    return pid
            return None

        return int(wait_until(find, 30, f"rank {rank} of {run_id}"))


def alive(pid: int) -> bool:
    """Running (not gone, not a zombie)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2 :].split()[0] != "Z"


def fault_rank(bench: Bench, run_id: str, every: int) -> dict[str, Any]:
    ckpt, _ = bench.wait_mid_interval(run_id, 1, 0, every)
    pid = bench.rank_pid(run_id, 1)
    last = bench.metrics(run_id, 1)[-1]["step"]
    kill_pid(pid)
    killed = time.time()

    def resumed() -> dict[str, Any] | None:
        return next((e for e in bench.metrics(run_id, 1) if e["ts"] > killed), None)

    first = wait_until(resumed, RUN_TIMEOUT_S, "the first step after the rank kill", 0.02)
    events = read_events(bench.events_path(run_id, 1))
    restored = next(
        (
            e
            for e in events
            if e["type"] == "log"
            and e["ts"] > killed
            and str(e.get("message", "")).startswith("resumed from")
        ),
        None,
    )
    return {
        "checkpoint_step": ckpt,
        "step_at_kill": last,
        "resumed_at_step": first["step"],
        "steps_recomputed": last - first["step"] + 1,
        "seconds_to_restore": restored["ts"] - killed if restored else None,
        "seconds_to_first_step": first["ts"] - killed,
    }


def fault_worker(
    bench: Bench, run_id: str, worker: subprocess.Popen[bytes], after_step: int, every: int
) -> tuple[dict[str, Any], subprocess.Popen[bytes]]:
    ckpt, _ = bench.wait_mid_interval(run_id, 1, after_step, every)
    tree = descendants(worker.pid)
    last = bench.metrics(run_id, 1)[-1]["step"]
    for pid in [worker.pid, *tree]:
        kill_pid(pid)
    killed = time.time()
    worker.wait(timeout=30)
    time.sleep(0.5)
    survivors = [p for p in tree if alive(p)]
    restarted = bench.start_worker("worker-2")

    def recovering() -> float | None:
        events = bench.run(run_id).get("events", [])
        return next(
            (
                ts(e["at"])
                for e in events
                if e["kind"] == "state" and e.get("to_state") == "recovering"
            ),
            None,
        )

    detected = wait_until(recovering, RUN_TIMEOUT_S, "the run to go recovering", 0.1)

    def resumed() -> dict[str, Any] | None:
        found = bench.metrics(run_id, 2)
        return found[0] if found else None

    first = wait_until(resumed, RUN_TIMEOUT_S, "the first step of attempt 2", 0.02)
    restored = next(
        (
            e
            for e in read_events(bench.events_path(run_id, 2))
            if e["type"] == "log" and str(e.get("message", "")).startswith("resumed from")
        ),
        None,
    )
    releases = [
        ts(e["at"])
        for e in bench.run(run_id)["events"]
        if e["kind"] == "state" and e.get("to_state") == "running"
    ]
    return {
        "checkpoint_step": ckpt,
        "step_at_kill": last,
        "resumed_at_step": first["step"],
        "steps_recomputed": last - first["step"] + 1,
        "processes_killed": 1 + len(tree),
        "survivors": len(survivors),
        "seconds_to_detection": detected - killed,
        "seconds_to_new_lease": (releases[-1] - killed) if len(releases) > 1 else None,
        "seconds_to_restore": restored["ts"] - killed if restored else None,
        "seconds_to_first_step": first["ts"] - killed,
    }, restarted


def wall_goodput(run: dict[str, Any], tele: dict[str, Any]) -> float | None:
    leases = [
        ts(e["at"])
        for e in run["events"]
        if e["kind"] == "state" and e.get("to_state") == "running"
    ]
    if not leases or not run.get("finished_at"):
        return None
    return float(tele["productive_seconds"]) / (ts(run["finished_at"]) - leases[0])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lease-ttl", type=float, default=5.0, help="ITO_LEASE_TTL_SECONDS")
    parser.add_argument("--heartbeat", type=float, default=1.0, help="ITO_HEARTBEAT_SECONDS")
    parser.add_argument(
        "--tokens", type=int, default=None, help="pretrain tokens (default: the demo recipe's 400k)"
    )
    args = parser.parse_args(argv)

    exit_on_sigterm()
    tmp = Path(tempfile.mkdtemp(prefix="ito-bench-recovery-"))
    procs = Processes(str(tmp))
    bench = Bench(tmp, procs, args.lease_ttl, args.heartbeat)
    try:
        bench.start_server()
        bench.tenant()
        manifest = bench.manifest(args.tokens)
        document = json.loads(manifest.read_text())
        every = int(document["checkpoint"]["every_steps"])
        print(
            f"server {bench.url} (SQLite, --no-worker), lease TTL {args.lease_ttl} s, "
            f"heartbeat {args.heartbeat} s; ito-worker --executor local (torchrun, 2 ranks); "
            f"demo recipe, pretrain {document['curriculum'][0]['tokens']:,} tokens, "
            f"checkpoint every {every} steps",
            flush=True,
        )
        worker = bench.start_worker("worker-1")

        started = time.monotonic()
        clean_id = bench.create_run(manifest, "bench-clean")
        clean = bench.wait_terminal(clean_id)
        clean_tele = bench.telemetry(clean_id)
        print(
            f"  clean run {clean_id}: {clean['state']} in {time.monotonic() - started:.0f} s",
            flush=True,
        )

        started = time.monotonic()
        fault_id = bench.create_run(manifest, "bench-faults")
        rank = fault_rank(bench, fault_id, every)
        print(
            f"  faulted run {fault_id}: rank 1 killed at step {rank['step_at_kill']} → "
            f"resumed at step {rank['resumed_at_step']} after "
            f"{rank['seconds_to_first_step']:.1f} s",
            flush=True,
        )
        wk, worker = fault_worker(bench, fault_id, worker, rank["checkpoint_step"], every)
        print(
            f"  faulted run: worker tree killed at step {wk['step_at_kill']} → recovering "
            f"after {wk['seconds_to_detection']:.1f} s, resumed at step "
            f"{wk['resumed_at_step']} after {wk['seconds_to_first_step']:.1f} s",
            flush=True,
        )
        faulted = bench.wait_terminal(fault_id)
        fault_tele = bench.telemetry(fault_id)
        print(
            f"  faulted run: {faulted['state']} in {time.monotonic() - started:.0f} s", flush=True
        )

        print()
        print(
            table(
                "kill → recovery (seconds)",
                [
                    "fault",
                    "detection",
                    "new lease",
                    "restored",
                    "first resumed step",
                    "ckpt step",
                    "killed at",
                    "resumed at",
                    "steps recomputed",
                ],
                [
                    [
                        "kill -9 rank 1 (torchrun restart)",
                        None,
                        None,
                        rank["seconds_to_restore"],
                        rank["seconds_to_first_step"],
                        rank["checkpoint_step"],
                        rank["step_at_kill"],
                        rank["resumed_at_step"],
                        rank["steps_recomputed"],
                    ],
                    [
                        "kill -9 worker + tree (new worker)",
                        wk["seconds_to_detection"],
                        wk["seconds_to_new_lease"],
                        wk["seconds_to_restore"],
                        wk["seconds_to_first_step"],
                        wk["checkpoint_step"],
                        wk["step_at_kill"],
                        wk["resumed_at_step"],
                        wk["steps_recomputed"],
                    ],
                ],
            )
        )
        print()
        clean_wall = wall_goodput(clean, clean_tele)
        fault_wall = wall_goodput(faulted, fault_tele)
        rows = []
        for name, run, tele, wall in (
            ("clean", clean, clean_tele, clean_wall),
            ("2 faults", faulted, fault_tele, fault_wall),
        ):
            rows.append(
                [
                    name,
                    run["state"],
                    tele["interruptions"],
                    tele["wall_seconds_held"],
                    tele["productive_seconds"],
                    tele["goodput"],
                    wall,
                ]
            )
        print(
            table(
                "goodput (telemetry of the run)",
                [
                    "run",
                    "state",
                    "interruptions",
                    "held s",
                    "productive s",
                    "goodput",
                    "goodput over whole wall",
                ],
                rows,
            )
        )
        ratio = (
            fault_tele["goodput"] / clean_tele["goodput"]
            if fault_tele["goodput"] and clean_tele["goodput"]
            else None
        )
        ratio_wall = fault_wall / clean_wall if fault_wall and clean_wall else None
        print()
        print(
            f"goodput with 2 injected failures ÷ clean: {ratio:.3f} (lease-held wall), "
            f"{ratio_wall:.3f} (whole wall)"
            if ratio and ratio_wall
            else "goodput: n/a"
        )
        restart = wk["seconds_to_first_step"] - wk["seconds_to_detection"]
        projected_detect = DEFAULT_TTL_S + DEFAULT_SWEEP_S
        projected_resume = projected_detect + restart
        print(
            f"with the service defaults (TTL {DEFAULT_TTL_S:.0f} s, heartbeat "
            f"{DEFAULT_HEARTBEAT_S:.0f} s, sweep {DEFAULT_SWEEP_S:.0f} s): detection ≤ "
            f"{projected_detect:.0f} s (target < 600 s), resume ≈ {projected_resume:.0f} s "
            f"(target < 900 s); a killed rank resumes in {rank['seconds_to_first_step']:.0f} s "
            "regardless of the lease"
        )
        ok = (
            clean["state"] == "succeeded"
            and faulted["state"] == "succeeded"
            and wk["survivors"] == 0
        )
        summary = {
            "bench": "recovery",
            "lease_ttl_s": args.lease_ttl,
            "heartbeat_s": args.heartbeat,
            "world": 2,
            "executor": "local",
            "checkpoint_every_steps": every,
            "rank_kill": {k: rnd(v, 3) if isinstance(v, float) else v for k, v in rank.items()},
            "worker_kill": {k: rnd(v, 3) if isinstance(v, float) else v for k, v in wk.items()},
            "clean": {
                "state": clean["state"],
                **{
                    k: clean_tele[k]
                    for k in ("goodput", "wall_seconds_held", "productive_seconds", "interruptions")
                },
                "goodput_whole_wall": rnd(clean_wall),
            },
            "faulted": {
                "state": faulted["state"],
                **{
                    k: fault_tele[k]
                    for k in ("goodput", "wall_seconds_held", "productive_seconds", "interruptions")
                },
                "goodput_whole_wall": rnd(fault_wall),
            },
            "goodput_ratio": rnd(ratio),
            "goodput_ratio_whole_wall": rnd(ratio_wall),
            "projected_default_detection_s": projected_detect,
            "projected_default_resume_s": rnd(projected_resume, 1),
            "ok": ok,
        }
        print(json.dumps(summary))
        return 0 if ok else 1
    finally:
        bench.http.close()
        procs.kill_all()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
