"""The web pages under ``/ui``: approver sign-in, device-login approval (RFC 8628's
verification page) and confirmation approval (DESIGN §5.5, §8).

Every page needs a signed-in user (a session cookie); API keys are not accepted here. Every form
carries a CSRF token checked in constant time before anything is read or decided. A GET without
a session is sent to the sign-in page and back; a POST without one is refused. Refusals render
the error page with their code's status instead of the JSON envelope.
"""

from __future__ import annotations

import logging
from typing import Annotated, Any
from urllib.parse import quote

from fastapi import APIRouter, Form, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from ito.core.errors import ItoError
from ito.server.routers.deps import State, source_of
from ito.server.routers.route import OneHopRoute
from ito.server.services.approvals import (
    account_view,
    confirmation_view,
    pending_confirmations,
)
from ito.server.services.confirmations import decide_confirmation
from ito.server.services.device_auth import (
    decide_device_code,
    device_code_view,
    format_user_code,
)
from ito.server.services.users import (
    find_sign_in_candidate,
    rehash_password,
    set_password_hash,
    verify_password,
)
from ito.server.services.web_sessions import (
    SignedInUser,
    csrf_token,
    csrf_valid,
    end_session,
    new_secret,
    resolve_session,
    start_session,
)
from ito.server.state import AppState
from ito.server.store.tables import utcnow
from ito.server.web.pages import SECURITY_HEADERS, error_page, render

router = APIRouter(prefix="/ui", include_in_schema=False, route_class=OneHopRoute)
log = logging.getLogger("ito.server.web")

SESSION_COOKIE = "ito_session"
LOGIN_COOKIE = "ito_login"
LOGIN_COOKIE_SECONDS = 3600
FormField = Annotated[str, Form(max_length=4096)]


# --- sessions and redirects -------------------------------------------------------------------


def _secure(state: AppState) -> bool:
    return state.settings.public_url.lower().startswith("https://")


def _signed_in(request: Request, state: AppState) -> tuple[SignedInUser | None, str]:
    """The user behind the session cookie and that user's CSRF token (empty when none)."""
    secret = request.cookies.get(SESSION_COOKIE)
    with state.db.read() as session:
        user = resolve_session(session, state.pepper, secret, utcnow())
    if user is None or secret is None:
        return None, ""
    return user, csrf_token(state.pepper, "session", secret)


def _safe_next(value: str | None) -> str:
    """Only a local page under /ui: never another host (``//evil``, ``/\\evil``, schemes) nor
    a way out of /ui (``/ui/../``)."""
    if (
        not value
        or not (value == "/ui" or value.startswith(("/ui/", "/ui?")))
        or "\\" in value
        or "/.." in value
        or "%2e" in value.lower()
        or len(value) > 2000
        or any(ord(ch) < 33 or ord(ch) == 127 for ch in value)
    ):
        return "/ui/"
    return value


def _to_sign_in(request: Request) -> RedirectResponse:
    here = request.url.path + (f"?{request.url.query}" if request.url.query else "")
    return RedirectResponse(
        f"/ui/login?next={quote(here, safe='')}", status_code=303, headers=SECURITY_HEADERS
    )


def _approver(user: SignedInUser, csrf: str) -> HTMLResponse | None:
    """Pages decide as an approver; any other role is refused."""
    if user.role != "approver":
        return error_page(
            ItoError("forbidden_scope", required=["approver"]), user=user, csrf_token=csrf
        )
    return None


def _form_guard(
    request: Request, state: AppState, presented: str
) -> tuple[SignedInUser | None, str, HTMLResponse | None]:
    """For a POST: a signed-in approver and a valid CSRF token, or the refusal page."""
    secret = request.cookies.get(SESSION_COOKIE)
    user, csrf = _signed_in(request, state)
    if user is None:
        # Back to the page the form was on once signed in (a path of ours: _safe_next).
        here = _safe_next(request.url.path)
        return (
            None,
            "",
            error_page(
                ItoError("not_authenticated", "sign in first"),
                sign_in_url=f"/ui/login?next={quote(here, safe='')}",
            ),
        )
    if not csrf_valid(state.pepper, "session", secret, presented):
        log.warning("csrf check failed for web session %s on %s", user.session_id, request.url.path)
        return None, "", error_page(ItoError("csrf_failed"), user=user, csrf_token=csrf)
    return user, csrf, _approver(user, csrf)


def _account(state: AppState, account_id: str) -> dict[str, str]:
    with state.db.read() as session:
        return account_view(session, account_id)


# --- sign-in ----------------------------------------------------------------------------------


def _login_page(
    state: AppState,
    login_secret: str,
    *,
    next_url: str,
    email: str = "",
    error: ItoError | None = None,
) -> HTMLResponse:
    response = render(
        "login.html",
        error.status if error else 200,
        next=next_url,
        email=email,
        error=error,
        login_csrf=csrf_token(state.pepper, "login", login_secret),
    )
    response.set_cookie(
        LOGIN_COOKIE,
        login_secret,
        max_age=LOGIN_COOKIE_SECONDS,
        path="/ui",
        secure=_secure(state),
        httponly=True,
        samesite="strict",
    )
    return response


def _login_secret(request: Request) -> str:
    value = request.cookies.get(LOGIN_COOKIE, "")
    return value if 20 <= len(value) <= 100 else new_secret()


@router.get("/login")
def login_form(request: Request, state: State, next: str | None = None) -> Response:
    user, _ = _signed_in(request, state)
    if user is not None:
        return RedirectResponse(_safe_next(next), status_code=303, headers=SECURITY_HEADERS)
    return _login_page(state, _login_secret(request), next_url=_safe_next(next))


@router.post("/login")
async def login_submit(
    request: Request,
    state: State,
    email: FormField = "",
    password: FormField = "",
    csrf_token: FormField = "",
    next: FormField = "",
) -> Response:
    next_url = _safe_next(next)
    if not csrf_valid(state.pepper, "login", request.cookies.get(LOGIN_COOKIE), csrf_token):
        return error_page(ItoError("csrf_failed"))
    # Password guessing gets a few tries a minute per account email (from anywhere) and per
    # address and email; an address gets a few times that over all emails (a spray of many
    # emails is stopped, while one account's guesser behind a shared NAT never reaches it).
    account = "email:" + email.strip().lower()
    address = source_of(request)
    sources = (f"{address} {account}", account)
    try:
        for source in sources:  # the window is in the database: off the event loop
            await run_in_threadpool(state.limits.check_source, source)
        await run_in_threadpool(state.limits.check_sign_in_address, address)
    except ItoError as limited:
        log.warning("web sign-in refused: rate limited")
        return _login_page(
            state, _login_secret(request), next_url=next_url, email=email, error=limited
        )

    def check() -> tuple[str, str] | None:
        with state.db.read() as session:
            candidate = find_sign_in_candidate(session, email)
        # argon2 runs outside any transaction, and as long for an unknown email.
        if not verify_password(candidate.password_hash if candidate else None, password):
            return None
        assert candidate is not None
        fresh_hash = rehash_password(candidate.password_hash, password)
        with state.db.write() as session:
            if fresh_hash is not None:
                set_password_hash(session, candidate.user_id, fresh_hash)
            secret, row = start_session(
                session,
                state.pepper,
                user_id=candidate.user_id,
                account_id=candidate.account_id,
                now=utcnow(),
                ttl_seconds=state.settings.web_session_ttl_seconds,
            )
            log.info("web sign-in: user %s, session %s", candidate.user_id, row.id)
        return secret, row.id

    outcome = await run_in_threadpool(check)
    if outcome is None:
        for source in sources:
            await run_in_threadpool(state.limits.failed, source)
        await run_in_threadpool(state.limits.sign_in_address_failed, address)
        log.warning("web sign-in refused: invalid credentials")
        return _login_page(
            state,
            _login_secret(request),
            next_url=next_url,
            email=email,
            error=ItoError("invalid_credentials"),
        )
    secret, _ = outcome
    response = RedirectResponse(next_url, status_code=303, headers=SECURITY_HEADERS)
    response.set_cookie(
        SESSION_COOKIE,
        secret,
        max_age=state.settings.web_session_ttl_seconds,
        path="/ui",
        secure=_secure(state),
        httponly=True,
        samesite="strict",
    )
    response.delete_cookie(
        LOGIN_COOKIE, path="/ui", secure=_secure(state), httponly=True, samesite="strict"
    )
    return response


@router.post("/logout")
def logout(request: Request, state: State, csrf_token: FormField = "") -> Response:
    user, _ = _signed_in(request, state)
    if user is not None:
        if not csrf_valid(state.pepper, "session", request.cookies.get(SESSION_COOKIE), csrf_token):
            return error_page(ItoError("csrf_failed"))
        with state.db.write() as session:
            end_session(session, user.session_id, utcnow())
        log.info("web sign-out: user %s, session %s", user.user_id, user.session_id)
    response = RedirectResponse("/ui/login", status_code=303, headers=SECURITY_HEADERS)
    response.delete_cookie(
        SESSION_COOKIE, path="/ui", secure=_secure(state), httponly=True, samesite="strict"
    )
    return response


# --- start page -------------------------------------------------------------------------------


@router.get("")
@router.get("/")
def home(request: Request, state: State) -> Response:
    user, csrf = _signed_in(request, state)
    if user is None:
        return _to_sign_in(request)
    with state.db.read() as session:
        pending = pending_confirmations(
            session, user.account_id, state.settings.public_url, utcnow()
        )
    return render(
        "home.html",
        user=user,
        csrf_token=csrf,
        pending=pending,
        account=_account(state, user.account_id),
    )


# --- device login (RFC 8628 §3.3) -------------------------------------------------------------


@router.get("/device")
def device_page(request: Request, state: State, user_code: str | None = None) -> Response:
    user, csrf = _signed_in(request, state)
    if user is None:
        return _to_sign_in(request)
    if (refused := _approver(user, csrf)) is not None:
        return refused
    if not user_code:
        return render("device_enter.html", user=user, csrf_token=csrf)
    try:
        with state.db.read() as session:
            row = device_code_view(session, user_code, utcnow())
            view: dict[str, Any] = {
                "user_code": format_user_code(row.user_code),
                "client_name": row.client_name,
                "created_at": row.created_at.isoformat(timespec="seconds"),
                "expires_at": row.expires_at.isoformat(timespec="seconds"),
            }
    except ItoError as error:
        return error_page(error, user=user, csrf_token=csrf)
    return render(
        "device.html", user=user, csrf_token=csrf, account=_account(state, user.account_id), **view
    )


@router.post("/device")
def device_decide(
    request: Request,
    state: State,
    user_code: FormField = "",
    decision: FormField = "",
    csrf_token: FormField = "",
) -> Response:
    user, csrf, refused = _form_guard(request, state, csrf_token)
    if refused is not None:
        return refused
    assert user is not None
    if decision not in ("approve", "deny"):
        return error_page(
            ItoError("invalid_arguments", "decision is approve or deny"), user=user, csrf_token=csrf
        )
    try:
        with state.db.write() as session:
            row = decide_device_code(
                session, user, user_code, approve=decision == "approve", now=utcnow()
            )
            code_id, decided = row.id, row.state
    except ItoError as error:
        return error_page(error, user=user, csrf_token=csrf)
    log.info(
        "device login %s %s by user %s (account %s)",
        code_id,
        decided,
        user.user_id,
        user.account_id,
    )
    return render(
        "device_done.html",
        user=user,
        csrf_token=csrf,
        state=decided,
        user_code=format_user_code(row.user_code),
        account=_account(state, user.account_id),
    )


# --- confirmations (DESIGN §5.5) --------------------------------------------------------------


@router.get("/confirmations/{ref}")
def confirmation_page(
    ref: str, request: Request, state: State, decided: str | None = None
) -> Response:
    user, csrf = _signed_in(request, state)
    if user is None:
        return _to_sign_in(request)
    if (refused := _approver(user, csrf)) is not None:
        return refused
    try:
        with state.db.read() as session:
            view = confirmation_view(session, user.account_id, ref, state.settings.public_url)
    except ItoError as error:
        return error_page(error, user=user, csrf_token=csrf)
    notice = {
        "approved": "Approved. The requester can use it once, before it expires.",
        "rejected": "Rejected. It can never be used.",
    }.get(decided or "")
    return render("confirmation.html", user=user, csrf_token=csrf, notice=notice, **view)


@router.post("/confirmations/{ref}")
def confirmation_decide(
    ref: str, request: Request, state: State, decision: FormField = "", csrf_token: FormField = ""
) -> Response:
    user, csrf, refused = _form_guard(request, state, csrf_token)
    if refused is not None:
        return refused
    assert user is not None
    if decision not in ("approve", "reject"):
        return error_page(
            ItoError("invalid_arguments", "decision is approve or reject"),
            user=user,
            csrf_token=csrf,
        )
    try:
        with state.db.write() as session:
            row = decide_confirmation(
                session, user.auth_context(), state.pepper, ref, approve=decision == "approve"
            )
            decided = row.state
    except ItoError as error:
        return error_page(error, user=user, csrf_token=csrf)
    log.info("confirmation %s %s on the web by user %s", ref, decided, user.user_id)
    return RedirectResponse(
        f"/ui/confirmations/{quote(ref, safe='')}?decided={decided}",
        status_code=303,
        headers=SECURITY_HEADERS,
    )
