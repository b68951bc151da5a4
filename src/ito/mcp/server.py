"""``ito-mcp``: the canonical client's operations as MCP tools, over stdio (DESIGN §6.4).

Every tool is a thin call into :class:`ito.client.operations.Operations`, the same layer
``ito --json`` prints, so a tool result carries exactly the §4 envelope: as JSON text content, as
structured content (the declared output schema is the envelope), and with ``isError`` set when
``ok`` is false.

What this server guarantees:

- Approval is a human's act, out of band: no tool approves or rejects a confirmation.
- Credentials come only from the environment (``ITO_API_KEY``) or the stored login, never from
  tool arguments; an argument that looks like a credential (or is named like one) is refused with
  ``secret_in_arguments`` before anything else, and its value is never echoed.
- Arguments are checked against the tool's declared schema before any network call
  (``invalid_arguments``, ``live_api_contacted: false``).
- A tool whose operation the client does not implement yet (runtime lifecycle: logs, metrics,
  checkpoints, cancel, cleanup) answers ``capability_unavailable`` and contacts nothing. A tool
  finds its operation by name on ``Operations``, so adding the method there is all it takes.
- Nothing heavy is imported at startup (no training stack); ``Operations`` calls are blocking
  HTTP and run in a worker thread so the stdio loop keeps serving.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from typing import Any

import anyio
import anyio.to_thread
import mcp.types as types
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server

from ito import __version__
from ito.client.config import load_config
from ito.client.credentials import resolve_token
from ito.client.operations import ACTIONS, Envelope, Operations
from ito.core.envelope import error_envelope
from ito.core.errors import ItoError
from ito.core.secret_scan import scan_json_value

__all__ = ["ENVELOPE_SCHEMA", "TOOLS", "Param", "ToolSpec", "build_server", "main", "run_tool"]

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


@dataclass(frozen=True)
class Param:
    """One tool argument."""

    name: str
    """The argument name, identical to the keyword of the ``Operations`` method."""
    kind: str
    """JSON type: ``string`` or ``integer``."""
    description: str
    """What the argument means, shown to the MCP client."""
    required: bool = False
    """Whether the tool refuses a call without it."""
    enum: tuple[str, ...] = ()
    """Allowed values of a string argument; empty means any."""
    minimum: int | None = None
    """Smallest allowed value of an integer argument."""

    def schema(self) -> dict[str, Any]:
        schema: dict[str, Any] = {"type": self.kind, "description": self.description}
        if self.enum:
            schema["enum"] = list(self.enum)
        if self.minimum is not None:
            schema["minimum"] = self.minimum
        return schema

    def problem(self, value: Any) -> str | None:
        """Why ``value`` is unacceptable, or None. Never quotes the value."""
        if self.kind == "integer":
            # bool is an int subclass in Python but not a JSON integer.
            if isinstance(value, bool) or not isinstance(value, int):
                return "must be an integer"
            if self.minimum is not None and value < self.minimum:
                return f"must be at least {self.minimum}"
            return None
        if not isinstance(value, str):
            return "must be a string"
        if self.enum and value not in self.enum:
            return f"must be one of {list(self.enum)}"
        return None


@dataclass(frozen=True)
class ToolSpec:
    """One MCP tool and the ``Operations`` method behind it."""

    name: str
    """The MCP tool name."""
    operation: str
    """Name of the ``Operations`` method it calls; a missing one means capability_unavailable."""
    description: str
    """What the tool does, shown to the MCP client."""
    params: tuple[Param, ...] = ()
    """Its arguments, passed as keywords to the operation."""
    read_only: bool = True
    """Hint: the tool changes nothing."""
    destructive: bool = False
    """Hint: the tool may destroy something (a running job, stored checkpoints)."""
    idempotent: bool = True
    """Hint: repeating the call has no further effect (reads; mutations keyed by an
    idempotency key). False for ``ito_confirm``: each call requests a new confirmation."""

    def input_schema(self) -> dict[str, Any]:
        return {
            "type": "object",
            "properties": {p.name: p.schema() for p in self.params},
            "required": [p.name for p in self.params if p.required],
            "additionalProperties": False,
        }

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


def _run(required: bool = False) -> Param:
    return Param("run", "string", "Run id.", required=required)


_BOOKING = Param("booking", "string", "Booking id.", required=True)
_MANIFEST = Param(
    "manifest",
    "string",
    "Absolute path of the manifest file on this machine (read securely, DESIGN §6.1).",
    required=True,
)
_CONFIRMATION = Param(
    "confirmation_ref",
    "string",
    "Reference of a confirmation a human approved out of band.",
    required=True,
)
_KEY = Param(
    "idempotency_key",
    "string",
    "Idempotency key; retrying with the same key returns the same result, never a second one.",
    required=True,
)

TOOLS: tuple[ToolSpec, ...] = (
    ToolSpec(
        "ito_auth",
        "auth",
        "Validate the credential in use (ITO_API_KEY or the stored login). Never starts a login.",
    ),
    ToolSpec(
        "ito_status",
        "status",
        "This account's bookings and recent runs; or one run, by "
        "run id or by the idempotency key it was created with.",
        (_run(), Param("idempotency_key", "string", "Idempotency key of a train request.")),
    ),
    ToolSpec(
        "ito_plan",
        "plan",
        "What creating the run would do and cost (parallelism plan, "
        "estimate, gates). Creates nothing.",
        (_BOOKING, _MANIFEST),
    ),
    ToolSpec(
        "ito_confirm",
        "confirm",
        "Request a single-use confirmation for an action. A human "
        "approves it out of band; this tool cannot approve.",
        (
            Param(
                "action",
                "string",
                "What the confirmation is for.",
                required=True,
                enum=tuple(ACTIONS),
            ),
            Param("booking", "string", "Booking id (action train)."),
            Param("manifest", "string", "Absolute manifest path (action train)."),
            Param("run", "string", "Run id (actions cancel, cleanup, restart)."),
            Param(
                "checkpoint",
                "integer",
                "Checkpoint step to restart from (action restart).",
                minimum=0,
            ),
            Param("ttl_seconds", "integer", "Lifetime of the confirmation in seconds.", minimum=1),
        ),
        read_only=False,
        idempotent=False,
    ),
    ToolSpec(
        "ito_train",
        "train",
        "Create a training run on a booking, behind the five gates and an approved confirmation.",
        (_BOOKING, _MANIFEST, _CONFIRMATION, _KEY),
        read_only=False,
    ),
    ToolSpec(
        "ito_runs",
        "runs",
        "This account's runs, newest first (optionally of one "
        "booking), or one run with its events.",
        (
            _run(),
            Param("booking", "string", "Only runs of this booking."),
            Param("limit", "integer", "At most this many runs.", minimum=1),
        ),
    ),
    ToolSpec(
        "ito_logs",
        "logs",
        "A run's logs, cursor-paginated in a stable order.",
        (_run(required=True), Param("since", "string", "Cursor from a previous page.")),
    ),
    ToolSpec(
        "ito_metrics",
        "metrics",
        "A run's training metrics.",
        (_run(required=True), Param("name", "string", "Only this metric (e.g. loss).")),
    ),
    ToolSpec(
        "ito_checkpoints", "checkpoints", "A run's committed checkpoints.", (_run(required=True),)
    ),
    ToolSpec(
        "ito_cancel",
        "cancel",
        "Cancel a run, with an approved cancel confirmation.",
        (_run(required=True), _CONFIRMATION, _KEY),
        read_only=False,
        destructive=True,
    ),
    ToolSpec(
        "ito_cleanup",
        "cleanup",
        "Delete a run's checkpoints and scratch data (the run "
        "record and logs stay; the booking is untouched), with an approved cleanup "
        "confirmation.",
        (_run(required=True), _CONFIRMATION, _KEY),
        read_only=False,
        destructive=True,
    ),
)
_BY_NAME = {spec.name: spec for spec in TOOLS}
# Approval is a human's act (DESIGN §5.5, §6.4): no tool may reach it.
assert all(spec.operation != "decide" for spec in TOOLS)


def _refusal(error: ItoError, notice: str = _NOTHING_SENT) -> Envelope:
    return error_envelope(error, notice, live_api_contacted=False)


def _arguments(spec: ToolSpec, arguments: dict[str, Any]) -> dict[str, Any]:
    """The keyword arguments for the operation, or ItoError(invalid_arguments)."""
    known = {p.name for p in spec.params}
    unknown = sorted(set(arguments) - known)
    if unknown:
        raise ItoError(
            "invalid_arguments",
            f"{spec.name} takes no argument(s) {unknown}; it takes {sorted(known)}",
        )
    kwargs: dict[str, Any] = {}
    for param in spec.params:
        value = arguments.get(param.name)
        if value is None:
            if param.required:
                raise ItoError("invalid_arguments", f"{spec.name} needs '{param.name}'")
            continue
        problem = param.problem(value)
        if problem:
            raise ItoError("invalid_arguments", f"'{param.name}' {problem}")
        kwargs[param.name] = value
    return kwargs


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
