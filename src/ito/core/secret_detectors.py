"""The maintained credential detectors of ``detect-secrets`` (Yelp), used in-process and pure.

Only the string-matching half of each plugin is used: ``RegexBasedDetector.analyze_string`` (its
regular expressions) and ``HighEntropyStringsPlugin.calculate_shannon_entropy``. Never
``analyze_line`` or ``scan_line``: those read the library's global settings (mutated by
``transient_settings``, not thread-safe) and may *verify* a candidate by calling the issuer's API
over the network. The plugin instances are stateless, so sharing them between threads is safe.

Left out, with the reason (costs measured on 1 MiB of manifest text; each plugin kept costs
about a millisecond there, because its expressions start with a literal the regex engine can
search for):

- ``JwtTokenDetector``, ``NpmDetector`` and ``OpenAIDetector``: their expressions backtrack
  quadratically on long runs (``eyJeyJ…``, ``//a//a…``: seconds on 100 KB; ``sk-sk-…``: minutes
  on 1 MiB, ``sk-[…]*[…]{20}T3BlbkFJ`` rescans the run from every ``sk-``);
  :mod:`ito.core.secret_scan` has linear patterns for these shapes.
- ``IbmCloudIamDetector``, ``IbmCosHmacDetector``, ``SoftlayerDetector``, ``CloudantDetector``
  (assignments such as ``ibm_api_key = "…"``, 60-210 ms each), ``MailchimpDetector``,
  ``ArtifactoryDetector``, ``TelegramBotTokenDetector`` (30-50 ms each) and the second pattern
  of ``AWSKeyDetector`` (an AWS secret key in a quoted assignment): the keys they look for are
  long random strings the entropy tests below flag anyway, and secret-named fields are judged
  on the JSON keys. ``SlackDetector`` and ``StripeDetector`` (12-25 ms) are covered by the own
  shapes of :mod:`ito.core.secret_scan`; AWS key ids likewise.
- ``IPPublicDetector``: an address is not a credential, and data URIs may name hosts by address.
- ``KeywordDetector``: source-code assignments; secret-named fields are judged on the JSON keys.

Entropy (``Base64HighEntropyString`` at 4.5 bits, ``HexHighEntropyString`` at 3.0 — the
library's defaults) is judged on each maximal run of the base64 alphabet of at least
:data:`MIN_ENTROPY_LENGTH` characters, the way ``detect-secrets scan --string`` does without
quotes. Tuned for manifests, which legitimately hold digests and paths:

- a run made of hex digits only is a digest when it is exactly as long as a SHA-1, SHA-256 or
  SHA-512 hex digest (40, 64, 128) — ``sha256`` fields, ``sha256:…`` revisions, digests inside
  data file names — and is then not judged; a hex key of one of those lengths is not told apart
  from a digest (no detector can);
- in a URI or an absolute path, '/' separates path segments and each segment is judged alone
  (elsewhere '/' is part of the base64 alphabet, as in an AWS secret access key);
- a base64 run is judged only if it mixes upper case, lower case and digits (a random 20+
  character key does with probability > 0.999; paths, words and model names mostly do not), and
  is not a UUID or a sequential string (``detect_secrets.filters.heuristic``).
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Callable, Iterator

from detect_secrets.filters.heuristic import is_potential_uuid, is_sequential_string
from detect_secrets.plugins.azure_storage_key import AzureStorageKeyDetector
from detect_secrets.plugins.base import RegexBasedDetector
from detect_secrets.plugins.basic_auth import BasicAuthDetector
from detect_secrets.plugins.discord import DiscordBotTokenDetector
from detect_secrets.plugins.github_token import GitHubTokenDetector
from detect_secrets.plugins.gitlab_token import GitLabTokenDetector
from detect_secrets.plugins.high_entropy_strings import (
    Base64HighEntropyString,
    HexHighEntropyString,
)
from detect_secrets.plugins.private_key import PrivateKeyDetector
from detect_secrets.plugins.pypi_token import PypiTokenDetector
from detect_secrets.plugins.sendgrid import SendGridDetector
from detect_secrets.plugins.square_oauth import SquareOAuthDetector
from detect_secrets.plugins.twilio import TwilioKeyDetector

__all__ = [
    "MAX_JUDGED_RUNS",
    "MIN_ENTROPY_LENGTH",
    "detector_hits",
    "high_entropy_kind",
    "is_uri",
    "shannon_entropy",
]

MIN_ENTROPY_LENGTH = 20
"""Shorter runs are not judged by entropy: under 23 characters a string cannot reach 4.5 bits
per character at all, and short hex words ("deadbeef", "facade") would trip the hex test."""

MAX_JUDGED_RUNS = 1024
"""Random-looking runs (enough distinct characters to pass the base64 limit) judged at most in
one document; a document with more is refused (``too_many_random_strings``). Judging one costs
microseconds of Python; a reviewed manifest holds a handful (digests are hex, and exempt)."""

_REGEX_DETECTORS: tuple[RegexBasedDetector, ...] = (
    AzureStorageKeyDetector(),
    BasicAuthDetector(),
    DiscordBotTokenDetector(),
    GitHubTokenDetector(),
    GitLabTokenDetector(),
    PrivateKeyDetector(),
    PypiTokenDetector(),
    SendGridDetector(),
    SquareOAuthDetector(),
    TwilioKeyDetector(),
)
# Literal text every match of a detector's expression holds (checked in the library's
# expressions below): an expression whose anchors are all absent from the text is not run. An
# expression not listed here (a new version of the library) is always run.
_ANCHORS: dict[str, tuple[str, ...]] = {
    "AccountKey=[a-zA-Z0-9+\\/=]{88}": ("AccountKey=",),
    "://[^:/\\?\\#\\[\\]@!\\$\\&'\\(\\)\\*\\+,;=\\s]+:([^:/\\?\\#\\[\\]@!\\$\\&'\\(\\)\\*\\+,;=\\s]+)@": (  # noqa: E501
        "://",
    ),
    "[MNO][a-zA-Z\\d_-]{23,25}\\.[a-zA-Z\\d_-]{6}\\.[a-zA-Z\\d_-]{27}": (".",),
    "(ghp|gho|ghu|ghs|ghr)_[A-Za-z0-9_]{36}": ("gh",),
    "(glpat|gldt|glft|glsoat|glrt)-[A-Za-z0-9_\\-]{20,50}(?!\\w)": ("gl",),
    "GR1348941[A-Za-z0-9_\\-]{20,50}(?!\\w)": ("GR1348941",),
    "glcbt-([0-9a-fA-F]{2}_)?[A-Za-z0-9_\\-]{20,50}(?!\\w)": ("glcbt-",),
    "glimt-[A-Za-z0-9_\\-]{25}(?!\\w)": ("glimt-",),
    "glptt-[A-Za-z0-9_\\-]{40}(?!\\w)": ("glptt-",),
    "glagent-[A-Za-z0-9_\\-]{50,1024}(?!\\w)": ("glagent-",),
    "gloas-[A-Za-z0-9_\\-]{64}(?!\\w)": ("gloas-",),
    **{
        key: (key,)
        for key in (  # PrivateKeyDetector: plain literals
            "BEGIN DSA PRIVATE KEY",
            "BEGIN EC PRIVATE KEY",
            "BEGIN OPENSSH PRIVATE KEY",
            "BEGIN PGP PRIVATE KEY BLOCK",
            "BEGIN PRIVATE KEY",
            "BEGIN RSA PRIVATE KEY",
            "BEGIN SSH2 ENCRYPTED PRIVATE KEY",
        )
    },
    "PuTTY-User-Key-File-2": ("PuTTY-User-Key-File-2",),
    "pypi-AgEIcHlwaS5vcmc[A-Za-z0-9-_]{70,}": ("pypi-AgEIcHlwaS5vcmc",),
    "pypi-AgENdGVzdC5weXBpLm9yZw[A-Za-z0-9-_]{70,}": ("pypi-AgENdGVzdC5weXBpLm9yZw",),
    "SG\\.[a-zA-Z0-9_-]{22}\\.[a-zA-Z0-9_-]{43}": ("SG.",),
    "sq0csp-[0-9A-Za-z\\\\\\-_]{43}": ("sq0csp-",),
    "AC[a-z0-9]{32}": ("AC",),
    "SK[a-z0-9]{32}": ("SK",),
}
_BASE64 = Base64HighEntropyString()
_HEX = HexHighEntropyString()
_DIGEST_HEX_LENGTHS = frozenset({40, 64, 128})
_RUN = re.compile(rf"[A-Za-z0-9+/=_-]{{{MIN_ENTROPY_LENGTH},}}")
_HEX_RUN = re.compile(r"[0-9a-fA-F]+")
_URI_START = re.compile(r"[A-Za-z][A-Za-z0-9+.-]{0,31}://")
_HEX_SUB_RUN = re.compile(rf"[0-9a-fA-F]{{{MIN_ENTROPY_LENGTH},}}")
# Largest number of distinct characters whose log2 does not exceed the limit.
_BASE64_MIN_DISTINCT = int(2**_BASE64.entropy_limit)
_HEX_MIN_DISTINCT = int(2**_HEX.entropy_limit)
_UPPER, _LOWER, _DIGIT = re.compile("[A-Z]"), re.compile("[a-z]"), re.compile("[0-9]")
_SEGMENT = re.compile(rf"[^/]{{{MIN_ENTROPY_LENGTH},}}")


def _kind(secret_type: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", secret_type.lower()).strip("_")


_DETECTOR_KINDS = {type(d): _kind(d.secret_type) for d in _REGEX_DETECTORS}


def detector_hits(
    text: str, in_uri: Callable[[int], bool] = lambda _: False
) -> Iterator[tuple[int, str]]:
    """(position, kind) of every credential the detectors find in ``text``; ``in_uri`` says
    whether the character at a position belongs to a URI (its path segments are judged one by
    one)."""
    for detector in _REGEX_DETECTORS:
        detector_kind = _DETECTOR_KINDS[type(detector)]
        for pattern in detector.denylist:
            anchors = _ANCHORS.get(pattern.pattern)
            if anchors is not None and not any(anchor in text for anchor in anchors):
                continue
            for match in pattern.finditer(text):
                yield match.start(), detector_kind
    judged = 0
    for match in _RUN.finditer(text):
        start, run = match.start(), match.group(0)
        if "/" in run and in_uri(start):
            candidates = [(start + m.start(), m.group(0)) for m in _SEGMENT.finditer(run)]
        else:
            candidates = [(start, run)]
        for position, candidate in candidates:
            if len(set(candidate)) > _BASE64_MIN_DISTINCT:
                judged += 1
                if judged > MAX_JUDGED_RUNS:
                    yield position, "too_many_random_strings"
                    return
            kind = high_entropy_kind(candidate)
            if kind is not None:
                yield position, kind


def is_uri(text: str) -> bool:
    """Whether ``text`` names a location whose '/' separates segments: a URI (``scheme://``),
    an absolute path, or a revision naming one (``hf:/…``) — an export's own path, which
    ``ito runs checkpoints`` lists, is judged segment by segment, not as one long run."""
    return _URI_START.match(text) is not None or text.startswith(("/", "hf:/"))


def high_entropy_kind(run: str) -> str | None:
    """``high_entropy_hex`` / ``high_entropy_base64`` if ``run`` (a run of the base64 alphabet)
    is or holds a random-looking key, else None."""
    if len(run) < MIN_ENTROPY_LENGTH:
        return None
    if _HEX_RUN.fullmatch(run):
        return _hex_kind(run)
    kind = _base64_kind(run)
    if kind is None:
        # A hex key with a suffix (Mailchimp's "<32 hex>-us12") is a hex run inside this one.
        for match in _HEX_SUB_RUN.finditer(run):
            kind = _hex_kind(match.group(0))
            if kind is not None:
                break
    return kind


def shannon_entropy(data: str) -> float:
    """Shannon entropy in bits per character: the formula of detect-secrets'
    ``HighEntropyStringsPlugin.calculate_shannon_entropy`` (equal for strings of the plugin's
    charset), counted in one pass instead of one ``str.count`` per charset character."""
    length = len(data)
    return -sum(n / length * math.log2(n / length) for n in Counter(data).values())


def _hex_kind(run: str) -> str | None:
    if len(run) in _DIGEST_HEX_LENGTHS or len(set(run)) <= _HEX_MIN_DISTINCT:
        return None
    if is_sequential_string(run):
        return None
    entropy = _HEX.calculate_shannon_entropy(run) if run.isdigit() else shannon_entropy(run)
    if entropy > _HEX.entropy_limit:
        return "high_entropy_hex"
    return None


def _base64_kind(run: str) -> str | None:
    # Cheap tests first: Shannon entropy is at most log2(distinct characters), so a run with
    # too few distinct characters cannot pass the limit whatever its length.
    if len(set(run)) <= _BASE64_MIN_DISTINCT:
        return None
    if not (_UPPER.search(run) and _LOWER.search(run) and _DIGIT.search(run)):
        return None
    if is_potential_uuid(run) or is_sequential_string(run):
        return None
    if shannon_entropy(run) > _BASE64.entropy_limit:
        return "high_entropy_base64"
    return None
