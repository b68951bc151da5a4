"""Shared fixtures: a real ``ito-server serve`` on loopback, once per backend (SQLite file and
PostgreSQL on 127.0.0.1:5432), and tenants set up through the desk API.

Every test that takes ``server`` runs on both backends. Tenants isolate tests from each other:
each test makes its own account, so rows never need clearing between tests.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import MetaData, create_engine, select, text

BIN = Path(sys.executable).parent
ITO = str(BIN / "ito")
ITO_SERVER = str(BIN / "ito-server")
PG_ADMIN_URL = os.environ.get(
    "ITO_TEST_PG_ADMIN_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_until(predicate: Any, timeout: float = 30.0, interval: float = 0.05) -> Any:
    """Poll ``predicate`` until it returns something truthy, or fail at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s")
        time.sleep(interval)


@dataclass
class Result:
    rc: int
    envelope: dict[str, Any] | None
    stdout: str
    stderr: str

    @property
    def code(self) -> str | None:
        if self.envelope is None or self.envelope.get("ok"):
            return None
        return str(self.envelope["error"]["code"])

    @property
    def data(self) -> dict[str, Any]:
        assert self.envelope is not None and self.envelope["ok"], self.stdout + self.stderr
        return dict(self.envelope["data"])


def run_cli(argv: list[str], env: dict[str, str], timeout: float = 60.0) -> Result:
    proc = subprocess.run(
        argv, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )
    envelope = None
    if "--json" in argv and proc.stdout.strip():
        envelope = json.loads(proc.stdout)
    return Result(proc.returncode, envelope, proc.stdout, proc.stderr)


def pg_database() -> Iterator[str]:
    name = f"ito_test_{uuid.uuid4().hex[:10]}"
    admin = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield PG_ADMIN_URL.rsplit("/", 1)[0] + f"/{name}"
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


@pytest.fixture(scope="session", params=["sqlite", "postgres"])
def backend_url(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path_factory.mktemp('sqlite') / 'ito.db'}"
    else:
        yield from pg_database()


@dataclass
class Server:
    url: str
    database_url: str
    home: Path
    log_path: Path
    env: dict[str, str]
    desk_key: str
    process: subprocess.Popen[bytes]
    engine: Any = field(default=None)

    @property
    def backend(self) -> str:
        return "sqlite" if self.database_url.startswith("sqlite") else "postgres"

    def desk(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        response = httpx.post(
            self.url + path,
            json=body,
            timeout=30,
            headers={"authorization": f"Bearer {self.desk_key}"},
        )
        envelope = response.json()
        assert envelope["ok"], envelope
        return dict(envelope["data"])

    def counts(self, account_id: str) -> dict[str, Any]:
        """Rows this account owns, and its confirmations by state: what a refusal must not
        change."""
        with self.engine.connect() as conn:

            def one(sql: str) -> int:
                return int(conn.execute(text(sql), {"a": account_id}).scalar_one())

            by_state = dict(
                conn.execute(
                    text(
                        "SELECT state, count(*) FROM confirmations"
                        " WHERE account_id = :a GROUP BY state"
                    ),
                    {"a": account_id},
                ).all()
            )
            return {
                "runs": one("SELECT count(*) FROM runs WHERE account_id = :a"),
                "idempotency": one(
                    "SELECT count(*) FROM idempotency_records WHERE account_id = :a"
                ),
                "manifests": one("SELECT count(*) FROM manifests WHERE account_id = :a"),
                "events": one("SELECT count(*) FROM run_events WHERE account_id = :a"),
                "confirmations": {k: int(v) for k, v in by_state.items()},
            }

    def get_text(self, path: str) -> str:
        response = httpx.get(
            self.url + path, timeout=30, headers={"authorization": f"Bearer {self.desk_key}"}
        )
        assert response.status_code == 200, response.text
        return response.text

    def sql(self, statement: str, **params: Any) -> None:
        with self.engine.begin() as conn:
            conn.execute(text(statement), params)


def start_server(
    database_url: str, home: Path, *, worker: bool = False, extra_env: dict[str, str] | None = None
) -> Server:
    """Migrate, create an operator (desk) key, serve on a free loopback port; wait until
    healthy. ``home`` is created if it does not exist."""
    home.mkdir(parents=True, exist_ok=True, mode=0o700)
    env = {k: v for k, v in os.environ.items() if not k.startswith("ITO_")}
    env |= {
        "ITO_HOME": str(home),
        "ITO_DATABASE_URL": database_url,
        "ITO_PEPPER": "test-pepper-" + secrets.token_hex(16),
        "ITO_DEVICE_POLL_INTERVAL_SECONDS": "1",
    }
    env |= extra_env or {}
    assert run_cli([ITO_SERVER, "migrate", "--json"], env).rc == 0
    # The desk is the platform's operator: its key belongs to no account.
    desk_key = run_cli(
        [ITO_SERVER, "key", "create", "--role", "desk", "--name", "test desk", "--json"], env
    ).data["api_key"]
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log_path = home / "server.log"
    log = log_path.open("wb")
    argv = [ITO_SERVER, "serve", "--host", "127.0.0.1", "--port", str(port)]
    if not worker:
        argv.append("--no-worker")
    process = subprocess.Popen(
        argv,
        env=env | {"ITO_PUBLIC_URL": url},
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    log.close()

    wait_healthy(process, url, log_path)
    return Server(
        url=url,
        database_url=database_url,
        home=home,
        log_path=log_path,
        env=env,
        desk_key=desk_key,
        process=process,
        engine=create_engine(database_url),
    )


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without any ``ITO_…`` variable, plus ``extra``."""
    return {k: v for k, v in os.environ.items() if not k.startswith("ITO_")} | extra


@pytest.fixture
def fresh_failure_window(server: Server) -> Iterator[None]:
    """The failed-authentication window is in the store, shared by every server on it: a test
    that locks out an address starts and ends with it empty."""
    server.sql("DELETE FROM auth_failures")
    yield
    server.sql("DELETE FROM auth_failures")


def wait_healthy(process: subprocess.Popen[bytes], url: str, log_path: Path) -> None:
    """Until ``url`` answers its health check; fails with the server's log if it exits first."""

    def healthy() -> bool:
        assert process.poll() is None, log_path.read_text()
        try:
            return httpx.get(url + "/v1/health", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    wait_until(healthy, timeout=60)


@contextmanager
def extra_server(server: Server, tmp: Path, *args: str, **settings: str) -> Iterator[str]:
    """Another ``ito-server serve`` on the same database (extra ``serve`` arguments, extra
    ``ITO_…`` settings); yields its URL, stops it on exit."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log_path = tmp / f"server-{port}.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [ITO_SERVER, "serve", "--host", "127.0.0.1", "--port", str(port), "--no-worker", *args],
            env=server.env | {"ITO_PUBLIC_URL": url} | settings,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        wait_healthy(process, url, log_path)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=30)


def stop_server(srv: Server) -> None:
    srv.process.terminate()
    try:
        srv.process.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(srv.process.pid, 9)
        srv.process.wait(timeout=30)
    srv.engine.dispose()


@pytest.fixture(scope="session")
def server(backend_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    srv = start_server(backend_url, tmp_path_factory.mktemp("ito-home"))
    try:
        yield srv
    finally:
        stop_server(srv)


@dataclass
class Tenant:
    server: Server
    account_id: str
    requester_key: str
    approver_key: str
    booking_id: str
    workdir: Path

    def env(self, key: str | None) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("ITO_")}
        env["ITO_API_URL"] = self.server.url
        env["ITO_HOME"] = str(self.workdir / "client-home")
        if key:
            env["ITO_API_KEY"] = key
        return env

    def ito(self, *args: str, key: str | None = "requester") -> Result:
        chosen = {"requester": self.requester_key, "approver": self.approver_key}.get(
            key or "", key
        )
        return run_cli([ITO, *args, "--json"], self.env(chosen))

    def api(self, method: str, path: str, key: str = "requester", **kwargs: Any) -> Any:
        token = {"requester": self.requester_key, "approver": self.approver_key}.get(key, key)
        response = httpx.request(
            method,
            self.server.url + path,
            timeout=30,
            headers={"authorization": f"Bearer {token}"},
            **kwargs,
        )
        return response.json()

    def booking(self, **overrides: Any) -> str:
        now = datetime.now(UTC)
        body: dict[str, Any] = {
            "account_id": self.account_id,
            "gpu": "cpu",
            "nodes": 1,
            "gpus_per_node": 2,
            "region": "local",
            "fabric": "ethernet",
            "start": (now - timedelta(hours=1)).isoformat(),
            "end": (now + timedelta(days=2)).isoformat(),
            "rate_usd_per_gpu_hour": 0.5,
            "storage_uri": f"file://{self.workdir}/storage",
            "storage_quota_gb": 10.0,
            "state": "completed",
        }
        body |= overrides
        return str(self.server.desk("/v1/desk/bookings", body)["booking_id"])

    def set_booking_state(self, booking_id: str, state: str) -> None:
        self.server.desk(f"/v1/desk/bookings/{booking_id}/state", {"state": state})

    def manifest(
        self, name: str = "m", recipe: str = "test", storage: Path | None = None, **edits: Any
    ) -> Path:
        """Write a recipe's manifest (0600, in a 0700 directory) and its data, inside the
        bookings' storage (where a run may read it; ``storage``: another booking's, as a local
        path); ``edits`` replace top-level fields of the document."""
        directory = (storage or self.workdir / "storage") / "manifests" / name
        result = self.ito("manifest", "init", "--recipe", recipe, "--out", str(directory), key=None)
        assert result.rc == 0, result.stderr
        path = directory / "manifest.json"
        if edits:
            document = json.loads(path.read_bytes())
            document |= edits
            path.write_text(json.dumps(document, indent=2))
        return path

    def counts(self) -> dict[str, Any]:
        return self.server.counts(self.account_id)

    def approved_confirmation(
        self,
        manifest: Path,
        booking_id: str | None = None,
        ttl_seconds: int | None = None,
        cost_bound: float | None = None,
    ) -> str:
        args = [
            "confirm",
            "--action",
            "train",
            "--booking",
            booking_id or self.booking_id,
            "--manifest",
            str(manifest),
        ]
        if ttl_seconds is not None:
            args += ["--ttl-seconds", str(ttl_seconds)]
        if cost_bound is not None:
            args += ["--cost-bound", f"{cost_bound:.6f}"]
        ref = str(self.ito(*args).data["confirmation_ref"])
        approved = self.api("POST", f"/v1/confirmations/{ref}/approve", key="approver")
        assert approved["ok"], approved
        return ref

    def train(
        self,
        manifest: Path,
        key: str,
        booking_id: str | None = None,
        cost_bound: float | None = None,
    ) -> str:
        """Create a run the way an agent does: an approved confirmation (bound to
        ``cost_bound`` when given, else the server's default), then ``ito train`` with
        idempotency key ``key``; the new run's id."""
        booking = booking_id or self.booking_id
        ref = self.approved_confirmation(manifest, booking_id=booking, cost_bound=cost_bound)
        created = self.ito(
            "train",
            "--booking",
            booking,
            "--manifest",
            str(manifest),
            "--confirmation-ref",
            ref,
            "--idempotency-key",
            key,
        )
        return str(created.data["run_id"])

    def work_once(self, home: Path) -> tuple[str, subprocess.CompletedProcess[str]]:
        """A fresh worker key of the tenant's booking, and a real ``ito-worker --once`` run
        with it (in ``ITO_API_KEY``, the only way a key is passed) until the run it leased
        ends."""
        key = str(
            self.server.desk(
                "/v1/desk/keys",
                {"account_id": self.account_id, "role": "worker", "booking_id": self.booking_id},
            )["api_key"]
        )
        env = clean_env(ITO_API_URL=self.server.url, ITO_API_KEY=key, ITO_HOME=str(home))
        done = subprocess.run(
            [
                str(Path(ITO).with_name("ito-worker")),
                "--booking",
                self.booking_id,
                "--once",
                "--json",
            ],
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
        return key, done


def make_tenant(server: Server, workdir: Path, name: str = "tenant") -> Tenant:
    account = server.desk("/v1/desk/accounts", {"name": name})["account_id"]
    requester = server.desk("/v1/desk/keys", {"account_id": account, "role": "requester"})
    approver = server.desk("/v1/desk/keys", {"account_id": account, "role": "approver"})
    workdir.mkdir(mode=0o700, parents=True, exist_ok=True)
    tenant = Tenant(
        server=server,
        account_id=account,
        requester_key=requester["api_key"],
        approver_key=approver["api_key"],
        booking_id="",
        workdir=workdir,
    )
    tenant.booking_id = tenant.booking()
    return tenant


@pytest.fixture
def tenant(server: Server, tmp_path: Path) -> Tenant:
    return make_tenant(server, tmp_path / "a", "tenant-a")


@pytest.fixture
def other_tenant(server: Server, tmp_path: Path) -> Tenant:
    return make_tenant(server, tmp_path / "b", "tenant-b")


def database_text(server: Server) -> bytes:
    """Every stored byte of the test database (SQLite file and WAL, or every PostgreSQL row)."""
    if server.backend == "sqlite":
        path = Path(server.database_url.removeprefix("sqlite:///"))
        blobs = [path.read_bytes()]
        wal = path.with_name(path.name + "-wal")
        if wal.exists():
            blobs.append(wal.read_bytes())
        return b"".join(blobs)
    metadata = MetaData()
    metadata.reflect(server.engine)
    out = []
    with server.engine.connect() as conn:
        for table in metadata.sorted_tables:
            for row in conn.execute(select(table)):
                out.append(repr(tuple(row)).encode())
    return b"\n".join(out)
