"""An eval gate's bound (DESIGN §7.5): exactly one, on the side its eval improves towards —
losses an upper bound (``max`` or ``max_ratio`` of the untrained model's value), accuracies a
lower one (``min``; ``min_ratio`` for multiple choice, not for exact match, whose step-0 value
is about 0). Refused at the eval's path otherwise; a relative bound without a step-0 value, or a
value that is not finite, fails closed."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

from ito.core.errors import ItoError
from ito.core.manifest import EvalSpec, parse_manifest

Doc = dict[str, Any]
PATH = "$.eval_batteries.probe[0]"


def _with_gate(doc: Doc, gate: dict[str, Any]) -> bytes:
    doc["eval_batteries"]["probe"] = [gate]
    return json.dumps(doc).encode()


ACCEPTED = [
    {"eval": "heldout_loss", "data": "web", "max": 3.0},
    {"eval": "heldout_loss", "data": "web", "max_ratio": 0.6},
    {"eval": "perplexity", "data": "web", "max_ratio": 0.5},
    {"eval": "exact_match", "data": "arith-heldout", "min": 0.5},
    {"eval": "sampled_exact_match", "data": "arith-heldout", "min": 0.4},
    {"eval": "multiple_choice", "data": "arith-heldout", "min": 0.3},
    {"eval": "multiple_choice", "data": "arith-heldout", "min_ratio": 1.5},
]


@pytest.mark.parametrize("gate", ACCEPTED, ids=lambda g: "-".join(map(str, g.values())))
def test_one_bound_on_the_side_the_eval_improves_towards_is_accepted(
    doc: Doc, gate: dict[str, Any]
) -> None:
    manifest = parse_manifest(_with_gate(doc, gate))
    (spec,) = manifest.eval_batteries["probe"]
    assert spec.relative == ("max_ratio" in gate or "min_ratio" in gate)


REFUSED = [
    ("no-bound", {"eval": "heldout_loss", "data": "web"}, PATH),
    ("two-bounds", {"eval": "heldout_loss", "data": "web", "max": 3.0, "max_ratio": 0.5}, PATH),
    ("loss-lower-bound", {"eval": "heldout_loss", "data": "web", "min": 1.0}, PATH),
    ("loss-min-ratio", {"eval": "perplexity", "data": "web", "min_ratio": 0.5}, PATH),
    (
        "accuracy-upper-bound",
        {"eval": "multiple_choice", "data": "arith-heldout", "max": 0.5},
        PATH,
    ),
    ("exact-match-ratio", {"eval": "exact_match", "data": "arith-heldout", "min_ratio": 2.0}, PATH),
    (
        "sampled-exact-match-ratio",
        {"eval": "sampled_exact_match", "data": "arith-heldout", "min_ratio": 2.0},
        PATH,
    ),
    (
        "sampled-on-text-data",
        {"eval": "sampled_exact_match", "data": "web", "min": 0.5},
        f"{PATH}.data",
    ),
    (
        "accuracy-above-one",
        {"eval": "exact_match", "data": "arith-heldout", "min": 1.5},
        f"{PATH}.min",
    ),
    ("accuracy-on-text-data", {"eval": "exact_match", "data": "web", "min": 0.5}, f"{PATH}.data"),
]


@pytest.mark.parametrize(("case", "gate", "path"), REFUSED, ids=[r[0] for r in REFUSED])
def test_any_other_bound_is_refused_at_the_evals_path(
    doc: Doc, case: str, gate: dict[str, Any], path: str
) -> None:
    with pytest.raises(ItoError) as info:
        parse_manifest(_with_gate(doc, gate))
    assert info.value.code == "manifest_invalid"
    assert path in [e["path"] for e in info.value.details["errors"]]


@pytest.mark.parametrize("ratio", [0.0, -0.5, 1001.0])
def test_a_ratio_out_of_its_range_is_refused(doc: Doc, ratio: float) -> None:
    with pytest.raises(ItoError) as info:
        parse_manifest(_with_gate(doc, {"eval": "heldout_loss", "data": "web", "max_ratio": ratio}))
    assert info.value.code == "manifest_invalid"


def test_a_relative_bound_is_the_ratio_times_the_step_0_value_and_fails_without_one() -> None:
    loss = EvalSpec(eval="heldout_loss", data="web", max_ratio=0.5)
    assert loss.threshold(6.0) == 3.0
    assert loss.passes(2.9, 6.0) and loss.passes(3.0, 6.0) and not loss.passes(3.1, 6.0)
    assert loss.threshold(None) is None and not loss.passes(0.1, None)
    accuracy = EvalSpec(eval="multiple_choice", data="mc", min_ratio=1.5)
    assert accuracy.threshold(0.2) == pytest.approx(0.3)
    assert accuracy.passes(0.31, 0.2) and not accuracy.passes(0.29, 0.2)
    assert loss.describe() == "heldout_loss(web) ≤ 0.5 × step 0"
    assert accuracy.describe() == "multiple_choice(mc) ≥ 1.5 × step 0"


@pytest.mark.parametrize("value", [None, math.nan, math.inf, -math.inf])
def test_a_value_that_is_not_finite_fails_closed(value: float | None) -> None:
    assert not EvalSpec(eval="heldout_loss", data="web", max=100.0).passes(value, None)
    assert not EvalSpec(eval="exact_match", data="e", min=0.0).passes(value, None)
