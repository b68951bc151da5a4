"""The ECC skill text agents load (``skills/ito-training/SKILL.md``, issue 12 item 4) names only
what exists: every ``ecc ito …`` command it shows is a verb of the bridge and a command of the
installed client's capability contract (supported, but for the compute-side verbs it tells the
agent to stop at), every error code it names is in the registry, every run state is a real
state, and each refusal code in its table says what to do next.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from ito.bridge.capabilities import REQUIRED_TRAINING_OPERATIONS
from ito.bridge.ecc import VERBS
from ito.client.capabilities import capabilities
from ito.client.cli import app as ito_app
from ito.core.errors import REGISTRY
from ito.core.states import RunState

SKILL = Path(__file__).resolve().parents[2] / "skills" / "ito-training" / "SKILL.md"
COMPUTE_SIDE = {"find", "evals"}
FIELDS = {
    "live_api_contacted",
    "approval_url",
    "idempotency_key",
    "run_id",
    "booking_id",
    "manifest_id",
    "ITO_API_KEY",
    "ECC_DRY_RUN",
    "ECC_ITO_CLI_EXECUTABLE",
}
"""Backticked names with an underscore that are envelope fields or variables, not codes."""


@pytest.fixture(scope="module")
def text() -> str:
    return SKILL.read_text(encoding="utf-8")


def _commands(text: str) -> list[str]:
    """``verb`` or ``verb sub`` of every ``ecc ito …`` in the text (line breaks included)."""
    found = []
    for verb, sub in re.findall(r"ecc ito ([a-z][a-z-]*)(?:\s+([a-z][a-z-]*))?", text):
        found.append(f"{verb} {sub}" if sub else verb)
    return found


def test_the_skill_is_english_with_the_ecc_front_matter(text: str) -> None:
    assert text.startswith("---\nname: ito-training\ndescription: ")
    for portuguese in ("treinamento", "reserva", "não", "você"):
        assert portuguese not in text


def test_every_command_it_names_is_a_bridge_verb_and_in_the_capability_contract(
    text: str,
) -> None:
    contract = {c["name"]: c["availability"] for c in capabilities(ito_app)["commands"]}
    named = _commands(text)
    assert len(named) > 20
    for command in named:
        verb = command.split(" ")[0]
        assert verb in VERBS, command
        group = [name for name in contract if name.startswith(verb + " ")]
        if command == verb and group:  # the group itself (`ecc ito runs …`)
            assert all(contract[name] == "supported" for name in group), command
            continue
        name = command if command in contract else verb
        assert name in contract, command
        if verb in COMPUTE_SIDE:
            assert contract[name] == "unsupported", command
        else:
            assert contract[name] == "supported", command
    assert not {"approve", "reject"} & {c.split(" ")[0] for c in named}


def test_it_walks_the_whole_gated_flow_and_lifecycle(text: str) -> None:
    named = set(_commands(text))
    for operation in REQUIRED_TRAINING_OPERATIONS:
        assert operation in named, operation
    for action in ("train", "cancel", "cleanup", "restart", "raise-bound"):
        assert f"ecc ito confirm --action {action}" in " ".join(text.split()), action


def test_every_error_code_it_names_is_registered(text: str) -> None:
    states = {state.value for state in RunState}
    for token in set(re.findall(r"`([A-Za-z][A-Za-z0-9]*(?:_[A-Za-z0-9]+)+)`", text)):
        assert token in REGISTRY or token in states or token in FIELDS, token


def test_each_refusal_code_in_its_table_is_registered_and_says_what_to_do(text: str) -> None:
    rows = re.findall(r"^\| `([a-z_]+)` \| ([^|]+) \| ([^|]+) \|$", text, flags=re.MULTILINE)
    assert len(rows) >= 40
    assert len({code for code, _, _ in rows}) == len(rows)
    for code, meaning, step in rows:
        assert code in REGISTRY, code
        assert meaning.strip() and step.strip(), code
    table = {code for code, _, _ in rows}
    for code in (
        "capability_unavailable",
        "secret_in_arguments",
        "credential_revoked",
        "confirmation_pending",
        "idempotency_key_reused",
        "transport_ambiguous",
        "eval_gate_failed",
        "pipeline_crashed",
    ):
        assert code in table, code
