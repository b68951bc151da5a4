"""The README's main job: one gated run, end to end, on the embedded default.

Everything is real and runs as separate processes: ``ito-server`` (SQLite under ./.ito-demo,
or ``ITO_DEMO_HOME``, served on a free loopback port) and the ``ito`` client. Keys travel only
in the environment (``ITO_API_KEY``), never in arguments, and are never printed.

``--summary FILE`` also writes the figures it prints as JSON (the demo test reads them).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
HOME = Path(os.environ.get("ITO_DEMO_HOME") or ROOT / ".ito-demo").resolve()


def step(title: str) -> None:
    print(f"\n\033[1m── {title}\033[0m", flush=True)


def run(args: list[str], env: dict[str, str], *, show: bool = True) -> dict[str, Any]:
    shown = " ".join(a if not a.startswith("ito_") else "<key>" for a in args)
    print(f"$ {shown}", flush=True)
    proc = subprocess.run(
        [str(BIN / args[0]), *args[1:], "--json"],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    envelope: dict[str, Any] = json.loads(proc.stdout)
    print(f"  → {envelope['notice']}", flush=True)
    if not envelope["ok"]:
        print(json.dumps(envelope["error"], indent=2), file=sys.stderr)
        raise SystemExit(f"demo stopped: {envelope['error']['code']}")
    if show:
        data = {k: v for k, v in envelope["data"].items() if k != "api_key"}
        print("    " + json.dumps(data, indent=None)[:400], flush=True)
    return dict(envelope["data"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--summary", type=Path, help="also write the figures as JSON here")
    args = parser.parse_args()
    summary: dict[str, Any] = {}
    try:
        _demo(summary)
    finally:
        if args.summary is not None:
            args.summary.write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n")


def _demo(summary: dict[str, Any]) -> None:
    shutil.rmtree(HOME, ignore_errors=True)
    HOME.mkdir(mode=0o700)
    base = {k: v for k, v in os.environ.items() if not k.startswith("ITO_")}
    server_env = base | {"ITO_HOME": str(HOME)}

    step("1. The desk: schema, an account, a requester and an approver key, a booking")
    run(["ito-server", "migrate"], server_env)
    account = run(["ito-server", "account", "create", "--name", "demo-buyer"], server_env)[
        "account_id"
    ]
    requester = run(
        [
            "ito-server",
            "key",
            "create",
            "--account",
            account,
            "--role",
            "requester",
            "--name",
            "agent",
        ],
        server_env,
    )["api_key"]
    approver = run(
        [
            "ito-server",
            "key",
            "create",
            "--account",
            account,
            "--role",
            "approver",
            "--name",
            "human",
        ],
        server_env,
    )["api_key"]
    now = datetime.now(UTC)
    booking = run(
        [
            "ito-server",
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
            (now - timedelta(minutes=5)).isoformat(),
            "--end",
            (now + timedelta(days=1)).isoformat(),
            "--rate-usd-per-gpu-hour",
            "0.50",
            "--storage-uri",
            f"file://{HOME / 'storage'}",
            "--state",
            "completed",
        ],
        server_env,
    )["booking_id"]

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    step(f"2. The canonical API on {url}")
    log = (HOME / "server.log").open("wb")
    server = subprocess.Popen(
        [str(BIN / "ito-server"), "serve", "--host", "127.0.0.1", "--port", str(port)],
        env=server_env | {"ITO_PUBLIC_URL": url},
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        _wait_healthy(url, server)
        client = base | {"ITO_API_URL": url, "ITO_HOME": str(HOME / "client")}
        agent = client | {"ITO_API_KEY": requester}
        human = client | {"ITO_API_KEY": approver}
        # The recipe's data lies in the booking's storage: a run reads nothing outside it.
        manifest = HOME / "storage" / "manifests" / "demo" / "manifest.json"

        step("3. The agent: a reviewed manifest, eligibility, a plan (creates nothing)")
        run(["ito", "manifest", "init", "--recipe", "demo", "--out", str(manifest.parent)], client)
        run(["ito", "bookings", "eligibility", booking], agent)
        plan = run(
            ["ito", "plan", "--booking", booking, "--manifest", str(manifest)], agent, show=False
        )
        cost = plan["cost"]
        print(
            f"    ready={plan['ready']} expected ${cost['cost_usd']:.4f} in "
            f"{cost['seconds'] / 60:.0f} min, at most ${cost['upper_cost_usd']:.4f} in "
            f"{cost['upper_seconds'] / 60:.0f} min (ceiling ${cost['ceiling_usd']}) "
            f"stages={[s['stage'] for s in plan['stage_plan']]}"
        )

        step("4. The agent asks for a confirmation; a human approves it out of band")
        confirmation = run(
            [
                "ito",
                "confirm",
                "--action",
                "train",
                "--booking",
                booking,
                "--manifest",
                str(manifest),
            ],
            agent,
            show=False,
        )
        ref = confirmation["confirmation_ref"]
        print(
            f"    {ref}: up to ${confirmation['cost_usd']} (the cost bound: the run stops "
            f"there and waits for a new approval), expires {confirmation['expires_at']}"
        )
        run(["ito", "approve", ref], human, show=False)

        step("5. The agent creates the run behind the five gates (and retries safely)")
        created = run(
            [
                "ito",
                "train",
                "--booking",
                booking,
                "--manifest",
                str(manifest),
                "--confirmation-ref",
                ref,
                "--idempotency-key",
                "demo-run-1",
            ],
            agent,
        )
        replay = run(
            [
                "ito",
                "train",
                "--booking",
                booking,
                "--manifest",
                str(manifest),
                "--confirmation-ref",
                ref,
                "--idempotency-key",
                "demo-run-1",
            ],
            agent,
            show=False,
        )
        assert replay["run_id"] == created["run_id"]

        step(
            "6. The in-process worker trains it: data prep, pretrain, midtrain, long context, "
            "SFT, DPO, RLVR, each behind its gate"
        )
        print(f"$ ito runs watch {created['run_id']}", flush=True)
        subprocess.run(
            [str(BIN / "ito"), "runs", "watch", created["run_id"], "--interval", "1"],
            env=agent,
            check=False,
        )
        status = run(["ito", "status", "--run", created["run_id"]], agent, show=False)
        summary.update(
            run_id=created["run_id"],
            state=status["state"],
            failure_code=status["failure_code"],
            cost_bound_usd=confirmation["cost_usd"],
        )
        if status["state"] == "awaiting_approval":
            waiting = status["latest_event"]
            raise SystemExit(
                f"the run waits for a human: {waiting['message']}\n(its state is under {HOME})"
            )
        for event in status["events"]:
            if event["kind"] in ("state", "stage", "gate"):
                print(f"    {event['at'][11:19]} {event['kind']:<6} {event['message']}")
        gates = run(["ito", "runs", "gates", created["run_id"]], agent, show=False)["gates"]
        for g in gates:
            initial = f" (step 0: {g['initial']:.3f})" if g.get("initial") is not None else ""
            value = "—" if g["value"] is None else f"{g['value']:.3f}"
            verdict = "passed" if g["passed"] else "FAILED"
            print(f"    gate {g['stage']:<12} {g['rule']}: {value}{initial} {verdict}")
        summary["gates"] = [
            {k: g[k] for k in ("stage", "eval", "data", "value", "passed")} for g in gates
        ]
        provenance = run(["ito", "runs", "provenance", created["run_id"]], agent, show=False)
        print(f"    data-preparation report bound: {provenance['sha256']}")
        losses = run(
            ["ito", "runs", "metrics", created["run_id"], "--name", "loss"], agent, show=False
        )["points"]
        # A step replayed after a restart is reported again: its last report is its value.
        losses = [p for p in losses if not p["superseded"]]
        # Each stage's own figure: a language-modelling loss in the curriculum and SFT, the
        # preference loss in DPO, the policy-gradient surrogate in RLVR (not comparable).
        by_stage: dict[str, list[dict[str, Any]]] = {}
        for point in losses:
            by_stage.setdefault(point["stage"], []).append(point)
        for stage, points in by_stage.items():
            print(
                f"    {stage:<12} loss {points[0]['value']:.3f} (step {points[0]['step']}) → "
                f"{points[-1]['value']:.3f} (step {points[-1]['step']})"
            )
        rewards = run(
            ["ito", "runs", "metrics", created["run_id"], "--name", "reward_mean"],
            agent,
            show=False,
        )["points"]
        rewards = [p for p in rewards if not p["superseded"]]
        rlvr_done = any(
            e["kind"] == "stage"
            and e["data"].get("stage") == "rlvr"
            and e["data"].get("status") == "completed"
            for e in status["events"]
        )
        if rewards and rlvr_done:
            # Ten parts of (nearly) equal size, the last one included: no short tail part
            # whose mean over a few steps reads as a trend.
            cuts = sorted({len(rewards) * i // 10 for i in range(11)})
            curve = [
                sum(p["value"] for p in rewards[lo:hi]) / (hi - lo)
                for lo, hi in itertools.pairwise(cuts)
            ]
            print(
                "    rlvr reward (mean per tenth of the stage): "
                + " ".join(f"{r:.2f}" for r in curve)
            )
            summary["reward_tenths"] = curve

        # Each stage's time against what the approver was shown: expected, and at most.
        planned = {st["name"]: st for st in status["stage_plan"]["stages"]}
        began: dict[str, datetime] = {}
        for event in status["events"]:
            if event["kind"] != "stage":
                continue
            name, at = event["data"].get("stage"), datetime.fromisoformat(event["at"])
            if event["data"].get("status") == "started":
                began[name] = at
            elif name in began and name in planned:
                took = (at - began[name]).total_seconds()
                expected, most = planned[name]["seconds"], planned[name]["upper_seconds"]
                summary.setdefault("stage_seconds", {})[name] = {
                    "took": took,
                    "expected": expected,
                    "upper": most,
                }
                verdict = "within its upper bound" if took <= most else "PAST its upper bound"
                print(
                    f"    {name:<12} took {took:6.0f} s; expected {expected:6.0f} s, at most "
                    f"{most:6.0f} s: {verdict}"
                )

        step("7. Checkpoints and telemetry")
        checkpoints = run(["ito", "runs", "checkpoints", created["run_id"]], agent, show=False)[
            "checkpoints"
        ]
        kept = [c for c in checkpoints if not c["deleted"]]
        print(
            f"    {len(checkpoints)} committed; the keep-last policy deleted "
            f"{len(checkpoints) - len(kept)}; on disk:"
        )
        for c in kept:
            print(
                f"    {c['stage']:<13} step {c['step']:>5}  {c['bytes'] / 1e6:7.2f} MB  "
                f"{c['seconds']:.2f} s"
            )
        telemetry = run(["ito", "telemetry", "--run", created["run_id"]], agent, show=False)
        summary["cost_usd"] = telemetry["cost_usd"]
        for name in (
            "goodput",
            "interruptions",
            "checkpoint_bandwidth_bytes_per_s",
            "tokens_per_s",
            "cost_usd",
            "wall_seconds_held",
        ):
            print(f"    {name:<34} {telemetry[name]}")
        step("8. The desk's audit trail for this account, newest first (no secrets)")
        trail = run(["ito-server", "audit", "--account", account], server_env, show=False)["events"]
        for event in trail:
            print(
                f"    {event['at'][11:19]} {event['actor']:<24} {event['action']:<18} "
                f"{event['target_id']} {event['outcome']}"
            )
        if status["state"] != "succeeded":
            final = status["latest_event"]["message"]
            raise SystemExit(
                f"the run ended {status['state']} ({status['failure_code']}): {final}\n"
                f"its logs: ito runs logs {created['run_id']} (state under {HOME})"
            )
        print(f"\nDone: run {created['run_id']} succeeded.")
    finally:
        server.terminate()
        try:
            server.wait(timeout=15)
        except subprocess.TimeoutExpired:
            server.kill()
        log.close()


def _wait_healthy(url: str, server: subprocess.Popen[bytes]) -> None:
    import httpx

    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise SystemExit(f"the server exited; see {HOME / 'server.log'}")
        try:
            if httpx.get(url + "/v1/health", timeout=1).status_code == 200:
                print("    healthy")
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise SystemExit("the server did not become healthy within 30 s")


if __name__ == "__main__":
    main()
