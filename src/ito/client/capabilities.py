"""The static capability contract ``ito capabilities --json`` prints (DESIGN §6.3).

It reads no credential and sends nothing. A command is ``supported`` only when this client
really implements it; ``find`` (RFQ) and ``evals`` (node qualification) belong to the
ito-compute service and are always ``unsupported``.
"""

from __future__ import annotations

from typing import Any

from ito import __version__

__all__ = ["CONTRACT_VERSION", "capabilities", "is_supported"]

CONTRACT_VERSION = "ito.cli.capabilities.v1"

# name, supported, auth, network, side_effect, authority
_COMMANDS: list[tuple[str, bool, str, str, str, str]] = [
    ("capabilities", True, "none", "none", "none", "none"),
    ("config", True, "none", "none", "none", "none"),
    ("manifest init", True, "none", "none", "none", "none"),
    ("manifest validate", True, "none", "none", "none", "none"),
    ("planner", True, "none", "none", "none", "none"),
    ("auth", True, "required", "ito_api", "none", "none"),
    ("login", True, "device_bootstrap", "ito_api", "credential_write", "device_owner"),
    ("logout", True, "required", "ito_api", "credential_revoke", "device_owner"),
    ("status", True, "required", "ito_api", "none", "none"),
    ("bookings list", True, "required", "ito_api", "none", "none"),
    ("bookings show", True, "required", "ito_api", "none", "none"),
    ("bookings eligibility", True, "required", "ito_api", "none", "none"),
    ("plan", True, "required", "ito_api", "none", "none"),
    ("confirm", True, "required", "ito_api", "confirmation_request", "none"),
    ("approve", True, "required", "ito_api", "confirmation_decision", "approver"),
    ("reject", True, "required", "ito_api", "confirmation_decision", "approver"),
    ("train", True, "required", "ito_api", "workload_start", "entitled_workload"),
    ("runs list", True, "required", "ito_api", "none", "none"),
    ("runs show", True, "required", "ito_api", "none", "none"),
    ("runs logs", True, "required", "ito_api", "none", "none"),
    ("runs metrics", True, "required", "ito_api", "none", "none"),
    ("runs checkpoints", True, "required", "ito_api", "none", "none"),
    ("runs gates", True, "required", "ito_api", "none", "none"),
    ("runs provenance", True, "required", "ito_api", "none", "none"),
    ("runs restart", True, "required", "ito_api", "workload_restart", "entitled_workload"),
    ("runs watch", True, "required", "ito_api", "none", "none"),
    ("runs cancel", True, "required", "ito_api", "workload_cancel", "entitled_workload"),
    ("runs cleanup", True, "required", "ito_api", "workload_cleanup", "entitled_workload"),
    ("telemetry", True, "required", "ito_api", "none", "none"),
    ("find", False, "required", "none", "none", "none"),
    ("evals", False, "required", "none", "none", "none"),
]


def capabilities() -> dict[str, Any]:
    return {
        "contract_version": CONTRACT_VERSION,
        "cli": {"name": "ito", "version": __version__},
        "commands": [
            {
                "name": name,
                "availability": "supported" if ok else "unsupported",
                "auth": auth,
                "network": network,
                "side_effect": effect,
                "authority": authority,
            }
            for name, ok, auth, network, effect, authority in _COMMANDS
        ],
    }


def is_supported(name: str) -> bool:
    return any(n == name and ok for n, ok, *_ in _COMMANDS)
