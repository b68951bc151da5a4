"""The single registry of stable error codes, and the one exception that carries them.

Every refusal anywhere in ito — client, server, bridge — is an :class:`ItoError` whose ``code``
comes from :data:`REGISTRY`. The registry fixes each code's HTTP status and whether retrying the
same request may succeed. Codes are a public contract: add new ones, never rename one.

Codes are typed: :data:`ErrorCode` is the ``Literal`` of the registry's keys, and
:class:`ItoError` takes only an ``ErrorCode``, so mypy refuses a misspelt code where it is
written; a code read at run time (an answer, an event) is checked with :func:`is_error_code`.
A test scans the whole source for every code a module emits (``ItoError(...)``, ``code=``,
``failure_code=``, the supervisor's outcomes) and fails on one missing here. A new code goes in
both :data:`ErrorCode` and :data:`REGISTRY` (a test keeps them equal).

Tree::

    Exception
    └── ItoError            code + safe message + retryable, rebuilt on the client from ``code``

Messages must be safe to show anywhere: they never carry a secret, token, key or password.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, TypeGuard

__all__ = ["REGISTRY", "ErrorCode", "ErrorSpec", "ItoError", "is_error_code", "spec_for"]


@dataclass(frozen=True)
class ErrorSpec:
    """How one stable error code behaves."""

    status: int
    """HTTP status the API answers with."""
    retryable: bool
    """Whether the same request may succeed later without any change."""
    summary: str
    """A default safe message."""


ErrorCode = Literal[
    "capability_unavailable",
    "client_not_configured",
    "client_executable_invalid",
    "invalid_arguments",
    "secret_in_arguments",
    "manifest_path_not_absolute",
    "manifest_symlink",
    "manifest_not_regular_file",
    "manifest_wrong_owner",
    "manifest_unsafe_permissions",
    "manifest_too_large",
    "manifest_changed",
    "not_authenticated",
    "transport_timeout",
    "transport_ambiguous",
    "transport_unreachable",
    "transport_bad_response",
    "api_answer_invalid",
    "credential_revoked",
    "forbidden_scope",
    "not_found",
    "account_not_found",
    "key_not_found",
    "booking_not_found",
    "booking_not_completed",
    "booking_expired",
    "booking_revoked",
    "booking_released",
    "booking_mismatch",
    "booking_term_insufficient",
    "manifest_not_found",
    "manifest_invalid",
    "manifest_contains_secret",
    "manifest_digest_mismatch",
    "confirmation_not_found",
    "confirmation_pending",
    "confirmation_rejected",
    "confirmation_expired",
    "confirmation_consumed",
    "confirmation_mismatch",
    "confirmation_not_pending",
    "self_approval_forbidden",
    "idempotency_key_invalid",
    "idempotency_key_reused",
    "idempotency_in_progress",
    "budget_exceeded",
    "capacity_insufficient",
    "fabric_incompatible",
    "data_policy_violation",
    "data_invalid",
    "tokenizer_invalid",
    "checkpoint_storage_invalid",
    "revision_unresolvable",
    "plan_refused",
    "layout_unsupported",
    "mesh_mismatch",
    "accelerator_unavailable",
    "eval_gate_failed",
    "ladder_rejected",
    "dynamic_sampling_exhausted",
    "rollout_worker_failed",
    "pipeline_crashed",
    "cost_bound_reached",
    "run_not_found",
    "run_not_cancellable",
    "invalid_transition",
    "run_not_terminal",
    "lease_lost",
    "provenance_mismatch",
    "provenance_not_found",
    "rate_limited",
    "request_too_large",
    "method_not_allowed",
    "authorization_pending",
    "slow_down",
    "access_denied",
    "device_code_expired",
    "device_code_not_found",
    "invalid_credentials",
    "csrf_failed",
    "device_code_not_pending",
    "user_exists",
    "store_busy",
    "store_not_migrated",
    "internal_error",
]
"""Every stable error code: the keys of :data:`REGISTRY`, as a type, so that mypy refuses a
misspelt code where one is written (a test keeps the two equal)."""


def _s(status: int, summary: str, retryable: bool = False) -> ErrorSpec:
    return ErrorSpec(status=status, retryable=retryable, summary=summary)


REGISTRY: dict[ErrorCode, ErrorSpec] = {
    # --- client side -------------------------------------------------------------------------
    "capability_unavailable": _s(501, "this capability is not available in this runtime"),
    "client_not_configured": _s(400, "the client is not configured"),
    "client_executable_invalid": _s(400, "the canonical client executable is not usable"),
    "invalid_arguments": _s(422, "the arguments are invalid"),
    "secret_in_arguments": _s(
        422,
        "an argument looks like a credential; pass secrets only "
        "through ITO_API_KEY or the stored login",
    ),
    "manifest_path_not_absolute": _s(422, "the manifest path must be absolute"),
    "manifest_symlink": _s(422, "a component of the manifest path is a symbolic link"),
    "manifest_not_regular_file": _s(422, "the manifest is not a regular file"),
    "manifest_wrong_owner": _s(422, "the manifest is not owned by the current user or root"),
    "manifest_unsafe_permissions": _s(422, "the manifest or its directory is writable by others"),
    "manifest_too_large": _s(413, "the manifest exceeds the size bound"),
    "manifest_changed": _s(409, "the manifest changed while it was being read"),
    "not_authenticated": _s(401, "no valid credential was presented"),
    "transport_timeout": _s(504, "the API did not answer within the deadline", True),
    "transport_ambiguous": _s(
        504,
        "the request may have reached the API but no answer came back;"
        " retry with the same idempotency key",
        True,
    ),
    "transport_unreachable": _s(503, "the API could not be reached; nothing was sent", True),
    "transport_bad_response": _s(
        502,
        "the API's answer was not a readable envelope (an error "
        "page of a proxy, a truncated or oversized body)",
        True,
    ),
    "api_answer_invalid": _s(
        502,
        "the API's answer does not match the model this side "
        "expects (a client and server of different versions?)",
    ),
    # --- server side -------------------------------------------------------------------------
    "credential_revoked": _s(401, "this credential has been revoked"),
    "forbidden_scope": _s(403, "this credential's role does not allow this operation"),
    "not_found": _s(404, "no such resource"),
    "account_not_found": _s(404, "account not found"),
    "key_not_found": _s(404, "key not found"),
    "booking_not_found": _s(404, "booking not found"),
    "booking_not_completed": _s(409, "the booking is not completed"),
    "booking_expired": _s(410, "the booking's term is over or has not started"),
    "booking_revoked": _s(410, "the booking was revoked"),
    "booking_released": _s(410, "the booking was released"),
    "booking_mismatch": _s(422, "the booking does not match what the request needs"),
    "booking_term_insufficient": _s(
        422, "the estimated run does not fit in the booking's remaining term"
    ),
    "manifest_not_found": _s(404, "manifest not found"),
    "manifest_invalid": _s(422, "the manifest does not match the schema"),
    "manifest_contains_secret": _s(
        422, "the manifest contains something that looks like a credential"
    ),
    "manifest_digest_mismatch": _s(422, "the manifest digest does not match"),
    "confirmation_not_found": _s(404, "confirmation not found"),
    "confirmation_pending": _s(409, "the confirmation has not been approved yet", True),
    "confirmation_rejected": _s(409, "the confirmation was rejected"),
    "confirmation_expired": _s(410, "the confirmation expired"),
    "confirmation_consumed": _s(409, "the confirmation was already used"),
    "confirmation_mismatch": _s(422, "the confirmation is bound to something else"),
    "confirmation_not_pending": _s(409, "the confirmation is no longer pending"),
    "self_approval_forbidden": _s(
        403, "the approver must be a different principal from the requester"
    ),
    "idempotency_key_invalid": _s(422, "the idempotency key must be 1-255 printable characters"),
    "idempotency_key_reused": _s(422, "this idempotency key was used for a different request"),
    "idempotency_in_progress": _s(409, "a request with this idempotency key is in progress", True),
    "budget_exceeded": _s(422, "the cost estimate exceeds the budget"),
    "capacity_insufficient": _s(422, "the booking is too small for this run"),
    "fabric_incompatible": _s(422, "the booking's fabric does not fit this run"),
    "data_policy_violation": _s(422, "the data does not satisfy the data policy"),
    "data_invalid": _s(
        422, "a data row does not fit its role (not JSON, a missing field, a wrong type)"
    ),
    "tokenizer_invalid": _s(
        422,
        "the manifest's tokenizer cannot be used (unreadable, not a tokenizer.json, its sha256 "
        "not the manifest's, or its vocabulary larger than the model's)",
    ),
    "checkpoint_storage_invalid": _s(422, "the checkpoint storage is not usable"),
    "revision_unresolvable": _s(
        422,
        "the manifest's model.revision names initial weights that cannot be used (no such run "
        "of this account, no committed checkpoint at that step, another architecture, outside "
        "the booking's storage, or a digest that does not match)",
    ),
    "plan_refused": _s(422, "no acceptable parallelism plan exists for this run"),
    "layout_unsupported": _s(422, "the planned layout has a degree the engine cannot apply"),
    "mesh_mismatch": _s(422, "the device mesh the engine built differs from the plan"),
    "accelerator_unavailable": _s(
        503, "the engine does not see the booked accelerator; the run never falls back to CPU"
    ),
    "eval_gate_failed": _s(
        422, "an eval gate of the run failed its thresholds; the run ended gate_failed"
    ),
    "ladder_rejected": _s(
        422,
        "the ladder decision job found that the custom data loses on the stage's battery by "
        "more than the manifest's margin; the run ended gate_failed before training",
    ),
    "dynamic_sampling_exhausted": _s(
        422,
        "RLVR's rollouts never held a prompt group whose rewards differ, and their rewards "
        "were never all right: nothing in these prompts can teach this policy; the stage ended",
    ),
    "cost_bound_reached": _s(
        409,
        "the run's spend reached the cost bound a human approved; it waits in "
        "awaiting_approval for a new bound (a run.raise_cost_bound confirmation) or a cancel",
    ),
    "rollout_worker_failed": _s(
        500, "RLVR's separate rollout worker exited or stopped answering; the stage ended"
    ),
    "pipeline_crashed": _s(
        500, "the training processes exited without a result after their restarts"
    ),
    "run_not_found": _s(404, "run not found"),
    "run_not_cancellable": _s(409, "the run cannot be cancelled in its current state"),
    "invalid_transition": _s(409, "that state change is not allowed"),
    "run_not_terminal": _s(409, "the run has not ended; cancel it first"),
    "lease_lost": _s(409, "this worker no longer holds the run's lease"),
    "provenance_mismatch": _s(
        409, "the data does not match the provenance report bound to this run"
    ),
    "provenance_not_found": _s(404, "this run has no data-preparation report yet"),
    "rate_limited": _s(429, "too many requests", True),
    "request_too_large": _s(413, "the request body exceeds the server's size bound"),
    "method_not_allowed": _s(405, "this method is not allowed here"),
    # --- device login (RFC 8628 §3.5 error responses) and web sign-in ------------------------
    "authorization_pending": _s(400, "the device code has not been approved yet", True),
    "slow_down": _s(429, "polling too fast; wait longer between polls", True),
    "access_denied": _s(403, "the device login was denied"),
    "device_code_expired": _s(410, "the device code expired; start the login again"),
    "device_code_not_found": _s(404, "unknown device code"),
    "invalid_credentials": _s(401, "wrong email or password"),
    "csrf_failed": _s(403, "the form's CSRF token is missing or wrong"),
    "device_code_not_pending": _s(409, "this device code was already approved or denied"),
    "user_exists": _s(409, "a user with this email already exists"),
    "store_busy": _s(503, "the store is busy; retry", True),
    "store_not_migrated": _s(
        503, "the database schema is not at the expected version; run 'ito-server migrate'"
    ),
    "internal_error": _s(500, "internal error", True),
}


def is_error_code(code: object) -> TypeGuard[ErrorCode]:
    """Whether ``code`` (read from an answer, an event, a column) is a registered code."""
    return isinstance(code, str) and code in REGISTRY


def spec_for(code: str) -> ErrorSpec:
    """The spec of ``code``; unknown codes (from a newer server) are treated as internal."""
    return REGISTRY[code] if is_error_code(code) else REGISTRY["internal_error"]


class ItoError(Exception):
    """A refusal with a stable code. ``message`` is safe to show; ``details`` is structured."""

    def __init__(self, code: ErrorCode, message: str | None = None, **details: Any) -> None:
        assert code in REGISTRY, f"unregistered error code {code!r}"
        self.code: ErrorCode = code
        self.message = message or REGISTRY[code].summary
        self.details = details
        super().__init__(f"{code}: {self.message}")

    @property
    def status(self) -> int:
        return REGISTRY[self.code].status

    @property
    def retryable(self) -> bool:
        return REGISTRY[self.code].retryable

    def to_error_body(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "code": self.code,
            "message": self.message,
            "retryable": self.retryable,
        }
        if self.details:
            body["details"] = self.details
        return body
