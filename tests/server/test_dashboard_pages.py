"""The run dashboard's pages over HTTP (DESIGN §8), on SQLite and PostgreSQL, against the real
server: a run fed through the real worker API (stages, metrics, logs, a gate, a checkpoint)
shows on ``/ui/runs`` and ``/ui/runs/{id}`` exactly as the JSON API reports it; another
tenant's run answers the page a missing one does; the request buttons need the form's CSRF
token and create one pending confirmation that a *different* approver must decide; the bookings
page shows the account's own bookings with their telemetry; no key reaches any page."""

from __future__ import annotations

import re
from collections.abc import Iterator

import httpx
import pytest

from ito.core.pipeline_events import (
    CheckpointEvent,
    GateEvent,
    GateResult,
    LogEvent,
    MetricEvent,
    ReportedEvent,
    SpikeEvent,
    StageEvent,
)
from ito.worker.api import WorkerApi
from tests.server.web_browser import Approver, Browser, csrf_field, make_approver, signed_in
from tests.support import Tenant

pytestmark = pytest.mark.slow

STEPS = 12
GATE = GateResult(
    eval="heldout_loss",
    data="web",
    value=3.125,
    initial=6.25,
    threshold=0.95 * 6.25,
    rule="heldout_loss(web) ≤ 0.95 × step 0",
    passed=True,
)


@pytest.fixture
def approver(tenant: Tenant) -> Approver:
    return make_approver(tenant.server, tenant.account_id)


@pytest.fixture
def web(tenant: Tenant, approver: Approver) -> Iterator[Browser]:
    b = signed_in(tenant.server, approver)
    try:
        yield b
    finally:
        b.close()


def _worker(tenant: Tenant) -> WorkerApi:
    key = tenant.server.desk(
        "/v1/desk/keys",
        {"account_id": tenant.account_id, "role": "worker", "booking_id": tenant.booking_id},
    )["api_key"]
    return WorkerApi(tenant.server.url, str(key))


def _running_run(tenant: Tenant, name: str, *more: ReportedEvent) -> str:
    """A run leased by a real worker key and fed what an engine reports in its first stage
    (then ``more``)."""
    run_id = tenant.train(tenant.manifest(name=name), name)
    api = _worker(tenant)
    try:
        lease = api.lease()
        assert lease is not None and lease.run_id == run_id
        events: list[ReportedEvent] = [StageEvent(stage="pretrain", status="started")]
        for step in range(1, STEPS + 1):
            events.append(
                MetricEvent(
                    stage="pretrain",
                    step=step,
                    values={"loss": 6.0 / step, "tokens_per_s": 1000.0 + step, "mfu": None},
                )
            )
            events.append(LogEvent(message=f"step {step} loss {6.0 / step:.3f}"))
        events.append(
            MetricEvent(stage="pretrain", step=STEPS, values={"eval/heldout_loss/web": 3.125})
        )
        events.append(GateEvent(stage="pretrain", battery="core", results=[GATE], passed=True))
        events.append(
            CheckpointEvent(
                stage="pretrain", step=STEPS, path="ckpt/step_12", bytes=4 << 20, seconds=0.5
            )
        )
        api.report(run_id, lease.attempt, [*events, *more])
    finally:
        api.close()
    return run_id


def _secrets(tenant: Tenant, web: Browser) -> list[str]:
    keys = [tenant.requester_key, tenant.approver_key, tenant.server.desk_key]
    cookie = web.session_cookie()
    assert cookie
    return [*keys, *(k.split("_", 3)[3] for k in keys if k.count("_") >= 3), cookie]


def test_run_page_shows_the_runs_stages_gate_charts_logs_and_checkpoints_as_the_api_does(
    tenant: Tenant, web: Browser
) -> None:
    post_training = [
        MetricEvent(stage="dpo", step=STEPS + 1, values={"dpo_margin": 0.5, "dpo_accuracy": 0.75}),
        MetricEvent(stage="rlvr", step=STEPS + 2, values={"reward_mean": 0.25}),
        MetricEvent(stage="rlvr", step=STEPS + 3, values={"reward_mean": 0.5}),
    ]
    run_id = _running_run(tenant, "dash", *post_training)
    page = web.get(f"/ui/runs/{run_id}")
    assert page.status_code == 200, page.text
    csp = page.headers["content-security-policy"]
    assert "script-src 'self'" in csp and "unsafe-inline" not in csp.split("script-src")[1][:30]
    html = page.text
    assert 'id="run-state">running<' in html
    # One script, ours, served from the package; no inline script at all.
    assert re.findall(r"<script[^>]*>", html) == ['<script src="/ui/static/dashboard.js" defer>']
    script = web.get("/ui/static/dashboard.js")
    assert script.status_code == 200
    assert script.headers["content-type"].startswith("text/javascript")
    assert "part" in script.text and "localStorage" not in script.text

    # The loss chart holds every loss point the API serves, the eval chart the gate's.
    loss = tenant.api("GET", f"/v1/runs/{run_id}/metrics", params={"name": "loss"})["data"]
    assert len(loss["points"]) == STEPS
    assert re.search(rf'data-chart="loss" data-points="{STEPS}"', html)
    assert re.search(r'data-chart="eval" data-points="1"', html)
    assert re.search(rf'data-chart="tokens_per_s" data-points="{STEPS}"', html)
    assert re.search(r'data-chart="mfu" data-points="0"', html)  # no known peak: none drawn
    # Post-training's figures, when reported: reward, and DPO's margin and accuracy.
    assert re.search(r'data-chart="reward" data-points="2"', html)
    assert re.search(r'data-chart="dpo" data-points="2"', html)

    # The stage and its gate, with the gate's numbers.
    assert 'data-stage="pretrain" data-status="running"' in html
    gate_row = re.search(
        r'<tr class="gate" data-stage="pretrain" data-passed="true">.*?</tr>', html, re.S
    )
    assert gate_row is not None
    assert "3.125" in gate_row.group(0) and "5.938" in gate_row.group(0)  # value, 0.95 × 6.25
    assert "heldout_loss(web)" in gate_row.group(0)
    # Progress inside the stage: its step of the stored plan's steps, as the API answers it.
    progress = tenant.api("GET", f"/v1/runs/{run_id}")["data"]["progress"]
    (pretrain,) = [p for p in progress if p["name"] == "pretrain"]
    assert pretrain["step"] == STEPS and pretrain["steps"] > STEPS
    row = re.search(r'<tr data-stage="pretrain" data-status="running">.*?</tr>', html, re.S)
    assert row is not None and f"{STEPS} / {pretrain['steps']}" in row.group(0)
    # The header says the same step of the same stage; the global step is named as such.
    header = re.search(r"<th>Stage</th><td>(.*?)</td>", html, re.S)
    assert header is not None
    assert f'step <span id="stage-step">{STEPS}</span> of {pretrain["steps"]}' in header[1]
    assert "global step" in header[1]

    # The log tail ends at the last line, the checkpoint is listed, telemetry is shown.
    logs = tenant.api("GET", f"/v1/runs/{run_id}/logs")["data"]["lines"]
    assert f'data-last-cursor="{logs[-1]["cursor"]}"' in html
    assert f"step {STEPS} loss 0.500" in html
    assert re.search(r'<table class="data" id="checkpoints">.*?<td>12</td>', html, re.S)
    assert 'id="telemetry"' in html

    # The live fragment is that same part alone, for the page's script.
    fragment = web.get(f"/ui/runs/{run_id}", params={"part": "live"})
    assert fragment.status_code == 200
    assert "<html" not in fragment.text and 'id="run-state">running<' in fragment.text
    assert_no_secret([html, fragment.text], _secrets(tenant, web))


def assert_no_secret(pages: list[str], secrets: list[str]) -> None:
    for html in pages:
        for secret in secrets:
            assert secret not in html


def test_runs_list_shows_state_stage_progress_and_cost_and_filters_by_state(
    tenant: Tenant, web: Browser
) -> None:
    running = _running_run(tenant, "listed")
    queued = tenant.train(tenant.manifest(name="queued"), "queued")
    everything = web.get("/ui/runs")
    assert everything.status_code == 200
    row = re.search(rf'<tr data-run="{running}">.*?</tr>', everything.text, re.S)
    assert row is not None
    assert ">running<" in row.group(0) and "pretrain" in row.group(0)
    assert "stages" in row.group(0)
    # Cost so far: the run's telemetry figure, as the API answers it.
    cost = tenant.api("GET", "/v1/telemetry", params={"run_id": running})["data"]["cost_usd"]
    assert f"{cost:.4f} USD" in row.group(0)
    assert f'data-run="{queued}"' in everything.text

    only_queued = web.get("/ui/runs", params={"state": "queued"})
    assert f'data-run="{queued}"' in only_queued.text
    assert f'data-run="{running}"' not in only_queued.text
    assert web.get("/ui/runs", params={"state": "nonsense"}).status_code == 422
    other_booking = tenant.booking()
    on_it = tenant.train(tenant.manifest(name="elsewhere"), "elsewhere", booking_id=other_booking)
    by_booking = web.get("/ui/runs", params={"booking": other_booking}).text
    assert f'data-run="{on_it}"' in by_booking
    assert f'data-run="{running}"' not in by_booking and f'data-run="{queued}"' not in by_booking
    assert web.get("/ui/runs", params={"part": "live"}).text.count("<html") == 0


def test_another_tenants_run_answers_the_same_404_page_as_a_missing_run(
    tenant: Tenant, other_tenant: Tenant, web: Browser
) -> None:
    theirs = other_tenant.train(other_tenant.manifest(name="theirs"), "theirs")
    missing = theirs[:-1] + ("a" if theirs[-1] != "a" else "b")
    for suffix in ("", "?part=live"):
        their_page = web.get(f"/ui/runs/{theirs}{suffix}")
        missing_page = web.get(f"/ui/runs/{missing}{suffix}")
        assert their_page.status_code == missing_page.status_code == 404
        assert their_page.text == missing_page.text
        assert theirs not in their_page.text
    # Nor can a request be made against it: the same refusal as for a missing run.
    csrf = csrf_field(web.get("/ui/runs").text)
    refusals = [
        web.post(f"/ui/runs/{run}/requests", {"action": "cancel", "csrf_token": csrf})
        for run in (theirs, missing)
    ]
    assert [r.status_code for r in refusals] == [404, 404]
    assert refusals[0].text == refusals[1].text
    assert other_tenant.counts()["confirmations"] == {"consumed": 1}


def test_pages_need_a_session_and_the_live_fragment_answers_401_not_a_form(
    tenant: Tenant,
) -> None:
    run_id = tenant.train(tenant.manifest(name="anon"), "anon")
    anonymous = httpx.Client(base_url=tenant.server.url, follow_redirects=False, timeout=30)
    try:
        for path in ("/ui/runs", f"/ui/runs/{run_id}", "/ui/bookings"):
            answer = anonymous.get(path)
            assert answer.status_code == 303
            assert answer.headers["location"].startswith("/ui/login?next=")
        fragment = anonymous.get(f"/ui/runs/{run_id}", params={"part": "live"})
        assert fragment.status_code == 401 and run_id not in fragment.text
        # An API key is not a session.
        keyed = anonymous.get(
            f"/ui/runs/{run_id}", headers={"authorization": f"Bearer {tenant.requester_key}"}
        )
        assert keyed.status_code == 303
    finally:
        anonymous.close()


def test_request_cancel_needs_csrf_makes_one_pending_confirmation_and_another_approver_decides(
    tenant: Tenant, web: Browser, approver: Approver
) -> None:
    run_id = tenant.train(tenant.manifest(name="cancel"), "cancel")
    page = web.get(f"/ui/runs/{run_id}")
    assert 'name="action" value="cancel"' in page.text
    csrf = csrf_field(page.text)
    before = tenant.counts()["confirmations"]

    # Without the form's token, or with another one: refused, nothing created.
    for token in ("", "0" * len(csrf)):
        refused = web.post(f"/ui/runs/{run_id}/requests", {"action": "cancel", "csrf_token": token})
        assert refused.status_code == 403
    assert tenant.counts()["confirmations"] == before
    assert (
        web.post(
            f"/ui/runs/{run_id}/requests", {"action": "delete-everything", "csrf_token": csrf}
        ).status_code
        == 422
    )

    # A restart names its checkpoint, and only a proposed one: refused as the API refuses it.
    no_step = web.post(f"/ui/runs/{run_id}/requests", {"action": "restart", "csrf_token": csrf})
    assert no_step.status_code == 422
    api_restart = tenant.api(
        "POST",
        "/v1/confirmations",
        json={"action": "run.restart_from_checkpoint", "run_id": run_id, "checkpoint_step": 1},
    )
    assert not api_restart["ok"]
    web_restart = web.post(
        f"/ui/runs/{run_id}/requests",
        {"action": "restart", "checkpoint_step": "1", "csrf_token": csrf},
    )
    assert web_restart.status_code == 409
    assert api_restart["error"]["code"] == "invalid_transition"
    assert 'name="action" value="restart"' not in page.text  # no button without a proposal
    assert tenant.counts()["confirmations"] == before

    requested = web.post(f"/ui/runs/{run_id}/requests", {"action": "cancel", "csrf_token": csrf})
    assert requested.status_code == 303
    ref = re.search(r"requested=(cfr_[A-Za-z0-9_]+)", requested.headers["location"])
    assert ref is not None
    ref_id = ref.group(1)
    # Pressed again (a double click, a resubmitted form): the same confirmation, no other.
    again = web.post(f"/ui/runs/{run_id}/requests", {"action": "cancel", "csrf_token": csrf})
    assert f"requested={ref_id}" in again.headers["location"]
    shown = tenant.api("GET", f"/v1/confirmations/{ref_id}", key="approver")["data"]
    assert shown["state"] == "pending" and shown["action"] == "run.cancel"
    assert shown["target"] == {"kind": "run", "id": run_id}
    assert tenant.counts()["confirmations"] == before | {"pending": 1}

    # The page says it waits for approval; the run is untouched.
    assert 'id="requested"' in web.get(requested.headers["location"]).text
    bogus = web.get(f"/ui/runs/{run_id}", params={"requested": "cfr_not_this_runs"})
    assert 'id="requested"' not in bogus.text  # only a confirmation of this run is announced
    waiting = web.get(f"/ui/runs/{run_id}")
    assert f'data-ref="{ref_id}" data-state="pending"' in waiting.text
    assert 'id="run-state">queued<' in waiting.text

    # The human who asked cannot approve it on the approval page.
    decision = web.get(f"/ui/confirmations/{ref_id}")
    self_approved = web.post(
        f"/ui/confirmations/{ref_id}",
        {"decision": "approve", "csrf_token": csrf_field(decision.text)},
    )
    assert self_approved.status_code == 403
    assert tenant.api("GET", f"/v1/confirmations/{ref_id}")["data"]["state"] == "pending"

    # Another approver approves; the asker applies it, once; a second press replays.
    approved = tenant.api("POST", f"/v1/confirmations/{ref_id}/approve", key="approver")
    assert approved["ok"], approved
    ready = web.get(f"/ui/runs/{run_id}")
    assert f'name="confirmation_ref" value="{ref_id}"' in ready.text
    for _ in range(2):
        applied = web.post(
            f"/ui/runs/{run_id}/apply", {"confirmation_ref": ref_id, "csrf_token": csrf}
        )
        assert applied.status_code == 303, applied.text
    run = tenant.api("GET", f"/v1/runs/{run_id}")["data"]
    assert run["state"] == "cancelled"
    assert tenant.api("GET", f"/v1/confirmations/{ref_id}")["data"]["state"] == "consumed"
    # Applying needs the token too.
    assert (
        web.post(
            f"/ui/runs/{run_id}/apply", {"confirmation_ref": ref_id, "csrf_token": ""}
        ).status_code
        == 403
    )


def test_bookings_page_shows_this_accounts_bookings_with_their_telemetry(
    tenant: Tenant, other_tenant: Tenant, web: Browser
) -> None:
    _running_run(tenant, "booked")
    page = web.get("/ui/bookings")
    assert page.status_code == 200
    assert f'data-booking="{tenant.booking_id}"' in page.text
    assert other_tenant.booking_id not in page.text
    section = re.search(
        rf'<section class="booking" data-booking="{tenant.booking_id}">.*?</section>',
        page.text,
        re.S,
    )
    assert section is not None
    for column in ("Goodput", "Interruptions", "Checkpoint bandwidth", "Cost"):
        assert column in section.group(0)
    assert_no_secret([page.text], _secrets(tenant, web))


def test_a_proposed_restart_and_a_finished_runs_cleanup_are_requested_from_the_page(
    tenant: Tenant, web: Browser
) -> None:
    spike = SpikeEvent(
        stage="pretrain", step=STEPS, loss=9.5, z=8.0, checkpoint_step=STEPS, skip_steps=2
    )
    run_id = _running_run(tenant, "spiked", spike)
    page = web.get(f"/ui/runs/{run_id}")
    assert 'id="run-state">awaiting_approval<' in page.text
    assert f'name="checkpoint_step" value="{STEPS}"' in page.text
    csrf = csrf_field(page.text)
    # Another checkpoint than the proposed one is refused, as by the API.
    other = web.post(
        f"/ui/runs/{run_id}/requests",
        {"action": "restart", "checkpoint_step": "3", "csrf_token": csrf},
    )
    assert other.status_code == 422
    asked = web.post(
        f"/ui/runs/{run_id}/requests",
        {"action": "restart", "checkpoint_step": str(STEPS), "csrf_token": csrf},
    )
    assert asked.status_code == 303
    ref = asked.headers["location"].split("requested=")[1].split("#")[0]
    shown = tenant.api("GET", f"/v1/confirmations/{ref}", key="approver")["data"]
    assert (shown["action"], shown["state"]) == ("run.restart_from_checkpoint", "pending")
    assert shown["details"]["checkpoint_step"] == STEPS

    # Once the run has ended (here: a cancel approved and applied through the API), the page
    # offers cleanup instead, and its request is a pending run.cleanup confirmation.
    cancel = tenant.ito("confirm", "--action", "cancel", "--run", run_id).data["confirmation_ref"]
    assert tenant.ito("approve", cancel, key="approver").rc == 0
    cancelled = tenant.ito(
        "runs", "cancel", run_id, "--confirmation-ref", cancel, "--idempotency-key", "c-1"
    )
    assert cancelled.rc == 0, cancelled.stdout
    # The spike released the lease: nothing holds the run, so the cancel ends it at once.
    assert tenant.api("GET", f"/v1/runs/{run_id}")["data"]["state"] == "cancelled"
    ended = web.get(f"/ui/runs/{run_id}").text
    assert 'id="run-state">cancelled<' in ended
    assert 'name="action" value="cleanup"' in ended
    assert 'name="action" value="cancel"' not in ended
    cleanup = web.post(f"/ui/runs/{run_id}/requests", {"action": "cleanup", "csrf_token": csrf})
    assert cleanup.status_code == 303
    cref = cleanup.headers["location"].split("requested=")[1].split("#")[0]
    assert tenant.api("GET", f"/v1/confirmations/{cref}")["data"]["action"] == "run.cleanup"
