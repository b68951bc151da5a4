"""``ecc ito …``: ECC's bridge to the canonical ``ito`` client (DESIGN §6.3).

A port of everything-claude-code's ``scripts/ito.js`` with its ``ito-environment`` and
``ito-capabilities`` helpers. The bridge holds no credential and decides nothing about
training itself: it checks the request, finds the canonical client, and hands it over.

In order, and before anything is spawned:

1. ``--help``/``-h`` anywhere (or no verb) prints help, exit 0;
2. ``--dry-run`` anywhere or ``ECC_DRY_RUN=1`` is refused: there is no dry-run success mode;
3. an argument that looks like a credential is refused (``secret_in_arguments``), unechoed;
4. ``--json`` at most once; it is moved first when forwarding, every other argument is
   forwarded unchanged and in order;
5. the verb must be in the fixed table :data:`VERBS` — ``approve``/``reject`` never are
   (approval is a human's act, out of band) — and this is decided **before** the executable is
   resolved; ``auth --no-browser`` is refused (auth only validates);
6. the client comes only from ``ECC_ITO_CLI_EXECUTABLE`` (:mod:`ito.bridge.executable`);
7. a **training verb** (:data:`TRAINING_VERBS`: ``plan``, ``confirm``, ``train``, ``runs`` —
   the verbs that start or steer a run) is forwarded only after ``<client> capabilities
   --json``, run with no ``ITO_*`` variable at all and at most 10 s, shows every gate and
   lifecycle operation supported (:mod:`ito.bridge.capabilities`); otherwise
   ``capability_unavailable`` and the credential-bearing call is never spawned. ``status``,
   ``bookings`` and ``telemetry`` only read, ``manifest`` is local, and the other verbs are
   ECC's own; they are forwarded without the probe and the client answers for itself.

The forwarded call runs with ``shell=False``, the scrubbed environment of
:mod:`ito.bridge.environment`, the deadline ``ECC_ITO_TIMEOUT`` (seconds, default 1800) and a
10 MiB bound per output stream. Its stdout, stderr and exit code pass through unchanged. The
bridge's own refusals print ``Error: <message>`` on stderr and exit 1, and with ``--json`` the
§4 envelope on stdout.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ito.bridge.capabilities import authorize_training, parse_contract
from ito.bridge.environment import child_environment, probe_environment
from ito.bridge.executable import resolve_client
from ito.bridge.process import Outcome, run_bounded
from ito.core.envelope import error_envelope
from ito.core.errors import ErrorCode, ItoError
from ito.core.secret_scan import scan_text

__all__ = ["TRAINING_VERBS", "VERBS", "Verb", "main", "run"]


@dataclass(frozen=True)
class Verb:
    """One entry of the fixed verb table."""

    credentials: bool
    """Talks to the Itô API: gets the API URL, timeouts and token settings."""
    api_key: bool
    """May also get ``ITO_API_KEY`` (never login or logout)."""
    training: bool = False
    """Forwarded only after the capability probe."""


VERBS: dict[str, Verb] = {
    "login": Verb(credentials=True, api_key=False),
    "logout": Verb(credentials=True, api_key=False),
    "auth": Verb(credentials=True, api_key=True),
    "find": Verb(credentials=True, api_key=True),
    "status": Verb(credentials=True, api_key=True),
    # Node qualification belongs to ito-compute: this client answers it without contacting
    # anything, so it gets no Itô variable at all (ECC also keeps ITO_* away from evals).
    "evals": Verb(credentials=False, api_key=False),
    "plan": Verb(credentials=True, api_key=True, training=True),
    "confirm": Verb(credentials=True, api_key=True, training=True),
    "train": Verb(credentials=True, api_key=True, training=True),
    "runs": Verb(credentials=True, api_key=True, training=True),
    "bookings": Verb(credentials=True, api_key=True),
    "manifest": Verb(credentials=False, api_key=False),
    "telemetry": Verb(credentials=True, api_key=True),
}
TRAINING_VERBS = frozenset(name for name, verb in VERBS.items() if verb.training)
_SUBCOMMAND_VERBS = frozenset({"runs", "bookings", "manifest"})
_MUTATIONS = frozenset({"train", "confirm", "runs cancel", "runs cleanup"})
_SECRET_OPTIONS = frozenset({"--api-key", "--token", "--password", "--secret", "--bearer", "--key"})
_VERB_SHAPE = frozenset("abcdefghijklmnopqrstuvwxyz0123456789-")

TIMEOUT_ENV = "ECC_ITO_TIMEOUT"
DEFAULT_TIMEOUT_S = 1800.0
MAX_TIMEOUT_S = 86400.0
CAPABILITY_TIMEOUT_S = 10.0
_PROBE_MAX_BYTES = 1024 * 1024
_NOTHING_SENT = "the bridge refused before forwarding; nothing was sent and nothing was created"

HELP = """\
ECC × Itô training bridge

Usage:
  ecc ito login [--no-browser]      device login (RFC 8628); never receives ITO_API_KEY
  ecc ito logout                    revoke remotely, then forget locally
  ecc ito auth                      validate the stored login or ITO_API_KEY; never logs in
  ecc ito status [--run R | --idempotency-key K]
  ecc ito bookings list | show B | eligibility B
  ecc ito manifest init --recipe demo --out DIR | validate PATH
  ecc ito plan --booking B --manifest M
  ecc ito confirm --action train --booking B --manifest M
  ecc ito train --booking B --manifest M --confirmation-ref REF --idempotency-key K
  ecc ito runs list | show R | logs R | metrics R | checkpoints R | provenance R | watch R
      | cancel R | cleanup R
  ecc ito telemetry --booking B | --run R
  ecc ito find [--gpu G --count N …]   RFQ search and node qualification belong to
  ecc ito evals [--cluster C …]        ito-compute: their options are accepted, and this
                                       runtime answers capability_unavailable, contacting nothing
  ecc ito <verb> ... --json         the JSON envelope (--json at most once)

The bridge invokes the separately installed canonical Itô client and returns its real stdout,
stderr and exit code unchanged. It holds no credential. There is no approve or reject verb:
approving a confirmation is a human's act, on the approval page. There is no dry-run success
mode: --dry-run and ECC_DRY_RUN=1 are refused.

Set ECC_ITO_CLI_EXECUTABLE to the explicit absolute path of the canonical client (for example
<venv>/bin/ito). It must resolve to a regular executable file that only its owner can write.
For safety, ECC never discovers this credential-bearing client through PATH.

plan, confirm, train and runs are forwarded only when `ito capabilities --json` (run without
any credential) shows every gate and lifecycle operation supported; otherwise the bridge
refuses with capability_unavailable and never starts the credential-bearing call.

The client gets only system variables, plus ITO_API_URL, ITO_CONNECT_TIMEOUT, ITO_TIMEOUT,
ITO_HOME, ITO_ALLOW_FILE_TOKEN and PYTHON_KEYRING_BACKEND for verbs that talk to the API, and
ITO_API_KEY for those except login and logout. Never put a key or token in arguments.
ECC_ITO_TIMEOUT bounds each call in seconds (default 1800).
"""


@dataclass(frozen=True)
class Request:
    """A checked ``ecc ito`` call."""

    verb: str
    invoked: str
    """The client command it reaches, as the capability contract names it (``runs logs``)."""
    argv: list[str]
    """What the client receives: ``--json`` first if given, then the verb and its arguments."""
    json_mode: bool

    @property
    def streaming(self) -> bool:
        """Shows output while it runs (device login, followed logs, watch)."""
        return (
            self.verb == "login"
            or self.invoked == "runs watch"
            or (self.invoked == "runs logs" and "--follow" in self.argv)
        )


def main() -> None:
    sys.exit(run(sys.argv[1:], os.environ))


def run(argv: Sequence[str], environ: Mapping[str, str]) -> int:
    json_mode = "--json" in argv
    try:
        request = parse(list(argv), environ)
        if request is None:
            sys.stdout.write(HELP)
            return 0
        timeout = _timeout(environ)
        client = resolve_client(environ)
        if VERBS[request.verb].training:
            _probe(client, environ, request, timeout)
        return _forward(client, environ, request, timeout)
    except ItoError as error:
        return _refuse(error, json_mode, live_api_contacted=False, notice=_NOTHING_SENT)
    except KeyboardInterrupt:  # the child and its session were already killed
        return 130


def parse(argv: list[str], environ: Mapping[str, str]) -> Request | None:
    """The request, None for help, or a refusal; decided without touching the filesystem."""
    rest = [arg for arg in argv if arg != "--json"]
    if "--help" in argv or "-h" in argv or rest in ([], ["ito"]):
        return None
    if environ.get("ECC_DRY_RUN") == "1" or any(
        arg == "--dry-run" or arg.startswith("--dry-run=") for arg in argv
    ):
        raise ItoError(
            "capability_unavailable",
            "Itô training has no paper or dry-run success mode. No CLI operation was invoked.",
        )
    for position, arg in enumerate(argv, start=1):
        if arg.split("=", 1)[0].lower() in _SECRET_OPTIONS or scan_text(arg):
            raise ItoError("secret_in_arguments", position=position)
    json_mode = len(rest) < len(argv)
    if len(argv) - len(rest) > 1:
        raise ItoError("invalid_arguments", "--json may only be provided once")
    if rest[0] != "ito":
        raise ItoError("invalid_arguments", "this ecc provides only the 'ecc ito …' bridge")
    verb, args = rest[1], rest[2:]
    if verb not in VERBS:
        raise ItoError("invalid_arguments", _unknown_verb(verb))
    if verb == "auth" and "--no-browser" in args:
        raise ItoError(
            "invalid_arguments",
            "--no-browser is valid only for ecc ito login; auth is validation-only",
        )
    invoked = verb
    if verb in _SUBCOMMAND_VERBS and args and not args[0].startswith("-"):
        invoked = f"{verb} {args[0]}"
    elif verb in TRAINING_VERBS and verb in _SUBCOMMAND_VERBS:
        raise ItoError("invalid_arguments", f"'ecc ito {verb}' needs a subcommand")
    return Request(
        verb=verb,
        invoked=invoked,
        json_mode=json_mode,
        argv=(["--json"] if json_mode else []) + [verb, *args],
    )


def _unknown_verb(verb: str) -> str:
    allowed = ", ".join(VERBS)
    if verb in ("approve", "reject"):
        return (
            f"'{verb}' is not a bridge verb: approving or rejecting a confirmation is a "
            f"human's act, out of band. ECC permits only {allowed}."
        )
    shown = verb if verb and len(verb) <= 32 and set(verb) <= _VERB_SHAPE else "(invalid)"
    return f"unsupported Itô command '{shown}'; ECC permits only {allowed}"


def _timeout(environ: Mapping[str, str]) -> float:
    raw = (environ.get(TIMEOUT_ENV) or "").strip()
    if not raw:
        return DEFAULT_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 0 < value <= MAX_TIMEOUT_S:
        raise ItoError(
            "client_not_configured",
            f"{TIMEOUT_ENV} must be a number of seconds in (0, {MAX_TIMEOUT_S:.0f}]",
        )
    return value


def _probe(client: str, environ: Mapping[str, str], request: Request, timeout: float) -> None:
    """``<client> capabilities --json`` without credentials; refuses unless it allows
    ``request``."""
    limit = min(CAPABILITY_TIMEOUT_S, timeout)
    outcome = run_bounded(
        [client, "capabilities", "--json"],
        probe_environment(environ),
        timeout=limit,
        max_bytes=_PROBE_MAX_BYTES,
    )
    if outcome.timed_out:
        raise ItoError(
            "capability_unavailable", f"the capability probe did not finish within {limit:g} s"
        )
    if outcome.overflowed or outcome.returncode != 0:
        raise ItoError(
            "capability_unavailable",
            "the canonical client rejected credential-free capability discovery",
        )
    authorize_training(parse_contract(outcome.stdout), request.invoked)


def _forward(client: str, environ: Mapping[str, str], request: Request, timeout: float) -> int:
    verb = VERBS[request.verb]
    environment = child_environment(environ, credentials=verb.credentials, api_key=verb.api_key)
    outcome = run_bounded(
        [client, *request.argv],
        environment,
        timeout=timeout,
        stream=request.streaming,
        inherit_stdin=request.verb == "login",
    )
    if outcome.returncode is None or outcome.returncode < 0 or outcome.overflowed:
        return _stopped(outcome, request, timeout)
    with contextlib.suppress(BrokenPipeError):
        sys.stdout.buffer.write(outcome.stdout)
        sys.stdout.buffer.flush()
    with contextlib.suppress(BrokenPipeError):
        sys.stderr.buffer.write(outcome.stderr)
        sys.stderr.buffer.flush()
    return outcome.returncode


def _stopped(outcome: Outcome, request: Request, timeout: float) -> int:
    """The client timed out, overflowed or died: nothing of its output is trusted."""
    code: ErrorCode
    if outcome.timed_out:
        code, what = "transport_timeout", f"did not finish within {timeout:g} s and was stopped"
    elif outcome.overflowed:
        code, what = (
            "client_executable_invalid",
            "wrote more output than the bridge accepts and was stopped",
        )
    else:
        code, what = "internal_error", f"was killed by signal {-(outcome.returncode or 0)}"
    details: dict[str, str] = {}
    if request.invoked in _MUTATIONS:
        code = "transport_ambiguous"
        key = _option(request.argv, "--idempotency-key")
        if key is not None:
            details["idempotency_key"] = key
    live = VERBS[request.verb].credentials
    notice = (
        "a request it sent may have reached the API; look the result up (ecc ito status) "
        "before retrying"
        if live
        else "this verb contacts no API; nothing was sent"
    )
    return _refuse(
        ItoError(code, f"the canonical client {what}", **details),
        request.json_mode,
        live_api_contacted=live,
        notice=notice,
    )


def _option(argv: list[str], name: str) -> str | None:
    for index, arg in enumerate(argv):
        if arg == name and index + 1 < len(argv):
            return argv[index + 1]
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
    return None


def _refuse(error: ItoError, json_mode: bool, *, live_api_contacted: bool, notice: str) -> int:
    sys.stderr.write(f"Error: {error.message}\n")
    sys.stderr.flush()
    if json_mode:
        envelope = error_envelope(error, notice, live_api_contacted=live_api_contacted)
        sys.stdout.write(json.dumps(envelope, indent=2) + "\n")
        sys.stdout.flush()
    return 1
