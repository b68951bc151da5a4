"""``ito-mcp``: the canonical client's operations as MCP tools, over stdio (DESIGN §6.4).

Every tool is a thin call into :class:`ito.client.operations.Operations`, the same layer
``ito --json`` prints, so a tool result carries exactly the §4 envelope: as JSON text content, as
structured content (the declared output schema is the envelope), and with ``isError`` set when
``ok`` is false. The tools: ``ito_auth``, ``ito_status``, ``ito_bookings``, ``ito_plan``,
``ito_confirm``, ``ito_train``, ``ito_runs``, ``ito_logs``, ``ito_metrics``,
``ito_checkpoints``, ``ito_telemetry``, ``ito_cancel``, ``ito_cleanup``, ``ito_restart``,
``ito_raise_bound``.

What this server guarantees:

- Approval is a human's act, out of band: no tool approves or rejects a confirmation.
- Credentials come only from the environment (``ITO_API_KEY``) or the stored login, never from
  tool arguments; an argument that looks like a credential (or is named like one) is refused with
  ``secret_in_arguments`` before anything else, and its value is never echoed.
- Each tool's arguments are a strict pydantic model whose JSON schema is the tool's input schema;
  where the API has a request model for what the tool sends (:mod:`ito.core.api_requests`), each
  such argument takes its type and bounds from that model, so the schema a tool advertises is
  what the server checks. Arguments are validated before any network call (``invalid_arguments``
  naming the argument and the rule, never the value; ``live_api_contacted: false``).
- A tool finds its operation by name on ``Operations``: should the installed client lack it, the
  tool answers ``capability_unavailable`` and contacts nothing.
- Nothing heavy is imported at startup (no training stack, no server); ``Operations`` calls are
  blocking HTTP and run in a worker thread so the stdio loop keeps serving.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from typing import Annotated, Any, Literal, Optional, get_args

import anyio
import anyio.to_thread
import mcp.types as types
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server
from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model

from ito import __version__
from ito.client.config import load_config
from ito.client.credentials import resolve_token
from ito.client.operations import ACTIONS, Envelope, Operations
from ito.core.api_requests import ConfirmationRequest, RunActionBody, RunCreateBody
from ito.core.envelope import error_envelope
from ito.core.errors import ItoError
from ito.core.secret_scan import scan_json_value

__all__ = ["ENVELOPE_SCHEMA", "TOOLS", "ToolSpec", "build_server", "main", "run_tool"]

SERVER_NAME = "ito-mcp"

ENVELOPE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "description": "The ito §4 envelope: ok, live_api_contacted, notice, and data or error.",
    "required": ["ok", "live_api_contacted", "notice"],
    "properties": {
        "ok": {"type": "boolean"},
        "live_api_contacted": {
            "type": "boolean",
            "description": "true once any byte of a request may have reached the API",
        },
        "notice": {"type": "string", "description": "what did or did not happen"},
        "data": {},
        "error": {
            "type": "object",
            "required": ["code", "message", "retryable"],
            "properties": {
                "code": {"type": "string"},
                "message": {"type": "string"},
                "retryable": {"type": "boolean"},
                "details": {"type": "object"},
                "reasons": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "required": ["code", "message"],
                        "properties": {
                            "code": {"type": "string"},
                            "message": {"type": "string"},
                        },
                    },
                },
            },
        },
    },
}

_NOTHING_SENT = "refused before anything was sent; nothing was created"


class _Arguments(BaseModel):
    """Base of every tool's input model: unknown arguments refused, no coercion."""

    model_config = ConfigDict(extra="forbid", strict=True)


def _api(model: type[BaseModel], field: str, description: str) -> Any:
    """The type of ``field`` of the API request ``model``, with every bound the API checks,
    described for the tool (the tool may name the argument differently: ``checkpoint`` for
    ``checkpoint_step``)."""
    info = model.model_fields[field]
    (base,) = [arg for arg in get_args(info.annotation) if arg is not type(None)] or [
        info.annotation
    ]
    return Annotated[(base, *info.metadata, Field(description=description))]


def _own(kind: Any, description: str, **bounds: Any) -> Any:
    """An argument with no API body behind it (an id in a URL path, a query parameter)."""
    return Annotated[kind, Field(description=description, **bounds)]


def _inputs(name: str, required: dict[str, Any], optional: dict[str, Any]) -> type[BaseModel]:
    fields: dict[str, Any] = {key: (kind, ...) for key, kind in required.items()}
    fields |= {key: (Optional[kind], None) for key, kind in optional.items()}  # noqa: UP045
    model: type[BaseModel] = create_model(name, __base__=_Arguments, **fields)
    return model


def _schema(model: type[BaseModel]) -> dict[str, Any]:
    """The model's JSON schema as a tool's input schema: an optional argument shows its own
    type (absent means not given), no titles."""
    schema = model.model_json_schema()
    properties: dict[str, Any] = {}
    for key, prop in schema.get("properties", {}).items():
        variants = [v for v in prop.pop("anyOf", []) if v != {"type": "null"}]
        if variants:
            (only,) = variants
            prop = only | {k: v for k, v in prop.items() if k != "default"}
        prop.pop("title", None)
        properties[key] = prop
    return {
        "type": "object",
        "properties": properties,
        "required": schema.get("required", []),
        "additionalProperties": False,
    }


@dataclass(frozen=True)
class ToolSpec:
    """One MCP tool and the ``Operations`` method behind it."""

    name: str
    """The MCP tool name."""
    operation: str
    """Name of the ``Operations`` method it calls; a missing one means capability_unavailable."""
    description: str
    """What the tool does, shown to the MCP client."""
    inputs: type[BaseModel]
    """Its arguments (the operation's keywords), checked before anything is sent; the input
    schema is generated from it."""
    read_only: bool = True
    """Hint: the tool changes nothing."""
    destructive: bool = False
    """Hint: the tool may destroy something (a running job, stored checkpoints)."""
    idempotent: bool = True
    """Hint: repeating the call has no further effect (reads; mutations keyed by an
    idempotency key). False for ``ito_confirm``: each call requests a new confirmation."""

    def input_schema(self) -> dict[str, Any]:
        return _schema(self.inputs)

    def tool(self) -> types.Tool:
        return types.Tool(
            name=self.name,
            description=self.description,
            input_schema=self.input_schema(),
            output_schema=ENVELOPE_SCHEMA,
            annotations=types.ToolAnnotations(
                read_only_hint=self.read_only,
                destructive_hint=self.destructive,
                idempotent_hint=self.idempotent,
                open_world_hint=False,
            ),
        )


_RUN = _own(str, "Run id (run_…).", max_length=64)
_BOOKING = _api(RunCreateBody, "booking_id", "Booking id (bkg_…).")
_MANIFEST = _own(
    str,
    "Absolute path of the manifest file on this machine (read securely, DESIGN §6.1).",
    min_length=1,
    max_length=4096,
)
_CONFIRMATION = _api(
    RunActionBody, "confirmation_ref", "Reference of a confirmation a human approved out of band."
)
_KEY = _api(
    RunActionBody,
    "idempotency_key",
    "Idempotency key; retrying with the same key returns the same result, never a second one.",
)
_ACTION_ARGUMENTS = {"run": _RUN, "confirmation_ref": _CONFIRMATION, "idempotency_key": _KEY}

TOOLS: tuple[ToolSpec, ...] = (
    ToolSpec(
        "ito_auth",
        "auth",
        "Validate the credential in use (ITO_API_KEY or the stored login). Never starts a login.",
        _inputs("AuthArguments", {}, {}),
    ),
    ToolSpec(
        "ito_status",
        "status",
        "This account's bookings and recent runs; or one run, by "
        "run id or by the idempotency key it was created with.",
        _inputs(
            "StatusArguments",
            {},
            {
                "run": _RUN,
                "idempotency_key": _own(str, "Idempotency key of a train request.", max_length=255),
            },
        ),
    ),
    ToolSpec(
        "ito_bookings",
        "bookings",
        "This account's bookings; or one booking; or, with eligibility, whether it can train "
        "now (computed afresh by the server, never cached).",
        _inputs(
            "BookingsArguments",
            {},
            {
                "booking": _BOOKING,
                "eligibility": _own(bool, "Fresh training eligibility of the booking."),
            },
        ),
    ),
    ToolSpec(
        "ito_plan",
        "plan",
        "What creating the run would do and cost (parallelism plan, the stage plan: exactly "
        "the stages the run would execute with their steps and durations, estimate, gates). "
        "Creates nothing.",
        _inputs("PlanArguments", {"booking": _BOOKING, "manifest": _MANIFEST}, {}),
    ),
    ToolSpec(
        "ito_confirm",
        "confirm",
        "Request a single-use confirmation for an action. A human "
        "approves it out of band; this tool cannot approve.",
        _inputs(
            "ConfirmArguments",
            {"action": _own(Literal[tuple(ACTIONS)], "What the confirmation is for.")},
            {
                "booking": _api(ConfirmationRequest, "booking_id", "Booking id (action train)."),
                "manifest": _own(
                    str, "Absolute manifest path (action train).", min_length=1, max_length=4096
                ),
                "run": _api(
                    ConfirmationRequest,
                    "run_id",
                    "Run id (actions cancel, cleanup, restart, raise-bound).",
                ),
                "checkpoint": _api(
                    ConfirmationRequest,
                    "checkpoint_step",
                    "Checkpoint step to restart from (action restart).",
                ),
                "cost_bound": _api(
                    ConfirmationRequest,
                    "cost_bound_usd",
                    "USD the whole run may spend (action raise-bound: the new bound).",
                ),
                "ttl_seconds": _api(
                    ConfirmationRequest,
                    "ttl_seconds",
                    "Lifetime of the confirmation in seconds (at most the server's default).",
                ),
            },
        ),
        read_only=False,
        idempotent=False,
    ),
    ToolSpec(
        "ito_train",
        "train",
        "Create a training run on a booking, behind the five gates and an approved confirmation.",
        _inputs(
            "TrainArguments",
            {
                "booking": _BOOKING,
                "manifest": _MANIFEST,
                "confirmation_ref": _api(
                    RunCreateBody,
                    "confirmation_ref",
                    "Reference of the train confirmation a human approved out of band.",
                ),
                "idempotency_key": _api(
                    RunCreateBody,
                    "idempotency_key",
                    "Your stable retry key: after a lost answer, retry with the same key and "
                    "get the one run, never a second.",
                ),
            },
            {},
        ),
        read_only=False,
    ),
    ToolSpec(
        "ito_runs",
        "runs",
        "This account's runs, newest first (optionally of one "
        "booking), or one run with its events, its stored stage plan (exactly the stages it "
        "executes) and each stage's progress (step / total, tokens, ETA).",
        _inputs(
            "RunsArguments",
            {},
            {
                "run": _RUN,
                "booking": _own(str, "Only runs of this booking.", max_length=64),
                "limit": _own(int, "At most this many runs.", ge=1, le=500),
            },
        ),
    ),
    ToolSpec(
        "ito_logs",
        "logs",
        "A run's logs, cursor-paginated in a stable order.",
        _inputs(
            "LogsArguments",
            {"run": _RUN},
            {
                "since": _own(
                    int, "Cursor from a previous page (its next_cursor).", ge=0, le=2**63 - 1
                ),
                "limit": _own(int, "At most this many lines.", ge=1, le=5000),
            },
        ),
    ),
    ToolSpec(
        "ito_metrics",
        "metrics",
        "A run's training metrics.",
        _inputs(
            "MetricsArguments",
            {"run": _RUN},
            {
                "name": _own(str, "Only this metric (e.g. loss).", max_length=64),
                "since": _own(int, "Cursor from a previous page.", ge=0, le=2**63 - 1),
            },
        ),
    ),
    ToolSpec(
        "ito_checkpoints",
        "checkpoints",
        "A run's committed checkpoints.",
        _inputs("CheckpointsArguments", {"run": _RUN}, {}),
    ),
    ToolSpec(
        "ito_telemetry",
        "telemetry",
        "Goodput, interruption rate, checkpoint bandwidth, tokens/s, MFU and cost of a run or of "
        "a booking (give exactly one).",
        _inputs(
            "TelemetryArguments",
            {},
            {"run": _RUN, "booking": _own(str, "Booking id (bkg_…).", max_length=64)},
        ),
    ),
    ToolSpec(
        "ito_cancel",
        "cancel",
        "Cancel a run, with an approved cancel confirmation.",
        _inputs("CancelArguments", _ACTION_ARGUMENTS, {}),
        read_only=False,
        destructive=True,
    ),
    ToolSpec(
        "ito_cleanup",
        "cleanup",
        "Delete a run's checkpoints and scratch data (the run "
        "record and logs stay; the booking is untouched), with an approved cleanup "
        "confirmation.",
        _inputs("CleanupArguments", _ACTION_ARGUMENTS, {}),
        read_only=False,
        destructive=True,
    ),
    ToolSpec(
        "ito_restart",
        "restart",
        "Resume a run that awaits approval after a loss spike, from the checkpoint it proposed, "
        "with an approved restart confirmation.",
        _inputs("RestartArguments", _ACTION_ARGUMENTS, {}),
        read_only=False,
    ),
    ToolSpec(
        "ito_raise_bound",
        "raise_bound",
        "Resume a run that waits at its cost bound (cost_bound_reached), with an approved "
        "raise-bound confirmation naming the new bound; it resumes from its last checkpoint.",
        _inputs("RaiseBoundArguments", _ACTION_ARGUMENTS, {}),
        read_only=False,
    ),
)
_BY_NAME = {spec.name: spec for spec in TOOLS}
# Approval is a human's act (DESIGN §5.5, §6.4): no tool may reach it.
assert all(spec.operation != "decide" for spec in TOOLS)


def _refusal(error: ItoError, notice: str = _NOTHING_SENT) -> Envelope:
    return error_envelope(error, notice, live_api_contacted=False)


def _arguments(spec: ToolSpec, arguments: dict[str, Any]) -> dict[str, Any]:
    """The keyword arguments for the operation, or ItoError(invalid_arguments) naming each
    offending argument and the rule it breaks — never its value."""
    try:
        parsed = spec.inputs.model_validate(arguments)
    except ValidationError as invalid:
        problems = [
            {"path": ".".join(str(part) for part in error["loc"]), "message": error["msg"]}
            for error in invalid.errors(include_input=False, include_url=False)
        ]
        raise ItoError(
            "invalid_arguments",
            f"{spec.name}: " + "; ".join(f"'{p['path']}': {p['message']}" for p in problems),
            errors=problems,
        ) from None
    return {key: value for key, value in parsed.model_dump().items() if value is not None}


def _execute(spec: ToolSpec, kwargs: dict[str, Any]) -> Envelope:
    """Resolve configuration and credential, then run the operation (blocking)."""
    try:
        config = load_config()
        token, _source = resolve_token(config.api_url, config)
    except ItoError as exc:
        return _refusal(exc, "nothing was sent")
    operation = getattr(Operations(config, token), spec.operation)
    envelope: Envelope = operation(**kwargs)
    return envelope


async def run_tool(name: str, arguments: dict[str, Any] | None) -> Envelope:
    """The §4 envelope of one tool call. Never raises for anything a caller can cause."""
    spec = _BY_NAME.get(name)
    if spec is None:
        return _refusal(
            ItoError("invalid_arguments", f"unknown tool; the tools are {sorted(_BY_NAME)}")
        )
    arguments = arguments or {}
    findings = scan_json_value(arguments, "$")
    if findings:
        # Paths only (a credential used as a key is redacted by the scanner), never values.
        return _refusal(
            ItoError("secret_in_arguments", arguments=sorted({f.path for f in findings})),
            "refused before anything was sent; credentials are taken only from "
            "ITO_API_KEY or the stored login",
        )
    try:
        kwargs = _arguments(spec, arguments)
    except ItoError as exc:
        return _refusal(exc)
    if getattr(Operations, spec.operation, None) is None:
        return _refusal(
            ItoError(
                "capability_unavailable",
                f"{spec.name} needs the runtime's "
                f"'{spec.operation}' operation, which this client does not "
                "have yet",
            ),
            "nothing was sent; this client cannot do this yet",
        )
    try:
        return await anyio.to_thread.run_sync(functools.partial(_execute, spec, kwargs))
    except Exception:
        # A defect, not a refusal: the request may or may not have left, so say so.
        return error_envelope(
            ItoError("internal_error", f"{spec.name} failed unexpectedly"),
            "ito-mcp failed unexpectedly; the request may have reached the "
            "API — check with ito_status or ito_runs before retrying",
            live_api_contacted=True,
        )


def _result(envelope: Envelope) -> types.CallToolResult:
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=json.dumps(envelope, sort_keys=True))],
        structured_content=envelope,
        is_error=not envelope.get("ok", False),
    )


async def _list_tools(
    ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
) -> types.ListToolsResult:
    return types.ListToolsResult(tools=[spec.tool() for spec in TOOLS])


async def _call_tool(
    ctx: ServerRequestContext[Any], params: types.CallToolRequestParams
) -> types.CallToolResult:
    return _result(await run_tool(params.name, params.arguments))


def build_server() -> Server[Any]:
    """The low-level MCP server with the ito tools (no I/O until it is run)."""
    return Server(
        SERVER_NAME,
        version=__version__,
        instructions="Tools of the ito-training client. Each result is the ito JSON envelope. "
        "Approving a confirmation is a human's act and is not available here.",
        on_list_tools=_list_tools,
        on_call_tool=_call_tool,
    )


async def _serve() -> None:
    server = build_server()
    async with stdio_server() as (read_stream, write_stream):
        await server.run(read_stream, write_stream, server.create_initialization_options())


def main() -> None:
    """Console entry point ``ito-mcp``: serve MCP on stdin/stdout until stdin closes."""
    anyio.run(_serve)


if __name__ == "__main__":
    main()
