"""Every client operation, returning its §4 envelope — the one implementation behind ``ito``
(which prints it) and ``ito-mcp`` (which returns it as a tool result).

An operation never raises for anything a user, the API or the network can cause: a refusal is
an error envelope with ``live_api_contacted`` telling whether any byte may have reached the API.
Manifests are read securely (§6.1), parsed and secret-scanned before any network call. A lost
response to ``train`` is resolved by looking the run up by its idempotency key (§6.2), never by
creating again.

An id that goes into a URL path (run, booking, confirmation) must be exactly an id of its kind
as the server mints them (:mod:`ito.core.ids`), or the operation is refused with
``invalid_arguments`` before anything is sent; each path segment is percent-quoted as well. A
value such as ``../confirmations/cfr_…/approve#`` can therefore never steer a request to another
endpoint (approval through ``ito runs cancel`` with an approver key in the environment).
"""

from __future__ import annotations

import base64
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import quote

from ito.core.envelope import error_envelope, ok_envelope
from ito.core.errors import ItoError
from ito.core.ids import is_public_id
from ito.transport import ApiRefusal, Transport, TransportFailure

if TYPE_CHECKING:
    from ito.client.config import ClientConfig
    from ito.client.secure_file import SecureRead

__all__ = ["ACTIONS", "Envelope", "Operations"]

Envelope = dict[str, Any]
ACTIONS = {
    "train": "train.create",
    "cancel": "run.cancel",
    "cleanup": "run.cleanup",
    "restart": "run.restart_from_checkpoint",
    "raise-bound": "run.raise_cost_bound",
}
_F = TypeVar("_F", bound=Callable[..., Envelope])
_ID_KINDS = {"run": "run", "booking": "bkg", "confirmation": "cfr"}


class _Stop(Exception):
    """Carries the final envelope out of an operation."""

    def __init__(self, envelope: Envelope) -> None:
        super().__init__(envelope.get("notice"))
        self.envelope = envelope


def _operation(method: _F) -> _F:
    def wrapper(*args: Any, **kwargs: Any) -> Envelope:
        try:
            return method(*args, **kwargs)
        except _Stop as stop:
            return stop.envelope
        except ItoError as exc:
            return error_envelope(
                exc,
                "refused before anything was sent; nothing was created",
                live_api_contacted=False,
            )

    wrapper.__name__ = method.__name__
    wrapper.__doc__ = method.__doc__
    return wrapper  # type: ignore[return-value]


def _local_refusal(error: ItoError, notice: str | None = None) -> _Stop:
    return _Stop(
        error_envelope(
            error,
            notice or "refused before anything was sent; nothing was created",
            live_api_contacted=False,
        )
    )


def _id(value: str, kind: str) -> str:
    """``value`` if it is an id of ``kind`` (run, booking, confirmation), else a refusal before
    anything is sent. The value is not echoed: it may be anything."""
    prefix = _ID_KINDS[kind]
    if not is_public_id(value, prefix):
        raise _local_refusal(
            ItoError(
                "invalid_arguments",
                f"the {kind} id must look like {prefix}_ followed by 24 characters a-z and 2-7",
                argument=kind,
            )
        )
    return value


def _path(*segments: str) -> str:
    """``/v1/…`` from fixed and checked segments, each percent-quoted (no ``/``, ``?``, ``#``
    or dot-segment survives)."""
    return "/v1/" + "/".join(quote(segment, safe="") for segment in segments)


def _transport_stop(failure: TransportFailure, mutation: bool) -> _Stop:
    if not failure.live_api_contacted:
        notice = "the API could not be reached; nothing was sent"
    elif mutation:
        notice = "the request may have been applied but no answer came back"
    else:
        notice = "the API did not answer in time; nothing was changed"
    return _Stop(error_envelope(failure, notice, live_api_contacted=failure.live_api_contacted))


class Operations:
    """The canonical client's operations for one configuration and credential."""

    def __init__(self, config: ClientConfig, token: str | None) -> None:
        self.config = config
        self.token = token

    # --- plumbing -------------------------------------------------------------------------

    def _client(self) -> Transport:
        if not self.token:
            raise _local_refusal(
                ItoError("not_authenticated", "no credential: set ITO_API_KEY or run 'ito login'"),
                "nothing was sent",
            )
        return self.config.transport(self.token)

    def _call(self, method: str, path: str, *, mutation: bool = False, **kwargs: Any) -> Envelope:
        client = self._client()
        try:
            return client.request(method, path, mutation=mutation, **kwargs)
        except ApiRefusal as refusal:
            raise _Stop(refusal.envelope) from None
        except TransportFailure as failure:
            raise _transport_stop(failure, mutation) from None

    @staticmethod
    def _read(path: str) -> SecureRead:
        """Read the manifest securely, then parse and secret-scan it here: a document the
        server would refuse (``manifest_invalid``, ``manifest_contains_secret``) never leaves
        this machine — a credentials file passed by mistake is not uploaded to be refused."""
        from ito.client.secure_file import read_manifest_securely
        from ito.core.manifest import parse_manifest

        try:
            read = read_manifest_securely(path)
            parse_manifest(read.raw)
            return read
        except ItoError as exc:
            raise _local_refusal(
                exc, "the manifest was refused before anything was sent; nothing was created"
            ) from None

    # --- reads ----------------------------------------------------------------------------

    @_operation
    def auth(self) -> Envelope:
        """Validate the credential in use; never starts a login."""
        return self._call("GET", "/v1/me")

    @_operation
    def status(self, run: str | None = None, idempotency_key: str | None = None) -> Envelope:
        """This account's bookings and recent runs, or one run."""
        if run is not None and idempotency_key is not None:
            raise _local_refusal(
                ItoError("invalid_arguments", "give a run or an idempotency key, not both")
            )
        if run is not None:
            return self._call("GET", _path("runs", _id(run, "run")))
        if idempotency_key is not None:
            runs = self._call("GET", "/v1/runs", params={"idempotency_key": idempotency_key})[
                "data"
            ]["runs"]
            if not runs:
                raise _Stop(
                    error_envelope(
                        ItoError("run_not_found", "no run has this idempotency key"),
                        "no run was found; nothing was changed",
                        live_api_contacted=True,
                    )
                )
            return ok_envelope(runs[0], f"run {runs[0]['run_id']} is {runs[0]['state']}")
        return self._call("GET", "/v1/status")

    @_operation
    def bookings(self, booking: str | None = None, eligibility: bool = False) -> Envelope:
        """Bookings of this account, one booking, or its fresh eligibility."""
        if booking is None:
            return self._call("GET", "/v1/bookings")
        segments = ["bookings", _id(booking, "booking")]
        if eligibility:
            segments.append("eligibility")
        return self._call("GET", _path(*segments))

    @_operation
    def runs(self, run: str | None = None, booking: str | None = None, limit: int = 50) -> Envelope:
        """Runs of this account (newest first), or one run with its events."""
        if run is not None:
            return self._call("GET", _path("runs", _id(run, "run")))
        params: dict[str, Any] = {"limit": limit}
        if booking:
            params["booking_id"] = booking
        return self._call("GET", "/v1/runs", params=params)

    @_operation
    def plan(self, booking: str, manifest: str) -> Envelope:
        """What creating the run would do, and cost. Creates nothing."""
        read = self._read(manifest)
        return self._call("POST", "/v1/plans", params={"booking_id": booking}, content=read.raw)

    # --- requests and mutations -----------------------------------------------------------

    @_operation
    def confirm(
        self,
        action: str,
        booking: str | None = None,
        manifest: str | None = None,
        run: str | None = None,
        checkpoint: int | None = None,
        ttl_seconds: int | None = None,
        cost_bound: float | None = None,
    ) -> Envelope:
        """Request a single-use confirmation; a human approves it out of band."""
        if action not in ACTIONS:
            raise _local_refusal(
                ItoError("invalid_arguments", f"action must be one of {sorted(ACTIONS)}")
            )
        body: dict[str, Any] = {"action": ACTIONS[action]}
        if ttl_seconds is not None:
            body["ttl_seconds"] = ttl_seconds
        if action == "train":
            if not booking or not manifest or run:
                raise _local_refusal(
                    ItoError(
                        "invalid_arguments", "a train confirmation needs a booking and a manifest"
                    )
                )
            read = self._read(manifest)
            body |= {
                "booking_id": booking,
                "manifest_id": read.digest,
                "manifest_b64": base64.b64encode(read.raw).decode(),
            }
        else:
            if not run or booking or manifest:
                raise _local_refusal(
                    ItoError("invalid_arguments", f"a {action} confirmation names a run only")
                )
            body["run_id"] = run
            if checkpoint is not None:
                body["checkpoint_step"] = checkpoint
        if cost_bound is not None:
            body["cost_bound_usd"] = cost_bound
        return self._call("POST", "/v1/confirmations", json=body, mutation=True)

    @_operation
    def decide(self, ref: str, approve: bool) -> Envelope:
        """Approve or reject a confirmation (approver credential only; never an MCP tool)."""
        verb = "approve" if approve else "reject"
        return self._call(
            "POST", _path("confirmations", _id(ref, "confirmation"), verb), mutation=True
        )

    @_operation
    def train(
        self, booking: str, manifest: str, confirmation_ref: str, idempotency_key: str
    ) -> Envelope:
        """Create a run behind the five gates; a retry with the same key returns the same run."""
        from ito.core.gates import validate_idempotency_key

        validate_idempotency_key(idempotency_key)
        read = self._read(manifest)
        client = self._client()
        body: dict[str, Any] = {
            "booking_id": booking,
            "manifest_id": read.digest,
            "confirmation_ref": confirmation_ref,
            "idempotency_key": idempotency_key,
        }
        try:
            client.request("GET", _path("manifests", read.digest))
        except ApiRefusal as refusal:
            if refusal.code != "manifest_not_found":
                raise _Stop(refusal.envelope) from None
            body["manifest_b64"] = base64.b64encode(read.raw).decode()
        except TransportFailure as failure:
            raise _transport_stop(failure, mutation=False) from None
        try:
            return client.request("POST", "/v1/runs", json=body, mutation=True)
        except ApiRefusal as refusal:
            raise _Stop(refusal.envelope) from None
        except TransportFailure as failure:
            if failure.code != "transport_ambiguous":
                raise _transport_stop(failure, mutation=True) from None
            return self._recover_lost_create(client, idempotency_key)

    def _recover_lost_create(self, client: Transport, key: str) -> Envelope:
        """The create may have committed: look the run up by its key before anything else."""
        try:
            envelope = client.request("GET", "/v1/runs", params={"idempotency_key": key})
        except ApiRefusal as refusal:
            if refusal.code == "credential_revoked":
                raise _Stop(refusal.envelope) from None
            envelope = None
        except TransportFailure:
            envelope = None
        runs = envelope["data"]["runs"] if envelope else []
        if runs:
            run = runs[0]
            return ok_envelope(
                {
                    "booking_id": run["booking_id"],
                    "run_id": run["run_id"],
                    "manifest_id": run["manifest_id"],
                    "idempotency_key": key,
                    "state": run["state"],
                    "stage": run["stage"],
                    "replayed": True,
                    "recovered_after_lost_response": True,
                },
                "the response was lost; the run was found by its idempotency key (no second "
                "run was created)",
            )
        raise _Stop(
            error_envelope(
                ItoError("transport_ambiguous", idempotency_key=key),
                "the request may have been applied; retry with the same idempotency key to get the "
                "one run",
                live_api_contacted=True,
            )
        )

    # --- lifecycle ------------------------------------------------------------------------

    @_operation
    def logs(self, run: str, since: int | None = None, limit: int = 500) -> Envelope:
        """Log lines of a run after the cursor ``since``, in stable order."""
        return self._call(
            "GET",
            _path("runs", _id(run, "run"), "logs"),
            params={"since": since or 0, "limit": limit},
        )

    @_operation
    def metrics(self, run: str, name: str | None = None, since: int | None = None) -> Envelope:
        """Metric points of a run (optionally one metric)."""
        params: dict[str, Any] = {"since": since or 0}
        if name:
            params["name"] = name
        return self._call("GET", _path("runs", _id(run, "run"), "metrics"), params=params)

    @_operation
    def checkpoints(self, run: str) -> Envelope:
        """Committed checkpoints of a run."""
        return self._call("GET", _path("runs", _id(run, "run"), "checkpoints"))

    @_operation
    def gates(self, run: str) -> Envelope:
        """A run's eval gate records: stage, battery, eval, data, value, the step-0 value,
        threshold, passed."""
        return self._call("GET", _path("runs", _id(run, "run"), "gates"))

    @_operation
    def provenance(self, run: str) -> Envelope:
        """The data-preparation report bound to a run: inputs, counts kept and removed per
        reason, eval items matched by decontamination, output shard digests."""
        return self._call("GET", _path("runs", _id(run, "run"), "provenance"))

    @_operation
    def cancel(self, run: str, confirmation_ref: str, idempotency_key: str) -> Envelope:
        """Cancel a run behind its own confirmation and idempotency key."""
        return self._run_action(run, "cancel", confirmation_ref, idempotency_key)

    @_operation
    def cleanup(self, run: str, confirmation_ref: str, idempotency_key: str) -> Envelope:
        """Delete a finished run's checkpoints and scratch data; never touches the booking."""
        return self._run_action(run, "cleanup", confirmation_ref, idempotency_key)

    @_operation
    def restart(self, run: str, confirmation_ref: str, idempotency_key: str) -> Envelope:
        """Apply a human-approved restart from the proposed checkpoint (after a loss spike)."""
        return self._run_action(run, "restart", confirmation_ref, idempotency_key)

    @_operation
    def raise_bound(self, run: str, confirmation_ref: str, idempotency_key: str) -> Envelope:
        """Apply a human-approved new cost bound to a run waiting at its bound; it resumes
        from its last committed checkpoint."""
        return self._run_action(run, "raise-bound", confirmation_ref, idempotency_key)

    def _run_action(self, run: str, verb: str, ref: str, key: str) -> Envelope:
        from ito.core.gates import validate_idempotency_key

        _id(run, "run")
        validate_idempotency_key(key)
        body = {"confirmation_ref": ref, "idempotency_key": key}
        client = self._client()
        try:
            return client.request("POST", _path("runs", run, verb), json=body, mutation=True)
        except ApiRefusal as refusal:
            raise _Stop(refusal.envelope) from None
        except TransportFailure as failure:
            if failure.code != "transport_ambiguous":
                raise _transport_stop(failure, mutation=True) from None
        # The answer was lost: the run's state says whether the action was applied.
        state = self._call("GET", _path("runs", run))["data"]
        raise _Stop(
            error_envelope(
                ItoError(
                    "transport_ambiguous",
                    idempotency_key=key,
                    run_state=state["state"],
                    cleanup_state=state["cleanup_state"],
                ),
                f"the {verb} may have been applied (the run is now {state['state']}); retry with "
                "the same idempotency key",
                live_api_contacted=True,
            )
        )

    @_operation
    def telemetry(self, booking: str | None = None, run: str | None = None) -> Envelope:
        """Goodput, interruption rate, checkpoint bandwidth, tokens/s and MFU."""
        if (booking is None) == (run is None):
            raise _local_refusal(ItoError("invalid_arguments", "give a booking or a run"))
        params = {"booking_id": booking} if booking else {"run_id": run}
        return self._call("GET", "/v1/telemetry", params=params)
