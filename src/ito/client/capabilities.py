"""The capability contract ``ito capabilities --json`` prints (DESIGN §6.3), derived from what
this installed client really implements.

It reads no credential and sends nothing. The command list is not written by hand: it is the
commands registered on the ``ito`` Typer application, walked at the moment of the call. Each one
carries its reviewed labels from :data:`LABELS` (auth, network, side effect, authority), and is
``supported`` only when

* it is registered on the application (a removed command disappears from the contract),
* the :class:`~ito.client.operations.Operations` method it calls, if any, exists (a removed
  operation turns its command ``unsupported``), and
* it is not a compute-side verb: ``find`` (RFQ) and ``evals`` (node qualification) belong to the
  ito-compute service and are always ``unsupported``.

A registered command without reviewed labels is listed ``unsupported`` with no labels, so a new
command is never advertised before someone decides what it does (a test keeps :data:`LABELS`
and the application in step). The ECC bridge's probe (:mod:`ito.bridge.capabilities`) refuses
every training verb unless each gate and lifecycle operation is ``supported``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ito import __version__

if TYPE_CHECKING:
    import typer

__all__ = ["CONTRACT_VERSION", "LABELS", "Label", "capabilities", "is_supported", "registered"]

CONTRACT_VERSION = "ito.cli.capabilities.v1"


@dataclass(frozen=True)
class Label:
    """What a command does, as reviewed; the contract prints these fields."""

    auth: str = "none"
    """``none``, ``required`` or ``device_bootstrap``."""
    network: str = "none"
    """``none`` or ``ito_api``."""
    side_effect: str = "none"
    """``none`` or what it changes (``workload_start``, ``confirmation_request``, …)."""
    authority: str = "none"
    """``none``, ``device_owner``, ``entitled_workload`` or ``approver``."""
    operation: str | None = None
    """The :class:`~ito.client.operations.Operations` method behind it, when it has one."""
    compute_side: bool = False
    """Belongs to ito-compute: registered only to answer ``capability_unavailable``."""


def _read(operation: str) -> Label:
    """An authenticated read of the API through ``operation``."""
    return Label("required", "ito_api", operation=operation)


def _effect(side_effect: str, operation: str, authority: str = "entitled_workload") -> Label:
    """An authenticated change through ``operation``."""
    return Label("required", "ito_api", side_effect, authority, operation)


LABELS: dict[str, Label] = {
    "capabilities": Label(),
    "config": Label(),
    "manifest init": Label(),
    "manifest validate": Label(),
    "planner": Label(),
    "auth": _read("auth"),
    "login": Label("device_bootstrap", "ito_api", "credential_write", "device_owner"),
    "logout": Label("required", "ito_api", "credential_revoke", "device_owner"),
    "status": _read("status"),
    "bookings list": _read("bookings"),
    "bookings show": _read("bookings"),
    "bookings eligibility": _read("bookings"),
    "plan": _read("plan"),
    "confirm": _effect("confirmation_request", "confirm", authority="none"),
    "approve": _effect("confirmation_decision", "decide", authority="approver"),
    "reject": _effect("confirmation_decision", "decide", authority="approver"),
    "train": _effect("workload_start", "train"),
    "runs list": _read("runs"),
    "runs show": _read("runs"),
    "runs logs": _read("logs"),
    "runs metrics": _read("metrics"),
    "runs checkpoints": _read("checkpoints"),
    "runs gates": _read("gates"),
    "runs provenance": _read("provenance"),
    "runs restart": _effect("workload_restart", "restart"),
    "runs raise-bound": _effect("workload_raise_bound", "raise_bound"),
    "runs watch": _read("runs"),
    "runs cancel": _effect("workload_cancel", "cancel"),
    "runs cleanup": _effect("workload_cleanup", "cleanup"),
    "telemetry": _read("telemetry"),
    "find": Label(auth="required", compute_side=True),
    "evals": Label(auth="required", compute_side=True),
}
"""The reviewed labels of every command this client may register, by contract name."""


def registered(app: typer.Typer) -> list[str]:
    """The contract names of the commands registered on ``app`` (``runs logs`` for a command
    of a sub-application), in registration order."""
    names = [_command_name(info) for info in app.registered_commands]
    for group in app.registered_groups:
        sub = group.typer_instance
        if group.name is None or sub is None:
            continue
        names.extend(f"{group.name} {name}" for name in registered(sub))
    return names


def _command_name(info: Any) -> str:
    # Typer's own rule (typer.main.get_command_name) for an unnamed command.
    name: str = info.name or info.callback.__name__
    return name.lower().replace("_", "-")


def _supported(name: str) -> bool:
    from ito.client.operations import Operations

    label = LABELS.get(name)
    if label is None or label.compute_side:
        return False
    return label.operation is None or callable(getattr(Operations, label.operation, None))


def capabilities(app: typer.Typer) -> dict[str, Any]:
    """The contract of ``app`` (the ``ito`` application passes itself: this module never
    imports the CLI, so the two do not import each other)."""
    commands = []
    for name in dict.fromkeys(registered(app)):
        label = LABELS.get(name, Label())
        commands.append(
            {
                "name": name,
                "availability": "supported" if _supported(name) else "unsupported",
                "auth": label.auth,
                "network": label.network,
                "side_effect": label.side_effect,
                "authority": label.authority,
            }
        )
    return {
        "contract_version": CONTRACT_VERSION,
        "cli": {"name": "ito", "version": __version__},
        "commands": commands,
    }


def is_supported(name: str, app: typer.Typer) -> bool:
    """Whether the contract of ``app`` advertises ``name`` as supported."""
    return any(
        command["name"] == name and command["availability"] == "supported"
        for command in capabilities(app)["commands"]
    )
