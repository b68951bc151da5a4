"""``ito``: the canonical client (DESIGN §5.10, §6).

Every command prints one §4 envelope with ``--json`` (anywhere on the line) and a readable
rendering without it; exit 0 ok, 1 refused or failed, 2 usage. Manifests are read securely
before any network call. Heavy modules are never imported: ``ito --help`` starts fast.
"""

from __future__ import annotations

import base64
import json
import os
import sys
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer

from ito.client.capabilities import capabilities as capability_contract
from ito.client.config import ClientConfig, load_config
from ito.client.secure_file import SecureRead, read_manifest_securely
from ito.client.transport import ApiClient, ApiRefusal, TransportFailure
from ito.console import Output, run_app
from ito.core.envelope import ok_envelope
from ito.core.errors import ItoError
from ito.core.secret_scan import scan_text

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="ito-training client. Add --json anywhere for the JSON envelope.")
manifest_app = typer.Typer(no_args_is_help=True, help="Create and check manifests locally.")
runs_app = typer.Typer(no_args_is_help=True, help="This account's runs.")
bookings_app = typer.Typer(no_args_is_help=True, help="This account's bookings.")
app.add_typer(manifest_app, name="manifest")
app.add_typer(runs_app, name="runs")
app.add_typer(bookings_app, name="bookings")

ACTIONS = {"train": "train.create", "cancel": "run.cancel", "cleanup": "run.cleanup",
           "restart": "run.restart_from_checkpoint"}


# --- plumbing ------------------------------------------------------------------------------------

def _client() -> ApiClient:
    return ApiClient(load_config())


def _api(client: ApiClient, method: str, path: str, *, mutation: bool = False,
         **kwargs: Any) -> dict[str, Any]:
    """The ok envelope, or finish the command with the API's refusal or the transport error."""
    try:
        return client.request(method, path, mutation=mutation, **kwargs)
    except ApiRefusal as refusal:
        Output.finish(refusal.envelope)
    except TransportFailure as failure:
        _transport_failed(failure, mutation)


def _transport_failed(failure: TransportFailure, mutation: bool) -> NoReturn:
    if not failure.live_api_contacted:
        notice = "the API could not be reached; nothing was sent"
    elif mutation:
        notice = "the request may have been applied but no answer came back"
    else:
        notice = "the API did not answer in time; nothing was changed"
    Output.fail(failure.error, live_api_contacted=failure.live_api_contacted, notice=notice)


def _read(path: str) -> SecureRead:
    try:
        return read_manifest_securely(path)
    except ItoError as exc:
        Output.fail(exc, live_api_contacted=False, notice="the manifest was refused before "
                    "anything was sent; nothing was created")


def _local_fail(error: ItoError) -> NoReturn:
    Output.fail(error, live_api_contacted=False)


# --- local commands ------------------------------------------------------------------------------

@app.command()
def capabilities() -> None:
    """The static capability contract (no credentials, no network)."""
    Output.finish(ok_envelope(capability_contract(), "capabilities of this client; nothing "
                              "was sent", live_api_contacted=False))


@app.command()
def config() -> None:
    """Print the configuration in effect (the key only by its public prefix)."""
    cfg: ClientConfig = load_config()
    Output.finish(ok_envelope({
        "api_url": cfg.api_url, "connect_timeout_s": cfg.connect_timeout,
        "timeout_s": cfg.timeout,
        "credential": {"source": "ITO_API_KEY" if cfg.api_key else None,
                       "key_prefix": cfg.key_prefix},
    }, "configuration from the environment; nothing was sent", live_api_contacted=False))


@app.command("find")
def find() -> None:
    """RFQ search: belongs to ito-compute, not this runtime."""
    _local_fail(ItoError("capability_unavailable", "'find' belongs to the ito-compute service"))


@app.command("evals")
def evals() -> None:
    """Node qualification: belongs to ito-compute, not this runtime."""
    _local_fail(ItoError("capability_unavailable", "'evals' belongs to the ito-compute service"))


@manifest_app.command("init")
def manifest_init(
    out: Annotated[str, typer.Option(help="Directory to write into (created 0700).")],
    recipe: Annotated[str, typer.Option(help="demo | test")] = "demo",
    force: Annotated[bool, typer.Option(help="Overwrite files already there.")] = False,
) -> None:
    """Write a complete manifest (mode 0600) and the small data files it references."""
    from ito.core.manifest import manifest_digest
    from ito.recipes import RECIPES, build_recipe

    if recipe not in RECIPES:
        _local_fail(ItoError("invalid_arguments", f"recipe must be one of {sorted(RECIPES)}"))
    directory = Path(out).expanduser().absolute()
    built = build_recipe(recipe, str(directory))
    names = ["manifest.json", *built.files]
    existing = [n for n in names if (directory / n).exists()]
    if existing and not force:
        _local_fail(ItoError("invalid_arguments", "files already exist; pass --force to "
                             "overwrite", existing=existing))
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    raw = json.dumps(built.manifest, indent=2).encode() + b"\n"
    for name, content in [("manifest.json", raw), *built.files.items()]:
        _write_private(directory / name, content)
    Output.finish(ok_envelope(
        {"manifest": str(directory / "manifest.json"), "manifest_id": manifest_digest(raw),
         "files": sorted(built.files), "recipe": recipe,
         "needs": built.manifest["resources"]},
        f"wrote the {recipe} manifest and its data; nothing was sent", live_api_contacted=False))


def _write_private(path: Path, content: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC,
                 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(content)
    os.chmod(path, 0o600)


@manifest_app.command("validate")
def manifest_validate(path: str) -> None:
    """Validate a manifest locally (secure read, schema, secret scan)."""
    from ito.core.manifest import manifest_summary, parse_manifest

    read = _read(path)
    try:
        manifest = parse_manifest(read.raw)
    except ItoError as exc:
        _local_fail(exc)
    Output.finish(ok_envelope({"manifest_id": read.digest, "valid": True,
                               "summary": manifest_summary(manifest)},
                              "the manifest is valid; nothing was sent",
                              live_api_contacted=False))


# --- API commands --------------------------------------------------------------------------------

@app.command()
def auth() -> None:
    """Validate the credential in use; never starts a login."""
    client = _client()
    Output.finish(_api(client, "GET", "/v1/me"))


@app.command()
def status(
    run: Annotated[str | None, typer.Option(help="A run id.")] = None,
    idempotency_key: Annotated[str | None, typer.Option(help="The key a run was created "
                                                        "with.")] = None,
) -> None:
    """This account's bookings and recent runs, or one run."""
    if run and idempotency_key:
        _local_fail(ItoError("invalid_arguments", "give --run or --idempotency-key, not both"))
    client = _client()
    if run:
        Output.finish(_api(client, "GET", f"/v1/runs/{run}"))
    if idempotency_key is not None:
        envelope = _api(client, "GET", "/v1/runs", params={"idempotency_key": idempotency_key})
        runs = envelope["data"]["runs"]
        if not runs:
            Output.fail(ItoError("run_not_found", "no run has this idempotency key"),
                        live_api_contacted=True, notice="no run was found; nothing was changed")
        Output.finish(ok_envelope(runs[0], f"run {runs[0]['run_id']} is {runs[0]['state']}"))
    Output.finish(_api(client, "GET", "/v1/status"))


@bookings_app.command("list")
def bookings_list() -> None:
    """Bookings of this account."""
    Output.finish(_api(_client(), "GET", "/v1/bookings"))


@bookings_app.command("show")
def bookings_show(booking: str) -> None:
    """One booking."""
    Output.finish(_api(_client(), "GET", f"/v1/bookings/{booking}"))


@bookings_app.command("eligibility")
def bookings_eligibility(booking: str) -> None:
    """Fresh training eligibility of a booking."""
    Output.finish(_api(_client(), "GET", f"/v1/bookings/{booking}/eligibility"))


@app.command()
def plan(
    booking: Annotated[str, typer.Option(help="Booking id.")],
    manifest: Annotated[str, typer.Option(help="Absolute path of the reviewed manifest.")],
) -> None:
    """What creating the run would do, and cost. Creates nothing."""
    read = _read(manifest)
    client = _client()
    Output.finish(_api(client, "POST", "/v1/plans", params={"booking_id": booking},
                       content=read.raw))


@app.command()
def confirm(
    action: Annotated[str, typer.Option(help="train | cancel | cleanup | restart")],
    booking: Annotated[str | None, typer.Option(help="Booking id (train).")] = None,
    manifest: Annotated[str | None, typer.Option(help="Manifest path (train).")] = None,
    run: Annotated[str | None, typer.Option(help="Run id (cancel, cleanup, restart).")] = None,
    checkpoint: Annotated[int | None, typer.Option(help="Checkpoint step (restart).")] = None,
    ttl_seconds: Annotated[int | None, typer.Option(help="Shorter expiry than the "
                                                    "server's default.")] = None,
) -> None:
    """Request a single-use confirmation; a human approves it out of band."""
    if action not in ACTIONS:
        _local_fail(ItoError("invalid_arguments", f"action must be one of {sorted(ACTIONS)}"))
    body: dict[str, Any] = {"action": ACTIONS[action]}
    if ttl_seconds is not None:
        body["ttl_seconds"] = ttl_seconds
    if action == "train":
        if not booking or not manifest or run:
            _local_fail(ItoError("invalid_arguments", "--action train needs --booking and "
                                 "--manifest"))
        read = _read(manifest)
        client = _client()
        body |= {"booking_id": booking, "manifest_id": read.digest,
                 "manifest_b64": base64.b64encode(read.raw).decode()}
    else:
        if not run or booking or manifest:
            _local_fail(ItoError("invalid_arguments", f"--action {action} needs --run only"))
        body["run_id"] = run
        if checkpoint is not None:
            body["checkpoint_step"] = checkpoint
        client = _client()
    Output.finish(_api(client, "POST", "/v1/confirmations", json=body, mutation=True))


@app.command()
def approve(ref: str) -> None:
    """Approve a confirmation (approver credential only)."""
    Output.finish(_api(_client(), "POST", f"/v1/confirmations/{ref}/approve", mutation=True))


@app.command()
def reject(ref: str) -> None:
    """Reject a confirmation (approver credential only)."""
    Output.finish(_api(_client(), "POST", f"/v1/confirmations/{ref}/reject", mutation=True))


@app.command()
def train(
    booking: Annotated[str, typer.Option(help="Booking id.")],
    manifest: Annotated[str, typer.Option(help="Absolute path of the reviewed manifest.")],
    confirmation_ref: Annotated[str, typer.Option(help="The approved confirmation.")],
    idempotency_key: Annotated[str, typer.Option(help="Your stable retry key.")],
) -> None:
    """Create a run behind the five gates. Retrying with the same key never makes a second."""
    from ito.core.gates import validate_idempotency_key

    try:
        validate_idempotency_key(idempotency_key)
    except ItoError as exc:
        _local_fail(exc)
    read = _read(manifest)
    client = _client()
    body: dict[str, Any] = {"booking_id": booking, "manifest_id": read.digest,
                            "confirmation_ref": confirmation_ref,
                            "idempotency_key": idempotency_key}
    try:
        client.request("GET", f"/v1/manifests/{read.digest}")
    except ApiRefusal as refusal:
        if refusal.code != "manifest_not_found":
            Output.finish(refusal.envelope)
        body["manifest_b64"] = base64.b64encode(read.raw).decode()
    except TransportFailure as failure:
        _transport_failed(failure, mutation=False)
    try:
        Output.finish(client.request("POST", "/v1/runs", json=body, mutation=True))
    except ApiRefusal as refusal:
        Output.finish(refusal.envelope)
    except TransportFailure as failure:
        if failure.error.code != "transport_ambiguous":
            _transport_failed(failure, mutation=True)
        _recover_lost_create(client, idempotency_key)


def _recover_lost_create(client: ApiClient, key: str) -> NoReturn:
    """The create may have committed: look the run up by its key before anything else."""
    try:
        envelope = client.request("GET", "/v1/runs", params={"idempotency_key": key})
    except (ApiRefusal, TransportFailure):
        envelope = None
    runs = envelope["data"]["runs"] if envelope else []
    if runs:
        run = runs[0]
        Output.finish(ok_envelope(
            {"booking_id": run["booking_id"], "run_id": run["run_id"],
             "manifest_id": run["manifest_id"], "idempotency_key": key, "state": run["state"],
             "stage": run["stage"], "replayed": True, "recovered_after_lost_response": True},
            "the response was lost; the run was found by its idempotency key (no second run "
            "was created)"))
    Output.fail(ItoError("transport_ambiguous", idempotency_key=key), live_api_contacted=True,
                notice="the request may have been applied; retry 'ito train' with the same "
                       "--idempotency-key to get the one run")


@runs_app.command("list")
def runs_list(
    booking: Annotated[str | None, typer.Option(help="Only runs on this booking.")] = None,
    limit: Annotated[int, typer.Option(help="Most recent N runs.")] = 50,
) -> None:
    """Runs of this account, newest first."""
    params: dict[str, Any] = {"limit": limit}
    if booking:
        params["booking_id"] = booking
    Output.finish(_api(_client(), "GET", "/v1/runs", params=params))


@runs_app.command("show")
def runs_show(run: str) -> None:
    """One run with its state events."""
    Output.finish(_api(_client(), "GET", f"/v1/runs/{run}"))


# --- entry point ---------------------------------------------------------------------------------

_SECRET_OPTIONS = ("--api-key", "--token", "--password", "--secret", "--bearer", "--key")


def _refuse_secret_arguments(argv: list[str]) -> None:
    for index, arg in enumerate(argv):
        name = arg.split("=", 1)[0].lower()
        if name in _SECRET_OPTIONS or scan_text(arg):
            raise ItoError("secret_in_arguments", position=index + 1)


def main() -> None:
    argv = sys.argv[1:]
    try:
        _refuse_secret_arguments(argv)
    except ItoError as exc:
        Output.json_mode = "--json" in argv
        try:
            Output.fail(exc, live_api_contacted=False)
        except typer.Exit as done:
            raise SystemExit(done.exit_code) from None
    run_app(app, argv, "ito")
