"""``ito login`` and ``ito logout`` (DESIGN §5.1).

Login is the OAuth 2.0 device authorization grant (RFC 8628): ask for a device code, show the
user code and verification URL (to stderr: stdout carries only the envelope), optionally open a
browser, then poll the token endpoint at the server's interval — slowing down by 5 s when told to
(RFC 8628 §3.5) — until approval, denial or expiry. The token is stored (keyring, or a private
file when allowed) and never printed. ``ITO_API_KEY`` is never used here.

Logout revokes remotely first; only then is the local token deleted. If the remote revocation
fails, the local token is kept and the envelope says so.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from ito.client.config import ClientConfig
from ito.client.credentials import TokenStore
from ito.core.envelope import error_envelope, ok_envelope
from ito.core.errors import ItoError
from ito.transport import ApiRefusal, TransportFailure

__all__ = ["device_login", "logout"]

SLOW_DOWN_STEP_SECONDS = 5.0


def device_login(
    config: ClientConfig,
    *,
    open_browser: bool,
    announce: Callable[[str], None],
    sleep: Callable[[float], None] = time.sleep,
) -> dict[str, Any]:
    store = TokenStore(config.api_url, config)
    anonymous = config.transport(None)
    try:
        grant = anonymous.request(
            "POST", "/v1/device/code", json={"client_name": "ito CLI"}, mutation=True
        )["data"]
    except ApiRefusal as refusal:
        return refusal.envelope
    except TransportFailure as failure:
        return error_envelope(
            failure,
            "the login could not start; nothing was stored",
            live_api_contacted=failure.live_api_contacted,
        )

    announce(
        f"To sign in, open {grant['verification_uri']} and enter the code "
        f"{grant['user_code']}\n(or open {grant['verification_uri_complete']})"
    )
    if open_browser:
        import webbrowser

        try:
            webbrowser.open(grant["verification_uri_complete"])
        except Exception:
            announce("Could not open a browser; open the URL yourself.")

    interval = float(grant.get("interval") or 5)
    deadline = time.monotonic() + float(grant["expires_in"])
    while True:
        sleep(interval)
        if time.monotonic() > deadline:
            return error_envelope(
                ItoError("device_code_expired"),
                "the login expired; nothing was stored",
                live_api_contacted=True,
            )
        try:
            token = anonymous.request(
                "POST",
                "/v1/device/token",
                json={"device_code": grant["device_code"]},
                mutation=True,
            )["data"]
        except ApiRefusal as refusal:
            if refusal.code == "authorization_pending":
                continue
            if refusal.code == "slow_down":
                interval += SLOW_DOWN_STEP_SECONDS
                continue
            return refusal.envelope | {
                "notice": "the login ended without a credential; nothing was stored"
            }
        except TransportFailure:
            continue  # polling is idempotent; the deadline bounds it
        break

    try:
        store.save(token["access_token"])
    except ItoError as exc:
        return error_envelope(
            exc,
            "the login was approved but the token could not be stored safely; it was discarded",
            live_api_contacted=True,
        )
    return ok_envelope(
        {
            "key_prefix": token["key_prefix"],
            "account_id": token["account_id"],
            "role": token.get("role"),
            "stored_in": store.kind,
        },
        f"logged in; the credential is stored in the {store.kind}",
    )


def logout(config: ClientConfig) -> dict[str, Any]:
    store = TokenStore(config.api_url, config)
    try:
        token = store.load()
    except ItoError as exc:
        return error_envelope(
            exc,
            "the stored credential could not be read; nothing changed",
            live_api_contacted=False,
        )
    if not token:
        return ok_envelope(
            {"logged_out": False},
            "no stored login for this API; nothing to do",
            live_api_contacted=False,
        )
    client = config.transport(token)
    try:
        client.request("POST", "/v1/credentials/self/revoke", mutation=True)
    except ApiRefusal as refusal:
        if refusal.code not in ("credential_revoked", "not_authenticated"):
            return refusal.envelope | {
                "notice": "remote revocation failed; the local credential was kept"
            }
    except TransportFailure as failure:
        return error_envelope(
            failure,
            "remote revocation failed; the local credential was kept",
            live_api_contacted=failure.live_api_contacted,
        )
    store.delete()
    return ok_envelope(
        {"logged_out": True}, "the credential was revoked on the server and deleted here"
    )
