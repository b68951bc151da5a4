"""``ito-mcp``: the canonical client's read and request operations as MCP tools over stdio
(DESIGN §6.4). Approval is never a tool; see :mod:`ito.mcp.server`."""

from __future__ import annotations

__all__: list[str] = []
