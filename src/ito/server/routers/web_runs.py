"""The run dashboard under ``/ui`` (DESIGN §8): the runs list, a run's page, the bookings desk
view, and the forms on a run's page that request cancel / cleanup / restart confirmations.

Same rules as the other pages (:mod:`ito.server.routers.web`): a session cookie, never an API
key; every form's CSRF token checked before anything is read or decided; every read scoped to
the signed-in user's account, so another tenant's run answers the very page a missing one does.

A request button creates the same pending confirmation ``ito confirm --action cancel|cleanup|
restart`` creates, requested by the signed-in human; it is still decided on the approval page,
by an approver other than the one who asked (``self_approval_forbidden``). Pressing it again
shows the confirmation already open instead of making another. Once approved, the page's Apply
button uses it once, under the idempotency key ``web-<ref>``, so a repeated press replays.

Pages refresh their live part without a reload: ``/ui/static/dashboard.js`` (served from the
package, allowed by the pages' CSP as ``script-src 'self'``) fetches ``?part=live`` every few
seconds and swaps the fragment in.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import quote

from fastapi import APIRouter, Form, Query, Request
from fastapi.responses import RedirectResponse, Response

from ito.core.errors import ItoError
from ito.core.states import ConfirmationAction, RunState
from ito.server.routers.deps import State
from ito.server.routers.route import OneHopRoute
from ito.server.routers.web import _form_guard, _signed_in, _to_sign_in
from ito.server.services.approvals import run_confirmations
from ito.server.services.confirmations import request_confirmation
from ito.server.services.lifecycle import apply_run_action
from ito.server.services.web_sessions import SignedInUser
from ito.server.state import AppState
from ito.server.store.tables import utcnow
from ito.server.web.dashboard import bookings_page, run_page, runs_page
from ito.server.web.pages import DASHBOARD_HEADERS, SECURITY_HEADERS, error_page, render

router = APIRouter(prefix="/ui", include_in_schema=False, route_class=OneHopRoute)
log = logging.getLogger("ito.server.web")

FormField = Annotated[str, Form(max_length=4096)]
SCRIPT = Path(__file__).resolve().parent.parent / "web" / "static" / "dashboard.js"
REQUESTABLE = {
    "cancel": ConfirmationAction.run_cancel,
    "cleanup": ConfirmationAction.run_cleanup,
    "restart": ConfirmationAction.run_restart,
}


def _page(
    request: Request, state: State, part: str | None
) -> tuple[SignedInUser | None, str, Response | None]:
    """The signed-in user, or the answer for nobody: the sign-in page for a page, a plain
    401 for a live fragment (the script stops; it never swaps a sign-in form in)."""
    user, csrf = _signed_in(request, state)
    if user is not None:
        return user, csrf, None
    if part == "live":
        return None, "", error_page(ItoError("not_authenticated", "sign in first"))
    return None, "", _to_sign_in(request)


def _render(template: str, part: str | None, **context: Any) -> Response:
    """The whole page, or (``part=live``) only its live fragment."""
    if part == "live":
        return render(f"{template}_live.html", headers=DASHBOARD_HEADERS, **context)
    return render(f"{template}.html", headers=DASHBOARD_HEADERS, **context)


@router.get("/static/dashboard.js")
def dashboard_script() -> Response:
    return Response(
        SCRIPT.read_text(encoding="utf-8"),
        media_type="text/javascript",
        headers={"x-content-type-options": "nosniff", "cache-control": "no-cache"},
    )


@router.get("/runs")
def runs_list_page(
    request: Request,
    state: State,
    run_state: Annotated[str | None, Query(alias="state", max_length=40)] = None,
    booking: Annotated[str | None, Query(max_length=64)] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 100,
    part: Annotated[str | None, Query(max_length=10)] = None,
) -> Response:
    user, csrf, answer = _page(request, state, part)
    if answer is not None:
        return answer
    if run_state and run_state not in {s.value for s in RunState}:
        return error_page(
            ItoError("invalid_arguments", "state is one of the run states"),
            user=user,
            csrf_token=csrf,
        )
    assert user is not None
    with state.db.read() as session:
        view = runs_page(
            session,
            user.account_id,
            state=run_state or None,
            booking_id=booking or None,
            limit=limit,
        )
    return _render("runs", part, user=user, csrf_token=csrf, **view)


@router.get("/runs/{run_id}")
def run_detail_page(
    run_id: str,
    request: Request,
    state: State,
    part: Annotated[str | None, Query(max_length=10)] = None,
    requested: Annotated[str | None, Query(max_length=80)] = None,
    applied: Annotated[str | None, Query(max_length=80)] = None,
) -> Response:
    user, csrf, answer = _page(request, state, part)
    if answer is not None:
        return answer
    assert user is not None
    try:
        with state.db.read() as session:
            view = run_page(session, user.account_id, run_id, state.settings.public_url, utcnow())
    except ItoError as error:
        return error_page(error, user=user, csrf_token=csrf)
    return _render(
        "run",
        part,
        user=user,
        csrf_token=csrf,
        requested=requested,
        applied=applied,
        **view,
    )


def _open_request(
    state: AppState, user: SignedInUser, run_id: str, action: ConfirmationAction
) -> str | None:
    """This user's confirmation of ``action`` on the run still waiting or usable, if any."""
    with state.db.read() as session:
        for c in run_confirmations(
            session, user.account_id, run_id, state.settings.public_url, utcnow()
        ):
            if (
                c["action"] == action.value
                and c["requester_id"] == user.principal_id
                and c["state"] in ("pending", "approved")
            ):
                return str(c["confirmation_ref"])
    return None


def _back(run_id: str, **query: str) -> RedirectResponse:
    params = "&".join(f"{k}={quote(v, safe='')}" for k, v in query.items())
    return RedirectResponse(
        f"/ui/runs/{quote(run_id, safe='')}?{params}#actions",
        status_code=303,
        headers=SECURITY_HEADERS,
    )


@router.post("/runs/{run_id}/requests")
def run_request(
    run_id: str,
    request: Request,
    state: State,
    action: FormField = "",
    checkpoint_step: FormField = "",
    csrf_token: FormField = "",
) -> Response:
    user, csrf, refused = _form_guard(request, state, csrf_token)
    if refused is not None:
        return refused
    assert user is not None
    act = REQUESTABLE.get(action)
    step: int | None = None
    if act is ConfirmationAction.run_restart:
        digits = (
            checkpoint_step.isascii() and checkpoint_step.isdigit() and len(checkpoint_step) < 19
        )
        step = int(checkpoint_step) if digits else None  # a step fits 63 bits, like the API's
    if act is None or (act is ConfirmationAction.run_restart and step is None):
        return error_page(
            ItoError("invalid_arguments", "action is cancel, cleanup or restart (with its step)"),
            user=user,
            csrf_token=csrf,
        )
    existing = _open_request(state, user, run_id, act)
    if existing is not None:
        return _back(run_id, requested=existing)
    try:
        with state.db.write() as session:
            row = request_confirmation(
                session,
                user.auth_context(),
                action=act.value,
                ttl_seconds=state.settings.confirmation_ttl_seconds,
                run_id=run_id,
                checkpoint_step=step,
            )
            ref = row.id
    except ItoError as error:
        return error_page(error, user=user, csrf_token=csrf)
    log.info(
        "confirmation %s (%s of run %s) requested on the web by user %s",
        ref,
        act.value,
        run_id,
        user.user_id,
    )
    return _back(run_id, requested=ref)


@router.post("/runs/{run_id}/apply")
def run_apply(
    run_id: str,
    request: Request,
    state: State,
    confirmation_ref: FormField = "",
    csrf_token: FormField = "",
) -> Response:
    user, csrf, refused = _form_guard(request, state, csrf_token)
    if refused is not None:
        return refused
    assert user is not None
    try:
        with state.db.read() as session:
            ours = [
                c
                for c in run_confirmations(
                    session, user.account_id, run_id, state.settings.public_url, utcnow()
                )
                if c["confirmation_ref"] == confirmation_ref
            ]
        if not ours:
            raise ItoError("confirmation_not_found")
        apply_run_action(
            state.db,
            user.auth_context(),
            state.pepper,
            run_id=run_id,
            action=ours[0]["action"],
            confirmation_ref=confirmation_ref,
            idempotency_key=f"web-{confirmation_ref}",
        )
    except ItoError as error:
        return error_page(error, user=user, csrf_token=csrf)
    log.info(
        "confirmation %s applied to run %s on the web by user %s",
        confirmation_ref,
        run_id,
        user.user_id,
    )
    return _back(run_id, applied=confirmation_ref)


@router.get("/bookings")
def bookings_list_page(
    request: Request,
    state: State,
    part: Annotated[str | None, Query(max_length=10)] = None,
) -> Response:
    user, csrf, answer = _page(request, state, part)
    if answer is not None:
        return answer
    assert user is not None
    with state.db.read() as session:
        view = bookings_page(session, user.account_id)
    return _render("bookings", part, user=user, csrf_token=csrf, **view)
