"""``ito planner``: the planner from the command line, computed locally (issue 9 item 2). It needs
no server and no credential: every test points the client at a port nobody listens on, and the
answer still comes, with ``live_api_contacted`` false."""

from __future__ import annotations

from tests.support import ITO, Result, clean_env, free_port, run_cli


def _planner(*args: str, json_mode: bool = True) -> Result:
    env = clean_env(ITO_API_URL=f"http://127.0.0.1:{free_port()}", ITO_API_KEY="unused")
    argv = [ITO, "planner", *args]
    return run_cli([*argv, "--json"] if json_mode else argv, env)


def test_a_named_size_plans_locally_with_its_layout_memory_and_rules() -> None:
    result = _planner("--size", "8b", "--gpu", "h100", "--global-batch-tokens", str(8 * 8192))
    assert result.rc == 0 and result.envelope is not None
    assert result.envelope["live_api_contacted"] is False
    plan = result.data["plan"]
    # Data parallel over the node's eight GPUs (FSDP, or HSDP when the planner predicts it
    # faster), nothing else.
    assert plan["dp_replicate"] * plan["dp_shard"] == 8
    assert (plan["tp"], plan["pp"], plan["cp"]) == (1, 1, 1)
    assert plan["global_batch_tokens"] == 8 * 8192
    assert plan["memory"]["total"] <= plan["memory"]["usable"]
    assert {rule["choice"] for rule in plan["rules"]} >= {"tp", "pp", "activation_checkpointing"}
    assert result.data["input"]["model"]["parameters"] == 8_030_261_248
    assert result.data["input"]["seq_len"] == 8192  # the size's own maximum


def test_the_planner_plans_eager_as_a_run_is_planned_unless_compile_is_asked_for() -> None:
    args = ("--size", "1b", "--gpu", "h100", "--global-batch-tokens", str(8 * 8192))
    eager, compiled = _planner(*args), _planner(*args, "--compile")
    assert eager.rc == 0 and compiled.rc == 0
    assert eager.data["input"]["compile"] is False and eager.data["plan"]["compile"] is False
    assert compiled.data["input"]["compile"] is True and compiled.data["plan"]["compile"] is True
    rules = [
        {r["choice"]: r["value"] for r in answer.data["plan"]["rules"]}["compile"]
        for answer in (eager, compiled)
    ]
    assert rules == [False, True]


def test_an_explicit_shape_that_cannot_fit_is_refused_with_its_reasons() -> None:
    result = _planner(
        "--params", "70600000000",
        "--layers", "80",
        "--hidden", "8192",
        "--heads", "64",
        "--kv-heads", "8",
        "--seq-len", "8192",
        "--gpu", "h100",
        "--nodes", "1",
        "--gpus-per-node", "8",
        "--fabric", "infiniband",
    )  # fmt: skip
    assert result.rc == 1 and result.code == "plan_refused"
    assert result.envelope is not None and result.envelope["live_api_contacted"] is False
    error = result.envelope["error"]
    assert error["retryable"] is False
    assert [reason["code"] for reason in error["reasons"]] == ["memory_exceeded"]


def test_pinned_degrees_are_checked_and_wasteful_ones_refused() -> None:
    across = _planner("--size", "8b", "--gpu", "h100", "--nodes", "2", "--tp", "16")
    assert across.rc == 1 and across.code == "plan_refused"
    assert across.envelope is not None
    assert "tp_across_nodes" in {r["code"] for r in across.envelope["error"]["reasons"]}
    fp8 = _planner("--size", "8b", "--gpu", "a100", "--fp8")
    assert fp8.code == "plan_refused"
    assert fp8.envelope is not None
    assert [r["code"] for r in fp8.envelope["error"]["reasons"]] == ["fp8_unsupported"]
    pinned = _planner("--size", "8b", "--gpu", "h100", "--nodes", "2", "--dp-replicate", "2")
    assert pinned.rc == 0 and pinned.data["plan"]["dp_replicate"] == 2
    assert pinned.data["input"]["pinned"] == {"dp_replicate": 2}


def test_malformed_requests_are_invalid_arguments() -> None:
    for args in (
        ["--size", "8b", "--gpu", "tpu"],
        ["--size", "8b", "--layers", "4", "--gpu", "h100"],
        ["--layers", "32", "--hidden", "4096", "--heads", "32", "--gpu", "h100"],
        [
            "--params", "9000000000", "--ffn", "14336", "--layers", "32", "--hidden", "4096",
            "--heads", "32", "--kv-heads", "8", "--seq-len", "8192", "--gpu", "h100",
        ],
        ["--size", "8b", "--gpu", "h100", "--activation-checkpointing", "some"],
        ["--size", "8b", "--gpu", "h100", "--global-batch-tokens", "1000"],
    ):  # fmt: skip
        result = _planner(*args)
        assert (result.rc, result.code) == (1, "invalid_arguments"), args
        assert result.envelope is not None and result.envelope["live_api_contacted"] is False


def test_the_readable_rendering_shows_the_layout_and_the_refusal_reasons() -> None:
    shown = _planner("--size", "1b", "--gpu", "h100", json_mode=False)
    assert shown.rc == 0
    assert "dp_shard=" in shown.stdout and "MFU" in shown.stdout and "why" in shown.stdout
    refused = _planner("--size", "8b", "--gpu", "a100", "--fp8", json_mode=False)
    assert refused.rc == 1
    assert "plan_refused" in refused.stderr and "fp8_unsupported" in refused.stderr


def test_the_capability_contract_lists_the_planner_as_local() -> None:
    result = run_cli([ITO, "capabilities", "--json"], clean_env())
    commands = {c["name"]: c for c in result.data["commands"]}
    planner = commands["planner"]
    assert planner["availability"] == "supported"
    assert (planner["auth"], planner["network"], planner["side_effect"]) == ("none",) * 3
