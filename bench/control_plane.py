"""Control-plane load bench: gated run creation under concurrency, against a bare baseline.

For each backend (SQLite in a fresh ``$ITO_HOME``; PostgreSQL in a fresh ``ito_bench_<random>``
database that is dropped at the end) this script:

1. sets up through the real operator CLI (``ito-server migrate``, ``account create``, ``key
   create`` for a requester and an approver, ``booking create --state completed``) and starts a
   real ``ito-server serve --no-worker --workers N`` on a free loopback port (``--workers``; by
   default 2 on both backends: on this 2-core machine, where the load generator shares the
   cores, medians of three runs each gave, SQLite, create ratio 0.53 with two processes vs
   0.39 with one, server CPU per create 2.4x vs 2.6x the insert's — the processes' writers
   queue on one lock per process, then on the database's — and PostgreSQL 0.60 vs 0.61, 2.5x vs
   2.4x, i.e. no difference);
2. **flow round**: ``--clients`` concurrent clients, each doing ``--runs-per-client`` times what
   ``ito confirm`` / ``ito approve`` / ``ito train`` / ``ito status`` do: upload the manifest,
   request a confirmation, approve it with the approver key, check the manifest, create the run
   with a unique idempotency key, then poll its status ``--polls`` times;
3. **create burst**: the same clients first get the same number of confirmations approved
   (untimed), then all fire only ``POST /v1/runs`` — the gated create alone, comparable one for
   one with the baseline's insert;
4. **duplicate rounds** (``--dup-rounds``, new keys each time): groups of clients fire
   ``POST /v1/runs`` with one shared idempotency key, each after a random delay up to
   ``--dup-jitter-ms`` (so some arrive while the first is committing) — in "same" groups with
   identical bodies (exactly one run; the others must replay it, retrying only on the retryable
   ``idempotency_in_progress``), in "conflict" groups each with its own approved confirmation
   (exactly one run; the others ``idempotency_key_reused``, their confirmations still
   ``approved``, i.e. nothing consumed);
5. **read-only round**: the same clients poll status, logs and metrics of the created runs
   (``--read-polls`` times each); their p99s and server CPU per read are reported against
   the bare app's steady round (step 7);
6. counts runs per idempotency key through the API (``GET /v1/runs?idempotency_key=``) and in
   the database (duplicates must be 0), and scans the server log for tracebacks and lock errors;
7. stops the server, then serves ``bench/baseline_app.py`` (FastAPI + SQLAlchemy, one
   ``POST /insert`` of one row, same backend) and hammers it twice, connections opened and
   warmed before the clock starts: like the create burst (same concurrency, same number of
   requests: the create ratios), then steadily like the read round (each client ``3 x
   --read-polls`` requests in a row: the read ratios). With ``--repeat N`` all of it runs N
   times per backend and the last JSON line also holds each target's median (``medians``).

``ratio_gated_create`` = create-burst runs/s ÷ bare inserts/s (one request each);
``ratio_full_flow`` = flow-round runs/s (about 8 requests per run) ÷ bare inserts/s. The load
generator shares the machine's cores with the server; its own CPU time is reported beside the
server's, and server CPU per create vs per insert is the figure least sensitive to that.

It prints a table and, last, one JSON line with every figure; the exit status is 1 when a
backend failed, a duplicate run exists or a duplicate round misbehaved. Loopback only; every
loop is bounded in count and time (``--max-seconds``); every subprocess it starts is stopped,
and the PostgreSQL database dropped, in ``finally``.

Usage: ``.venv/bin/python bench/control_plane.py [--clients 64] [--runs-per-client 2]
[--backends sqlite,postgres]``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ipaddress
import json
import math
import os
import random
import re
import secrets
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx

BENCH_DIR = Path(__file__).resolve().parent
LOOPBACK = "127.0.0.1"
DEFAULT_PG_ADMIN_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
CLI_TIMEOUT_S = 120.0
HEALTH_DEADLINE_S = 60.0
STOP_GRACE_S = 10.0
MAX_IN_PROGRESS_RETRIES = 20
LOG_PATTERN = re.compile(r"traceback|error|exception|locked|deadlock|timeout", re.IGNORECASE)


# ---------------------------------------------------------------------------------------------
# Measurements


def percentile(values: list[float], pct: float) -> float | None:
    """Nearest-rank percentile (None when there is nothing to rank)."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(pct / 100.0 * len(ordered)))
    return ordered[rank - 1]


def ms(value: float | None) -> float | None:
    return None if value is None else round(value * 1000.0, 2)


@dataclass
class Recorder:
    """Latencies and outcomes per endpoint label, for one server run."""

    latencies: dict[str, list[float]] = field(default_factory=dict)
    outcomes: dict[str, Counter[str]] = field(default_factory=dict)

    def add(self, label: str, seconds: float, outcome: str) -> None:
        self.latencies.setdefault(label, []).append(seconds)
        self.outcomes.setdefault(label, Counter())[outcome] += 1

    def summary(self, label: str) -> dict[str, Any]:
        values = self.latencies.get(label, [])
        return {
            "count": len(values),
            "p50_ms": ms(percentile(values, 50)),
            "p99_ms": ms(percentile(values, 99)),
            "max_ms": ms(max(values) if values else None),
            "outcomes": dict(sorted(self.outcomes.get(label, Counter()).items())),
        }

    def server_errors(self) -> int:
        return sum(
            n
            for counter in self.outcomes.values()
            for outcome, n in counter.items()
            if outcome.startswith("5") or outcome.startswith("transport")
        )


async def call(
    client: httpx.AsyncClient,
    rec: Recorder,
    label: str,
    method: str,
    path: str,
    *,
    token: str,
    **kwargs: Any,
) -> tuple[int, dict[str, Any] | None]:
    """One request; records latency and outcome (``200``, ``409:idempotency_in_progress``,
    ``transport:ReadTimeout``...). Returns (status, envelope) — status 0 on transport failure."""
    headers = {"Authorization": f"Bearer {token}"} | kwargs.pop("headers", {})
    start = time.perf_counter()
    try:
        response = await client.request(method, path, headers=headers, **kwargs)
    except httpx.HTTPError as exc:
        rec.add(label, time.perf_counter() - start, f"transport:{type(exc).__name__}")
        return 0, None
    elapsed = time.perf_counter() - start
    try:
        envelope = response.json()
    except ValueError:
        envelope = None
    outcome = str(response.status_code)
    if isinstance(envelope, dict) and not envelope.get("ok", False):
        outcome += ":" + str((envelope.get("error") or {}).get("code", "?"))
    rec.add(label, elapsed, outcome)
    return response.status_code, envelope


def new_client(base_url: str, timeout_s: float) -> httpx.AsyncClient:
    # trust_env=False: never route loopback traffic through a proxy from the environment.
    return httpx.AsyncClient(
        base_url=base_url,
        timeout=timeout_s,
        trust_env=False,
        limits=httpx.Limits(max_connections=4, max_keepalive_connections=4),
    )


# ---------------------------------------------------------------------------------------------
# Processes


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((LOOPBACK, 0))
        return int(sock.getsockname()[1])


def ito_server_command() -> list[str]:
    script = Path(sys.executable).parent / "ito-server"
    if script.exists():
        return [str(script)]
    found = shutil.which("ito-server")
    if found:
        return [found]
    return [sys.executable, "-c", "from ito.server.cli import main; main()"]


def operator(env: dict[str, str], *args: str) -> dict[str, Any]:
    """One ``ito-server ... --json`` operator command; its envelope's data, or SystemExit."""
    proc = subprocess.run(
        [*ito_server_command(), *args, "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=CLI_TIMEOUT_S,
        check=False,
    )
    try:
        envelope = json.loads(proc.stdout)
    except ValueError:
        envelope = None
    if proc.returncode != 0 or not isinstance(envelope, dict) or not envelope.get("ok"):
        raise SystemExit(
            f"ito-server {args[0]} failed (rc={proc.returncode}): "
            f"{proc.stdout[-800:]} {proc.stderr[-800:]}"
        )
    return dict(envelope.get("data") or {})


def cpu_seconds(pid: int) -> float | None:
    """User+system CPU of a process and its live child processes (``serve --workers N``) from
    /proc (Linux); None elsewhere."""
    total = 0.0
    found = False
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(stat.parent.name) == pid or int(fields[1]) == pid:
            total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
            found = found or int(stat.parent.name) == pid
    return total if found else None


class Server:
    """A server subprocess on a loopback port, its log in a file; stopped by ``stop``."""

    def __init__(
        self,
        name: str,
        command: list[str],
        env: dict[str, str],
        log_path: Path,
        port: int,
        health_path: str,
    ) -> None:
        self.name = name
        self.base_url = f"http://{LOOPBACK}:{port}"
        self.log_path = log_path
        self.health_path = health_path
        self._log = log_path.open("wb")
        self.proc = subprocess.Popen(
            command,
            env=env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )

    def wait_healthy(self, deadline_s: float = HEALTH_DEADLINE_S) -> float:
        start = time.monotonic()
        with httpx.Client(base_url=self.base_url, timeout=2.0, trust_env=False) as client:
            while time.monotonic() - start < deadline_s:
                if self.proc.poll() is not None:
                    raise SystemExit(
                        f"{self.name} exited with {self.proc.returncode} before "
                        f"answering; log: {self.log_tail()}"
                    )
                try:
                    if client.get(self.health_path).status_code == 200:
                        return time.monotonic() - start
                except httpx.HTTPError:
                    pass
                # Short back-off between probes while the server imports and binds.
                time.sleep(0.1)
        raise SystemExit(f"{self.name} did not answer {self.health_path} within {deadline_s}s")

    def cpu(self) -> float | None:
        return cpu_seconds(self.proc.pid)

    def stop(self) -> int | None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(STOP_GRACE_S)
        self._log.close()
        return self.proc.returncode

    def log_tail(self, chars: int = 1500) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def suspicious_log_lines(self, limit: int = 12) -> tuple[int, list[str]]:
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return 0, []
        hits = [line.strip() for line in lines if LOG_PATTERN.search(line)]
        distinct = list(dict.fromkeys(hit[:240] for hit in hits))
        return len(hits), distinct[:limit]


# ---------------------------------------------------------------------------------------------
# Backends


@dataclass
class Backend:
    name: str
    env: dict[str, str]
    ito_db_url: str
    baseline_db_url: str
    workdir: Path


def base_env(home: Path) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("ITO_") and k.lower() not in ("http_proxy", "https_proxy", "all_proxy")
    }
    env["ITO_HOME"] = str(home)
    env["ITO_PEPPER"] = secrets.token_urlsafe(32)
    env["NO_PROXY"] = env["no_proxy"] = "127.0.0.1,localhost"
    env["PYTHONUNBUFFERED"] = "1"
    # 64 clients share one requester key here: lift its rate limit (the limiter still runs on
    # every request, so its cost is in the figures), which exists for abuse, not for load.
    env["ITO_RATE_LIMIT_PER_SECOND"] = "1000000"
    env["ITO_RATE_LIMIT_BURST"] = "10000000"
    return env


def require_loopback_url(url: str) -> None:
    host = urlsplit(url).hostname or ""
    if host == "localhost":
        return
    try:
        ok = ipaddress.ip_address(host).is_loopback
    except ValueError:
        ok = False
    if not ok:
        raise SystemExit(f"refusing a non-loopback database host: {host!r}")


def with_database(url: str, database: str, driver: str | None = None) -> str:
    parts = urlsplit(url)
    scheme = parts.scheme.split("+", 1)[0]
    if driver:
        scheme = f"{scheme}+{driver}"
    return urlunsplit((scheme, parts.netloc, f"/{database}", parts.query, parts.fragment))


@contextlib.contextmanager
def sqlite_backend(root: Path) -> Iterator[Backend]:
    home = root / "sqlite-home"
    home.mkdir(mode=0o700)
    env = base_env(home)
    yield Backend(
        name="sqlite",
        env=env,
        ito_db_url=f"sqlite:///{home / 'ito.db'}",
        baseline_db_url=f"sqlite:///{root / 'baseline.db'}",
        workdir=home,
    )


@contextlib.contextmanager
def postgres_backend(root: Path, admin_url: str) -> Iterator[Backend]:
    import psycopg

    require_loopback_url(admin_url)
    database = f"ito_bench_{secrets.token_hex(6)}"
    plain_admin = with_database(admin_url, urlsplit(admin_url).path.lstrip("/") or "postgres")
    with psycopg.connect(plain_admin, autocommit=True, connect_timeout=10) as conn:
        conn.execute(f'CREATE DATABASE "{database}"')
    try:
        home = root / "postgres-home"
        home.mkdir(mode=0o700)
        env = base_env(home)
        url = with_database(admin_url, database, driver="psycopg")
        env["ITO_DATABASE_URL"] = url
        yield Backend(name="postgres", env=env, ito_db_url=url, baseline_db_url=url, workdir=home)
    finally:
        with psycopg.connect(plain_admin, autocommit=True, connect_timeout=10) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')


# ---------------------------------------------------------------------------------------------
# The ito rounds


@dataclass
class ItoSetup:
    base_url: str
    booking_id: str
    requester_key: str
    approver_key: str
    manifest: bytes
    digest: str


def set_up_ito(backend: Backend) -> tuple[str, str, str]:
    env = backend.env
    operator(env, "migrate")
    account = operator(env, "account", "create", "--name", "bench")["account_id"]
    requester = operator(
        env,
        "key",
        "create",
        "--account",
        account,
        "--role",
        "requester",
        "--name",
        "bench-requester",
    )["api_key"]
    approver = operator(
        env, "key", "create", "--account", account, "--role", "approver", "--name", "bench-approver"
    )["api_key"]
    storage = (backend.workdir / "checkpoints").as_uri()
    booking = operator(
        env,
        "booking",
        "create",
        "--account",
        account,
        "--gpu",
        "cpu",
        "--nodes",
        "1",
        "--gpus-per-node",
        "2",
        "--region",
        "local",
        "--fabric",
        "ethernet",
        "--start",
        "2026-01-01T00:00:00Z",
        "--end",
        "2030-01-01T00:00:00Z",
        "--rate-usd-per-gpu-hour",
        "0.5",
        "--storage-uri",
        storage,
        "--state",
        "completed",
    )["booking_id"]
    return booking, requester, approver


async def confirm_and_approve(client: httpx.AsyncClient, rec: Recorder, s: ItoSetup) -> str | None:
    status, env = await call(
        client,
        rec,
        "confirmations.create",
        "POST",
        "/v1/confirmations",
        token=s.requester_key,
        json={"action": "train.create", "booking_id": s.booking_id, "manifest_id": s.digest},
    )
    if status != 200 or env is None:
        return None
    ref = str(env["data"]["confirmation_ref"])
    status, _ = await call(
        client,
        rec,
        "confirmations.approve",
        "POST",
        f"/v1/confirmations/{ref}/approve",
        token=s.approver_key,
    )
    return ref if status == 200 else None


async def create_run(
    client: httpx.AsyncClient,
    rec: Recorder,
    s: ItoSetup,
    ref: str,
    key: str,
    label: str = "runs.create",
) -> tuple[int, dict[str, Any] | None]:
    body = {
        "booking_id": s.booking_id,
        "manifest_id": s.digest,
        "confirmation_ref": ref,
        "idempotency_key": key,
    }
    status, env = await call(
        client, rec, label, "POST", "/v1/runs", token=s.requester_key, json=body
    )
    if status == 0:
        # Like `ito train`: a lost response may have committed; find the run by its key.
        _, found = await call(
            client,
            rec,
            "runs.by_key",
            "GET",
            "/v1/runs",
            token=s.requester_key,
            params={"idempotency_key": key},
        )
        runs = (found or {}).get("data", {}).get("runs", []) if found else []
        if runs:
            return 200, {"ok": True, "data": dict(runs[0]) | {"replayed": True}}
    return status, env


async def flow_client(
    index: int,
    s: ItoSetup,
    rec: Recorder,
    args: argparse.Namespace,
    tag: str,
    deadline: float,
    created: list[str],
    keys: list[str],
) -> None:
    async with new_client(s.base_url, args.request_timeout_s) as client:
        for r in range(args.runs_per_client):
            if time.monotonic() > deadline:
                rec.add("flow.skipped_deadline", 0.0, "skipped")
                return
            await call(
                client,
                rec,
                "manifests.upload",
                "POST",
                "/v1/manifests",
                token=s.requester_key,
                content=s.manifest,
                headers={"Content-Type": "application/octet-stream"},
            )
            ref = await confirm_and_approve(client, rec, s)
            if ref is None:
                continue
            await call(
                client,
                rec,
                "manifests.show",
                "GET",
                f"/v1/manifests/{s.digest}",
                token=s.requester_key,
            )
            key = f"bench-{tag}-flow-c{index}-r{r}"
            keys.append(key)
            status, env = await create_run(client, rec, s, ref, key)
            if status != 200 or env is None:
                continue
            run_id = str(env["data"]["run_id"])
            if not env["data"].get("replayed"):
                created.append(run_id)
            for _ in range(args.polls):
                await call(
                    client, rec, "runs.status", "GET", f"/v1/runs/{run_id}", token=s.requester_key
                )


async def read_client(
    index: int,
    s: ItoSetup,
    rec: Recorder,
    args: argparse.Namespace,
    run_ids: list[str],
    deadline: float,
    ready: asyncio.Barrier,
) -> None:
    """Polls status, logs and metrics; its connection opened and warmed (one untimed status
    read) before the round starts, like the baseline's."""
    async with new_client(s.base_url, args.request_timeout_s) as client:
        if run_ids:
            await call(
                client, Recorder(), "warm", "GET", f"/v1/runs/{run_ids[0]}", token=s.requester_key
            )
        await ready.wait()
        for r in range(args.read_polls if run_ids else 0):
            if time.monotonic() > deadline:
                rec.add("read.skipped_deadline", 0.0, "skipped")
                return
            run_id = run_ids[(index + r) % len(run_ids)]
            await call(
                client, rec, "read.status", "GET", f"/v1/runs/{run_id}", token=s.requester_key
            )
            await call(
                client, rec, "read.logs", "GET", f"/v1/runs/{run_id}/logs", token=s.requester_key
            )
            await call(
                client,
                rec,
                "read.metrics",
                "GET",
                f"/v1/runs/{run_id}/metrics",
                token=s.requester_key,
            )


async def burst_client(
    index: int,
    s: ItoSetup,
    rec: Recorder,
    args: argparse.Namespace,
    tag: str,
    deadline: float,
    ready: asyncio.Barrier,
    go: asyncio.Event,
    created: list[str],
    keys: list[str],
    window: list[float],
) -> None:
    async with new_client(s.base_url, args.request_timeout_s) as client:
        refs = []
        for _ in range(args.runs_per_client):
            if time.monotonic() > deadline:
                break
            ref = await confirm_and_approve(client, rec, s)
            if ref is not None:
                refs.append(ref)
        await ready.wait()
        await go.wait()
        for r, ref in enumerate(refs):
            if time.monotonic() > deadline:
                rec.add("burst.skipped_deadline", 0.0, "skipped")
                break
            key = f"bench-{tag}-burst-c{index}-r{r}"
            keys.append(key)
            status, env = await create_run(client, rec, s, ref, key, label="runs.create_burst")
            if status == 200 and env is not None and not env["data"].get("replayed"):
                created.append(str(env["data"]["run_id"]))
        window.append(time.perf_counter())


async def dup_client(
    index: int,
    group: int,
    mode: str,
    shared_ref: str | None,
    s: ItoSetup,
    rec: Recorder,
    args: argparse.Namespace,
    tag: str,
    ready: asyncio.Barrier,
    go: asyncio.Event,
    results: list[dict[str, Any]],
) -> None:
    key = f"bench-{tag}-dup-g{group}"
    async with new_client(s.base_url, args.request_timeout_s) as client:
        ref = shared_ref if mode == "same" else await confirm_and_approve(client, rec, s)
        await ready.wait()
        await go.wait()
        if args.dup_jitter_ms > 0:
            # Spread the identical requests over a short window, as retries of a request still
            # in flight would arrive, so some land while the first one is committing.
            await asyncio.sleep(random.uniform(0.0, args.dup_jitter_ms / 1000.0))
        outcome: dict[str, Any] = {
            "client": index,
            "group": group,
            "mode": mode,
            "ref": ref,
            "key": key,
        }
        if ref is None:
            outcome["result"] = "no_confirmation"
            results.append(outcome)
            return
        for attempt in range(MAX_IN_PROGRESS_RETRIES):
            status, env = await create_run(client, rec, s, ref, key, label="runs.create_dup")
            code = ((env or {}).get("error") or {}).get("code")
            if status == 409 and code == "idempotency_in_progress":
                # Retryable by contract: back off briefly and ask again (bounded).
                await asyncio.sleep(0.02 * (attempt + 1))
                continue
            break
        outcome["status"] = status
        if env and env.get("ok"):
            outcome["run_id"] = env["data"]["run_id"]
            outcome["result"] = "replayed" if env["data"].get("replayed") else "created"
        else:
            outcome["result"] = code or f"http_{status}"
        results.append(outcome)


async def count_by_key(
    s: ItoSetup, rec: Recorder, args: argparse.Namespace, keys: list[str]
) -> dict[str, int]:
    counts: dict[str, int] = {}
    queue = list(dict.fromkeys(keys))

    async def worker() -> None:
        async with new_client(s.base_url, args.request_timeout_s) as client:
            while queue:
                key = queue.pop()
                status, env = await call(
                    client,
                    rec,
                    "runs.by_key",
                    "GET",
                    "/v1/runs",
                    token=s.requester_key,
                    params={"idempotency_key": key},
                )
                counts[key] = len(env["data"]["runs"]) if status == 200 and env else -1

    await asyncio.gather(*(worker() for _ in range(min(args.clients, max(1, len(queue))))))
    return counts


async def ito_rounds(
    s: ItoSetup, server: Server, args: argparse.Namespace, deadline: float
) -> dict[str, Any]:
    rec = Recorder()
    tag = secrets.token_hex(3)
    out: dict[str, Any] = {}
    all_keys: list[str] = []

    # Warm-up: one complete flow, untimed (imports, connection pools, first queries).
    warm: list[str] = []
    warm_args = argparse.Namespace(**(vars(args) | {"runs_per_client": 1}))
    await flow_client(-1, s, Recorder(), warm_args, tag, deadline, warm, all_keys)

    # Flow round.
    created: list[str] = []
    cpu0, own0, t0 = server.cpu(), time.process_time(), time.perf_counter()
    await asyncio.gather(
        *(
            flow_client(i, s, rec, args, tag, deadline, created, all_keys)
            for i in range(args.clients)
        )
    )
    wall = time.perf_counter() - t0
    cpu1, own1 = server.cpu(), time.process_time()
    expected = args.clients * args.runs_per_client
    out["flow"] = {
        "runs_expected": expected,
        "runs_created": len(created),
        "wall_s": round(wall, 3),
        "runs_per_s": round(len(created) / wall, 2) if wall > 0 else None,
        "requests": sum(len(v) for v in rec.latencies.values()),
        "server_cpu_s": _delta(cpu0, cpu1),
        "bench_cpu_s": round(own1 - own0, 2),
    }

    # Create burst: confirmations prepared first, then only POST /v1/runs.
    burst_created: list[str] = []
    ready = asyncio.Barrier(args.clients + 1)
    go = asyncio.Event()
    ends: list[float] = []
    tasks = [
        asyncio.create_task(
            burst_client(i, s, rec, args, tag, deadline, ready, go, burst_created, all_keys, ends)
        )
        for i in range(args.clients)
    ]
    await ready.wait()
    cpu0, own0, t0 = server.cpu(), time.process_time(), time.perf_counter()
    go.set()
    await asyncio.gather(*tasks)
    wall = (max(ends) if ends else time.perf_counter()) - t0
    cpu1, own1 = server.cpu(), time.process_time()
    out["burst"] = {
        "runs_expected": expected,
        "runs_created": len(burst_created),
        "wall_s": round(wall, 3),
        "runs_per_s": round(len(burst_created) / wall, 2) if wall > 0 else None,
        "server_cpu_s": _delta(cpu0, cpu1),
        "bench_cpu_s": round(own1 - own0, 2),
    }

    # Read-only round: every client polls status, logs and metrics of the created runs (queued,
    # as agents poll them), nothing else running.
    readable = created + burst_created
    ready = asyncio.Barrier(args.clients + 1)
    tasks = [
        asyncio.create_task(read_client(i, s, rec, args, readable, deadline, ready))
        for i in range(args.clients)
    ]
    await ready.wait()
    cpu0, t0 = server.cpu(), time.perf_counter()
    await asyncio.gather(*tasks)
    wall = time.perf_counter() - t0
    out["reads"] = {
        "requests": sum(
            len(rec.latencies.get(f"read.{what}", [])) for what in ("status", "logs", "metrics")
        ),
        "wall_s": round(wall, 3),
        "server_cpu_s": _delta(cpu0, server.cpu()),
    }

    # Duplicate rounds: groups sharing one idempotency key, fired together.
    group_size = max(2, args.clients // max(1, args.dup_keys))
    groups = max(1, args.clients // group_size)
    results: list[dict[str, Any]] = []
    for round_no in range(args.dup_rounds):
        if time.monotonic() > deadline:
            break
        ids = [round_no * groups + g for g in range(groups)]
        shared: dict[int, str | None] = {}
        async with new_client(s.base_url, args.request_timeout_s) as client:
            for g in ids:
                shared[g] = await confirm_and_approve(client, rec, s) if g % 2 == 0 else None
        ready = asyncio.Barrier(groups * group_size + 1)
        go = asyncio.Event()
        tasks = [
            asyncio.create_task(
                dup_client(
                    j * groups + g % groups,
                    g,
                    "same" if g % 2 == 0 else "conflict",
                    shared[g],
                    s,
                    rec,
                    args,
                    tag,
                    ready,
                    go,
                    results,
                )
            )
            for g in ids
            for j in range(group_size)
        ]
        await ready.wait()
        go.set()
        await asyncio.gather(*tasks)
        all_keys.extend(f"bench-{tag}-dup-g{g}" for g in ids)
    out["dup"] = await _judge_dups(s, rec, args, results, group_size)

    # Runs per idempotency key, through the API.
    counts = await count_by_key(s, rec, args, all_keys)
    out["keys_checked"] = len(counts)
    out["api_duplicates"] = sum(max(0, n - 1) for n in counts.values())
    out["api_lookup_failures"] = sum(1 for n in counts.values() if n < 0)
    out["api_keys_without_run"] = sum(1 for n in counts.values() if n == 0)
    out["endpoints"] = {label: rec.summary(label) for label in sorted(rec.latencies)}
    out["server_errors"] = rec.server_errors()
    return out


async def _judge_dups(
    s: ItoSetup,
    rec: Recorder,
    args: argparse.Namespace,
    results: list[dict[str, Any]],
    group_size: int,
) -> dict[str, Any]:
    anomalies: list[str] = []
    outcome_counts: Counter[str] = Counter()
    leftover_refs: list[str] = []
    group_ids = sorted({r["group"] for r in results})
    for g in group_ids:
        mine = [r for r in results if r["group"] == g]
        if len(mine) != group_size:
            anomalies.append(f"group {g}: {len(mine)} of {group_size} clients reported")
        mode = mine[0]["mode"] if mine else "?"
        outcome_counts.update(f"{mode}:{r['result']}" for r in mine)
        created = [r for r in mine if r["result"] == "created"]
        run_ids = {r["run_id"] for r in mine if "run_id" in r}
        if len(created) != 1 or len(run_ids) != 1:
            anomalies.append(f"group {g} ({mode}): {len(created)} created, run ids {run_ids}")
        if mode == "same" and any(r["result"] not in ("created", "replayed") for r in mine):
            anomalies.append(
                f"group {g} (same): "
                + ", ".join(
                    sorted(
                        {r["result"] for r in mine if r["result"] not in ("created", "replayed")}
                    )
                )
            )
        if mode == "conflict":
            bad = {
                r["result"]
                for r in mine
                if r["result"] not in ("created", "idempotency_key_reused")
            }
            if bad:
                anomalies.append(f"group {g} (conflict): unexpected {sorted(bad)}")
            leftover_refs.extend(
                r["ref"] for r in mine if r["result"] == "idempotency_key_reused" and r["ref"]
            )
    # A refused create must consume nothing: the losers' confirmations stay approved.
    consumed_by_refusals = 0
    async with new_client(s.base_url, args.request_timeout_s) as client:
        for ref in leftover_refs:
            status, env = await call(
                client,
                rec,
                "confirmations.show",
                "GET",
                f"/v1/confirmations/{ref}",
                token=s.requester_key,
            )
            if status != 200 or env is None or env["data"]["state"] != "approved":
                consumed_by_refusals += 1
    if consumed_by_refusals:
        anomalies.append(
            f"{consumed_by_refusals} refused creates left their confirmation not approved"
        )
    return {
        "groups": len(group_ids),
        "group_size": group_size,
        "rounds": args.dup_rounds,
        "outcomes": dict(sorted(outcome_counts.items())),
        "refused_confirmations_checked": len(leftover_refs),
        "anomalies": anomalies,
    }


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 2)


def _per(total_s: float | None, n: int) -> float | None:
    return None if total_s is None else total_s * 1000.0 / n


def _delta(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else round(b - a, 2)


def db_duplicates(url: str) -> dict[str, Any]:
    """Runs per (account, idempotency key), confirmations consumed, straight from the database."""
    from sqlalchemy import create_engine, text

    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            runs = conn.execute(text("SELECT count(*) FROM runs")).scalar_one()
            dup_keys = conn.execute(
                text(
                    "SELECT count(*) FROM (SELECT account_id, idempotency_key FROM runs "
                    "GROUP BY account_id, idempotency_key HAVING count(*) > 1) AS d"
                )
            ).scalar_one()
            extra = conn.execute(
                text(
                    "SELECT coalesce(sum(n - 1), 0) FROM (SELECT count(*) AS n FROM runs "
                    "GROUP BY account_id, idempotency_key HAVING count(*) > 1) AS d"
                )
            ).scalar_one()
            consumed = conn.execute(
                text("SELECT count(*) FROM confirmations WHERE state = 'consumed'")
            ).scalar_one()
            records = conn.execute(text("SELECT count(*) FROM idempotency_records")).scalar_one()
            unbound = conn.execute(
                text("SELECT count(*) FROM idempotency_records WHERE run_id IS NULL")
            ).scalar_one()
    finally:
        engine.dispose()
    return {
        "runs": int(runs),
        "keys_with_duplicates": int(dup_keys),
        "duplicate_runs": int(extra),
        "confirmations_consumed": int(consumed),
        "idempotency_records": int(records),
        "records_without_run": int(unbound),
    }


# ---------------------------------------------------------------------------------------------
# The baseline


def baseline_rows(url: str) -> int | None:
    from sqlalchemy import create_engine, text

    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            return int(conn.execute(text("SELECT count(*) FROM bench_baseline_rows")).scalar_one())
    except Exception:  # the figure is informative only
        return None
    finally:
        engine.dispose()


async def baseline_round(
    base_url: str, server: Server, args: argparse.Namespace, deadline: float
) -> dict[str, Any]:
    """Two rounds against the bare app, each after every client opened its connection and
    warmed the server with one untimed insert. **Burst**: the same shape as the create burst
    (all clients fire ``--runs-per-client`` inserts together), for the create ratios.
    **Steady**: the same shape as the read-only round (each client fires ``3 x --read-polls``
    requests one after another, as many as a read client), for the read ratios: a p99 from the
    same number of requests at the same concurrency, not from the burst's few."""
    tag = secrets.token_hex(3)
    burst = await _baseline_inserts(
        base_url, server, args, deadline, tag + "b", args.runs_per_client
    )
    steady = await _baseline_inserts(
        base_url, server, args, deadline, tag + "s", 3 * args.read_polls
    )
    return burst | {"steady": steady}


async def _baseline_inserts(
    base_url: str,
    server: Server,
    args: argparse.Namespace,
    deadline: float,
    tag: str,
    per_client: int,
) -> dict[str, Any]:
    rec = Recorder()
    ready = asyncio.Barrier(args.clients + 1)
    go = asyncio.Event()
    ends: list[float] = []

    async def client_task(index: int) -> None:
        async with new_client(base_url, args.request_timeout_s) as client:
            await call(
                client,
                Recorder(),
                "warm",
                "POST",
                "/insert",
                token="-",
                json={"key": f"{tag}-warm-c{index}"},
            )
            await ready.wait()
            await go.wait()
            for i in range(per_client):
                if time.monotonic() > deadline:
                    rec.add("insert.skipped_deadline", 0.0, "skipped")
                    break
                await call(
                    client,
                    rec,
                    "insert",
                    "POST",
                    "/insert",
                    token="-",
                    json={"key": f"{tag}-c{index}-{i}"},
                )
            ends.append(time.perf_counter())

    tasks = [asyncio.create_task(client_task(i)) for i in range(args.clients)]
    await ready.wait()
    cpu0, own0, t0 = server.cpu(), time.process_time(), time.perf_counter()
    go.set()
    await asyncio.gather(*tasks)
    wall = (max(ends) if ends else time.perf_counter()) - t0
    cpu1, own1 = server.cpu(), time.process_time()
    ok = rec.outcomes.get("insert", Counter()).get("200", 0)
    return {
        "requests": args.clients * per_client,
        "inserted": ok,
        "wall_s": round(wall, 3),
        "inserts_per_s": round(ok / wall, 2) if wall > 0 else None,
        "server_cpu_s": _delta(cpu0, cpu1),
        "bench_cpu_s": round(own1 - own0, 2),
        "insert": rec.summary("insert"),
        "server_errors": rec.server_errors(),
    }


# ---------------------------------------------------------------------------------------------
# One backend end to end


def workers_for(backend: str, args: argparse.Namespace) -> int:
    """``--workers`` when given; else what measured best on 2 cores (module docstring)."""
    if args.workers is not None:
        return int(args.workers)
    return 2


def bench_backend(
    backend: Backend, args: argparse.Namespace, manifest: bytes, digest: str, deadline: float
) -> dict[str, Any]:
    result: dict[str, Any] = {"backend": backend.name}
    t0 = time.monotonic()
    booking, requester, approver = set_up_ito(backend)
    result["setup_s"] = round(time.monotonic() - t0, 2)

    port = free_port()
    server = Server(
        "ito-server",
        [
            *ito_server_command(),
            "serve",
            "--host",
            LOOPBACK,
            "--port",
            str(port),
            "--no-worker",
            "--log-level",
            "warning",
            "--workers",
            str(workers_for(backend.name, args)),
        ],
        backend.env,
        backend.workdir / "ito-server.log",
        port,
        "/v1/health",
    )
    try:
        result["ito_startup_s"] = round(server.wait_healthy(), 2)
        setup = ItoSetup(
            base_url=server.base_url,
            booking_id=booking,
            requester_key=requester,
            approver_key=approver,
            manifest=manifest,
            digest=digest,
        )
        budget = max(30.0, deadline - time.monotonic() + 60.0)
        result["ito"] = asyncio.run(
            asyncio.wait_for(ito_rounds(setup, server, args, deadline), timeout=budget)
        )
    finally:
        result["ito_exit_code"] = server.stop()
        hits, lines = server.suspicious_log_lines()
        result["ito_log_suspicious_lines"] = hits
        result["ito_log_samples"] = lines
    result["db"] = db_duplicates(backend.ito_db_url)

    port = free_port()
    baseline = Server(
        "baseline",
        [
            sys.executable,
            str(BENCH_DIR / "baseline_app.py"),
            "--host",
            LOOPBACK,
            "--port",
            str(port),
            "--database-url",
            backend.baseline_db_url,
        ],
        backend.env,
        backend.workdir / "baseline.log",
        port,
        "/health",
    )
    try:
        baseline.wait_healthy()
        budget = max(30.0, deadline - time.monotonic() + 60.0)
        result["baseline"] = asyncio.run(
            asyncio.wait_for(
                baseline_round(baseline.base_url, baseline, args, deadline), timeout=budget
            )
        )
    finally:
        baseline.stop()
        hits, lines = baseline.suspicious_log_lines()
        result["baseline_log_suspicious_lines"] = hits
        result["baseline_log_samples"] = lines

    result["baseline"]["db_rows"] = baseline_rows(backend.baseline_db_url)

    bare = result["baseline"]["inserts_per_s"]
    burst = result["ito"]["burst"]["runs_per_s"]
    flow = result["ito"]["flow"]["runs_per_s"]
    result["ratio_gated_create"] = round(burst / bare, 3) if bare and burst else None
    result["ratio_full_flow"] = round(flow / bare, 3) if bare and flow else None
    ito = result["ito"]
    result["server_cpu_ms_per_gated_create"] = _round(
        _per(ito["burst"]["server_cpu_s"], max(1, ito["burst"]["runs_created"]))
    )
    result["server_cpu_ms_per_bare_insert"] = _round(
        _per(result["baseline"]["server_cpu_s"], max(1, result["baseline"]["inserted"]))
    )
    bare_p99 = result["baseline"]["insert"]["p99_ms"]
    steady = result["baseline"]["steady"]
    steady_p99 = steady["insert"]["p99_ms"]
    for what in ("status", "logs", "metrics"):
        p99 = ito["endpoints"].get(f"read.{what}", {}).get("p99_ms")
        result[f"ratio_p99_{what}_vs_insert"] = (
            round(p99 / steady_p99, 3) if p99 and steady_p99 else None
        )
    reads = ito.get("reads", {})
    result["server_cpu_ms_per_read"] = _round(
        _per(reads.get("server_cpu_s"), max(1, reads.get("requests", 0)))
    )
    result["server_cpu_ms_per_steady_insert"] = _round(
        _per(steady["server_cpu_s"], max(1, steady["inserted"]))
    )
    create_p99 = ito["endpoints"].get("runs.create_burst", {}).get("p99_ms")
    result["ratio_p99_create_vs_insert"] = (
        round(create_p99 / bare_p99, 3) if create_p99 and bare_p99 else None
    )
    result["ratio_cpu_create_vs_insert"] = (
        round(result["server_cpu_ms_per_gated_create"] / result["server_cpu_ms_per_bare_insert"], 3)
        if result["server_cpu_ms_per_gated_create"] and result["server_cpu_ms_per_bare_insert"]
        else None
    )
    result["duplicates"] = max(ito["api_duplicates"], result["db"]["duplicate_runs"])
    result["elapsed_s"] = round(time.monotonic() - t0, 2)
    return result


# ---------------------------------------------------------------------------------------------
# Output


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.2f}" if value < 1000 else f"{value:.0f}"
    return str(value)


TARGETS = (
    # (figure, goal, at least (True) or at most (False)): the targets, as ratios
    # against the bare app measured in the same run.
    ("ratio_gated_create", 0.5, True),
    ("ratio_cpu_create_vs_insert", 2.5, False),
    ("ratio_p99_create_vs_insert", 2.0, False),
    ("ratio_p99_status_vs_insert", 1.0, False),
    ("ratio_p99_logs_vs_insert", 1.0, False),
    ("ratio_p99_metrics_vs_insert", 1.0, False),
)


def print_medians(
    results: list[dict[str, Any]], args: argparse.Namespace
) -> dict[str, dict[str, Any]]:
    """The median (and range) of each target ratio per backend over ``--repeat`` runs."""
    medians: dict[str, dict[str, Any]] = {}
    print(f"\nmedians over {args.repeat} runs per backend (min..max), against the targets")
    for backend in args.backend_list:
        runs = [r for r in results if r["backend"] == backend and "error" not in r]
        medians[backend] = {"runs": len(runs)}
        for figure, goal, at_least in TARGETS:
            values = sorted(r[figure] for r in runs if r.get(figure) is not None)
            if not values:
                continue
            median = statistics.median(values)
            met = median >= goal if at_least else median <= goal
            medians[backend][figure] = {
                "median": round(median, 3),
                "min": values[0],
                "max": values[-1],
                "goal": goal,
                "met": met,
            }
            sign = ">=" if at_least else "<="
            print(
                f"{backend:9} {figure:30} {median:7.3f} ({values[0]:.3f}..{values[-1]:.3f})  "
                f"goal {sign} {goal}  {'met' if met else 'NOT met'}"
            )
    return medians


def print_report(results: list[dict[str, Any]], args: argparse.Namespace) -> None:
    print(
        f"\ncontrol-plane bench: {args.clients} clients x {args.runs_per_client} runs, "
        f"{args.polls} status polls per run, {os.cpu_count()} CPU(s)"
    )
    head = (
        f"{'backend':9} {'what':34} {'n':>6} {'wall s':>8} {'per s':>8} {'p50 ms':>8} {'p99 ms':>8}"
    )
    print(head)
    print("-" * len(head))
    for r in results:
        if "error" in r:
            print(f"{r['backend']:9} FAILED: {r['error']}")
            continue
        ito, base = r["ito"], r["baseline"]
        ep = ito["endpoints"]
        rows = [
            (
                "ito full gated flow (runs)",
                ito["flow"]["runs_created"],
                ito["flow"]["wall_s"],
                ito["flow"]["runs_per_s"],
                None,
                None,
            ),
            (
                "  POST /v1/runs (in flow)",
                ep.get("runs.create", {}).get("count"),
                None,
                None,
                ep.get("runs.create", {}).get("p50_ms"),
                ep.get("runs.create", {}).get("p99_ms"),
            ),
            (
                "  GET /v1/runs/{id} (status)",
                ep.get("runs.status", {}).get("count"),
                None,
                None,
                ep.get("runs.status", {}).get("p50_ms"),
                ep.get("runs.status", {}).get("p99_ms"),
            ),
            (
                "ito create burst (POST /v1/runs)",
                ito["burst"]["runs_created"],
                ito["burst"]["wall_s"],
                ito["burst"]["runs_per_s"],
                ep.get("runs.create_burst", {}).get("p50_ms"),
                ep.get("runs.create_burst", {}).get("p99_ms"),
            ),
            (
                "bare FastAPI+SQLAlchemy insert",
                base["inserted"],
                base["wall_s"],
                base["inserts_per_s"],
                base["insert"]["p50_ms"],
                base["insert"]["p99_ms"],
            ),
            (
                "ito reads (status, logs, metrics)",
                ito.get("reads", {}).get("requests"),
                ito.get("reads", {}).get("wall_s"),
                None,
                ep.get("read.status", {}).get("p50_ms"),
                ep.get("read.status", {}).get("p99_ms"),
            ),
            (
                "bare insert, steady (as the reads)",
                base["steady"]["inserted"],
                base["steady"]["wall_s"],
                base["steady"]["inserts_per_s"],
                base["steady"]["insert"]["p50_ms"],
                base["steady"]["insert"]["p99_ms"],
            ),
        ]
        for what, n, wall, rate, p50, p99 in rows:
            print(
                f"{r['backend']:9} {what:34} {_fmt(n):>6} {_fmt(wall):>8} {_fmt(rate):>8} "
                f"{_fmt(p50):>8} {_fmt(p99):>8}"
            )
        print(
            f"{r['backend']:9} ratio gated create / bare insert = {_fmt(r['ratio_gated_create'])}"
            f";  full flow / bare insert = {_fmt(r['ratio_full_flow'])}"
        )
        n_runs = max(1, ito["burst"]["runs_created"])
        n_rows = max(1, base["inserted"])
        print(
            f"{r['backend']:9} p99 / bare insert p99: create "
            f"{_fmt(r['ratio_p99_create_vs_insert'])} (burst vs burst); status "
            f"{_fmt(r['ratio_p99_status_vs_insert'])}, logs {_fmt(r['ratio_p99_logs_vs_insert'])}"
            f", metrics {_fmt(r['ratio_p99_metrics_vs_insert'])} (steady vs steady); server CPU "
            f"per create / per insert {_fmt(r['ratio_cpu_create_vs_insert'])}; server CPU ms per "
            f"read {_fmt(r['server_cpu_ms_per_read'])} vs per steady insert "
            f"{_fmt(r['server_cpu_ms_per_steady_insert'])}"
        )
        print(
            f"{r['backend']:9} CPU s server/bench: flow {_fmt(ito['flow']['server_cpu_s'])}/"
            f"{_fmt(ito['flow']['bench_cpu_s'])}, burst {_fmt(ito['burst']['server_cpu_s'])}/"
            f"{_fmt(ito['burst']['bench_cpu_s'])}, baseline {_fmt(base['server_cpu_s'])}/"
            f"{_fmt(base['bench_cpu_s'])}; server CPU ms per create "
            f"{_fmt(_per(ito['burst']['server_cpu_s'], n_runs))} vs per bare insert "
            f"{_fmt(_per(base['server_cpu_s'], n_rows))}"
        )
        dup = ito["dup"]
        print(
            f"{r['backend']:9} duplicates: {r['duplicates']} (API over {ito['keys_checked']} "
            f"keys: {ito['api_duplicates']}, DB: {r['db']['duplicate_runs']}); dup rounds "
            f"{dup['groups']} groups x {dup['group_size']}: {dup['outcomes']}"
        )
        if dup["anomalies"]:
            print(f"{r['backend']:9} dup-round anomalies: {dup['anomalies']}")
        print(f"{r['backend']:9} db: {r['db']}")
        print(
            f"{r['backend']:9} 5xx/transport errors: ito {ito['server_errors']}, "
            f"baseline {base['server_errors']}; suspicious server log lines: ito "
            f"{r['ito_log_suspicious_lines']}, baseline {r['baseline_log_suspicious_lines']}"
        )
        for line in r["ito_log_samples"][:6]:
            print(f"{r['backend']:9}   ito log: {line}")
        print(f"{r['backend']:9} endpoint latencies (ms):")
        for label, summary in ep.items():
            print(
                f"{r['backend']:9}   {label:24} n={summary['count']:<5} "
                f"p50={_fmt(summary['p50_ms']):>7} p99={_fmt(summary['p99_ms']):>8} "
                f"max={_fmt(summary['max_ms']):>8} {summary['outcomes']}"
            )
        print()


# ---------------------------------------------------------------------------------------------
# Entry point


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--runs-per-client", type=int, default=2)
    parser.add_argument("--polls", type=int, default=3, help="status polls after each create")
    parser.add_argument(
        "--dup-keys", type=int, default=8, help="idempotency keys shared in the duplicate round"
    )
    parser.add_argument(
        "--dup-rounds",
        type=int,
        default=3,
        help="how many times the duplicate round is fired (new keys each time)",
    )
    parser.add_argument(
        "--dup-jitter-ms",
        type=float,
        default=50.0,
        help="each duplicate-round request starts after a random delay up to this (0: all at once)",
    )
    parser.add_argument(
        "--read-polls",
        type=int,
        default=10,
        help="status+logs+metrics polls per client in the read-only round",
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=None,
        help="ito-server API processes (serve --workers; both backends allow "
        "it: PostgreSQL, SQLite in WAL); default 2",
    )
    parser.add_argument("--backends", default="sqlite,postgres")
    parser.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="run every backend this many times (fresh set-up each, backends interleaved) and "
        "print the median of each target ratio: one run on a noisy 2-core machine is anecdote",
    )
    parser.add_argument(
        "--pg-admin-url",
        default=DEFAULT_PG_ADMIN_URL,
        help="loopback PostgreSQL URL used to create and drop the bench database",
    )
    parser.add_argument("--request-timeout-s", type=float, default=30.0)
    parser.add_argument(
        "--max-seconds",
        type=float,
        default=300.0,
        help="deadline of each backend run: no new work starts after it",
    )
    args = parser.parse_args(argv)
    if (
        not 1 <= args.clients <= 512
        or not 1 <= args.runs_per_client <= 1000
        or not 0 <= args.polls <= 100
        or not 1 <= args.dup_keys <= args.clients
        or not 0 <= args.dup_rounds <= 50
        or not 0 <= args.dup_jitter_ms <= 5000
        or not 0 <= args.read_polls <= 1000
        or not (args.workers is None or 1 <= args.workers <= 16)
    ):
        parser.error(
            "out-of-range --clients / --runs-per-client / --polls / --dup-keys / --dup-rounds"
        )
    if not 1 <= args.repeat <= 20:
        parser.error("--repeat must be 1..20")
    args.backend_list = [b.strip() for b in args.backends.split(",") if b.strip()]
    unknown = set(args.backend_list) - {"sqlite", "postgres"}
    if unknown or not args.backend_list:
        parser.error(f"unknown backend(s): {sorted(unknown)}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from ito.core.manifest import manifest_digest
    from ito.recipes import build_recipe

    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="ito-bench-") as tmp:
        root = Path(tmp)
        manifest = json.dumps(build_recipe("test", str(root / "data")).manifest).encode()
        digest = manifest_digest(manifest)
        for index, name in enumerate([b for _ in range(args.repeat) for b in args.backend_list]):
            run_root = root / f"run-{index}"
            run_root.mkdir()
            try:
                context = (
                    sqlite_backend(run_root)
                    if name == "sqlite"
                    else postgres_backend(run_root, args.pg_admin_url)
                )
                with context as backend:
                    deadline = time.monotonic() + args.max_seconds
                    results.append(bench_backend(backend, args, manifest, digest, deadline))
            except (Exception, SystemExit) as exc:  # one backend failing must not hide the other
                results.append({"backend": name, "error": f"{type(exc).__name__}: {exc}"[:2000]})
    print_report(results, args)
    summary = {
        "bench": "control_plane",
        "clients": args.clients,
        "runs_per_client": args.runs_per_client,
        "polls": args.polls,
        "cpus": os.cpu_count(),
        "backends": {r["backend"]: r for r in results},
        "runs": results if args.repeat > 1 else None,
    }
    if args.repeat > 1:
        summary["medians"] = print_medians(results, args)
    print(json.dumps(summary, sort_keys=True, default=str))
    failed = any(
        "error" in r or r.get("duplicates") or r["ito"]["dup"]["anomalies"] for r in results
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
