"""Which characters text may carry when it enters ito (DESIGN §9: bad input gets its code).

Refused everywhere text enters — path, query values, headers we read, form fields, JSON strings
(keys included) at any depth, manifest strings:

* C0 controls (NUL among them: PostgreSQL cannot store it in text at all), DEL and C1
  controls. Multi-line text (JSON strings, form fields) may carry TAB, LF and CR; a single-line
  value (path, query value, header) may not.
* Unicode bidirectional embeddings, overrides and isolates (U+202A–U+202E, U+2066–U+2069):
  they let a name, a manifest summary or a notice read differently on the approval page from
  what it is ("Trojan Source", CVE-2021-42574). No identifier, name or value of ours needs them.
* Lone surrogates (U+D800–U+DFFF): JSON's ``\\ud800`` escape makes one, and no encoder can
  store or print it.

Text that the training side produces (log lines, error messages) is content, not input: the
worker makes it safe with :func:`escape_unsafe` before sending instead of losing a report.
"""

from __future__ import annotations

import re
from typing import Any

__all__ = ["escape_unsafe", "is_safe", "json_text_may_be_unsafe", "unsafe_json_paths"]

_BIDI_AND_SURROGATES = "\u202a-\u202e\u2066-\u2069\ud800-\udfff"
_SINGLE_LINE = re.compile(f"[\x00-\x1f\x7f-\x9f{_BIDI_AND_SURROGATES}]")
_MULTI_LINE = re.compile(f"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f{_BIDI_AND_SURROGATES}]")
_IDENTIFIER = re.compile(r"[A-Za-z0-9_\-]{1,64}")
# A JSON \u escape of a refused character: a control other than TAB/LF/CR, DEL, a C1 control,
# a bidi override or isolate, or a surrogate. Starts with a literal, so the engine only tries it
# where ``\u`` is.
_UNSAFE_U_ESCAPE = re.compile(
    r"\\u(?:00(?:0[0-8bBcCeEfF]|1[0-9a-fA-F]|7[fF]|[89][0-9a-fA-F])"
    r"|202[a-eA-E]|206[6-9]|[dD][89a-fA-F][0-9a-fA-F]{2})"
)


def _pattern(multiline: bool) -> re.Pattern[str]:
    return _MULTI_LINE if multiline else _SINGLE_LINE


def is_safe(text: str, *, multiline: bool = False) -> bool:
    """Whether ``text`` carries none of the refused characters."""
    return _pattern(multiline).search(text) is None


def json_text_may_be_unsafe(text: str) -> bool:
    """Whether JSON ``text`` (valid, as :func:`json.loads` accepts it) may hold a string or key
    that :func:`unsafe_json_paths` refuses. False proves it holds none, at the cost of a few
    scans in C instead of a walk of every string of the parsed document.

    A refused character in a parsed string is either in the text as it is, or written as an
    escape (``\\b``, ``\\f``, ``\\uXXXX``; a lone surrogate can only be written so). As it is:
    the parser refuses raw C0 controls inside strings and allows only whitespace outside them,
    so ASCII text can only carry DEL (``str.isascii`` is a flag lookup, the full character test
    is for other text). Escapes: every pair ``\\\\`` is removed first, the way the parser reads
    a run of backslashes from its start, so that each backslash left begins an escape."""
    raw = "\x7f" in text if text.isascii() else _MULTI_LINE.search(text) is not None
    if raw:
        return True
    if "\\" not in text:
        return False
    escapes = text.replace("\\\\", "")
    return "\\b" in escapes or "\\f" in escapes or _UNSAFE_U_ESCAPE.search(escapes) is not None


def unsafe_json_paths(value: Any, path: str = "$", *, limit: int = 20) -> list[str]:
    """JSON paths (``$.a[0].b``) of the strings, object keys included, in a parsed JSON
    ``value`` that carry refused characters (multi-line text allowed). Only keys that read as
    plain identifiers are echoed; any other is named by its position."""
    found: list[str] = []
    stack: list[tuple[Any, str]] = [(value, path)]
    while stack and len(found) < limit:
        item, where = stack.pop()
        if isinstance(item, str):
            if not is_safe(item, multiline=True):
                found.append(where)
        elif isinstance(item, dict):
            for index, (key, child) in enumerate(item.items()):
                key_text = str(key)
                shown = key_text if _IDENTIFIER.fullmatch(key_text) else f"<key {index}>"
                if not is_safe(key_text, multiline=True):
                    found.append(f"{where}.{shown}")
                    continue
                stack.append((child, f"{where}.{shown}"))
        elif isinstance(item, list):
            stack.extend((child, f"{where}[{i}]") for i, child in enumerate(item))
    return sorted(found)


def escape_unsafe(value: Any, *, multiline: bool = True) -> Any:
    """``value`` (a JSON-like structure) with every refused character in every string written
    as a visible escape (``\\x00``, ``\\u202e``), so it passes the checks above and shows what
    it was."""
    if isinstance(value, str):
        return _pattern(multiline).sub(lambda m: _escape(m.group()), value)
    if isinstance(value, dict):
        return {
            escape_unsafe(str(k), multiline=multiline): escape_unsafe(v, multiline=multiline)
            for k, v in value.items()
        }
    if isinstance(value, list | tuple):
        return [escape_unsafe(v, multiline=multiline) for v in value]
    return value


def _escape(char: str) -> str:
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"
