"""The runtime end to end with real processes (DESIGN §5.9, §7.1, §7.3, §7.7): a confirmed run
trains on two CPU processes through the in-process worker of ``ito-server serve`` and through a
separate ``ito-worker``; cancel, cleanup, a killed worker, and telemetry."""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import subprocess
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from tests.support import (
    ITO,
    Server,
    Tenant,
    make_tenant,
    run_cli,
    start_server,
    stop_server,
    wait_until,
)
from tests.worker.slurm_support import Cluster

pytestmark = pytest.mark.slow
BIN = Path(ITO).parent
TERMINAL = {"succeeded", "failed", "gate_failed", "cancelled"}


@pytest.fixture(scope="module")
def worker_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A server with its in-process worker, on its own SQLite file."""
    home = tmp_path_factory.mktemp("worker-home")
    srv = start_server(
        f"sqlite:///{home / 'ito.db'}",
        home,
        worker=True,
        extra_env={"ITO_LEASE_TTL_SECONDS": "8", "ITO_HEARTBEAT_SECONDS": "1"},
    )
    yield srv
    stop_server(srv)


@pytest.fixture(scope="module")
def plain_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A server without a worker: runs wait for a separate ito-worker."""
    home = tmp_path_factory.mktemp("plain-home")
    srv = start_server(
        f"sqlite:///{home / 'ito.db'}",
        home,
        worker=False,
        extra_env={"ITO_LEASE_TTL_SECONDS": "4", "ITO_HEARTBEAT_SECONDS": "1"},
    )
    yield srv
    stop_server(srv)


@pytest.fixture(scope="module")
def budget_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A server without a worker whose leases last 280 s: the budget guard keeps a whole TTL of
    headroom, so a run whose estimate is E seconds is stopped once it has held E − 280 s."""
    home = tmp_path_factory.mktemp("budget-home")
    srv = start_server(
        f"sqlite:///{home / 'ito.db'}",
        home,
        worker=False,
        extra_env={"ITO_LEASE_TTL_SECONDS": "280", "ITO_HEARTBEAT_SECONDS": "1"},
    )
    yield srv
    stop_server(srv)


def _state(t: Tenant, run_id: str) -> dict[str, Any]:
    return dict(t.api("GET", f"/v1/runs/{run_id}")["data"])


def _wait_state(t: Tenant, run_id: str, states: set[str], timeout: float = 300) -> dict[str, Any]:
    return dict(
        wait_until(
            lambda: (s := _state(t, run_id))["state"] in states and s, timeout=timeout, interval=0.5
        )
    )


def _worker_env(
    server: Server, t: Tenant, booking: str, home: Path, **extra: str
) -> dict[str, str]:
    """An ``ito-worker``'s environment: a fresh worker key of ``booking`` in ``ITO_API_KEY``
    (the only way a key is passed), none of this process's other ``ITO_*`` settings."""
    key = server.desk(
        "/v1/desk/keys", {"account_id": t.account_id, "role": "worker", "booking_id": booking}
    )["api_key"]
    return (
        {k: v for k, v in os.environ.items() if not k.startswith("ITO_")}
        | {"ITO_API_URL": server.url, "ITO_API_KEY": key, "ITO_HOME": str(home)}
        | extra
    )


def _work_once_until_ended(
    t: Tenant, run_id: str, booking: str, env: dict[str, str]
) -> dict[str, Any]:
    """A real ``ito-worker --once`` of ``booking`` with ``env`` until ``run_id`` ends; the
    run's final status (the worker must exit 0; it is killed if it outlives the test)."""
    worker = subprocess.Popen(
        [str(BIN / "ito-worker"), "--booking", booking, "--once"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        final = _wait_state(t, run_id, TERMINAL, timeout=300)
        assert worker.wait(timeout=60) == 0
    finally:
        if worker.poll() is None:
            os.killpg(worker.pid, signal.SIGKILL)
    return final


def _long_manifest(t: Tenant, name: str) -> Path:
    path = t.manifest(name)
    document = json.loads(path.read_text())
    document["curriculum"][0]["tokens"] = 50_000_000
    document["budget"] = {"ceiling_usd": 5.0, "max_incremental_cost_usd": 5.0}
    path.write_text(json.dumps(document))
    return path


def _ran_exactly_its_plan(t: Tenant, run_id: str, final: dict[str, Any]) -> None:
    """The engine took exactly the steps the run's stored plan says, stage by stage (the
    plan counts them on the layout gate 5 planned); every stage is done, and the final event
    names them all."""
    plan = final["stage_plan"]
    losses = t.ito("runs", "metrics", run_id, "--name", "loss").data["points"]
    last: dict[str, int] = {}
    for point in losses:
        last[point["stage"]] = max(last.get(point["stage"], 0), point["step"])
    trained = [s for s in plan["stages"] if s["steps"] is not None]
    assert trained and set(last) == {s["name"] for s in trained}
    for stage in trained:
        assert last[stage["name"]] == stage["first_step"] + stage["steps"], stage
    assert [r["name"] for r in final["progress"]] == [s["name"] for s in plan["stages"]]
    assert {r["status"] for r in final["progress"]} == {"done"}
    ended = next(e for e in final["events"] if e["to_state"] == "succeeded")
    assert ended["data"]["stages_completed"] == [s["name"] for s in plan["stages"]]


def _processes_of(run_id: str) -> list[str]:
    out = subprocess.run(["pgrep", "-af", run_id], capture_output=True, text=True, check=False)
    return [line for line in out.stdout.splitlines() if "pgrep" not in line]


def test_pinned_tensor_parallelism_is_planned_carried_and_built_by_the_engine(
    worker_server: Server, tmp_path: Path
) -> None:
    """Issue 9: a manifest pinning ``tp=2`` on the two-process CPU booking plans that layout at
    gate 5, the run carries it, and the engine builds exactly that mesh (its ``mesh`` event,
    ``planned``) and trains to the end."""
    t = make_tenant(worker_server, tmp_path / "t", "tp")
    path = t.manifest("tp")
    document = json.loads(path.read_text())
    document["resources"]["parallelism"] = {"tp": 2}
    path.write_text(json.dumps(document))
    run_id = t.train(path, "tp-1")
    shown = _state(t, run_id)
    assert shown["estimate"]["parallelism"]["layout"]["tp"] == 2
    final = _wait_state(t, run_id, TERMINAL)
    assert final["state"] == "succeeded", final
    meshes = [e["data"] for e in final["events"] if e["kind"] == "mesh"]
    assert meshes and all(m["planned"] is True for m in meshes)
    assert all(m["dims"]["tp"] == 2 and m["dims"]["dp_shard"] == 1 for m in meshes)
    _ran_exactly_its_plan(t, run_id, final)


def test_a_confirmed_run_trains_to_succeeded_through_the_in_process_worker(
    worker_server: Server, tmp_path: Path
) -> None:
    t = make_tenant(worker_server, tmp_path / "t", "trainer")
    manifest = t.manifest()
    run_id = t.train(manifest, "train-1")
    final = _wait_state(t, run_id, TERMINAL)
    assert final["state"] == "succeeded", final

    kinds = [(e["kind"], e["data"].get("stage"), e["data"].get("status")) for e in final["events"]]
    for stage in ("data_prep", "pretrain", "midtrain", "long_context"):
        assert ("stage", stage, "completed") in kinds, kinds
    gates = [e for e in final["events"] if e["kind"] == "gate"]
    assert [g["data"]["passed"] for g in gates] == [True, True, True]
    # The layout the engine built is on the run's record, once per training stage.
    meshes = [e["data"] for e in final["events"] if e["kind"] == "mesh"]
    assert meshes and all(m["device"] == "cpu" and m["planned"] is False for m in meshes)
    _ran_exactly_its_plan(t, run_id, final)

    losses = t.ito("runs", "metrics", run_id, "--name", "loss").data["points"]
    assert len(losses) >= 5
    assert losses[-1]["value"] < losses[0]["value"]
    listed = t.ito("runs", "checkpoints", run_id).data
    checkpoints = listed["checkpoints"]
    assert checkpoints and all(c["bytes"] > 0 for c in checkpoints)
    # Each stage's final weights, exported as a Hugging Face directory, with their digest.
    exports = listed["exports"]
    assert [e["stage"] for e in exports] == ["pretrain", "midtrain", "long_context"]
    for export in exports:
        weights = (Path(export["path"]) / "model.safetensors").read_bytes()
        assert hashlib.sha256(weights).hexdigest() == export["sha256"]
        assert export["bytes"] > len(weights) and export["deleted"] is False
    logs = t.ito("runs", "logs", run_id).data
    assert logs["lines"] and logs["next_cursor"] == logs["lines"][-1]["cursor"]
    assert t.ito("runs", "logs", run_id, "--since", str(logs["next_cursor"])).data["lines"] == []

    # The data-preparation report the worker uploaded is bound to the run and served.
    provenance = t.ito("runs", "provenance", run_id).data
    assert final["provenance_sha256"] == provenance["sha256"]
    assert ("provenance", None, None) in kinds
    reported = {d["id"]: d for d in provenance["report"]["datasets"]}
    assert set(reported) == {d["id"] for d in json.loads(manifest.read_bytes())["data"]}
    assert all(d["counts"]["output"] > 0 for d in reported.values())
    # The tokenizer was trained by data preparation, and the report lists its digest.
    assert provenance["report"]["tokenizer"]["source"] == "trained"

    telemetry = t.ito("telemetry", "--run", run_id).data
    assert 0 < telemetry["goodput"] <= 1
    # Goodput is productive time ÷ the whole time held, lease to finish (not to the last beat).
    held, productive = telemetry["wall_seconds_held"], telemetry["productive_seconds"]
    assert telemetry["goodput"] == pytest.approx(productive / held, abs=1e-3)
    leased = next(e["at"] for e in final["events"] if e["to_state"] == "running")
    finished = next(e["at"] for e in final["events"] if e["to_state"] == "succeeded")
    span = (datetime.fromisoformat(finished) - datetime.fromisoformat(leased)).total_seconds()
    assert held == pytest.approx(span, abs=0.5)
    assert telemetry["checkpoint_bandwidth_bytes_per_s"] > 0
    assert telemetry["tokens_per_s"] > 0
    assert telemetry["interruptions"] == 0
    booking = t.ito("telemetry", "--booking", t.booking_id).data
    assert booking["runs"] == 1 and booking["goodput"] == telemetry["goodput"]
    prometheus = worker_server.get_text("/metrics")
    assert f'run="{run_id}"' in prometheus and "ito_run_goodput" in prometheus


def test_a_gpu_booking_this_machine_cannot_serve_fails_before_any_training_step(
    worker_server: Server, tmp_path: Path
) -> None:
    """Fail closed (DESIGN §7.2): an ``h100`` booking on this CPU machine ends
    ``accelerator_unavailable``; no step, no loss, no checkpoint — never a CPU fallback."""
    t = make_tenant(worker_server, tmp_path / "t", "no-gpu-here")
    t.booking_id = t.booking(gpu="h100", gpus_per_node=1)
    path = t.manifest()
    document = json.loads(path.read_text())
    document["resources"].update(accelerators=["h100"], gpus_per_node=1)
    path.write_text(json.dumps(document))
    run_id = t.train(path, "gpu-1")
    final = _wait_state(t, run_id, TERMINAL)

    assert final["state"] == "failed", final
    assert final["failure_code"] == "accelerator_unavailable"
    # The run carried its plan to the engine (stored with its estimate at creation).
    assert final["estimate"]["parallelism"]["mode"] == "planned"
    stages = {(e["data"].get("stage"), e["data"].get("status")) for e in final["events"]}
    assert ("pretrain", "started") not in stages, final["events"]
    assert t.ito("runs", "metrics", run_id, "--name", "loss").data["points"] == []
    assert t.ito("runs", "checkpoints", run_id).data["checkpoints"] == []


def test_cancel_reaches_the_running_job_and_cleanup_frees_its_bytes(
    worker_server: Server, tmp_path: Path
) -> None:
    t = make_tenant(worker_server, tmp_path / "t", "canceller")
    run_id = t.train(_long_manifest(t, "long"), "long-1")
    wait_until(
        lambda: t.ito("runs", "checkpoints", run_id).data["checkpoints"], timeout=300, interval=0.5
    )
    assert _processes_of(run_id)

    cancel_ref = t.ito("confirm", "--action", "cancel", "--run", run_id).data["confirmation_ref"]
    assert t.ito("approve", cancel_ref, key="approver").rc == 0
    cancelled = t.ito(
        "runs", "cancel", run_id, "--confirmation-ref", cancel_ref, "--idempotency-key", "cancel-1"
    )
    assert cancelled.rc == 0 and cancelled.data["state"] in ("cancelling", "cancelled")
    _wait_state(t, run_id, {"cancelled"}, timeout=60)
    wait_until(lambda: not _processes_of(run_id), timeout=30)
    assert t.ito("runs", "checkpoints", run_id).data["checkpoints"]  # the latest stays

    booking_before = t.ito("bookings", "show", t.booking_id).data
    cleanup_ref = t.ito("confirm", "--action", "cleanup", "--run", run_id).data["confirmation_ref"]
    assert t.ito("approve", cleanup_ref, key="approver").rc == 0
    assert (
        t.ito(
            "runs",
            "cleanup",
            run_id,
            "--confirmation-ref",
            cleanup_ref,
            "--idempotency-key",
            "cleanup-1",
        ).rc
        == 0
    )
    done = wait_until(
        lambda: (s := _state(t, run_id))["cleanup_state"] == "cleaned" and s,
        timeout=60,
        interval=0.5,
    )
    freed = [
        e
        for e in done["events"]
        if e["kind"] == "cleanup" and e["data"].get("cleanup_state") == "cleaned"
    ]
    assert freed and freed[0]["data"]["bytes_freed"] > 0
    listed = t.ito("runs", "checkpoints", run_id).data
    assert all(c["deleted"] for c in listed["checkpoints"])
    # An export made before the cancel went with the rest of the run's storage.
    assert all(e["deleted"] and not Path(e["path"]).exists() for e in listed["exports"])
    assert t.ito("bookings", "show", t.booking_id).data == booking_before
    assert t.ito("runs", "logs", run_id).data["lines"]  # the record and logs stay


def _tree(top: Path) -> dict[str, bytes | None]:
    """Every entry under ``top`` (links as themselves) with the bytes of its regular files."""
    found: dict[str, bytes | None] = {}
    for base, dirs, files in os.walk(top):
        for name in dirs + files:
            path = Path(base, name)
            found[str(path.relative_to(top))] = (
                None if path.is_symlink() or not path.is_file() else path.read_bytes()
            )
    return found


def _outside(tmp_path: Path) -> Path:
    """A directory outside every booking's storage, holding what looks like someone's committed
    checkpoint and an uncommitted one: nothing may be written, pruned or deleted there."""
    outside = tmp_path / "outside"
    committed = outside / "step_00000001"
    committed.mkdir(parents=True)
    (committed / "COMMIT").write_text(json.dumps({"step": 1, "stage": "pretrain"}))
    (committed / "precious.bin").write_bytes(b"\x01" * 4096)
    (outside / "step_00000002").mkdir()
    (outside / "step_00000002" / "half.bin").write_bytes(b"\x02" * 64)
    (outside / "precious.txt").write_text("keep me")
    return outside


def test_a_link_in_the_booking_storage_fails_the_run_before_anything_is_written_outside(
    worker_server: Server, tmp_path: Path
) -> None:
    t = make_tenant(worker_server, tmp_path / "t", "linked-storage")
    outside = _outside(tmp_path)
    storage = t.workdir / "storage"
    storage.mkdir()
    (storage / "runs").symlink_to(outside)  # where every run's directory would be created
    before = _tree(outside)

    run_id = t.train(t.manifest(), "linked-1")
    final = _wait_state(t, run_id, TERMINAL)

    assert final["state"] == "failed", final
    assert final["failure_code"] == "checkpoint_storage_invalid"
    assert _tree(outside) == before
    assert not t.ito("runs", "checkpoints", run_id).data["checkpoints"]


def test_a_link_swapped_in_while_training_refuses_the_next_checkpoint_and_prunes_nothing(
    worker_server: Server, tmp_path: Path
) -> None:
    t = make_tenant(worker_server, tmp_path / "t", "swapped-storage")
    outside = _outside(tmp_path)
    before = _tree(outside)
    run_id = t.train(_long_manifest(t, "long"), "swapped-1")
    listed = wait_until(
        lambda: t.ito("runs", "checkpoints", run_id).data["checkpoints"], timeout=300, interval=0.5
    )
    stage_dir = t.workdir / "storage" / "runs" / run_id / "pretrain"
    assert Path(listed[0]["path"]).parent == stage_dir  # the real location is reported

    # The stage directory the next save and the keep-last pruning use becomes a link to a
    # directory outside the booking, which holds an older "committed checkpoint" to prune.
    os.rename(stage_dir, tmp_path / "moved-away")
    stage_dir.symlink_to(outside)
    final = _wait_state(t, run_id, TERMINAL)

    assert final["state"] == "failed", final
    assert final["failure_code"] == "checkpoint_storage_invalid"
    wait_until(lambda: not _processes_of(run_id), timeout=60)
    assert _tree(outside) == before


def test_cleanup_deletes_a_run_directory_without_following_links_planted_in_it(
    worker_server: Server, tmp_path: Path
) -> None:
    t = make_tenant(worker_server, tmp_path / "t", "planted-link")
    outside = _outside(tmp_path)
    # The operator reaches the storage through a link above the booking's root (their layout,
    # followed); what the API reports is where the files really are.
    real = tmp_path / "real-volume"
    (real / "storage").mkdir(parents=True)
    (t.workdir / "volume").symlink_to(real)
    t.booking_id = t.booking(storage_uri=f"file://{t.workdir}/volume/storage")
    storage = real / "storage"
    (storage / "runs").symlink_to(tmp_path / "nowhere")  # dangling: the run fails at once
    # The manifest's data in the booking's storage, named as the booking names it (through
    # the operator's link; the manifest file itself is read at its real path).
    manifest = t.manifest(storage=real / "storage")
    document = json.loads(manifest.read_text())
    for ref in document["data"]:
        ref["uri"] = ref["uri"].replace(str(real), str(t.workdir / "volume"), 1)
    manifest.write_text(json.dumps(document))
    run_id = t.train(manifest, "planted-1")
    failed = _wait_state(t, run_id, TERMINAL)
    assert failed["failure_code"] == "checkpoint_storage_invalid", failed
    assert not (tmp_path / "nowhere").exists()

    (storage / "runs").unlink()
    run_dir = storage / "runs" / run_id
    (run_dir / "pretrain").mkdir(parents=True)
    (run_dir / "pretrain" / "shard.bin").write_bytes(b"\x00" * 100)
    (run_dir / "pretrain" / "step_00000003").symlink_to(outside)
    (run_dir / "tokenizer.json").symlink_to(outside / "step_00000001" / "precious.bin")
    before = _tree(outside)

    ref = t.ito("confirm", "--action", "cleanup", "--run", run_id).data["confirmation_ref"]
    assert t.ito("approve", ref, key="approver").rc == 0
    assert (
        t.ito(
            "runs", "cleanup", run_id, "--confirmation-ref", ref, "--idempotency-key", "cleanup-1"
        ).rc
        == 0
    )
    done = wait_until(
        lambda: (s := _state(t, run_id))["cleanup_state"] == "cleaned" and s,
        timeout=60,
        interval=0.5,
    )

    assert not run_dir.exists() and (storage / "runs").is_dir()
    assert _tree(outside) == before
    cleaned = next(
        e
        for e in done["events"]
        if e["kind"] == "cleanup" and e["data"].get("cleanup_state") == "cleaned"
    )
    assert cleaned["data"]["bytes_freed"] == 100  # the links' targets are not counted either
    assert str(run_dir) in cleaned["data"]["paths"]


def test_a_killed_worker_is_detected_and_another_worker_resumes_the_run(
    plain_server: Server, tmp_path: Path
) -> None:
    t = make_tenant(plain_server, tmp_path / "t", "resilient")
    # The first attempt hangs at step 12, after committing step 10: the kill below lands on a
    # run that is still training however fast this machine is (attempt 2 is not held).
    env = _worker_env(
        plain_server,
        t,
        t.booking_id,
        tmp_path / "worker-home",
        ITO_FAULT_INJECTION=json.dumps({"pause_at_step": 12}),
    )
    run_id = t.train(t.manifest(), "resume-1")

    first = subprocess.Popen(
        [str(BIN / "ito-worker"), "--booking", t.booking_id],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    wait_until(
        lambda: t.ito("runs", "checkpoints", run_id).data["checkpoints"], timeout=300, interval=0.5
    )
    for line in _processes_of(run_id):
        os.kill(int(line.split()[0]), signal.SIGKILL)
    os.killpg(first.pid, signal.SIGKILL)
    first.wait(timeout=30)

    recovering = _wait_state(t, run_id, {"recovering"}, timeout=240)
    assert recovering["state"] == "recovering"
    second = subprocess.Popen(
        [str(BIN / "ito-worker"), "--booking", t.booking_id, "--once"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        final = _wait_state(t, run_id, TERMINAL, timeout=300)
    finally:
        second.wait(timeout=120)
    assert final["state"] == "succeeded", final
    leases = [e for e in final["events"] if e["kind"] == "state" and e["to_state"] == "running"]
    assert len(leases) == 2 and "resuming" in leases[1]["message"]
    losses = t.ito("runs", "metrics", run_id, "--name", "loss").data["points"]
    # Attempt 1 reported every step up to its commit at 10 and none past its hang at 12.
    assert max(p["step"] for p in losses if p["attempt"] == 1) in (10, 11)
    assert min(p["step"] for p in losses if p["attempt"] == 2) == 11  # from the commit at 10
    assert t.ito("telemetry", "--run", run_id).data["interruptions"] == 1


def test_worker_key_of_another_booking_cannot_lease(plain_server: Server, tmp_path: Path) -> None:
    t = make_tenant(plain_server, tmp_path / "t", "scoped")
    other = t.booking()
    key = plain_server.desk(
        "/v1/desk/keys", {"account_id": t.account_id, "role": "worker", "booking_id": other}
    )["api_key"]
    t.train(t.manifest(), "scoped-1")
    leased = t.api("POST", "/v1/worker/lease", key=key)
    assert leased["ok"] and leased["data"] is None
    requester = t.api("POST", "/v1/worker/lease")
    assert requester["error"]["code"] == "forbidden_scope"
    env = {k: v for k, v in os.environ.items() if not k.startswith("ITO_")} | {
        "ITO_API_URL": plain_server.url,
        "ITO_API_KEY": key,
    }
    refused = run_cli([str(BIN / "ito-worker"), "--booking", t.booking_id, "--once", "--json"], env)
    assert refused.rc == 1 and refused.code == "forbidden_scope"


def _slurm_run(
    server: Server, cluster: Cluster, tmp_path: Path, name: str, resources: dict[str, Any]
) -> tuple[Tenant, str, dict[str, Any]]:
    """A two-node booking, a confirmed run of the test recipe with ``resources``, and one
    ``ito-worker --executor slurm --once`` that must take it to its end; returns the final run."""
    t = make_tenant(server, tmp_path / "t", name)
    booking = t.booking(nodes=2, gpus_per_node=1, fabric=resources["fabrics"][0])
    manifest = t.manifest(name)
    document = json.loads(manifest.read_text())
    document["resources"] = resources
    manifest.write_text(json.dumps(document))
    run_id = t.train(manifest, name, booking_id=booking)
    env = _worker_env(server, t, booking, tmp_path / "worker-home", SLURM_CONF=str(cluster.conf))
    worker = subprocess.run(
        [str(BIN / "ito-worker"), "--booking", booking, "--executor", "slurm", "--once", "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert worker.returncode == 0, worker.stderr[-3000:]
    return t, run_id, _state(t, run_id)


def test_a_two_node_run_trains_through_ito_worker_with_the_slurm_executor(
    plain_server: Server, slurm_cluster: Cluster, tmp_path: Path
) -> None:
    _, _, final = _slurm_run(
        plain_server,
        slurm_cluster,
        tmp_path,
        "slurm-buyer",
        {"accelerators": ["cpu"], "nodes": 2, "gpus_per_node": 1, "fabrics": ["infiniband"]},
    )
    assert final["state"] == "succeeded", final
    job_logs = list((tmp_path / "worker-home").rglob("slurm-*.out"))
    assert job_logs, "the run did not go through sbatch"
    assert [g["data"]["passed"] for g in final["events"] if g["kind"] == "gate"] == [
        True,
        True,
        True,
    ]


def test_a_two_node_run_with_a_replica_group_per_node_trains_on_slurm(
    plain_server: Server, slurm_cluster: Cluster, tmp_path: Path
) -> None:
    t, run_id, final = _slurm_run(
        plain_server,
        slurm_cluster,
        tmp_path,
        "slurm-replicas",
        {
            "accelerators": ["cpu"],
            "nodes": 2,
            "gpus_per_node": 1,
            "fabrics": ["ethernet"],
            "replica_groups": 2,
        },
    )
    assert final["state"] == "succeeded", final
    # One replica group per node, meeting through the lighthouse the batch script started.
    assert list((tmp_path / "worker-home").rglob("lighthouse-*.log"))
    # Both groups end with the same model at the same step. Whether the second group trained
    # beside the first is timing: under load it may come up only after the first committed
    # the last step, and then it loads that commit (the first quorum waits only for groups
    # already heartbeating). Equal final models are what the protocol guarantees.
    lines: list[str] = []
    cursor = 0
    while page := t.ito("runs", "logs", run_id, "--since", str(cursor)).data["lines"]:
        lines += [line["message"] for line in page]
        cursor = page[-1]["cursor"]
    ends = dict(
        (m.group(1), (m.group(2), m.group(3)))
        for m in (
            re.search(r"^\[replica (\d)\] rank 0 parameters digest (\w+) at step (\d+)", line)
            for line in lines
        )
        if m
    )
    assert set(ends) == {"0", "1"} and ends["0"] == ends["1"], ends
    points = t.ito("runs", "metrics", run_id, "--name", "replicas").data["points"]
    assert points and {p["value"] for p in points} <= {1.0, 2.0}


def test_a_loss_spike_waits_for_a_confirmed_restart_and_never_acts_alone(
    plain_server: Server, tmp_path: Path
) -> None:
    t = make_tenant(plain_server, tmp_path / "t", "spiky")
    manifest = t.manifest("spike")
    document = json.loads(manifest.read_text())
    document["curriculum"][0]["tokens"] = 60_000  # 58 steps of 1024 tokens
    manifest.write_text(json.dumps(document))
    run_id = t.train(manifest, "spike-1")
    env = _worker_env(
        plain_server,
        t,
        t.booking_id,
        tmp_path / "worker-home",
        ITO_FAULT_INJECTION=json.dumps({"loss_spike_at": 40}),
    )
    worker = subprocess.Popen(
        [str(BIN / "ito-worker"), "--booking", t.booking_id, "--poll-seconds", "0.5"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        waiting = _wait_state(t, run_id, {"awaiting_approval", *TERMINAL}, timeout=300)
        assert waiting["state"] == "awaiting_approval", waiting
        proposal = waiting["events"][-1]["data"]
        assert proposal["spike_step"] == 40 and proposal["checkpoint_step"] == 30
        assert proposal["skip_steps"] == 10
        wait_until(lambda: not _processes_of(run_id), timeout=60)  # it stopped by itself

        # Nothing happens without a human: a wrong checkpoint is refused, the run still waits.
        wrong = t.ito("confirm", "--action", "restart", "--run", run_id, "--checkpoint", "20")
        assert wrong.code == "confirmation_mismatch"
        assert _state(t, run_id)["state"] == "awaiting_approval"

        ref = t.ito("confirm", "--action", "restart", "--run", run_id, "--checkpoint", "30").data[
            "confirmation_ref"
        ]
        assert (
            t.ito(
                "runs",
                "restart",
                run_id,
                "--confirmation-ref",
                ref,
                "--idempotency-key",
                "restart-1",
            ).code
            == "confirmation_pending"
        )
        assert t.ito("approve", ref, key="approver").rc == 0
        restarted = t.ito(
            "runs", "restart", run_id, "--confirmation-ref", ref, "--idempotency-key", "restart-1"
        )
        assert restarted.rc == 0 and restarted.data["state"] == "recovering"
        final = _wait_state(t, run_id, TERMINAL, timeout=300)
    finally:
        os.killpg(worker.pid, signal.SIGTERM)
        worker.wait(timeout=60)
    assert final["state"] == "succeeded", final
    losses = t.ito("runs", "metrics", run_id, "--name", "loss").data["points"]
    second = [p for p in losses if p["attempt"] == 2]
    assert second[0]["step"] == 31  # resumed from checkpoint 30
    spike = next(p for p in losses if p["attempt"] == 1 and p["step"] == 40)
    assert spike["value"] > 1.5 * second[9]["value"]


def test_a_killed_rank_is_restarted_by_torchrun_and_the_run_still_succeeds(
    worker_server: Server, tmp_path: Path
) -> None:
    t = make_tenant(worker_server, tmp_path / "t", "rank-killer")
    manifest = t.manifest("ranks")
    document = json.loads(manifest.read_text())
    document["curriculum"][0]["tokens"] = 120_000  # ~117 steps: time to kill mid-stage
    manifest.write_text(json.dumps(document))
    run_id = t.train(manifest, "rank-1")
    wait_until(
        lambda: t.ito("runs", "checkpoints", run_id).data["checkpoints"], timeout=300, interval=0.5
    )
    ranks = [line for line in _processes_of(run_id) if "torchrun" not in line]
    assert ranks, _processes_of(run_id)
    os.kill(int(ranks[-1].split()[0]), signal.SIGKILL)

    final = _wait_state(t, run_id, TERMINAL, timeout=300)
    assert final["state"] == "succeeded", final
    leases = [e for e in final["events"] if e["kind"] == "state" and e["to_state"] == "running"]
    assert len(leases) == 1  # torchrun restarted the ranks inside the same attempt
    assert [e["kind"] for e in final["events"]].count("restart") >= 1
    assert t.ito("telemetry", "--run", run_id).data["interruptions"] >= 1


def test_a_budget_stop_checkpoints_the_running_job_and_fails_it_budget_exceeded(
    budget_server: Server, tmp_path: Path
) -> None:
    t = make_tenant(budget_server, tmp_path / "t", "thrifty")
    booking = t.booking(rate_usd_per_gpu_hour=36.0)
    manifest = t.manifest("budget")
    document = json.loads(manifest.read_text())
    document["curriculum"] = document["curriculum"][:1]  # pretrain only
    # ~1,600 steps, paced at 0.5 s each below: the budget stops it long before the end. (The
    # estimate prices the data preparation and this one stage: about 315 s.)
    document["curriculum"][0]["tokens"] = 1_650_000
    steps = 1_650_000 // (8 * 128)
    manifest.write_text(json.dumps(document))
    plan = t.ito("plan", "--booking", booking, "--manifest", str(manifest)).data["cost"]
    # The tightest ceiling the budget gate accepts: the run's own estimate. The guard stops the
    # run once held time + one lease TTL (280 s) would cost more, i.e. after E − 280 s held.
    estimate_s = plan["seconds"]
    assert 290 < estimate_s < 340, plan  # stops 10-60 s in: never after the ~60 s it trains
    ceiling = plan["cost_usd"]
    document["budget"] = {"ceiling_usd": ceiling, "max_incremental_cost_usd": ceiling}
    manifest.write_text(json.dumps(document))
    run_id = t.train(manifest, "budget-1", booking_id=booking)

    env = _worker_env(
        budget_server,
        t,
        booking,
        tmp_path / "worker-home",
        ITO_FAULT_INJECTION=json.dumps({"min_step_seconds": 0.5}),
    )
    final = _work_once_until_ended(t, run_id, booking, env)
    assert final["state"] == "failed" and final["failure_code"] == "budget_exceeded", final
    assert not _processes_of(run_id)

    # It stopped mid-training, having committed the step where it saw the stop.
    losses = t.ito("runs", "metrics", run_id, "--name", "loss").data["points"]
    last_step = max(p["step"] for p in losses)
    assert 1 <= last_step < steps
    checkpoints = t.ito("runs", "checkpoints", run_id).data["checkpoints"]
    assert max(c["step"] for c in checkpoints) == last_step
    assert f"checkpoint committed at step {last_step}" in final["events"][-1]["message"]
    # Every dollar accounted, none past the ceiling.
    telemetry = t.ito("telemetry", "--run", run_id).data
    assert 0 < telemetry["cost_usd"] <= ceiling
    assert telemetry["wall_seconds_held"] >= estimate_s - 280 - 2


def test_a_deterministic_engine_error_ends_the_run_once_with_its_code(
    plain_server: Server, tmp_path: Path
) -> None:
    """A registered, non-retryable error raised by one rank (not rank 0, which writes the
    events: the harder case) ends the run after one attempt with that code: no torchrun
    restart, no second lease, no interruption, each stage started once (DESIGN §7.3)."""
    t = make_tenant(plain_server, tmp_path / "t", "deterministic")
    manifest = t.manifest("error")
    document = json.loads(manifest.read_text())
    document["curriculum"][0]["tokens"] = 60_000
    manifest.write_text(json.dumps(document))
    run_id = t.train(manifest, "error-1")
    env = _worker_env(
        plain_server,
        t,
        t.booking_id,
        tmp_path / "worker-home",
        ITO_FAULT_INJECTION=json.dumps(
            {"error_at": {"rank": 1, "step": 12, "code": "data_invalid"}}
        ),
    )
    final = _work_once_until_ended(t, run_id, t.booking_id, env)
    assert final["state"] == "failed" and final["failure_code"] == "data_invalid", final
    assert not _processes_of(run_id)
    kinds = [e["kind"] for e in final["events"]]
    assert "restart" not in kinds
    leases = [e for e in final["events"] if e["kind"] == "state" and e["to_state"] == "running"]
    assert len(leases) == 1
    started = [
        e["data"]["stage"]
        for e in final["events"]
        if e["kind"] == "stage" and e["data"]["status"] == "started"
    ]
    assert sorted(started) == sorted(set(started)) and "pretrain" in started
    assert t.ito("telemetry", "--run", run_id).data["interruptions"] == 0
    losses = t.ito("runs", "metrics", run_id, "--name", "loss").data["points"]
    assert {p["attempt"] for p in losses} == {1}
    assert max(p["step"] for p in losses) < 12
