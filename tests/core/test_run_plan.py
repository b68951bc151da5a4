"""Gate 5 asks the planner (DESIGN §5.8, §7.2): the run's layout on its booking is planned, carried
with the estimate, and an unplannable manifest is refused ``plan_refused`` with its reasons."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest

from ito.core.gates import BookingView, check_resources
from ito.core.manifest import Manifest, parse_manifest
from ito.core.planner import PlanRefused
from ito.core.run_plan import SEQUENCES_PER_RANK, plan_run_parallelism
from tests.core.booking_views import NOW, booking_view

Doc = dict[str, Any]


def _booking(**changes: Any) -> BookingView:
    return booking_view(term_end=NOW + timedelta(days=30), rate_usd_per_gpu_hour=0.01, **changes)


def _manifest(doc: Doc, **resources: Any) -> Manifest:
    doc["resources"].update(resources)
    return parse_manifest(json.dumps(doc).encode())


def _gpu_manifest(doc: Doc, nodes: int, gpus_per_node: int, **resources: Any) -> Manifest:
    doc["budget"] = {"ceiling_usd": 1e6, "max_incremental_cost_usd": 1e6}
    return _manifest(
        doc,
        accelerators=["h100"],
        nodes=nodes,
        gpus_per_node=gpus_per_node,
        fabrics=["ethernet", "infiniband"],
        **resources,
    )


def test_a_cpu_booking_plans_the_engine_s_own_layout_and_the_run_carries_it(doc: Doc) -> None:
    result = check_resources(_manifest(doc), _booking(), NOW)
    run_plan = result.plan
    assert run_plan.mode == "cpu_stand_in"
    assert run_plan.applied is True
    layout = run_plan.plan.layout
    assert (layout.dp_replicate, layout.dp_shard, layout.tp, layout.pp, layout.cp) == (
        1,
        2,
        1,
        1,
        1,
    )
    assert run_plan.plan.micro_batch == SEQUENCES_PER_RANK
    assert run_plan.plan.grad_accum == 1
    assert run_plan.plan.param_dtype == "float32"
    longest = max(s["seq_len"] for s in doc["curriculum"])
    assert run_plan.seq_len == longest
    assert run_plan.plan.global_batch_tokens == SEQUENCES_PER_RANK * 2 * longest
    # Stored with the estimate: what the run row keeps and the worker hands on.
    stored = result.estimate.to_dict()["parallelism"]
    assert stored == run_plan.to_dict()
    assert stored["plan"]["mesh"] == {"pp": 1, "dp_replicate": 1, "dp_shard": 2, "cp": 1, "tp": 1}
    # The engine's default layout is the plan: the spec carries none for it to build.
    assert run_plan.layout is None and stored["layout"] is None


def test_replica_groups_pin_the_replicate_degree(doc: Doc) -> None:
    run_plan = check_resources(_manifest(doc, replica_groups=2), _booking(), NOW).plan
    assert (run_plan.plan.dp_replicate, run_plan.plan.dp_shard) == (2, 1)
    assert run_plan.pinned["dp_replicate"] == 2
    assert run_plan.applied is True and run_plan.layout is None


def test_pinned_degrees_on_the_cpu_stand_in_travel_to_the_engine(doc: Doc) -> None:
    manifest = _manifest(doc, parallelism={"tp": 2})
    run_plan = check_resources(manifest, _booking(), NOW).plan
    assert run_plan.applied is True
    assert run_plan.layout is not None
    assert (run_plan.layout.tp, run_plan.layout.dp_shard, run_plan.layout.param_dtype) == (
        2,
        1,
        "float32",
    )
    assert run_plan.to_dict()["layout"] == run_plan.layout.model_dump()


def test_another_layout_inside_replica_groups_is_refused_not_dropped(doc: Doc) -> None:
    manifest = _manifest(doc, gpus_per_node=4, replica_groups=2, parallelism={"tp": 2})
    refused = _refusal(manifest, _booking(gpus_per_node=4))
    assert [r.code.value for r in refused.reasons] == ["layout_with_replica_groups"]


def test_a_gpu_booking_is_planned_and_carries_the_layout_the_engine_builds(doc: Doc) -> None:
    manifest = _gpu_manifest(doc, 1, 8)
    run_plan = check_resources(manifest, _booking(gpu="h100", gpus_per_node=8), NOW).plan
    assert run_plan.mode == "planned"
    plan = run_plan.plan
    assert plan.param_dtype == "bfloat16"
    assert plan.layout.world == 8
    assert 0 < plan.time.mfu <= 1
    # This engine runs eager: the plan does not claim compiled layers.
    assert plan.compile is False and plan.rule("compile").value is False
    assert run_plan.applied is True
    # The planner picks another layout than the engine's default (FSDP over all 8 ranks) for
    # this model on one 8-GPU node, so the spec carries it.
    assert (plan.dp_replicate, plan.dp_shard, plan.tp, plan.pp) != (1, 8, 1, 1)
    layout = run_plan.layout
    assert layout is not None
    assert (layout.dp_replicate, layout.dp_shard, layout.tp, layout.pp, layout.cp) == (
        plan.dp_replicate,
        plan.dp_shard,
        plan.tp,
        plan.pp,
        plan.cp,
    )
    assert (layout.micro_batch, layout.grad_accum, layout.pp_microbatches) == (
        plan.micro_batch,
        plan.grad_accum,
        plan.pp_microbatches,
    )
    assert (layout.param_dtype, layout.reduce_dtype) == ("bfloat16", "float32")
    assert layout.activation_checkpointing == plan.activation_checkpointing


def test_pinned_degrees_are_validated_not_chosen(doc: Doc) -> None:
    pins = {"dp_replicate": 4, "dp_shard": 2, "activation_checkpointing": "none"}
    doc["model"]["size"] = "150m"
    manifest = _gpu_manifest(doc, 1, 8, parallelism=pins)
    run_plan = check_resources(manifest, _booking(gpu="h100", gpus_per_node=8), NOW).plan
    plan = run_plan.plan
    assert (plan.dp_replicate, plan.dp_shard, plan.tp, plan.pp) == (4, 2, 1, 1)
    assert plan.activation_checkpointing == "none"
    assert plan.micro_batch * plan.grad_accum == SEQUENCES_PER_RANK
    assert run_plan.pinned == pins
    assert all(plan.rule(choice).why.startswith("pinned") for choice in pins)


def _refusal(manifest: Manifest, booking: BookingView) -> PlanRefused:
    with pytest.raises(PlanRefused) as info:
        check_resources(manifest, booking, NOW)
    assert info.value.code == "plan_refused"
    return info.value


def test_more_pinned_pipeline_stages_than_layers_is_refused_with_its_reason(doc: Doc) -> None:
    manifest = _manifest(doc, gpus_per_node=4, parallelism={"pp": 4})
    refused = _refusal(manifest, _booking(gpus_per_node=4))
    assert "pp_more_stages_than_layers" in [r.code.value for r in refused.reasons]
    assert refused.to_error_body()["reasons"]


def test_data_parallelism_over_ethernet_that_cannot_hide_its_traffic_is_refused(
    doc: Doc,
) -> None:
    manifest = _gpu_manifest(doc, 4, 8)
    refused = _refusal(manifest, _booking(gpu="h100", nodes=4, gpus_per_node=8))
    assert "exposed_communication" in [r.code.value for r in refused.reasons]
    # The same run over InfiniBand plans.
    booking = _booking(gpu="h100", nodes=4, gpus_per_node=8, fabric="infiniband")
    assert check_resources(manifest, booking, NOW).plan.plan.layout.world == 32


def test_the_plan_ignores_no_pinned_degree(doc: Doc) -> None:
    # A context-parallel degree the engine cannot apply is refused, not dropped.
    manifest = _gpu_manifest(doc, 1, 8, parallelism={"cp": 2})
    with pytest.raises(PlanRefused) as refused:
        plan_run_parallelism(manifest, gpu="h100", nodes=1, gpus_per_node=8, fabric="nvlink")
    assert "cp_unsupported" in [r.code.value for r in refused.value.reasons]
