"""The parallelism planner (DESIGN §7.2, issue 9 item 1): published layouts accepted, wasteful
and impossible ones refused with their codes, pinned degrees validated instead of chosen, and
the formulas behind it checked on numbers worked out by hand."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest

from ito.core.errors import REGISTRY
from ito.core.hardware import ACCELERATORS, FABRIC_LINKS
from ito.core.model_sizes import SIZES
from ito.core.planner import (
    Layout,
    ModelShape,
    Parallelism,
    Plan,
    PlannerInput,
    PlanRefused,
    ReasonCode,
    plan,
)
from ito.core.planner_checks import useful_tp
from ito.core.planner_memory import activation_bytes_per_token, memory_per_gpu
from ito.core.planner_time import step_time

LLAMA3_8B = ModelShape.from_size(SIZES["8b"])
LLAMA3_70B = ModelShape(layers=80, hidden=8192, heads=64, kv_heads=8, ffn=28672, vocab=128256)
LLAMA3_405B = ModelShape(layers=126, hidden=16384, heads=128, kv_heads=8, ffn=53248, vocab=128256)
M150 = ModelShape.from_size(SIZES["150m"])
TINY = ModelShape.from_size(SIZES["tiny"])
SEQ = 8192


def _input(
    model: ModelShape,
    *,
    nodes: int = 1,
    gpus_per_node: int = 8,
    gpu: str = "h100",
    fabric: str = "infiniband",
    sequences: int | None = None,
    seq_len: int = SEQ,
    fp8: bool = False,
    allow_wasteful: bool = False,
    **pinned: Any,
) -> PlannerInput:
    return PlannerInput(
        model=model,
        seq_len=seq_len,
        accelerator=ACCELERATORS[gpu],
        nodes=nodes,
        gpus_per_node=gpus_per_node,
        fabric=FABRIC_LINKS[fabric],
        global_batch_tokens=None if sequences is None else sequences * seq_len,
        fp8=fp8,
        pinned=Parallelism(**pinned),
        allow_wasteful=allow_wasteful,
    )


def replace_fabric(inp: PlannerInput, fabric: str) -> PlannerInput:
    return replace(inp, fabric=FABRIC_LINKS[fabric])


def replace_pin(inp: PlannerInput, **changes: Any) -> PlannerInput:
    return replace(inp, pinned=replace(inp.pinned, **changes))


def _refusal(inp: PlannerInput) -> set[str]:
    with pytest.raises(PlanRefused) as caught:
        plan(inp)
    assert caught.value.code == "plan_refused"
    assert caught.value.reasons
    return {reason.code.value for reason in caught.value.reasons}


# --- published TorchTitan layouts (Liang et al. 2024, "TorchTitan", §3: Llama 3.1 on H100) ------

PUBLISHED = {
    "8b_fsdp_8": (_input(LLAMA3_8B, sequences=8, dp_shard=8), (1, 8, 1, 1)),
    "8b_fsdp_128": (_input(LLAMA3_8B, nodes=16, sequences=128, dp_shard=128), (1, 128, 1, 1)),
    "70b_fsdp_tp8_256": (
        _input(LLAMA3_70B, nodes=32, sequences=256, dp_shard=32, tp=8),
        (1, 32, 8, 1),
    ),
    "405b_fsdp_tp8_pp8_512": (
        _input(LLAMA3_405B, nodes=64, sequences=256, dp_shard=8, tp=8, pp=8),
        (1, 8, 8, 8),
    ),
}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_published_torchtitan_layouts_are_accepted_with_memory_under_capacity(name: str) -> None:
    inp, (dp_replicate, dp_shard, tp, pp) = PUBLISHED[name]
    result = plan(inp)
    assert (result.dp_replicate, result.dp_shard, result.tp, result.pp, result.cp) == (
        dp_replicate,
        dp_shard,
        tp,
        pp,
        1,
    )
    memory = result.memory
    assert memory.total <= memory.usable < memory.capacity == inp.accelerator.memory_bytes
    assert memory.headroom > 0 and memory.fits
    assert result.global_batch_tokens == inp.global_batch_tokens
    assert 0 < result.time.mfu < inp.accelerator.kernel_efficiency
    for dim in ("dp_shard", "tp", "pp"):
        if getattr(inp.pinned, dim) is not None:
            assert result.rule(dim).why.startswith("pinned")
    assert not result.warnings


def test_the_405b_pipeline_keeps_its_bubble_within_a_quarter() -> None:
    inp, _ = PUBLISHED["405b_fsdp_tp8_pp8_512"]
    result = plan(inp)
    m = result.pp_microbatches
    assert result.grad_accum == 1 and m >= 8
    assert result.time.bubble_fraction == pytest.approx(7 / (m + 7))
    assert result.time.bubble_fraction <= 0.25


# --- wasteful or impossible variants ------------------------------------------------------------


def test_70b_on_one_node_of_h100_does_not_fit() -> None:
    assert _refusal(_input(LLAMA3_70B, sequences=64)) == {"memory_exceeded"}


def test_405b_on_64_h100_does_not_fit() -> None:
    assert _refusal(_input(LLAMA3_405B, nodes=8, sequences=256)) == {"memory_exceeded"}


def test_150m_on_64_h100_with_a_tiny_batch_is_an_oversized_booking() -> None:
    inp = _input(M150, nodes=8, sequences=16, seq_len=2048)
    assert "booking_oversized" in _refusal(inp)


def test_a_booking_is_oversized_only_when_the_batch_cannot_keep_it_busy() -> None:
    assert [useful_tp(_input(m)) for m in (M150, LLAMA3_8B, LLAMA3_70B, LLAMA3_405B)] == [
        1,
        4,
        8,
        8,
    ]
    # 8B on 128 GPUs with 64 sequences: tensor parallel 2 keeps every GPU busy.
    assert plan(_input(LLAMA3_8B, nodes=16, sequences=64)).tp == 2
    # A big model on a big booking with a big batch is no waste.
    huge = plan(_input(LLAMA3_405B, nodes=4096, sequences=16384))
    assert huge.global_batch_tokens == 16384 * SEQ


def test_a_batch_smaller_than_the_data_parallel_ranks_leaves_accelerators_idle() -> None:
    inp = _input(M150, nodes=8, sequences=16, seq_len=2048, dp_shard=64, allow_wasteful=True)
    assert _refusal(inp) == {"idle_accelerators"}
    uneven = _input(LLAMA3_8B, sequences=12, dp_shard=8)
    assert _refusal(uneven) == {"idle_accelerators"}


def test_tensor_parallel_16_on_8_gpu_nodes_crosses_nodes() -> None:
    inp = _input(LLAMA3_70B, nodes=32, sequences=256, tp=16)
    assert "tp_across_nodes" in _refusal(inp)


def test_fp8_on_a100_is_refused_and_granted_on_h100() -> None:
    assert _refusal(_input(LLAMA3_8B, gpu="a100", sequences=8, fp8=True)) == {"fp8_unsupported"}
    on_h100 = plan(_input(LLAMA3_8B, sequences=8, fp8=True))
    bf16 = plan(_input(LLAMA3_8B, sequences=8))
    assert on_h100.fp8 and not bf16.fp8
    assert on_h100.time.step_seconds < bf16.time.step_seconds


def test_data_parallel_of_a_large_model_over_ethernet_exposes_its_gradients() -> None:
    hsdp = _input(LLAMA3_8B, nodes=16, fabric="ethernet", sequences=128, dp_replicate=16)
    assert _refusal(hsdp) == {"exposed_communication"}
    same_over_infiniband = plan(replace_fabric(hsdp, "infiniband"))
    assert same_over_infiniband.dp_replicate == 16


def test_pure_fsdp_across_slow_nodes_is_refused_for_hsdp() -> None:
    fsdp = _input(LLAMA3_8B, nodes=2, fabric="ethernet", sequences=16, dp_shard=16)
    assert "fsdp_all_gather_exposed" in _refusal(fsdp)
    # The same check over InfiniBand with short sequences: a layer's all-gather outlasts its
    # forward even on a fast fabric when the micro-batch has few tokens.
    short = _input(LLAMA3_8B, nodes=2, sequences=16, seq_len=1024, dp_shard=16)
    assert "fsdp_all_gather_exposed" in _refusal(short)
    assert plan(_input(LLAMA3_8B, nodes=2, sequences=16, dp_shard=16)).dp_shard == 16


# --- every refusal of item 1 ----------------------------------------------------------------------


def test_degrees_whose_product_is_not_the_world_are_refused() -> None:
    inp = _input(LLAMA3_8B, sequences=8, dp_replicate=1, dp_shard=4, tp=1, pp=1, cp=1)
    assert _refusal(inp) == {"degrees_mismatch_world"}


def test_tensor_parallel_must_divide_heads_and_kv_heads() -> None:
    inp = _input(M150, sequences=8, seq_len=2048, tp=8)
    assert _refusal(inp) == {"tp_not_dividing_model"}


def test_more_pipeline_stages_than_layers_are_refused() -> None:
    inp = _input(TINY, gpus_per_node=4, sequences=32, seq_len=256, pp=4)
    assert "pp_more_stages_than_layers" in _refusal(inp)


def test_fewer_micro_batches_than_stages_are_refused() -> None:
    inp = _input(LLAMA3_8B, sequences=4, pp=4, dp_shard=2)
    assert "pp_too_few_microbatches" in _refusal(inp)


def test_a_pipeline_bubble_above_a_quarter_is_refused() -> None:
    # 4 sequences per data-parallel rank: m = 4 micro-batches, bubble 3/7.
    inp = _input(LLAMA3_8B, sequences=8, pp=4, dp_shard=2)
    assert _refusal(inp) == {"pipeline_bubble"}


def test_context_parallel_is_refused_where_the_sequence_does_not_need_it() -> None:
    codes = _refusal(_input(LLAMA3_8B, sequences=8, cp=2, dp_shard=4, micro_batch=1))
    assert {"cp_not_needed", "cp_unsupported"} <= codes
    assert "cp_not_dividing_sequence" in _refusal(
        _input(LLAMA3_8B, sequences=8, seq_len=8196, cp=4)
    )


def test_context_parallel_is_never_planned_while_the_engine_cannot_apply_it() -> None:
    inp = _input(LLAMA3_8B, sequences=8, cp=2, micro_batch=1, allow_wasteful=True)
    assert _refusal(inp) == {"cp_unsupported"}


def test_a_pinned_micro_batch_that_does_not_divide_the_rank_share_is_refused() -> None:
    assert _refusal(_input(LLAMA3_8B, sequences=16, micro_batch=3)) == {"micro_batch_not_dividing"}


def test_several_nodes_over_nvlink_alone_are_refused() -> None:
    inp = _input(LLAMA3_8B, nodes=2, fabric="nvlink", sequences=16)
    assert "fabric_not_inter_node" in _refusal(inp)


@pytest.mark.parametrize("tp", [2, 4, 8])
def test_tensor_parallel_where_plain_fsdp_fits_and_is_faster_is_refused(tp: int) -> None:
    assert _refusal(_input(LLAMA3_8B, sequences=8, tp=tp)) == {"tp_not_needed"}


def test_pipeline_parallel_where_plain_fsdp_fits_and_is_faster_is_refused() -> None:
    assert _refusal(_input(LLAMA3_8B, sequences=16, pp=2, tp=1)) == {"pp_not_needed"}


def test_full_checkpointing_where_less_recomputation_fits_is_refused() -> None:
    inp = _input(LLAMA3_8B, sequences=8, dp_shard=8, activation_checkpointing="full")
    assert _refusal(inp) == {"full_checkpointing_not_needed"}
    assert plan(replace_pin(inp, activation_checkpointing=None)).activation_checkpointing == (
        "selective"
    )
    # At 10240 tokens the activations no longer fit whole; selective checkpointing does.
    pinned = _input(
        LLAMA3_8B, sequences=8, seq_len=10240, dp_shard=8, activation_checkpointing="full"
    )
    assert _refusal(pinned) == {"full_checkpointing_not_needed"}
    assert plan(replace_pin(pinned, activation_checkpointing=None)).activation_checkpointing == (
        "selective"
    )


def test_every_reason_code_is_snake_case_and_classified() -> None:
    for code in ReasonCode:
        assert code.value == code.name and code.value.islower()
    wasteful = {c.value for c in ReasonCode if c.wasteful}
    assert "memory_exceeded" not in wasteful and "tp_not_needed" in wasteful


# --- pinned degrees are validated, not chosen -------------------------------------------------


def test_pinned_degrees_are_validated_instead_of_chosen() -> None:
    free = plan(_input(LLAMA3_8B, nodes=2, sequences=16))
    pinned = plan(_input(LLAMA3_8B, nodes=2, sequences=16, dp_replicate=2, dp_shard=8))
    assert (pinned.dp_replicate, pinned.dp_shard, pinned.tp, pinned.pp) == (2, 8, 1, 1)
    assert pinned.rule("dp_replicate").why.startswith("pinned")
    assert pinned.rule("dp_shard").why.startswith("pinned")
    assert not free.rule("dp_shard").why.startswith("pinned")
    assert pinned.time.tokens_per_second <= free.time.tokens_per_second
    # A pin the planner would never choose is checked, and refused with its reason.
    assert free.tp == 1
    assert _refusal(_input(LLAMA3_8B, nodes=2, sequences=16, tp=2)) == {"tp_not_needed"}


def test_parallelism_mapping_rejects_unknown_keys_and_bad_values() -> None:
    assert Parallelism.from_mapping({"tp": 2, "dp_shard": 4}) == Parallelism(tp=2, dp_shard=4)
    with pytest.raises(ValueError, match="unknown"):
        Parallelism.from_mapping({"tensor_parallel": 2})
    with pytest.raises(ValueError, match=r"parallelism\.tp"):
        Parallelism(tp=0)
    with pytest.raises(ValueError, match="activation_checkpointing"):
        Parallelism.from_mapping({"activation_checkpointing": "some"})


def test_allow_wasteful_turns_waste_into_warnings_but_never_the_impossible() -> None:
    allowed = plan(_input(LLAMA3_8B, sequences=8, tp=2, allow_wasteful=True))
    assert allowed.tp == 2
    assert [w.code.value for w in allowed.warnings] == ["tp_not_needed"]
    impossible = _input(LLAMA3_70B, sequences=64, allow_wasteful=True)
    assert _refusal(impossible) == {"memory_exceeded"}


# --- the choice is the fastest and says why ----------------------------------------------------


@pytest.mark.parametrize(
    "inp",
    [
        _input(LLAMA3_8B, sequences=8),
        _input(LLAMA3_8B, nodes=2, sequences=32),
        _input(LLAMA3_70B, nodes=32, sequences=256),
    ],
    ids=["8b_1x8", "8b_2x8", "70b_32x8"],
)
def test_the_plan_is_the_fastest_acceptable_layout(inp: PlannerInput) -> None:
    best = plan(inp)
    assert best.acceptable >= 1 and best.candidates > best.acceptable
    world = inp.world
    for tp in (1, 2, 4, 8):
        for pp in (1, 2):
            if world % (tp * pp):
                continue
            dp = world // (tp * pp)
            for dp_replicate in (1, 2, dp):
                if dp % dp_replicate:
                    continue
                pins = replace_pin(inp, tp=tp, pp=pp, dp_replicate=dp_replicate)
                try:
                    other = plan(pins)
                except PlanRefused:
                    continue
                assert other.time.tokens_per_second <= best.time.tokens_per_second


def test_every_choice_carries_its_rule() -> None:
    result = plan(_input(LLAMA3_8B, sequences=8))
    chosen = {rule.choice for rule in result.rules}
    assert chosen >= {
        "dp_replicate",
        "dp_shard",
        "tp",
        "pp",
        "cp",
        "micro_batch",
        "activation_checkpointing",
        "grad_accum",
        "global_batch_tokens",
        "precision",
        "fp8",
        "compile",
    }
    assert all(rule.why for rule in result.rules)
    assert result.rule("tp").value == 1 and "tokens/s" in result.rule("tp").why


def test_without_a_batch_the_planner_sizes_one_micro_batch_per_rank() -> None:
    result = plan(_input(LLAMA3_8B))
    assert result.grad_accum == 1
    assert result.global_batch_tokens == result.dp_replicate * result.dp_shard * (
        result.micro_batch * SEQ
    )
    piped = plan(_input(LLAMA3_8B, pp=4, tp=1, allow_wasteful=True))
    assert piped.pp_microbatches == 9  # the fewest with (p-1)/(m+p-1) <= 1/4: m >= 3(p-1)
    assert piped.time.bubble_fraction == pytest.approx(0.25)


def test_the_cpu_stand_in_plans_fp32_without_compile() -> None:
    result = plan(_input(TINY, gpu="cpu", gpus_per_node=2, fabric="ethernet", seq_len=256))
    assert (result.param_dtype, result.reduce_dtype, result.compile) == (
        "float32",
        "float32",
        False,
    )
    assert result.memory.runtime_reserve == 0


# --- the answer's shape ---------------------------------------------------------------------------


def test_the_plan_dumps_to_json_with_every_part_of_the_contract() -> None:
    result: Plan = plan(_input(LLAMA3_70B, nodes=32, sequences=256, dp_shard=32, tp=8))
    data = json.loads(json.dumps(result.to_dict()))
    for key in (
        "dp_replicate",
        "dp_shard",
        "tp",
        "pp",
        "cp",
        "micro_batch",
        "grad_accum",
        "pp_microbatches",
        "activation_checkpointing",
        "compile",
        "mesh",
        "rules",
    ):
        assert key in data
    assert list(data["mesh"]) == ["pp", "dp_replicate", "dp_shard", "cp", "tp"]
    assert data["precision"] == {"param_dtype": "bfloat16", "reduce_dtype": "float32", "fp8": False}
    memory = data["memory"]
    assert memory["total"] == sum(
        memory[k]
        for k in (
            "parameters",
            "gradients",
            "optimizer_states",
            "activations",
            "loss",
            "buffers",
            "runtime_reserve",
        )
    )
    assert memory["headroom"] == memory["capacity"] - memory["total"]
    assert data["communication"]["tp"]["bytes"] > 0
    assert data["communication"]["fsdp"]["crosses_nodes"] is True
    assert 0 < data["predicted"]["mfu"] < 1


def test_a_refusal_is_a_non_retryable_plan_refused_with_its_reasons_in_the_body() -> None:
    with pytest.raises(PlanRefused) as caught:
        plan(_input(LLAMA3_70B, sequences=64))
    body = caught.value.to_error_body()
    assert body["code"] == "plan_refused" and body["retryable"] is False
    assert REGISTRY["plan_refused"].status == 422
    assert [reason["code"] for reason in body["reasons"]] == ["memory_exceeded"]
    assert all(reason["message"] for reason in body["reasons"])


# --- the formulas on hand-worked numbers ------------------------------------------------------


def test_model_shapes_count_llama_parameters() -> None:
    for size in SIZES.values():
        assert ModelShape.from_size(size).parameters == size.parameters
    assert LLAMA3_70B.parameters == 70_553_706_496
    assert LLAMA3_405B.parameters == 405_853_388_800
    solved = ModelShape.with_parameters(
        70_553_706_496, layers=80, hidden=8192, heads=64, kv_heads=8, vocab=128256
    )
    assert solved.ffn == 28672
    with pytest.raises(ValueError, match="heads"):
        ModelShape(layers=2, hidden=64, heads=5, kv_heads=5, ffn=128, vocab=16)


def test_activations_follow_korthikanti_with_swiglu_and_no_score_matrix() -> None:
    h, f, a, g = 4096, 14336, 32, 8 / 32
    # bf16, no tensor parallel: 8h + 4gh + 8f bytes of projections, attention and MLP, the two
    # RMSNorms' fp32 input and bf16 normalised tensor (2 × 6h), plus the fp32 LSE.
    assert activation_bytes_per_token(LLAMA3_8B, 1, "none", 2) == (
        8 * h + 4 * g * h + 8 * f + 12 * h + 4 * a
    )
    assert (
        activation_bytes_per_token(LLAMA3_8B, 1, "selective", 2)
        == 8 * h + 4 * g * h + 4 * f + 4 * a
    )
    assert activation_bytes_per_token(LLAMA3_8B, 1, "full", 2) == 2 * h
    # Sequence parallel divides everything but the two all-gathered projection inputs and the
    # norms' fp32 copies.
    assert activation_bytes_per_token(LLAMA3_8B, 8, "none", 2) == (
        (8 * h + 4 * g * h + 8 * f + 4 * a) / 8 + 4 * h + 8 * h
    )
    # No s² term: the per-token figure does not depend on the sequence length.
    short = memory_per_gpu(_input(LLAMA3_8B, seq_len=1024), _layout(micro_batch=8))
    long = memory_per_gpu(_input(LLAMA3_8B, seq_len=8192), _layout(micro_batch=1))
    assert short.activations == long.activations


def test_the_loss_counts_one_chunk_of_fp32_logits_on_the_last_stage_only() -> None:
    from ito.core.planner_memory import stage_memory

    v = LLAMA3_8B.vocab
    # 12 bytes per vocabulary entry (log-softmax, its gradient, the logits' gradient) for a
    # chunk of 1024 tokens, however long the micro-batch; whole on every tensor-parallel rank.
    for seq_len, tp in ((8192, 1), (8192, 8), (512, 1)):
        memory = memory_per_gpu(_input(LLAMA3_8B, seq_len=seq_len), _layout(tp=tp))
        assert memory.loss == 12 * v * min(1024, seq_len)
        assert memory.peak_allocated == sum(
            (memory.parameters, memory.gradients, memory.optimizer_states),
            memory.activations + memory.loss + memory.buffers,
        )
    inp, pipeline = _input(LLAMA3_8B), _layout(dp_shard=4, pp=2, microbatches=4)
    assert stage_memory(inp, pipeline, "first").loss == 0
    assert stage_memory(inp, pipeline, "last").loss == 12 * v * 1024


def _layout(**changes: Any) -> Layout:
    base: dict[str, Any] = {
        "dp_replicate": 1,
        "dp_shard": 8,
        "tp": 1,
        "pp": 1,
        "cp": 1,
        "micro_batch": 1,
        "microbatches": 1,
        "activation_checkpointing": "selective",
    }
    return Layout(**(base | changes))


def test_model_states_are_16_bytes_per_parameter_split_by_every_sharding_degree() -> None:
    inp = _input(LLAMA3_8B)
    memory = memory_per_gpu(inp, _layout())
    n = LLAMA3_8B.parameters
    assert memory.parameters == round(4 * n / 8)
    assert memory.gradients == round(4 * n / 8)
    assert memory.optimizer_states == round(8 * n / 8)
    replicated = memory_per_gpu(inp, _layout(dp_replicate=8, dp_shard=1))
    assert replicated.optimizer_states == 8 * n


def test_the_pipeline_bubble_is_p_minus_1_over_m_plus_p_minus_1() -> None:
    inp = _input(LLAMA3_8B)
    for pp, m in ((2, 8), (4, 4), (8, 32)):
        time = step_time(inp, _layout(dp_shard=8 // pp, pp=pp, microbatches=m))
        assert time.bubble_fraction == pytest.approx((pp - 1) / (m + pp - 1))
        assert time.bubble_seconds == pytest.approx((pp - 1) * time.compute_seconds / m)


def test_step_time_is_compute_plus_exposed_communication() -> None:
    inp = _input(LLAMA3_8B, nodes=2, fabric="ethernet")
    time = step_time(inp, _layout(dp_replicate=2, dp_shard=8))
    accel = inp.accelerator
    tokens = 16 * SEQ
    compute = (
        tokens
        * LLAMA3_8B.flops_per_token(SEQ)
        / 16
        / (accel.peak_bf16_flops * accel.kernel_efficiency)
    )
    assert time.compute_seconds == pytest.approx(compute * 1.03)
    exposed = sum(t.exposed_seconds for t in (time.fsdp, time.replicate, time.tp, time.pp))
    assert time.step_seconds == pytest.approx(time.compute_seconds + exposed)
    assert time.replicate.crosses_nodes and time.replicate.exposed_seconds > 0
    assert not time.fsdp.crosses_nodes


def test_selective_checkpointing_under_tensor_parallel_also_recomputes_the_o_projection() -> None:
    # 70b on 32 nodes, 256 sequences a step, tp=8 and selective: each GPU replays its 1/8 of
    # every layer's o projection (h × h, 2·h·h forward FLOPs per token) on top of the 3 %
    # memory-bound share; the down projection's matmul is not replayed (the engine's
    # recomputation stops before it), and without tensor parallel no matmul is.
    h, layers, tp, gpus, sequences = LLAMA3_70B.hidden, LLAMA3_70B.layers, 8, 256, 256
    inp = _input(LLAMA3_70B, nodes=32, sequences=sequences)
    accel = inp.accelerator
    rate = accel.peak_bf16_flops * accel.kernel_efficiency
    base = sequences * SEQ * LLAMA3_70B.flops_per_token(SEQ) / gpus / rate
    dp = gpus // tp
    tokens_per_gpu = sequences // dp * SEQ  # a tensor-parallel group's tokens, on each rank
    o_proj = tokens_per_gpu * layers * 2 * h * h / tp / rate

    def recompute(**changes: Any) -> float:
        return step_time(inp, _layout(**changes)).recompute_seconds

    tensor_parallel = {"dp_shard": dp, "tp": tp, "micro_batch": sequences // dp}
    assert recompute(**tensor_parallel) == pytest.approx(0.03 * base + o_proj)
    assert recompute(dp_shard=gpus, micro_batch=sequences // gpus) == pytest.approx(0.03 * base)
    assert recompute(**tensor_parallel, activation_checkpointing="none") == 0
    assert recompute(**tensor_parallel, activation_checkpointing="full") == pytest.approx(base / 3)
