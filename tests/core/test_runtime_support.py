"""What the runtime can carry out of a valid manifest (``ito.core.runtime_support``): data it
cannot read and gates it cannot measure are refused with their JSON paths; the shipped recipes
ask for nothing it lacks."""

from __future__ import annotations

import json
from typing import Any

import pytest

from ito.core.errors import ItoError
from ito.core.manifest import parse_manifest
from ito.core.runtime_support import check_runtime_support, unsupported_parts
from ito.recipes import RECIPES, build_recipe
from tests.core.conftest import with_post_training


def _doc(recipe: str = "test") -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(json.dumps(build_recipe(recipe, "/data/arith").manifest))
    return doc


def _paths(doc: dict[str, Any]) -> list[tuple[str, str]]:
    found = unsupported_parts(parse_manifest(json.dumps(doc).encode()))
    return [(f["path"], f["capability"]) for f in found]


@pytest.mark.parametrize("recipe", sorted(RECIPES))
def test_the_shipped_recipes_ask_for_nothing_the_runtime_lacks(recipe: str) -> None:
    assert _paths(_doc(recipe)) == []


@pytest.mark.parametrize(
    "revision", ["run:run_abc@12", "hf:/models/tiny@sha256:" + "0" * 64], ids=["run", "hf"]
)
def test_the_revisions_the_engine_loads_are_not_refused_here(revision: str) -> None:
    """Whether they resolve is the server's to say (``ito.server.services.revisions``)."""
    doc = _doc()
    doc["model"]["revision"] = revision
    assert _paths(doc) == []


def test_a_bare_digest_is_no_longer_a_revision() -> None:
    doc = _doc()
    doc["model"]["revision"] = "sha256:" + "0" * 64
    with pytest.raises(ItoError) as refused:
        parse_manifest(json.dumps(doc).encode())
    assert refused.value.code == "manifest_invalid"


@pytest.mark.parametrize(
    "uri",
    [
        "s3://bucket/web.jsonl",
        "https://data.example.com/web.jsonl",
        "gs://bucket/web.parquet",
    ],
)
def test_data_at_a_scheme_the_runtime_cannot_read_is_refused(uri: str) -> None:
    doc = _doc()
    doc["data"][2]["uri"] = uri
    assert _paths(doc) == [("$.data[2].uri", "data_uri_scheme")]


@pytest.mark.parametrize(
    "uri", ["file://otherhost/data/web.jsonl", "file://localhost/data/web.jsonl"]
)
def test_a_file_uri_must_name_a_local_absolute_path(uri: str) -> None:
    doc = _doc()
    doc["data"][0]["uri"] = uri
    expected = [] if "localhost" in uri else [("$.data[0].uri", "data_uri")]
    assert _paths(doc) == expected


@pytest.mark.parametrize(
    ("uri", "capability"),
    [
        ("s3://bucket/tokenizer.json", "tokenizer_uri_scheme"),
        ("https://huggingface.co/x/resolve/main/tokenizer.json", "tokenizer_uri_scheme"),
        ("gs://bucket/tokenizer.json", "tokenizer_uri_scheme"),
        ("file://otherhost/data/tokenizer.json", "tokenizer_uri"),
        ("file:///data/tokenizer.json", None),
        ("file://localhost/data/tokenizer.json", None),
        ("/data/tokenizer.json", None),
    ],
)
def test_a_tokenizer_the_runtime_cannot_read_is_refused_at_its_path(
    uri: str, capability: str | None
) -> None:
    doc = _doc()
    doc["model"]["tokenizer"] = {"uri": uri, "sha256": "0" * 64}
    expected = [] if capability is None else [("$.model.tokenizer.uri", capability)]
    assert _paths(doc) == expected
    if capability is None:
        return
    with pytest.raises(ItoError) as info:
        check_runtime_support(parse_manifest(json.dumps(doc).encode()))
    assert info.value.code == "capability_unavailable"
    assert [u["path"] for u in info.value.details["unsupported"]] == ["$.model.tokenizer.uri"]


def _paths_on(doc: dict[str, Any], pipeline_stages: int) -> list[tuple[str, str]]:
    found = unsupported_parts(parse_manifest(json.dumps(doc).encode()), pipeline_stages)
    return [(f["path"], f["capability"]) for f in found]


def test_item_evals_are_measured_on_fsdp_and_refused_once_under_pipeline_parallelism() -> None:
    doc = _doc()
    doc["eval_batteries"]["core"].append(
        {"eval": "exact_match", "data": "arith-heldout", "min": 0.5}
    )
    assert _paths(doc) == []
    # Both stages use "core": the battery is reported once, at its own path.
    assert _paths_on(doc, 2) == [("$.eval_batteries.core[1].eval", "eval_layout")]
    with pytest.raises(ItoError) as info:
        check_runtime_support(parse_manifest(json.dumps(doc).encode()), pipeline_stages=2)
    assert info.value.code == "capability_unavailable" and info.value.status == 501
    assert [u["path"] for u in info.value.details["unsupported"]] == [
        "$.eval_batteries.core[1].eval"
    ]


def test_every_unsupported_part_is_listed() -> None:
    doc = _doc()
    doc["data"][0]["uri"] = "s3://bucket/web.jsonl"
    doc["data"][4]["uri"] = "https://data.example.com/heldout.jsonl"
    doc["curriculum"][1]["battery"] = "arith"
    assert _paths_on(doc, 4) == [
        ("$.data[0].uri", "data_uri_scheme"),
        ("$.data[4].uri", "data_uri_scheme"),
        ("$.eval_batteries.arith[0].eval", "eval_layout"),
    ]


def test_post_training_is_run_on_one_world_without_pipeline_stages() -> None:
    doc = with_post_training(_doc())
    assert _paths(doc) == []


def test_post_training_under_pipeline_parallelism_is_refused_stage_by_stage() -> None:
    doc = with_post_training(_doc())
    found = unsupported_parts(parse_manifest(json.dumps(doc).encode()), pipeline_stages=2)
    assert [(f["path"], f["capability"]) for f in found if f["capability"] == "post_training"] == [
        ("$.post_training.sft", "post_training"),
        ("$.post_training.dpo", "post_training"),
        ("$.post_training.rlvr", "post_training"),
    ]


def test_post_training_with_several_replica_groups_is_refused() -> None:
    doc = with_post_training(_doc())
    doc["resources"]["replica_groups"] = 2
    assert _paths(doc) == [
        ("$.post_training.sft", "post_training"),
        ("$.post_training.dpo", "post_training"),
        ("$.post_training.rlvr", "post_training"),
    ]
    with pytest.raises(ItoError) as refused:
        check_runtime_support(parse_manifest(json.dumps(doc).encode()))
    assert refused.value.code == "capability_unavailable"


def test_a_post_training_battery_the_engine_cannot_measure_is_refused() -> None:
    doc = with_post_training(_doc())
    doc["eval_batteries"]["arith"] = [{"eval": "exact_match", "data": "arith-heldout", "min": 0.5}]
    found = unsupported_parts(parse_manifest(json.dumps(doc).encode()), pipeline_stages=2)
    assert ("$.eval_batteries.arith[0].eval", "eval_layout") in [
        (f["path"], f["capability"]) for f in found
    ]


def _with_custom_midtrain_data(doc: dict[str, Any]) -> dict[str, Any]:
    """arith-mid (data[1]) marked custom, beside web in the pretrain stage: what the ladder
    judges."""
    doc["data"][1]["custom"] = True
    doc["curriculum"][0]["data"] = ["web", "arith-mid"]
    doc["ladder"]["enabled"] = True
    return doc


def test_custom_data_of_one_curriculum_stage_is_judged_by_the_ladder() -> None:
    assert _paths(_with_custom_midtrain_data(_doc())) == []


def test_custom_data_a_later_stage_uses_again_was_judged_with_the_first() -> None:
    # arith-mid is midtrain's data too: the ladder judged it in the pretrain stage.
    doc = _with_custom_midtrain_data(_doc())
    assert doc["curriculum"][1]["data"] == ["arith-mid"]
    assert _paths(doc) == []


def test_custom_data_the_ladder_does_not_judge_is_refused() -> None:
    doc = _with_custom_midtrain_data(with_post_training(_doc()))
    doc["data"][2]["custom"] = True  # arith-sft: post-training data, never in a curriculum stage
    assert ("$.data[2].custom", "ladder") in _paths(doc)


def test_the_ladder_with_several_replica_groups_is_refused() -> None:
    doc = _with_custom_midtrain_data(_doc())
    doc["resources"]["replica_groups"] = 2
    assert _paths(doc) == [("$.ladder.enabled", "ladder")]


def test_a_rollout_worker_on_a_layout_it_cannot_serve_is_refused_at_max_staleness() -> None:
    """``max_staleness`` ≥ 1 asks for the separate rollout worker; where it cannot serve the
    planned layout the run is refused at plan, not run synchronously behind the approver's
    back. On-policy (0) rollouts need no worker."""
    doc = _doc("post")
    doc["post_training"]["rlvr"]["max_staleness"] = 1
    manifest = parse_manifest(json.dumps(doc).encode())
    assert unsupported_parts(manifest, rollout_worker_served=True) == []
    with pytest.raises(ItoError) as refused:
        check_runtime_support(manifest, rollout_worker_served=False)
    assert refused.value.code == "capability_unavailable"
    paths = [(f["path"], f["capability"]) for f in refused.value.details["unsupported"]]
    assert paths == [("$.post_training.rlvr.max_staleness", "rollout_worker")]
    doc["post_training"]["rlvr"]["max_staleness"] = 0
    on_policy = parse_manifest(json.dumps(doc).encode())
    assert unsupported_parts(on_policy, rollout_worker_served=False) == []
