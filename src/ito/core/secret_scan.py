"""Recognise things that look like credentials, without ever echoing them.

Used on manifests (``manifest_contains_secret``, :func:`scan_document`) and on command-line and
tool arguments (``secret_in_arguments``, :func:`scan_text` and :func:`scan_json_value`). A
finding names *where* and *what kind*, never the value.

Two depths of scan:

- :func:`scan_text` / :func:`scan_json_value` match this module's own credential shapes and
  secret-named fields. They are cheap to import (the CLI scans every argument before it starts)
  and never judge randomness, because ids and idempotency keys in arguments are random.
- :func:`scan_document` is for manifests: every key and every string at any depth, matched
  against the own shapes, the maintained detectors of ``detect-secrets`` and its entropy tests
  (:mod:`ito.core.secret_detectors`).

Every pattern is linear in its input (no unbounded repetition that can backtrack over a run it
already consumed), and :func:`scan_document` runs each pattern once over all the strings of a
document joined together, so a 1 MiB document costs one pass per pattern whatever its shape.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from bisect import bisect_right
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import accumulate, islice
from operator import add
from typing import Any

__all__ = ["MAX_FINDINGS", "Finding", "scan_document", "scan_json_value", "scan_text"]

MAX_FINDINGS = 20
"""Findings reported at most; one is enough to refuse, the rest help fix the document."""


@dataclass(frozen=True)
class Finding:
    kind: str
    """What it looks like: ``private_key``, ``bearer_token``, ``cloud_key``, ``password_field``…"""
    path: str
    """JSON path (``$.data[0].uri``) or argument position (``argv[3]``)."""


# Patterns that identify a credential by its shape alone. Sources: the formats documented by
# the issuers (AWS, GitHub, GitLab, Slack, Stripe, Google, OpenAI, Anthropic, Hugging Face,
# npm, PyPI, Shopify, Databricks, DigitalOcean, Azure Storage, PEM/OpenPGP armour, RFC 7617
# Basic and RFC 6750 Bearer credentials) and the query parameters of signed URLs (AWS SigV4
# ``X-Amz-Signature``, GCS V4 ``X-Goog-Signature``, Azure SAS ``sig``).
#
# Speed and linearity: every pattern starts with a literal, so the regex engine skips to its
# occurrences with a fast string search (a leading ``\b``, class or ``(?i)`` makes it step
# through every position: 20-50 ms per MiB each, instead of under 1 ms); a word boundary
# is a lookbehind placed after the literal. No open-ended repetition is needed to decide that a
# shape is there, so quantifiers are fixed (`{20}` rather than `{20,}`): a run of ``sk-sk-sk-…``
# costs one bounded match per occurrence, never a rescan of the run. Case-insensitive shapes are
# written in lower case and matched against an ASCII-folded copy of the text (same length, so
# positions agree).


def _word(literal: str, rest: str) -> str:
    """``literal`` not preceded by a word character, then ``rest``."""
    return f"{literal}(?<![A-Za-z0-9_]{literal}){rest}"


def _param(name: str) -> str:
    """A query parameter ``name=`` with a value (after ``?``, ``&`` or ``;``)."""
    escaped = re.escape(name + "=")
    return f"{escaped}(?<=[?&;]{escaped})[^&#\\s]"


_EXACT: list[tuple[str, str, tuple[str, ...]]] = [
    ("private_key", r"-----BEGIN [A-Z0-9 ]{0,64}PRIVATE KEY", ("-----BEGIN ",)),
    ("private_key", r"PuTTY-User-Key-File-\d", ("PuTTY-User-Key-File-",)),
    ("cloud_key", r"(?:AKIA|ASIA|ABIA|ACCA)[0-9A-Z]{16}", ("AKIA", "ASIA", "ABIA", "ACCA")),
    ("cloud_key", _word("AIza", r"[0-9A-Za-z_-]{35}"), ("AIza",)),
    ("cloud_key", r"GOCSPX-[A-Za-z0-9_-]{20}", ("GOCSPX-",)),
    ("cloud_key", _word("do[opr]_v1_", r"[a-f0-9]{64}"), ("_v1_",)),
    ("api_token", _word("gh[pousr]_", r"[A-Za-z0-9]{30}"), ("gh",)),
    ("api_token", r"github_pat_[A-Za-z0-9_]{30}", ("github_pat_",)),
    ("api_token", r"glpat-[A-Za-z0-9_-]{20}", ("glpat-",)),
    ("api_token", _word("xox[abposr]-", r"[A-Za-z0-9-]{10}"), ("xox",)),
    (
        "api_token",
        r"hooks\.slack\.com/(?:services|workflows|triggers)/[A-Za-z0-9_]",
        ("hooks.slack.com/",),
    ),
    ("api_token", r"discord\.com/api/webhooks/\d+/[\w-]", ("discord.com/api/webhooks/",)),
    ("api_token", r"discordapp\.com/api/webhooks/\d+/[\w-]", ("discordapp.com/api/webhooks/",)),
    ("api_token", _word("sk_(?:live|test)_", r"[A-Za-z0-9]{16}"), ("sk_live_", "sk_test_")),
    ("api_token", _word("rk_(?:live|test)_", r"[A-Za-z0-9]{16}"), ("rk_live_", "rk_test_")),
    ("api_token", _word("whsec_", r"[A-Za-z0-9]{24}"), ("whsec_",)),
    ("api_token", _word("sk-", r"[A-Za-z0-9_-]{20}"), ("sk-",)),
    ("api_token", _word("hf_", r"[A-Za-z0-9]{30}"), ("hf_",)),
    ("api_token", _word("npm_", r"[A-Za-z0-9]{36}"), ("npm_",)),
    ("api_token", r":_authToken=\s*[^\s\"']", (":_authToken=",)),
    ("api_token", r"pypi-AgE[A-Za-z0-9_-]{50}", ("pypi-AgE",)),
    ("api_token", _word("shp(?:at|ca|pa|ss)_", r"[a-fA-F0-9]{32}"), ("shp",)),
    ("api_token", _word("dapi", r"[a-f0-9]{32}"), ("dapi",)),
    ("api_token", _word("SG\\.", r"[A-Za-z0-9_-]{16,}\.[A-Za-z0-9_-]{16}"), ("SG.",)),
    ("api_token", _word("ito_", r"[a-z]+_[A-Za-z0-9]{8}_[A-Za-z0-9_-]{20}"), ("ito_",)),
    ("api_token", _word("sbp_", r"[a-f0-9]{40}"), ("sbp_",)),
    ("jwt", _word("eyJ", r"[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8}"), ("eyJ",)),
    # Scheme-less on purpose: a `[a-z]+://` prefix would be retried at every letter of a long
    # word (quadratic); the class stops at '/', so each `://` is looked at once.
    ("uri_userinfo", r"://[^/\s@?#:]*:[^/\s@?#]*@", ("://",)),
    ("uri_userinfo", r"://[^/\s@?#:]+@", ("://",)),
]
_FOLDED: list[tuple[str, str, tuple[str, ...]]] = [
    ("bearer_token", _word("bearer", r"\s+[a-z0-9._~+/=-]{12}"), ("bearer",)),
    ("authorization_header", r"authorization\s*[:=]\s*[a-z]+\s+\S{8}", ("authorization",)),
    *(
        ("authorization_header", rf"{name}\s*:\s*\S{{8}}", (name,))
        for name in ("api-key", "x-auth-token", "cookie")
    ),
    # A netrc line (``machine … login … password …``), and a W&B key by its context (its 40 hex
    # digits alone are a SHA-1's shape, which digests legitimately take).
    ("secret_assignment", r"login[ \t]+\S+[ \t]+password[ \t]+\S{4}", ("login",)),
    ("api_token", r"wandb_api_key\s*[=:]\s*[\"']?(?:local-)?[0-9a-f]{40}", ("wandb_api_key",)),
    ("api_token", r"wandb[ \t]+login[ \t]+(?:-\S+[ \t]+)*(?:local-)?[0-9a-f]{40}", ("wandb",)),
    ("cloud_key", r"accountkey=[a-z0-9+/=]{20}", ("accountkey=",)),
    ("cloud_key", r"sharedaccesskey=[a-z0-9+/=]{20}", ("sharedaccesskey=",)),
    ("cloud_key", r"sharedaccesssignature=\S{8}", ("sharedaccesssignature=",)),
    *(
        ("signed_url", _param(name), (name + "=",))
        for name in (
            "x-amz-signature",
            "x-amz-credential",
            "x-amz-security-token",
            "x-goog-signature",
            "x-goog-credential",
            "googleaccessid",
            "sig",
            "signature",
            "access_token",
            "token",
            "api_key",
            "apikey",
            "password",
            "client_secret",
        )
    ),
    *(
        ("secret_assignment", rf"{re.escape(name)}\s*[=:]\s*\S{{4}}", (name,))
        for name in (
            "secret_access_key",
            "session_token",
            "secret_key",
            "password",
            "passwd",
            "api_key",
            "api-key",
            "apikey",
            "access_token",
            "access-token",
            "client_secret",
            "client-secret",
        )
    ),
]
_VALUE_PATTERNS: list[tuple[str, re.Pattern[str], bool, tuple[str, ...]]] = [
    *((kind, re.compile(pattern), False, anchors) for kind, pattern, anchors in _EXACT),
    *((kind, re.compile(pattern), True, anchors) for kind, pattern, anchors in _FOLDED),
]
"""(kind, pattern, matched against the folded text, anchors). Every match of a pattern holds
one of its anchors (literal text it cannot match without), so a pattern whose anchors are all
absent is not run: a substring test costs a fraction of a regular expression pass, and most
text holds none of the anchors."""


class _Anchors:
    """Which anchors ``text`` holds, each looked up once (several patterns share one), and one
    that contains another anchor only if that one is there (``password=`` after ``password``):
    each lookup is a pass over the text."""

    def __init__(self, text: str, inner: dict[str, str]) -> None:
        self.text = text
        self.inner = inner
        self.known: dict[str, bool] = {}

    def any(self, anchors: tuple[str, ...]) -> bool:
        return any(map(self.holds, anchors))

    def holds(self, anchor: str) -> bool:
        known = self.known.get(anchor)
        if known is None:
            inner = self.inner.get(anchor)
            known = (inner is None or self.holds(inner)) and anchor in self.text
            self.known[anchor] = known
        return known


def _inner_anchors(groups: list[tuple[str, ...]]) -> dict[str, str]:
    anchors = {anchor for group in groups for anchor in group}
    inner = {}
    for anchor in anchors:
        parts = [other for other in anchors if other != anchor and other in anchor]
        if parts:
            inner[anchor] = max(parts, key=len)
    return inner


_INNER_PLAIN = _inner_anchors([anchors for _, _, fold, anchors in _VALUE_PATTERNS if not fold])
_INNER_FOLDED = _inner_anchors([anchors for _, _, fold, anchors in _VALUE_PATTERNS if fold])


# RFC 7617: "Basic" then base64 of "user:password". Prose ("basic arithmetic") does not decode
# to a colon-bearing pair, so the decoded form is checked, not just the shape. Found in the
# folded text, decoded from the same span of the unfolded one.
_BASIC = re.compile(_word("basic", r"\s+([a-z0-9+/]{8,}={0,2})(?![a-z0-9+/=])"))


def _ascii(text: str) -> tuple[str, str]:
    """``text`` with every non-ASCII character replaced by '?', and that in lower case: the
    same length as ``text``, so a position in either is a position in ``text``."""
    plain = text.encode("ascii", "replace").decode("ascii")
    return plain, plain.lower()


# Field names whose value is a credential whatever it looks like.
_SECRET_FIELD = re.compile(
    r"(?i)^(?:password|passwd|pwd|passphrase|secret|client_secret|api_key|apikey|access_token|"
    r"refresh_token|auth_token|id_token|session_token|aws_session_token|token|bearer|"
    r"authorization|cookie|private_key|secret_access_key|aws_secret_access_key|account_key|"
    r"sas_token|connection_string|signing_key|credentials?)$"
)
# The same names, found as whole lines of the distinct keys joined by newlines: one pass in C
# instead of a match per key (a 1 MiB object has 68 000 of them).
_SECRET_FIELD_LINE = re.compile(_SECRET_FIELD.pattern, re.MULTILINE)


def _secret_fields(keys: set[str]) -> set[str]:
    """The keys that ``_SECRET_FIELD`` matches. A key it matches is a name of the list, in any
    case, perhaps followed by one newline (``$``): either way a whole line of the joined keys,
    so every one is among the lines found, each confirmed with the key pattern itself."""
    lines = {match.group() for match in _SECRET_FIELD_LINE.finditer("\n".join(keys))}
    candidates = lines | {line + "\n" for line in lines}
    return {key for key in candidates & keys if _SECRET_FIELD.match(key)}


_PLAIN_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")
_MAX_KEY_IN_PATH = 64
# Joins the strings of a document for one pass per pattern. A match may run across it (a
# pattern with `\s`); it is then attributed to the string it starts in: the document is refused
# all the same, only the reported path is the neighbour's.
_JOIN = "\n"


def _basic_spans(plain: str, folded: str) -> Iterator[int]:
    """Start of every RFC 7617 Basic credential (``user:password`` inside)."""
    for match in _BASIC.finditer(folded):
        try:
            decoded = base64.b64decode(plain[match.start(1) : match.end(1)], validate=True)
        except (binascii.Error, ValueError):
            continue
        if b":" in decoded:
            yield match.start()


def _shape_matches(text: str) -> Iterator[tuple[int, str]]:
    """(position, kind) of every own credential shape in ``text``."""
    plain, folded = _ascii(text)
    in_plain, in_folded = _Anchors(plain, _INNER_PLAIN), _Anchors(folded, _INNER_FOLDED)
    for kind, pattern, fold, anchors in _VALUE_PATTERNS:
        if (in_folded if fold else in_plain).any(anchors):
            for match in pattern.finditer(folded if fold else plain):
                yield match.start(), kind
    if "basic" in folded:
        for position in _basic_spans(plain, folded):
            yield position, "basic_auth"


def scan_text(text: str, path: str = "$") -> list[Finding]:
    """Findings for credential-shaped substrings of ``text`` (own shapes only)."""
    found: list[Finding] = []
    for _, kind in _shape_matches(text):
        if Finding(kind, path) not in found:
            found.append(Finding(kind, path))
    return found


def scan_json_value(value: Any, path: str = "$") -> list[Finding]:
    """Walk a parsed JSON value (tool arguments); flag secret-named fields and
    credential-shaped keys and strings (own shapes only)."""
    return _scan(value, path, deep=False)


def scan_document(value: Any) -> list[Finding]:
    """Every key and string of a parsed manifest, at any depth, against the own shapes, the
    ``detect-secrets`` detectors and its entropy tests. At most :data:`MAX_FINDINGS`."""
    return _scan(value, "$", deep=True)


class _Path:
    """The path of a container, rendered only for a finding: building every string's path
    eagerly costs depth × items for a deep, wide document."""

    __slots__ = ("key", "parent", "segment")

    def __init__(self, parent: _Path | None, segment: str, key: bool) -> None:
        self.parent = parent
        self.segment = segment
        self.key = key

    def render(self, root: str, redacted: set[tuple[int, str]]) -> str:
        parts: list[str] = []
        node: _Path | None = self
        while node is not None:
            parts.append(
                _key_segment(node.parent, node.segment, redacted) if node.key else node.segment
            )
            node = node.parent
        return root + "".join(reversed(parts))


def _key_segment(parent: _Path | None, key: str, redacted: set[tuple[int, str]]) -> str:
    if (id(parent), key) in redacted:
        # A credential used as a key must not reappear in any path that passes through it.
        return "[<redacted key>]"
    if _PLAIN_KEY.fullmatch(key):
        return f".{key}"
    if len(key) > _MAX_KEY_IN_PATH:
        return "[<long key>]"
    return f"[{json.dumps(key)}]"


def _scan(value: Any, root: str, deep: bool) -> list[Finding]:
    # One iterative walk (no recursion limit to hit) collecting every key and string. Per
    # container, its strings are added in one call (an object's keys, each followed by its
    # value if a string; an array's string items, in order) and one span records where they start:
    # where a string sits is worked out again from its container only for a finding. Per-item
    # Python work is kept to the containers inside containers.
    strings: list[str] = []
    spans: list[tuple[int, _Path | None, Any]] = []  # (index of the first string, path, container)
    objects: list[tuple[_Path | None, dict[str, Any]]] = []
    keys: set[str] = set()
    stack: list[tuple[Any, _Path | None]] = [(value, None)]
    while stack:
        item, node = stack.pop()
        if isinstance(item, dict):
            if not all(isinstance(key, str) for key in item):
                item = {str(key): child for key, child in item.items()}
            spans.append((len(strings), node, item))
            objects.append((node, item))
            keys.update(item)
            # Each key, then its value if it is a string: a pattern that runs across the
            # separator (``Basic`` then the credential) sees a key next to its value.
            strings.extend(
                [text for pair in item.items() for text in pair if isinstance(text, str)]
            )
            stack.extend(
                [
                    (child, _Path(node, key, key=True))
                    for key, child in item.items()
                    if isinstance(child, dict | list)
                ]
            )
        elif isinstance(item, list):
            spans.append((len(strings), node, item))
            texts = [child for child in item if isinstance(child, str)]
            strings.extend(texts)
            if len(texts) < len(item):
                stack.extend(
                    [
                        (child, _Path(node, f"[{index}]", key=False))
                        for index, child in enumerate(item)
                        if isinstance(child, dict | list)
                    ]
                )
        elif isinstance(item, str):
            spans.append((len(strings), None, item))
            strings.append(item)

    # Secret-named fields: the name test runs once per distinct key, then only the objects
    # holding a flagged name are looked at.
    flagged = _secret_fields(keys)
    field_hits: list[tuple[_Path | None, str]] = []
    if flagged:
        for node, item in objects:
            if not flagged.isdisjoint(item):
                field_hits += [
                    (node, key)
                    for key, child in item.items()
                    if key in flagged and child not in (None, "", [], {})
                ]

    def place(index: int) -> tuple[_Path | None, str | None, bool]:
        first, node, container = spans[bisect_right(spans, index, key=lambda span: span[0]) - 1]
        offset = index - first
        if isinstance(container, dict):
            key, is_key = next(
                islice(
                    (
                        (k, text is k)
                        for k, v in container.items()
                        for text in (k, v)
                        if isinstance(text, str)
                    ),
                    offset,
                    None,
                )
            )
            return node, key, is_key
        if isinstance(container, list):
            position = next(
                islice((i for i, v in enumerate(container) if isinstance(v, str)), offset, None)
            )
            return node, f"[{position}]", False
        return None, None, False

    hits = _shape_hits(strings, deep)
    located = [(*place(i), kind) for i, kind in hits]
    redacted = {
        (id(node), last) for node, last, is_key, _ in located if is_key and last is not None
    }

    def render(node: _Path | None, last: str | None) -> str:
        head = node.render(root, redacted) if node is not None else root
        if last is None:
            return head
        if last.startswith("[") and last.endswith("]") and last[1:-1].isdigit():
            return head + last
        return head + _key_segment(node, last, redacted)

    found: list[Finding] = []
    located += [(node, key, False, "password_field") for node, key in field_hits]
    for node, last, _, kind in located:
        finding = Finding(kind, render(node, last))
        if finding not in found:
            found.append(finding)
            if len(found) >= MAX_FINDINGS:
                break
    return found


def _shape_hits(strings: list[str], deep: bool) -> list[tuple[int, str]]:
    """(index of the string, kind) for every string with a credential shape, in string order."""
    if not strings:
        return []
    # starts[i] = position of strings[i] in the joined text (lengths summed in C, not a loop).
    starts = list(
        map(
            add,
            accumulate(map(len, strings), initial=0),
            range(0, len(_JOIN) * len(strings), len(_JOIN)),
        )
    )
    joined = _JOIN.join(strings)

    def owner(position: int) -> int:
        return bisect_right(starts, position) - 1

    # One kind per string: the first found, the own shapes before the detectors'.
    # Scanning stops once MAX_FINDINGS strings are known to hold one.
    hits: dict[int, str] = {}
    for position, kind in _shape_matches(joined):
        hits.setdefault(owner(position), kind)
        if len(hits) >= MAX_FINDINGS:
            return sorted(hits.items())
    if deep:
        from ito.core.secret_detectors import detector_hits, is_uri

        def in_uri(position: int) -> bool:
            return is_uri(strings[owner(position)])

        for position, kind in detector_hits(joined, in_uri):
            hits.setdefault(owner(position), kind)
            if len(hits) >= MAX_FINDINGS:
                break
    return sorted(hits.items())
