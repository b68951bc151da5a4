"""``ito capabilities`` is derived from what the installed client implements (issue 12, item 2):
a command removed from the ``ito`` application disappears from the contract, a removed
:class:`~ito.client.operations.Operations` method turns its command ``unsupported``, and in
either case the ECC bridge's probe refuses every training verb with ``capability_unavailable``
and never spawns the credential-bearing call.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import typer

from ito.bridge.capabilities import REQUIRED_TRAINING_OPERATIONS, authorize_training, parse_contract
from ito.client import cli
from ito.client.capabilities import LABELS, capabilities, registered
from ito.client.cli import app as ito_app
from ito.client.operations import Operations
from ito.core.errors import ItoError
from tests.bridge.ecc_fakes import base_env, ecc, envelope, make_fake

TRAIN = [
    "ito",
    "train",
    "--booking",
    "bkg_1",
    "--manifest",
    "/m.json",
    "--confirmation-ref",
    "cfr_1",
    "--idempotency-key",
    "k-1",
    "--json",
]


def _contract_bytes() -> bytes:
    return json.dumps(envelope(capabilities(ito_app)["commands"])).encode()


def _without(app: typer.Typer, name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Unregister the command ``name`` (``runs cancel``) from ``app`` for this test."""
    *group, command = name.split(" ")
    target = app
    if group:
        (info,) = [g for g in app.registered_groups if g.name == group[0]]
        assert info.typer_instance is not None
        target = info.typer_instance
    kept = [
        c
        for c in target.registered_commands
        if (c.name or (c.callback.__name__ if c.callback else "")).replace("_", "-") != command
    ]
    assert len(kept) == len(target.registered_commands) - 1
    monkeypatch.setattr(target, "registered_commands", kept)


def test_every_registered_command_has_reviewed_labels_and_every_label_a_command() -> None:
    assert sorted(registered(cli.app)) == sorted(LABELS)


def test_the_installed_contract_supports_every_operation_the_bridge_requires() -> None:
    authorize_training(parse_contract(_contract_bytes()), "train")


@pytest.mark.parametrize("operation", REQUIRED_TRAINING_OPERATIONS)
def test_a_removed_command_disappears_and_the_probe_refuses(
    operation: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    _without(cli.app, operation, monkeypatch)
    names = [c["name"] for c in capabilities(ito_app)["commands"]]
    assert operation not in names
    with pytest.raises(ItoError) as refused:
        authorize_training(parse_contract(_contract_bytes()), "train")
    assert refused.value.code == "capability_unavailable"
    assert refused.value.details["unsupported"] == [operation]


def test_a_removed_operation_makes_its_command_unsupported(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delattr(Operations, "cancel")
    commands = {c["name"]: c["availability"] for c in capabilities(ito_app)["commands"]}
    assert commands["runs cancel"] == "unsupported"
    assert commands["runs cleanup"] == "supported"


def test_the_bridge_refuses_train_when_the_client_lost_an_operation(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delattr(Operations, "restart")
    fake = make_fake(tmp_path / "client", probe=envelope(capabilities(ito_app)["commands"]))
    result = ecc(TRAIN, base_env(tmp_path, ECC_ITO_CLI_EXECUTABLE=str(fake.path)))
    assert (result.rc, result.code) == (1, "capability_unavailable")
    assert result.envelope is not None
    assert result.envelope["error"]["details"]["unsupported"] == ["runs restart"]
    assert len(fake.probes()) == 1 and fake.calls() == []


def test_the_bridge_forwards_train_when_the_derived_contract_is_whole(tmp_path: Path) -> None:
    fake = make_fake(tmp_path / "client", probe=envelope(capabilities(ito_app)["commands"]))
    result = ecc(TRAIN, base_env(tmp_path, ECC_ITO_CLI_EXECUTABLE=str(fake.path)))
    assert result.rc == 0, result.stderr
    assert len(fake.calls()) == 1
