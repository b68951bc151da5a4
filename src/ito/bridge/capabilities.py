"""Reading the client's capability contract, and deciding whether a training verb may pass.

Ported from ECC's ``scripts/lib/ito-capabilities.js`` (``parseItoCapabilities``,
``authorizeEccCapability``), with this runtime's contract (DESIGN §6.3):

* the output of ``<client> capabilities --json`` must be a local-only success envelope
  (``ok: true``, ``live_api_contacted: false``) whose ``data.contract_version`` is exactly
  ``ito.cli.capabilities.v1``, naming the ``ito`` client, with a bounded list of commands, each
  with exactly the six documented fields and known values; a duplicated command name, unknown
  field or value, or anything unparseable fails closed;
* a training verb is forwarded only when **every** operation of
  :data:`REQUIRED_TRAINING_OPERATIONS` — the gates a run goes through and the whole lifecycle
  needed to watch, stop and clean it up — and the invoked command itself are ``supported``; an
  agent must not start what it could not then follow, cancel or clean up;
* ECC's exact-tuple rule: the effectful operations must carry exactly the reviewed side effect
  and authority (:data:`EFFECT_POLICY`), every other one checked must declare no side effect
  and no authority — so a client that mislabels an operation is not trusted.
"""

from __future__ import annotations

import json
import re
from typing import Any

from ito.core.errors import ItoError

__all__ = [
    "CONTRACT_VERSION",
    "EFFECT_POLICY",
    "REQUIRED_TRAINING_OPERATIONS",
    "authorize_training",
    "parse_contract",
]

CONTRACT_VERSION = "ito.cli.capabilities.v1"
MAX_COMMANDS = 128
COMMAND_FIELDS = frozenset({"name", "availability", "auth", "network", "side_effect", "authority"})
ENUMS: dict[str, frozenset[str]] = {
    "availability": frozenset({"supported", "unsupported"}),
    "auth": frozenset({"none", "required", "device_bootstrap"}),
    "network": frozenset({"none", "ito_api"}),
    "authority": frozenset({"none", "device_owner", "entitled_workload", "approver"}),
}
_NAME = re.compile(r"^[a-z][a-z0-9-]{0,31}( [a-z][a-z0-9-]{0,31})?$")
_SIDE_EFFECT = re.compile(r"^[a-z][a-z0-9_]{0,63}$")

REQUIRED_TRAINING_OPERATIONS: tuple[str, ...] = (
    # The gates (§5.8) as the client reaches them: fresh eligibility, the inspection that
    # creates nothing, the human confirmation, the run creation.
    "bookings eligibility",
    "plan",
    "confirm",
    "train",
    # The lifecycle (§5.9): follow, stop and clean up what was started.
    "status",
    "runs list",
    "runs show",
    "runs logs",
    "runs metrics",
    "runs checkpoints",
    "runs watch",
    "runs cancel",
    "runs cleanup",
    "runs restart",
    "runs raise-bound",
)
"""Every one must be advertised ``supported`` before any training verb is forwarded."""

EFFECT_POLICY: dict[str, dict[str, str]] = {
    "confirm": {
        "auth": "required",
        "network": "ito_api",
        "side_effect": "confirmation_request",
        "authority": "none",
    },
    "train": {
        "auth": "required",
        "network": "ito_api",
        "side_effect": "workload_start",
        "authority": "entitled_workload",
    },
    "runs cancel": {
        "auth": "required",
        "network": "ito_api",
        "side_effect": "workload_cancel",
        "authority": "entitled_workload",
    },
    "runs cleanup": {
        "auth": "required",
        "network": "ito_api",
        "side_effect": "workload_cleanup",
        "authority": "entitled_workload",
    },
    "runs restart": {
        "auth": "required",
        "network": "ito_api",
        "side_effect": "workload_restart",
        "authority": "entitled_workload",
    },
    "runs raise-bound": {
        "auth": "required",
        "network": "ito_api",
        "side_effect": "workload_raise_bound",
        "authority": "entitled_workload",
    },
}
"""The reviewed tuple of each effectful operation; any other checked operation must have
``side_effect: none`` and ``authority: none``."""


def _invalid(reason: str) -> ItoError:
    return ItoError(
        "capability_unavailable",
        f"the canonical client's capability contract is not usable: {reason}",
    )


def parse_contract(stdout: bytes) -> dict[str, dict[str, str]]:
    """The advertised commands by name, from the probe's stdout; refuses anything malformed."""
    try:
        envelope = json.loads(stdout.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise _invalid("the client did not print a JSON envelope") from None
    if not isinstance(envelope, dict) or set(envelope) != {
        "ok",
        "live_api_contacted",
        "notice",
        "data",
    }:
        raise _invalid("not a success envelope")
    if (
        envelope["ok"] is not True
        or envelope["live_api_contacted"] is not False
        or not isinstance(envelope["notice"], str)
        or not envelope["notice"]
    ):
        raise _invalid("discovery must be a local-only success")
    data = envelope["data"]
    if not isinstance(data, dict) or data.get("contract_version") != CONTRACT_VERSION:
        raise _invalid(f"contract_version is not {CONTRACT_VERSION}")
    cli = data.get("cli")
    if (
        not isinstance(cli, dict)
        or cli.get("name") != "ito"
        or not isinstance(cli.get("version"), str)
        or not cli["version"]
    ):
        raise _invalid("unexpected client identity")
    commands = data.get("commands")
    if not isinstance(commands, list) or not 1 <= len(commands) <= MAX_COMMANDS:
        raise _invalid("commands must be a bounded, non-empty list")
    advertised: dict[str, dict[str, str]] = {}
    for entry in commands:
        command = _command(entry)
        if command["name"] in advertised:
            raise _invalid(f"duplicate command {command['name']!r}")
        advertised[command["name"]] = command
    return advertised


def _command(entry: Any) -> dict[str, str]:
    if not isinstance(entry, dict) or set(entry) != COMMAND_FIELDS:
        raise _invalid("a command has unknown or missing fields")
    if not all(isinstance(value, str) for value in entry.values()):
        raise _invalid("a command field is not a string")
    if not _NAME.match(entry["name"]):
        raise _invalid("malformed command name")
    for field, allowed in ENUMS.items():
        if entry[field] not in allowed:
            raise _invalid(f"unknown {field} value")
    if not _SIDE_EFFECT.match(entry["side_effect"]):
        raise _invalid("malformed side_effect")
    return dict(entry)


def authorize_training(advertised: dict[str, dict[str, str]], invoked: str) -> None:
    """Refuse with ``capability_unavailable`` unless every required operation and ``invoked``
    are supported and labelled as reviewed."""
    needed = list(dict.fromkeys((*REQUIRED_TRAINING_OPERATIONS, invoked)))
    missing = [
        name for name in needed if advertised.get(name, {}).get("availability") != "supported"
    ]
    if missing:
        raise ItoError(
            "capability_unavailable",
            "the canonical client does not yet support every gate and lifecycle "
            "operation a training verb needs; nothing was forwarded",
            unsupported=missing,
        )
    for name in needed:
        command = advertised[name]
        expected = EFFECT_POLICY.get(name, {"side_effect": "none", "authority": "none"})
        if any(command[field] != value for field, value in expected.items()):
            raise ItoError(
                "capability_unavailable",
                f"the canonical client labels {name!r} outside ECC's reviewed "
                "policy; nothing was forwarded",
                operation=name,
            )
