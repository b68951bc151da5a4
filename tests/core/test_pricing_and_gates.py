"""The cost estimate and the pure gates of run creation (DESIGN §5.2, §5.4, §5.6, §5.8)."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

import pytest

from ito.core.errors import ItoError
from ito.core.gates import (
    BookingView,
    check_eligibility,
    check_resources,
    idempotency_fingerprint,
    validate_idempotency_key,
)
from ito.core.manifest import Manifest, parse_manifest
from ito.core.pricing import STAGE_OVERHEAD_SECONDS, CostEstimate, estimate_cost
from ito.recipes import build_recipe
from tests.core.booking_views import NOW
from tests.core.booking_views import booking_view as _booking

STORAGE = "file:///srv/ckpt/bkg_1"
Doc = dict[str, Any]


@pytest.fixture
def doc() -> Doc:
    # A JSON round trip, not deepcopy: the recipe shares lists between entries. Its data lies
    # in the booking's storage, where the run may read it.
    data_dir = "/srv/ckpt/bkg_1/data"
    document: Doc = json.loads(json.dumps(build_recipe("test", data_dir).manifest))
    return document


def _manifest(doc: Doc, mutate: Callable[[Doc], None] | None = None) -> Manifest:
    doc = copy.deepcopy(doc)
    if mutate is not None:
        mutate(doc)
    return parse_manifest(json.dumps(doc).encode())


def _code(fn: Callable[[], object]) -> str:
    with pytest.raises(ItoError) as info:
        fn()
    return info.value.code


# --- cost estimate --------------------------------------------------------------------------


def _estimate(manifest: Manifest, gpus_per_node: int = 2, rate: float = 2.5) -> CostEstimate:
    return estimate_cost(
        manifest,
        accelerator="cpu",
        nodes=1,
        gpus_per_node=gpus_per_node,
        rate_usd_per_gpu_hour=rate,
    )


def _compute_seconds(estimate: CostEstimate) -> float:
    return sum(s.seconds - STAGE_OVERHEAD_SECONDS for s in estimate.stages if s.flops > 0)


def test_cost_is_gpu_hours_times_the_hourly_rate(doc: Doc) -> None:
    estimate = _estimate(_manifest(doc), rate=2.5)
    assert estimate.cost_usd == pytest.approx(estimate.gpu_hours * 2.5, rel=1e-5)
    assert estimate.gpu_hours == pytest.approx(estimate.seconds / 3600 * 2, rel=1e-5)
    assert estimate.accelerators == 2


def test_doubling_gpus_per_node_halves_compute_time_but_keeps_compute_gpu_hours(
    doc: Doc,
) -> None:
    manifest = _manifest(doc)
    two, four = _estimate(manifest, gpus_per_node=2), _estimate(manifest, gpus_per_node=4)
    assert _compute_seconds(two) > 0
    assert _compute_seconds(four) == pytest.approx(_compute_seconds(two) / 2, rel=1e-6)
    assert _compute_seconds(four) * 4 == pytest.approx(_compute_seconds(two) * 2, rel=1e-6)
    assert four.seconds < two.seconds


def test_more_tokens_cost_more(doc: Doc) -> None:
    small = _estimate(_manifest(doc))

    def bigger(d: Doc) -> None:
        d["curriculum"][0]["tokens"] *= 100

    assert _estimate(_manifest(doc, bigger)).cost_usd > small.cost_usd


def test_the_estimate_is_compared_with_the_manifest_budget(doc: Doc) -> None:
    estimate = _estimate(_manifest(doc))
    assert estimate.ceiling_usd == doc["budget"]["ceiling_usd"]
    assert estimate.max_incremental_cost_usd == doc["budget"]["max_incremental_cost_usd"]
    assert estimate.within_ceiling and estimate.within_incremental
    assert estimate.to_dict()["within_ceiling"] is True


# --- eligibility ----------------------------------------------------------------------------


def test_a_completed_booking_inside_its_term_is_eligible() -> None:
    check_eligibility(_booking(), NOW)


@pytest.mark.parametrize(
    ("state", "code"),
    [
        ("pending", "booking_not_completed"),
        ("expired", "booking_expired"),
        ("revoked", "booking_revoked"),
        ("released", "booking_released"),
    ],
)
def test_a_booking_in_a_non_completed_state_is_not_eligible(state: str, code: str) -> None:
    assert _code(lambda: check_eligibility(_booking(state=state), NOW)) == code


@pytest.mark.parametrize(
    "now",
    [
        NOW - timedelta(hours=2),
        NOW + timedelta(days=1),
        NOW + timedelta(days=2),
    ],
    ids=["before-start", "at-end", "after-end"],
)
def test_a_completed_booking_outside_its_term_is_expired(now: datetime) -> None:
    assert _code(lambda: check_eligibility(_booking(), now)) == "booking_expired"


# --- resources ------------------------------------------------------------------------------


def test_a_fitting_booking_passes_every_resource_gate(doc: Doc) -> None:
    result = check_resources(_manifest(doc), _booking(), NOW, run_id_hint="run_9")
    assert result.checkpoint_uri == f"{STORAGE}/runs/run_9"
    assert result.checkpoint_bytes > 0
    assert result.estimate.cost_usd > 0


@pytest.mark.parametrize(
    "uri",
    [
        "file:///etc/passwd",
        "file:///srv/ckpt/bkg_2/web.jsonl",  # another booking's storage
        "file:///srv/ckpt/bkg_1/../bkg_2/web.jsonl",
        "file:///srv/ckpt/bkg_1/%2e%2e/bkg_2/web.jsonl",
        "file:///srv/ckpt/bkg_10/web.jsonl",  # a prefix is not containment
    ],
)
def test_a_data_file_outside_the_bookings_storage_is_refused_at_its_path(
    doc: Doc, uri: str
) -> None:
    """The worker's host holds every tenant's files and its own: a data URI names only what
    lies in the booking's storage, decided on the URI alone (nothing is opened)."""

    def elsewhere(d: Doc) -> None:
        d["data"][2]["uri"] = uri

    with pytest.raises(ItoError) as refused:
        check_resources(_manifest(doc, elsewhere), _booking(), NOW, run_id_hint="run_9")
    assert refused.value.code == "data_policy_violation"
    assert refused.value.details["violations"] == [
        {"path": "$.data[2].uri", "reason": "not inside the booking's storage"}
    ]


@pytest.mark.parametrize(
    ("uri", "inside"),
    [
        ("/opt/tokenizers/t.json", False),
        ("file:///root/.ito/t.json", False),
        ("/srv/ckpt/bkg_1/tokenizers/t.json", True),
        ("file:///srv/ckpt/bkg_1/t%20j.json", True),
    ],
)
def test_a_tokenizer_file_must_lie_inside_the_bookings_storage(
    doc: Doc, uri: str, inside: bool
) -> None:
    def named(d: Doc) -> None:
        d["model"]["tokenizer"] = {"uri": uri, "sha256": "c" * 64}

    manifest = _manifest(doc, named)
    if inside:
        checked = check_resources(manifest, _booking(), NOW, run_id_hint="run_9")
        assert checked.estimate.cost_usd > 0
        return
    with pytest.raises(ItoError) as refused:
        check_resources(manifest, _booking(), NOW, run_id_hint="run_9")
    assert refused.value.code == "tokenizer_invalid"
    assert refused.value.details["path"] == "$.model.tokenizer.uri"


def test_an_accelerator_the_manifest_does_not_accept_is_a_mismatch(doc: Doc) -> None:
    booking = _booking(gpu="h100", gpu_memory_gb=80)
    assert _code(lambda: check_resources(_manifest(doc), booking, NOW)) == "booking_mismatch"


def _two_nodes(d: Doc) -> None:
    d["resources"]["nodes"] = 2


@pytest.mark.parametrize(
    ("mutate", "booking"),
    [
        (_two_nodes, _booking(nodes=1)),
        (None, _booking(gpus_per_node=1)),
        (None, _booking(gpu_memory_gb=0)),
    ],
    ids=["fewer-nodes", "fewer-gpus-per-node", "memory-too-small"],
)
def test_a_booking_smaller_than_the_manifest_needs_is_insufficient(
    doc: Doc, mutate: Callable[[Doc], None] | None, booking: BookingView
) -> None:
    manifest = _manifest(doc, mutate)
    assert _code(lambda: check_resources(manifest, booking, NOW)) == "capacity_insufficient"


def _fabrics(*names: str) -> Callable[[Doc], None]:
    def apply(d: Doc) -> None:
        d["resources"]["fabrics"] = list(names)

    return apply


@pytest.mark.parametrize(
    ("accepted", "booked"),
    [
        (("infiniband",), "ethernet"),
        (("nvlink", "ethernet"), "nvlink"),
    ],
    ids=["fabric-not-accepted", "nvlink-between-nodes"],
)
def test_a_multi_node_booking_on_an_unaccepted_fabric_is_incompatible(
    doc: Doc, accepted: tuple[str, ...], booked: str
) -> None:
    manifest = _manifest(doc, _fabrics(*accepted))
    booking = _booking(nodes=2, fabric=booked)
    assert _code(lambda: check_resources(manifest, booking, NOW)) == "fabric_incompatible"


def test_the_fabric_does_not_matter_inside_one_node(doc: Doc) -> None:
    manifest = _manifest(doc, _fabrics("infiniband"))
    check_resources(manifest, _booking(nodes=1, fabric="ethernet"), NOW)


def _licence(d: Doc) -> None:
    d["data"][0]["license"] = "proprietary"


def _no_decontamination(d: Doc) -> None:
    del d["data"][0]["decontamination"]


def _second_eval_suite(d: Doc) -> None:
    extra = dict(d["data"][-1], id="extra-heldout", uri=d["data"][-1]["uri"] + ".2")
    d["data"].append(extra)
    for ref in d["data"]:
        if ref["role"] != "eval" and ref["id"] != "web":
            ref["decontamination"]["eval_suites"] = ["arith-heldout", "extra-heldout"]


@pytest.mark.parametrize(
    ("mutate", "path"),
    [
        (_licence, "$.data[0].license"),
        (_no_decontamination, "$.data[0].decontamination"),
        (_second_eval_suite, "$.data[0].decontamination.eval_suites"),
    ],
    ids=["licence-not-allowed", "no-decontamination", "eval-not-covered"],
)
def test_data_outside_the_data_policy_is_refused(
    doc: Doc, mutate: Callable[[Doc], None], path: str
) -> None:
    manifest = _manifest(doc, mutate)
    with pytest.raises(ItoError) as info:
        check_resources(manifest, _booking(), NOW)
    assert info.value.code == "data_policy_violation"
    assert [v["path"] for v in info.value.details["violations"]] == [path]


def _storage(uri: str) -> Callable[[Doc], None]:
    def apply(d: Doc) -> None:
        d["checkpoint"]["storage"] = uri

    return apply


def test_checkpoint_storage_inside_the_booking_storage_is_used(doc: Doc) -> None:
    manifest = _manifest(doc, _storage(f"{STORAGE}/mine/"))
    result = check_resources(manifest, _booking(), NOW, run_id_hint="run_9")
    assert result.checkpoint_uri == f"{STORAGE}/mine/run_9"


@pytest.mark.parametrize(
    ("mutate", "booking"),
    [
        (None, _booking(storage_uri=None)),
        (_storage("file:///srv/other/x"), _booking()),
        (_storage(f"{STORAGE}0/x"), _booking()),
        (_storage(f"{STORAGE}/../bkg_2"), _booking()),
        (_storage(f"{STORAGE}/a/../../bkg_2"), _booking()),
        (None, _booking(storage_quota_gb=0.001)),
    ],
    ids=[
        "no-storage",
        "outside",
        "sibling-with-same-prefix",
        "dotdot",
        "nested-dotdot",
        "quota-too-small",
    ],
)
def test_unusable_checkpoint_storage_is_refused(
    doc: Doc, mutate: Callable[[Doc], None] | None, booking: BookingView
) -> None:
    manifest = _manifest(doc, mutate)
    assert _code(lambda: check_resources(manifest, booking, NOW)) == "checkpoint_storage_invalid"


def test_a_run_that_outlasts_the_booking_term_is_refused(doc: Doc) -> None:
    booking = _booking(term_end=NOW + timedelta(seconds=1))
    assert (
        _code(lambda: check_resources(_manifest(doc), booking, NOW)) == "booking_term_insufficient"
    )


def _budget(ceiling: float, incremental: float) -> Callable[[Doc], None]:
    def apply(d: Doc) -> None:
        d["budget"] = {"ceiling_usd": ceiling, "max_incremental_cost_usd": incremental}

    return apply


@pytest.mark.parametrize(
    ("ceiling", "incremental", "key"),
    [
        (0.001, 0.001, "ceiling_usd"),
        (5.0, 0.001, "max_incremental_cost_usd"),
    ],
    ids=["ceiling", "incremental"],
)
def test_an_estimate_over_the_budget_is_refused(
    doc: Doc, ceiling: float, incremental: float, key: str
) -> None:
    manifest = _manifest(doc, _budget(ceiling, incremental))
    with pytest.raises(ItoError) as info:
        check_resources(manifest, _booking(), NOW)
    assert info.value.code == "budget_exceeded"
    assert key in info.value.details


# --- idempotency ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "key",
    ["", "k" * 256, "line\nbreak", "tab\there", "del\x7f", "nul\x00"],
    ids=["empty", "256-chars", "newline", "tab", "del", "nul"],
)
def test_an_idempotency_key_outside_1_to_255_printable_characters_is_invalid(key: str) -> None:
    assert _code(lambda: validate_idempotency_key(key)) == "idempotency_key_invalid"


@pytest.mark.parametrize("key", ["k", "k" * 255, "run 2026-03-01 #1 (retry)~"])
def test_an_idempotency_key_of_1_to_255_printable_characters_is_valid(key: str) -> None:
    validate_idempotency_key(key)


def test_the_fingerprint_is_stable_for_the_same_request() -> None:
    args = ("train.create", "bkg_1", "sha256:" + "a" * 64, "cfr_1")
    assert idempotency_fingerprint(*args) == idempotency_fingerprint(*args)


@pytest.mark.parametrize("index", range(4), ids=["action", "target", "digest", "ref"])
def test_the_fingerprint_changes_with_each_input(index: int) -> None:
    args = ["train.create", "bkg_1", "sha256:" + "a" * 64, "cfr_1"]
    changed = list(args)
    changed[index] = ["run.cancel", "bkg_2", "sha256:" + "b" * 64, "cfr_2"][index]
    assert idempotency_fingerprint(*changed) != idempotency_fingerprint(*args)


def test_the_fingerprint_does_not_confuse_moved_boundaries_between_inputs() -> None:
    assert idempotency_fingerprint("ab", "c", None, "d") != idempotency_fingerprint(
        "a", "bc", None, "d"
    )
