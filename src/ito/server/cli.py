"""``ito-server``: migrate, serve, and the desk's operator commands (DESIGN §5.10).

Operator commands act on the database directly (the operator holds it); every one takes
``--json`` and prints the §4 envelope. ``--database-url`` defaults to the embedded SQLite file
under ``$ITO_HOME``; ``ITO_DATABASE_URL`` sets it too (read by :mod:`ito.server.settings`, as
every setting; ``ito-server config`` prints them). Every command that changes tenant data or
the operator's keys is recorded in the audit trail (actor ``cli:<os user>``); ``ito-server
audit`` reads it. Operator (desk) keys are minted here only, and for no account.
"""

from __future__ import annotations

import sys
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any

import typer

from ito.console import Output, run_app
from ito.core.envelope import ok_envelope
from ito.core.errors import ItoError

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="ito-training server: API, migrations and desk operations.",
)
account_app = typer.Typer(no_args_is_help=True, help="Accounts (tenants).")
key_app = typer.Typer(no_args_is_help=True, help="API keys.")
booking_app = typer.Typer(no_args_is_help=True, help="Bookings, as the desk records them.")
user_app = typer.Typer(no_args_is_help=True, help="Web users (approvers who sign in).")
app.add_typer(account_app, name="account")
app.add_typer(key_app, name="key")
app.add_typer(booking_app, name="booking")
app.add_typer(user_app, name="user")

DatabaseUrl = Annotated[
    str | None,
    typer.Option(
        "--database-url",
        help="SQLAlchemy URL (default: $ITO_DATABASE_URL, else embedded SQLite under $ITO_HOME).",
    ),
]


def _open(database_url: str | None, *, check_schema: bool = True) -> Any:
    from ito.server.home import private_umask, secure_state
    from ito.server.settings import load_settings
    from ito.server.store.db import Database, require_current_schema

    private_umask()  # before anything is created: every file of ours is 0600
    settings = load_settings(database_url)
    if settings.is_embedded():
        settings.home.mkdir(mode=0o700, parents=True, exist_ok=True)
    secure_state(settings.home, _sqlite_path(settings.resolved_database_url()))
    db = Database(settings.resolved_database_url(), pool_size=settings.db_pool_size)
    if check_schema:
        require_current_schema(db)
    return settings, db


def _sqlite_path(url: str) -> Path | None:
    from sqlalchemy.engine import make_url

    parsed = make_url(url)
    if (
        parsed.get_backend_name() != "sqlite"
        or not parsed.database
        or parsed.database == ":memory:"
    ):
        return None
    return Path(parsed.database)


@app.command()
def config(database_url: DatabaseUrl = None) -> None:
    """Print the settings in effect and where each came from; creates and opens nothing (no
    secret: the pepper shows as set/not set, a database password as ***)."""
    from pydantic import ValidationError

    from ito.server.settings import ServerSettings, pepper_state
    from ito.settings import env_name, mask_url

    try:
        settings = ServerSettings()
    except ValidationError as exc:
        names = sorted({env_name(str(e["loc"][0])) for e in exc.errors() if e["loc"]})
        Output.fail(
            ItoError("invalid_arguments", f"{', '.join(names)} is not valid"),
            live_api_contacted=False,
        )
    if database_url:
        settings = settings.with_source("argument", database_url=database_url)
    shown = settings.effective()
    shown["pepper"] |= pepper_state(settings)
    Output.finish(
        ok_envelope(
            {
                "settings": shown,
                "database": mask_url(settings.resolved_database_url()),
                "embedded": settings.is_embedded(),
            },
            "configuration from the environment; nothing was opened or created",
            live_api_contacted=False,
        )
    )


@app.command()
def migrate(database_url: DatabaseUrl = None) -> None:
    """Upgrade the database schema to the current version."""
    from ito.server.store.db import migrate as run_migrations
    from ito.server.store.db import schema_revision

    _, db = _open(database_url, check_schema=False)
    before, _ = schema_revision(db)
    run_migrations(db)
    after, _ = schema_revision(db)
    db.dispose()
    notice = "schema already current" if before == after else f"schema migrated to {after}"
    Output.finish(ok_envelope({"from": before, "to": after}, notice, live_api_contacted=False))


@app.command()
def serve(
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on.")] = 8000,
    no_worker: Annotated[
        bool, typer.Option("--no-worker", help="Do not run the in-process worker.")
    ] = False,
    database_url: DatabaseUrl = None,
    log_level: Annotated[str, typer.Option(help="uvicorn log level.")] = "info",
    workers: Annotated[
        int,
        typer.Option(
            min=1,
            max=64,
            help="API processes (uvicorn "
            "workers). Above 1 only where the store allows it: "
            "PostgreSQL, or SQLite in WAL mode.",
        ),
    ] = 1,
) -> None:
    """Serve the canonical API over HTTP."""
    import os

    import uvicorn

    from ito.server.app import create_app
    from ito.server.logging_config import log_config

    settings, db = _open(database_url)
    if settings.public_url == "http://127.0.0.1:8000" and (host, port) != ("127.0.0.1", 8000):
        settings = settings.model_copy(update={"public_url": f"http://{host}:{port}"})
    local = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host  # noqa: S104
    worker_url = None if no_worker else f"http://{local}:{port}"
    proxies = [p.strip() for p in settings.trusted_proxies.split(",") if p.strip()]
    # Forwarded headers only from named proxies: uvicorn's default trusts them from loopback.
    options: dict[str, Any] = {
        "host": host,
        "port": port,
        "log_level": log_level,
        "server_header": False,
        "proxy_headers": bool(proxies),
        "forwarded_allow_ips": proxies or None,
        "log_config": log_config(),
    }
    if workers == 1:
        uvicorn.run(create_app(settings, db, embedded_worker_url=worker_url), **options)
        return
    from ito.server.background import BackgroundDuties
    from ito.server.state import AppState
    from ito.server.store.db import several_processes_refusal

    refusal = several_processes_refusal(db)
    if refusal is not None:
        raise ItoError(
            "invalid_arguments",
            f"--workers {workers} needs a store that several processes can share: {refusal}",
            workers=workers,
        )
    # Each worker process builds its app from the environment (ito.server.asgi); the
    # background duties (lease sweeper, embedded worker) run once, here, in the supervisor.
    os.environ["ITO_DATABASE_URL"] = settings.resolved_database_url()
    os.environ["ITO_PUBLIC_URL"] = settings.public_url
    duties = BackgroundDuties(AppState(settings=settings, db=db), worker_url)
    duties.start()
    try:
        uvicorn.run(
            "ito.server.asgi:app_from_environment", factory=True, workers=workers, **options
        )
    finally:
        duties.stop()


@account_app.command("create")
def account_create(
    name: Annotated[str, typer.Option(help="Display name of the tenant.")],
    database_url: DatabaseUrl = None,
) -> None:
    """Create an account (a tenant)."""
    from ito.server.services.accounts import create_account
    from ito.server.services.audit import Actor, audited

    _, db = _open(database_url)
    with audited(
        db, Actor.cli(), "account.create", target_kind="account", details={"name": name}
    ) as (session, note):
        account = create_account(session, name)
        note.account_id = note.target_id = account.id
        data = {"account_id": account.id, "name": account.name}
    Output.finish(ok_envelope(data, "account created", live_api_contacted=False))


@key_app.command("create")
def key_create(
    role: Annotated[
        str,
        typer.Option(
            help="requester | approver | worker (a tenant's, with "
            "--account) or desk (the operator's, without)"
        ),
    ],
    account: Annotated[
        str | None, typer.Option(help="Account id of a tenant key; never given for --role desk.")
    ] = None,
    name: Annotated[str | None, typer.Option(help="A label for the key.")] = None,
    booking: Annotated[str | None, typer.Option(help="Booking a worker key is bound to.")] = None,
    database_url: DatabaseUrl = None,
) -> None:
    """Mint an API key; it is shown once and only its hash is kept. A desk key is the
    platform operator's and belongs to no account."""
    from ito.server.services.audit import Actor, audited
    from ito.server.services.credentials import OPERATOR_ROLE, create_key, create_operator_key

    settings, db = _open(database_url)
    pepper = settings.pepper.get_secret_value()
    with audited(
        db,
        Actor.cli(),
        "key.create",
        account_id=account,
        target_kind="key",
        details={"role": role, "name": name, "booking_id": booking},
    ) as (session, note):
        if role == OPERATOR_ROLE:
            if account is not None or booking is not None:
                raise ItoError(
                    "invalid_arguments",
                    "a desk key is the operator's: it takes no --account and no --booking",
                )
            minted = create_operator_key(session, pepper, name=name)
        elif account is None:
            raise ItoError("invalid_arguments", f"a {role} key needs --account")
        else:
            minted = create_key(
                session, pepper, account_id=account, role=role, name=name, booking_id=booking
            )
        note.target_id = minted.key_id
        note.details["key_prefix"] = minted.prefix
    Output.finish(
        ok_envelope(
            {
                "key_id": minted.key_id,
                "principal_id": minted.principal_id,
                "key_prefix": minted.prefix,
                "role": role,
                "account_id": account,
                "api_key": minted.api_key,
            },
            "key created; the api_key is shown once and never stored",
            live_api_contacted=False,
        )
    )


@key_app.command("revoke")
def key_revoke(key_id: str, database_url: DatabaseUrl = None) -> None:
    """Revoke a key; its next request gets credential_revoked."""
    from ito.server.services.audit import Actor, audited
    from ito.server.services.credentials import revoke_key

    _, db = _open(database_url)
    with audited(db, Actor.cli(), "key.revoke", target_kind="key", target_id=key_id) as (
        session,
        note,
    ):
        key = revoke_key(session, key_id)
        note.details["key_prefix"] = key.prefix
        data = {"key_id": key.id, "key_prefix": key.prefix, "revoked": True}
    Output.finish(ok_envelope(data, "key revoked", live_api_contacted=False))


def _read_password(from_stdin: bool) -> str:
    """The new password: one line of stdin, or typed twice at a hidden prompt. Never echoed."""
    if from_stdin:
        line = sys.stdin.readline()
        password = line[:-1] if line.endswith("\n") else line
        password = password.removesuffix("\r")
        if not password:
            raise ItoError("invalid_arguments", "--password-stdin read no password")
        return password
    if not sys.stdin.isatty():
        raise ItoError("invalid_arguments", "no terminal to prompt on; use --password-stdin")
    first = typer.prompt("Password", hide_input=True, err=True)
    second = typer.prompt("Repeat password", hide_input=True, err=True)
    if not isinstance(first, str) or first != second:
        raise ItoError("invalid_arguments", "the two passwords differ")
    return first


@user_app.command("create")
def user_create(
    account: Annotated[str, typer.Option(help="Account id.")],
    email: Annotated[str, typer.Option(help="Sign-in email of the user.")],
    role: Annotated[str, typer.Option(help="approver (the only web role)")] = "approver",
    password_stdin: Annotated[
        bool,
        typer.Option(
            "--password-stdin",
            help="Read the password from the first line of stdin instead of prompting.",
        ),
    ] = False,
    database_url: DatabaseUrl = None,
) -> None:
    """Create a web user: an approver principal that signs in with an argon2-hashed password."""
    from ito.server.services.audit import Actor, audited
    from ito.server.services.users import USER_ROLES, create_user, hash_password, normalise_email

    if role not in USER_ROLES:
        raise ItoError(
            "invalid_arguments",
            f"a user's role must be one of {', '.join(USER_ROLES)}"
            "; requesters use keys or ito login",
        )
    normalised = normalise_email(email)
    _, db = _open(database_url)
    # Hashed before the transaction opens: argon2 is slow on purpose.
    password_hash = hash_password(_read_password(password_stdin))
    with audited(
        db,
        Actor.cli(),
        "user.create",
        account_id=account,
        target_kind="user",
        details={"email": normalised, "role": role},
    ) as (session, note):
        user = create_user(
            session, account_id=account, role=role, email=normalised, password_hash=password_hash
        )
        note.target_id = user.id
        data = {
            "user_id": user.id,
            "principal_id": user.principal_id,
            "account_id": user.account_id,
            "email": user.email,
            "role": role,
        }
    Output.finish(
        ok_envelope(data, "user created; they can sign in at /ui/login", live_api_contacted=False)
    )


def _when(value: str, field: str) -> datetime:
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise ItoError("invalid_arguments", f"--{field} is not an ISO 8601 time") from None
    if parsed.tzinfo is None:
        raise ItoError("invalid_arguments", f"--{field} needs a time zone (e.g. Z)")
    return parsed


@booking_app.command("create")
def booking_create(
    account: Annotated[str, typer.Option(help="Account id.")],
    gpu: Annotated[str, typer.Option(help="h100 | h200 | a100 | b200 | cpu")],
    nodes: Annotated[int, typer.Option(help="Booked nodes.")],
    gpus_per_node: Annotated[int, typer.Option(help="Accelerators per node.")],
    region: Annotated[str, typer.Option(help="Region name.")],
    fabric: Annotated[str, typer.Option(help="infiniband | roce | ethernet | nvlink")],
    start: Annotated[str, typer.Option(help="Term start, ISO 8601 with zone.")],
    end: Annotated[str, typer.Option(help="Term end, ISO 8601 with zone.")],
    rate_usd_per_gpu_hour: Annotated[float, typer.Option(help="Price per GPU-hour.")],
    storage_uri: Annotated[str, typer.Option(help="Checkpoint storage of the booking.")],
    storage_quota_gb: Annotated[float, typer.Option(help="Storage quota in GB.")] = 100.0,
    state: Annotated[str, typer.Option(help="pending | completed")] = "pending",
    database_url: DatabaseUrl = None,
) -> None:
    """Record a booking the desk made."""
    from ito.server.services.audit import Actor, audited
    from ito.server.services.bookings import NewBooking, booking_dict, create_booking

    new = NewBooking(
        account_id=account,
        gpu=gpu,
        nodes=nodes,
        gpus_per_node=gpus_per_node,
        region=region,
        fabric=fabric,
        term_start=_when(start, "start"),
        term_end=_when(end, "end"),
        rate_usd_per_gpu_hour=rate_usd_per_gpu_hour,
        storage_uri=storage_uri,
        storage_quota_gb=storage_quota_gb,
        state=state,
    )
    _, db = _open(database_url)
    with audited(db, Actor.cli(), "booking.create", account_id=account, target_kind="booking") as (
        session,
        note,
    ):
        data = booking_dict(create_booking(session, new))
        note.target_id = data["booking_id"]
        note.details["state"] = data["state"]
    Output.finish(
        ok_envelope(data, f"booking recorded ({data['state']})", live_api_contacted=False)
    )


@booking_app.command("set-state")
def booking_set_state(
    booking: str,
    state: Annotated[str, typer.Option(help="completed | expired | revoked | released")],
    database_url: DatabaseUrl = None,
) -> None:
    """Move a booking to a new state, as the desk decided."""
    from ito.server.services.audit import Actor, audited
    from ito.server.services.bookings import booking_dict, move_booking

    _, db = _open(database_url)
    with audited(
        db,
        Actor.cli(),
        "booking.set_state",
        target_kind="booking",
        target_id=booking,
        details={"to_state": state},
    ) as (session, note):
        moved, previous = move_booking(session, booking, state)
        note.details["from_state"] = previous
        data = booking_dict(moved)
    Output.finish(ok_envelope(data, f"booking is now {data['state']}", live_api_contacted=False))


@app.command()
def audit(
    account: Annotated[str | None, typer.Option(help="Only this account's events.")] = None,
    limit: Annotated[
        int, typer.Option(min=1, max=10000, help="At most this many, newest first.")
    ] = 100,
    database_url: DatabaseUrl = None,
) -> None:
    """The desk's audit trail: who did what to which account, when, and how it ended."""
    from ito.server.services.audit import audit_dict, list_audit

    _, db = _open(database_url)
    with db.read() as session:
        rows = [audit_dict(r) for r in list_audit(session, account_id=account, limit=limit)]
    Output.finish(
        ok_envelope(
            {"events": rows}, f"{len(rows)} audit event(s), newest first", live_api_contacted=False
        )
    )


def main() -> None:
    run_app(
        app, sys.argv[1:], "ito-server", refusal_notice="refused; nothing was created or changed"
    )
