"""Ids the client puts into URL paths must be ids of their kind, or nothing is sent: a crafted
"run id" can never steer a request to another endpoint — above all not to approval, with an
approver key in ``ITO_API_KEY`` (the real ``ito`` CLI against the real server, on SQLite and
PostgreSQL)."""

from __future__ import annotations

import pytest

from ito.server.ids import new_id
from tests.support import Tenant

pytestmark = pytest.mark.slow


def crafted(ref: str) -> list[str]:
    """Values that, pasted into ``/v1/runs/{id}/…`` and resolved, reach the approval."""
    return [
        f"../confirmations/{ref}/approve#",
        f"../confirmations/{ref}/approve?",
        f"..%2Fconfirmations%2F{ref}%2Fapprove%23",
        f"run_/../../confirmations/{ref}/approve#",
    ]


def commands(value: str) -> list[list[str]]:
    action = ["--confirmation-ref", "cfr_" + "a" * 24, "--idempotency-key", "k-1"]
    return [
        ["runs", "cancel", value, *action],
        ["runs", "cleanup", value, *action],
        ["runs", "restart", value, *action],
        ["status", "--run", value],
        ["runs", "show", value],
        ["runs", "logs", value],
        ["runs", "metrics", value],
        ["runs", "checkpoints", value],
        ["bookings", "show", value],
        ["bookings", "eligibility", value],
        ["approve", value],
        ["reject", value],
    ]


def test_crafted_ids_are_refused_before_anything_is_sent(tenant: Tenant) -> None:
    manifest = tenant.manifest()
    ref = tenant.ito(
        "confirm", "--action", "train", "--booking", tenant.booking_id, "--manifest", str(manifest)
    ).data["confirmation_ref"]
    before = tenant.counts()
    assert before["confirmations"] == {"pending": 1}
    first, *others = crafted(ref)
    attempts = [(first, args) for args in commands(first)]
    attempts += [(value, commands(value)[0]) for value in others]  # runs cancel
    for value, args in attempts:
        result = tenant.ito(*args, key="approver")
        assert (result.rc, result.code) == (1, "invalid_arguments"), (args, result.stdout)
        assert result.envelope is not None
        assert result.envelope["live_api_contacted"] is False, args
        assert value not in result.stdout
    # Not approved, not rejected, nothing else touched.
    assert tenant.counts() == before
    shown = tenant.api("GET", f"/v1/confirmations/{ref}")
    assert shown["data"]["state"] == "pending"


@pytest.mark.parametrize(
    "value",
    [
        "",
        "run_x",
        "bkg_" + "a" * 24,
        "run_" + "a" * 23,
        "run_" + "a" * 25,
        "RUN_" + "A" * 24,
        "run_" + "a" * 23 + "1",
        "run_" + "a" * 24 + "\n",
        "run_" + "a" * 23 + "/",
    ],
)
def test_a_run_id_must_be_exactly_a_minted_run_id(tenant: Tenant, value: str) -> None:
    result = tenant.ito("status", "--run", value)
    assert (result.rc, result.code) == (1, "invalid_arguments"), result.stdout
    assert result.envelope is not None and result.envelope["live_api_contacted"] is False


def test_well_formed_ids_reach_the_server(tenant: Tenant) -> None:
    unknown_run = new_id("run")
    for args, code in [
        (["status", "--run", unknown_run], "run_not_found"),
        (["runs", "logs", unknown_run], "run_not_found"),
        (["bookings", "show", new_id("bkg")], "booking_not_found"),
        (["approve", new_id("cfr")], "confirmation_not_found"),
    ]:
        key = "approver" if args[0] == "approve" else "requester"
        result = tenant.ito(*args, key=key)
        assert (result.rc, result.code) == (1, code), (args, result.stdout)
        assert result.envelope is not None and result.envelope["live_api_contacted"] is True
    shown = tenant.ito("bookings", "show", tenant.booking_id)
    assert shown.rc == 0 and shown.data["booking_id"] == tenant.booking_id
