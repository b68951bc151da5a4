"""Recognise things that look like credentials, without ever echoing them.

Used on manifests (``manifest_contains_secret``) and on command-line arguments
(``secret_in_arguments``). A finding names *where* and *what kind*, never the value.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

__all__ = ["Finding", "scan_json_value", "scan_text"]


@dataclass(frozen=True)
class Finding:
    kind: str
    """What it looks like: ``private_key``, ``bearer_token``, ``cloud_key``, ``password_field``…"""
    path: str
    """JSON path (``$.data[0].uri``) or argument position (``argv[3]``)."""


# Patterns that identify a credential by its shape alone. Sources: the formats documented by
# the issuers (AWS access key ids, GitHub/GitLab/Slack/Google/OpenAI/Hugging Face tokens, PEM).
_VALUE_PATTERNS: list[tuple[str, re.Pattern[str]]] = [
    ("private_key", re.compile(r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----")),
    ("bearer_token", re.compile(r"(?i)\bbearer\s+[A-Za-z0-9._~+/=-]{12,}")),
    ("cloud_key", re.compile(r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b")),
    ("cloud_key", re.compile(r"\bAIza[0-9A-Za-z_-]{35}\b")),
    ("api_token", re.compile(r"\bgh[pousr]_[A-Za-z0-9]{30,}\b")),
    ("api_token", re.compile(r"\bglpat-[A-Za-z0-9_-]{20,}\b")),
    ("api_token", re.compile(r"\bxox[abprs]-[A-Za-z0-9-]{10,}\b")),
    ("api_token", re.compile(r"\bsk-[A-Za-z0-9_-]{20,}\b")),
    ("api_token", re.compile(r"\bhf_[A-Za-z0-9]{30,}\b")),
    ("api_token", re.compile(r"\bito_[a-z]+_[A-Za-z0-9]{8}_[A-Za-z0-9_-]{20,}")),
    ("jwt", re.compile(r"\beyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}")),
    ("uri_userinfo", re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^/\s@:]*:[^/\s@]*@")),
    ("uri_userinfo", re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^/\s@:]+@")),
    ("secret_assignment", re.compile(
        r"(?i)\b(?:aws_secret_access_key|secret_key|password|passwd|api[_-]?key|access[_-]?token"
        r"|client[_-]?secret)\s*[=:]\s*\S{4,}")),
]

# Field names whose string value is a credential whatever it looks like.
_SECRET_FIELD = re.compile(
    r"(?i)^(?:password|passwd|pwd|secret|client_secret|api_key|apikey|access_token|"
    r"refresh_token|auth_token|token|bearer|private_key|secret_access_key|"
    r"aws_secret_access_key|credentials?)$"
)


def scan_text(text: str, path: str = "$") -> list[Finding]:
    """Findings for credential-shaped substrings of ``text``."""
    found: list[Finding] = []
    for kind, pattern in _VALUE_PATTERNS:
        if pattern.search(text) and Finding(kind, path) not in found:
            found.append(Finding(kind, path))
    return found


def scan_json_value(value: Any, path: str = "$") -> list[Finding]:
    """Walk a parsed JSON document; flag secret-named fields and credential-shaped strings."""
    found: list[Finding] = []
    if isinstance(value, dict):
        for key, child in value.items():
            key_findings = scan_text(str(key))
            if key_findings:
                # A credential used as a key must not reappear in the path that reports it.
                child_path = f"{path}[<redacted key>]"
                found.extend(Finding(f.kind, child_path) for f in key_findings)
            elif _plain_key(key):
                child_path = f"{path}.{key}"
            else:
                child_path = f"{path}[{json.dumps(key)}]"
            if _SECRET_FIELD.match(str(key)) and child not in (None, "", [], {}):
                found.append(Finding("password_field", child_path))
            found.extend(scan_json_value(child, child_path))
    elif isinstance(value, list):
        for index, child in enumerate(value):
            found.extend(scan_json_value(child, f"{path}[{index}]"))
    elif isinstance(value, str):
        found.extend(scan_text(value, path))
    return found


def _plain_key(key: object) -> bool:
    return isinstance(key, str) and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key) is not None
