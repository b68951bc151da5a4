"""``ito``: the canonical client (DESIGN §5.10, §6).

Every command prints one §4 envelope with ``--json`` (anywhere on the line) and a readable
rendering without it; exit 0 ok, 1 refused or failed, 2 usage. Manifests are read securely
before any network call. Heavy modules are never imported: ``ito --help`` starts fast.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer

from ito.client.capabilities import capabilities as capability_contract
from ito.console import Output, run_app
from ito.core.envelope import ok_envelope
from ito.core.errors import ItoError
from ito.core.secret_scan import scan_text

if TYPE_CHECKING:
    from ito.client.operations import Operations
    from ito.client.secure_file import SecureRead

# The settings, credentials, HTTP and manifest modules are imported by the commands that use
# them: ``ito --version``, ``--help`` and ``capabilities`` start without them
# (bench/client_start.py).

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="ito-training client. Add --json anywhere for the JSON envelope.",
)
manifest_app = typer.Typer(no_args_is_help=True, help="Create and check manifests locally.")
runs_app = typer.Typer(no_args_is_help=True, help="This account's runs.")
bookings_app = typer.Typer(no_args_is_help=True, help="This account's bookings.")
app.add_typer(manifest_app, name="manifest")
app.add_typer(runs_app, name="runs")
app.add_typer(bookings_app, name="bookings")


def _print_version(value: bool) -> None:
    if value:
        from importlib.metadata import PackageNotFoundError, version

        try:
            typer.echo(f"ito {version('ito-training')}")
        except PackageNotFoundError:
            typer.echo("ito (not installed as a package)")
        raise typer.Exit()


@app.callback()
def _main(
    version: Annotated[
        bool,
        typer.Option(
            "--version",
            is_eager=True,
            callback=_print_version,
            help="Print the client's version and exit (nothing is read or sent).",
        ),
    ] = False,
) -> None:
    """ito-training client. Add --json anywhere for the JSON envelope."""


def _local_fail(error: ItoError) -> NoReturn:
    Output.fail(error, live_api_contacted=False)


def _read(path: str) -> SecureRead:
    from ito.client.secure_file import read_manifest_securely

    try:
        return read_manifest_securely(path)
    except ItoError as exc:
        Output.fail(
            exc,
            live_api_contacted=False,
            notice="the manifest was refused before anything was sent; nothing was created",
        )


# --- local commands ------------------------------------------------------------------------------


@app.command()
def capabilities() -> None:
    """The capability contract, derived from the commands this client registers (no
    credentials, no network)."""
    Output.finish(
        ok_envelope(
            capability_contract(app),
            "capabilities of this client; nothing was sent",
            live_api_contacted=False,
        )
    )


@app.command()
def config() -> None:
    """Print the settings in effect and where each came from (no secret: a key shows as
    set/not set, the credential in use only by its public prefix)."""
    from ito.client.config import load_config
    from ito.client.credentials import resolve_token
    from ito.settings import mask_url
    from ito.transport import DEFAULT_MAX_RESPONSE_BYTES

    cfg = load_config()
    token, source = resolve_token(cfg.api_url, cfg)
    Output.finish(
        ok_envelope(
            {
                "api_url": mask_url(cfg.api_url),
                "connect_timeout_s": cfg.connect_timeout,
                "timeout_s": cfg.timeout,
                "max_response_bytes": DEFAULT_MAX_RESPONSE_BYTES,
                "settings": cfg.effective(),
                "credential": {"source": source, "key_prefix": _public_prefix(token)},
            },
            "configuration from the environment; nothing was sent",
            live_api_contacted=False,
        )
    )


def _public_prefix(token: str | None) -> str | None:
    """``ito_<role>_<prefix>`` of a key shaped ``ito_<role>_<prefix>_<secret>``; nothing of any
    other value (it could be all secret)."""
    parts = (token or "").split("_")
    return "_".join(parts[:3]) if len(parts) >= 4 and parts[0] == "ito" and parts[3] else None


# ECC's compute-side verbs take the ito-compute service's options (``find --gpu h200 --count 8
# --region …``, ``evals --cluster …``); this runtime accepts whatever ECC passes — the answer does
# not depend on it — and refuses with ``capability_unavailable`` without reading a credential or
# contacting anything. The values are never echoed.
_COMPUTE_VERB = {"allow_extra_args": True, "ignore_unknown_options": True}


def _compute_side(verb: str, what: str) -> NoReturn:
    _local_fail(
        ItoError(
            "capability_unavailable",
            f"'{verb}' ({what}) belongs to the ito-compute service, not this training runtime; "
            "nothing was contacted",
            verb=verb,
        )
    )


@app.command("find", context_settings=_COMPUTE_VERB)
def find(ctx: typer.Context) -> None:
    """RFQ search (ECC options such as --gpu, --count accepted): belongs to ito-compute; answers
    capability_unavailable, contacting nothing."""
    _compute_side("find", "RFQ search")


@app.command("evals", context_settings=_COMPUTE_VERB)
def evals(ctx: typer.Context) -> None:
    """Node qualification (ECC options such as --cluster accepted): belongs to ito-compute;
    answers capability_unavailable, contacting nothing."""
    _compute_side("evals", "node qualification")


@manifest_app.command("init")
def manifest_init(
    out: Annotated[str, typer.Option(help="Directory to write into (created 0700).")],
    recipe: Annotated[
        str, typer.Option(help="demo | test | ladder-helpful | ladder-harmful")
    ] = "demo",
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
        _local_fail(
            ItoError(
                "invalid_arguments",
                "files already exist; pass --force to overwrite",
                existing=existing,
            )
        )
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    raw = json.dumps(built.manifest, indent=2).encode() + b"\n"
    for name, content in [("manifest.json", raw), *built.files.items()]:
        _write_private(directory / name, content)
    Output.finish(
        ok_envelope(
            {
                "manifest": str(directory / "manifest.json"),
                "manifest_id": manifest_digest(raw),
                "files": sorted(built.files),
                "recipe": recipe,
                "needs": built.manifest["resources"],
            },
            f"wrote the {recipe} manifest and its data; nothing was sent",
            live_api_contacted=False,
        )
    )


def _write_private(path: Path, content: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
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
    Output.finish(
        ok_envelope(
            {"manifest_id": read.digest, "valid": True, "summary": manifest_summary(manifest)},
            "the manifest is valid; nothing was sent",
            live_api_contacted=False,
        )
    )


@app.command()
def planner(
    gpu: Annotated[str, typer.Option(help="Accelerator: a100 | h100 | h200 | b200 | cpu.")],
    size: Annotated[
        str | None, typer.Option(help="A named size (tiny, 150m, 1b, 8b) instead of a shape.")
    ] = None,
    params: Annotated[int | None, typer.Option(help="Parameters (solves --ffn if absent).")] = None,
    layers: Annotated[int | None, typer.Option(help="Decoder layers.")] = None,
    hidden: Annotated[int | None, typer.Option(help="Hidden size.")] = None,
    heads: Annotated[int | None, typer.Option(help="Attention heads.")] = None,
    kv_heads: Annotated[int | None, typer.Option(help="Key/value heads (default: heads).")] = None,
    ffn: Annotated[int | None, typer.Option(help="SwiGLU width.")] = None,
    vocab: Annotated[int | None, typer.Option(help="Vocabulary (default: Llama 3's).")] = None,
    seq_len: Annotated[
        int | None, typer.Option(help="Tokens per sequence (default with --size: its maximum).")
    ] = None,
    nodes: Annotated[int, typer.Option(help="Nodes.")] = 1,
    gpus_per_node: Annotated[int, typer.Option(help="GPUs per node.")] = 8,
    fabric: Annotated[
        str, typer.Option(help="Between nodes: infiniband | roce | ethernet | nvlink.")
    ] = "infiniband",
    global_batch_tokens: Annotated[
        int | None, typer.Option(help="Tokens per optimizer step (default: planner's choice).")
    ] = None,
    fp8: Annotated[bool, typer.Option("--fp8", help="Request fp8 matmuls.")] = False,
    compile: Annotated[
        bool,
        typer.Option(
            "--compile",
            help="Plan as if the layers were torch.compile-d (this version's engine runs "
            "eager, as a run is planned; off by default).",
        ),
    ] = False,
    dp_replicate: Annotated[int | None, typer.Option(help="Pin HSDP replicas.")] = None,
    dp_shard: Annotated[int | None, typer.Option(help="Pin the FSDP shard degree.")] = None,
    tp: Annotated[int | None, typer.Option(help="Pin tensor parallel.")] = None,
    pp: Annotated[int | None, typer.Option(help="Pin pipeline stages.")] = None,
    cp: Annotated[int | None, typer.Option(help="Pin context parallel.")] = None,
    micro_batch: Annotated[int | None, typer.Option(help="Pin sequences per micro-batch.")] = None,
    activation_checkpointing: Annotated[
        str | None, typer.Option(help="Pin none | selective | full.")
    ] = None,
    allow_wasteful: Annotated[
        bool,
        typer.Option("--allow-wasteful", help="Warn about wasteful choices instead of refusing."),
    ] = False,
) -> None:
    """Choose parallelism and precision for a model on hardware, or say why none fits.
    Computed locally: no server, no credential."""
    from ito.client.planning import PlannerRequest, planner_envelope, render_plan
    from ito.core.planner import Parallelism

    try:
        pinned = Parallelism(
            dp_replicate=dp_replicate,
            dp_shard=dp_shard,
            tp=tp,
            pp=pp,
            cp=cp,
            micro_batch=micro_batch,
            activation_checkpointing=activation_checkpointing,  # type: ignore[arg-type]
        )
    except ValueError as exc:
        _local_fail(ItoError("invalid_arguments", str(exc)))
    request = PlannerRequest(
        gpu=gpu,
        nodes=nodes,
        gpus_per_node=gpus_per_node,
        fabric=fabric,
        size=size,
        params=params,
        layers=layers,
        hidden=hidden,
        heads=heads,
        kv_heads=kv_heads,
        ffn=ffn,
        vocab=vocab,
        seq_len=seq_len,
        global_batch_tokens=global_batch_tokens,
        fp8=fp8,
        compile=compile,
        parallelism=pinned,
        allow_wasteful=allow_wasteful,
    )
    Output.finish(planner_envelope(request), render=render_plan)


# --- API commands --------------------------------------------------------------------------------


def _ops() -> Operations:
    from ito.client.config import load_config
    from ito.client.credentials import resolve_token
    from ito.client.operations import Operations

    config = load_config()
    token, _ = resolve_token(config.api_url, config)
    return Operations(config, token)


@app.command()
def login(
    no_browser: Annotated[
        bool, typer.Option("--no-browser", help="Print the URL instead of opening a browser.")
    ] = False,
) -> None:
    """Sign in with the device authorization grant; the token goes to the OS keyring."""
    from ito.client.config import load_config
    from ito.client.login import device_login

    def announce(message: str) -> None:
        sys.stderr.write(message + "\n")
        sys.stderr.flush()

    Output.finish(device_login(load_config(), open_browser=not no_browser, announce=announce))


@app.command()
def logout() -> None:
    """Revoke the stored login on the server, then delete it here."""
    from ito.client.config import load_config
    from ito.client.login import logout as do_logout

    Output.finish(do_logout(load_config()))


@app.command()
def auth() -> None:
    """Validate the credential in use (ITO_API_KEY or the stored login); never starts a login."""
    Output.finish(_ops().auth())


@app.command()
def status(
    run: Annotated[str | None, typer.Option(help="A run id.")] = None,
    idempotency_key: Annotated[
        str | None, typer.Option(help="The key a run was created with.")
    ] = None,
) -> None:
    """This account's bookings and recent runs, or one run."""
    Output.finish(_ops().status(run=run, idempotency_key=idempotency_key))


@bookings_app.command("list")
def bookings_list() -> None:
    """Bookings of this account."""
    Output.finish(_ops().bookings())


@bookings_app.command("show")
def bookings_show(booking: str) -> None:
    """One booking."""
    Output.finish(_ops().bookings(booking))


@bookings_app.command("eligibility")
def bookings_eligibility(booking: str) -> None:
    """Fresh training eligibility of a booking."""
    Output.finish(_ops().bookings(booking, eligibility=True))


@app.command()
def plan(
    booking: Annotated[str, typer.Option(help="Booking id.")],
    manifest: Annotated[str, typer.Option(help="Absolute path of the reviewed manifest.")],
) -> None:
    """What creating the run would do, its parallelism plan, and its cost. Creates nothing."""
    from ito.client.planning import render_run_plan

    Output.finish(_ops().plan(booking, manifest), render=render_run_plan)


@app.command()
def confirm(
    action: Annotated[str, typer.Option(help="train | cancel | cleanup | restart | raise-bound")],
    booking: Annotated[str | None, typer.Option(help="Booking id (train).")] = None,
    manifest: Annotated[str | None, typer.Option(help="Manifest path (train).")] = None,
    run: Annotated[
        str | None, typer.Option(help="Run id (cancel, cleanup, restart, raise-bound).")
    ] = None,
    checkpoint: Annotated[int | None, typer.Option(help="Checkpoint step (restart).")] = None,
    cost_bound: Annotated[
        float | None,
        typer.Option(help="USD the whole run may spend (raise-bound: the new bound)."),
    ] = None,
    ttl_seconds: Annotated[
        int | None, typer.Option(help="Shorter expiry than the server's default.")
    ] = None,
) -> None:
    """Request a single-use confirmation; a human approves it out of band."""
    Output.finish(
        _ops().confirm(
            action,
            booking=booking,
            manifest=manifest,
            run=run,
            checkpoint=checkpoint,
            ttl_seconds=ttl_seconds,
            cost_bound=cost_bound,
        )
    )


@app.command()
def approve(ref: str) -> None:
    """Approve a confirmation (approver credential only)."""
    Output.finish(_ops().decide(ref, approve=True))


@app.command()
def reject(ref: str) -> None:
    """Reject a confirmation (approver credential only)."""
    Output.finish(_ops().decide(ref, approve=False))


@app.command()
def train(
    booking: Annotated[str, typer.Option(help="Booking id.")],
    manifest: Annotated[str, typer.Option(help="Absolute path of the reviewed manifest.")],
    confirmation_ref: Annotated[str, typer.Option(help="The approved confirmation.")],
    idempotency_key: Annotated[str, typer.Option(help="Your stable retry key.")],
) -> None:
    """Create a run behind the five gates. Retrying with the same key never makes a second."""
    Output.finish(_ops().train(booking, manifest, confirmation_ref, idempotency_key))


@runs_app.command("list")
def runs_list(
    booking: Annotated[str | None, typer.Option(help="Only runs on this booking.")] = None,
    limit: Annotated[int, typer.Option(help="Most recent N runs.")] = 50,
) -> None:
    """Runs of this account, newest first."""
    Output.finish(_ops().runs(booking=booking, limit=limit))


@runs_app.command("show")
def runs_show(run: str) -> None:
    """One run: its state, each stage of its plan with its progress, its events."""
    from ito.client.run_display import render_run

    Output.finish(_ops().runs(run), render_run)


@runs_app.command("logs")
def runs_logs(
    run: str,
    since: Annotated[int, typer.Option(help="Cursor: only lines after it.")] = 0,
    follow: Annotated[
        bool, typer.Option("--follow", help="Keep printing until the run ends.")
    ] = False,
) -> None:
    """Log lines of a run, in stable cursor order."""
    ops = _ops()
    if not follow:
        Output.finish(ops.logs(run, since=since))
    from ito.client.follow import follow_logs

    Output.finish(follow_logs(ops, run, since, json_mode=Output.json_mode))


@runs_app.command("metrics")
def runs_metrics(
    run: str,
    name: Annotated[str | None, typer.Option(help="Only this metric (e.g. loss).")] = None,
) -> None:
    """Metric points of a run."""
    Output.finish(_ops().metrics(run, name=name))


@runs_app.command("checkpoints")
def runs_checkpoints(run: str) -> None:
    """Committed checkpoints of a run."""
    Output.finish(_ops().checkpoints(run))


@runs_app.command("gates")
def runs_gates(run: str) -> None:
    """The eval gates a run's stages were measured against: each eval's value, the untrained
    model's value at step 0, the threshold and whether it passed."""
    Output.finish(_ops().gates(run), render=_render_gates)


def _render_gates(envelope: dict[str, Any]) -> None:
    from rich.console import Console

    console = Console()
    data = envelope["data"]
    console.print(f"run {data['run_id']} ({data['state']}): {envelope['notice']}", markup=False)

    def fmt(value: object) -> str:
        return "—" if value is None else f"{value:.4g}"

    for g in data["gates"]:
        mark = "[green]pass[/green]" if g["passed"] else "[red]FAIL[/red]"
        console.print(
            f"{mark}  {g['stage']} ({g['battery']}): {g['rule'] or g['eval']} — value "
            f"{fmt(g['value'])}, step 0 {fmt(g['initial'])}, threshold {fmt(g['threshold'])}",
            highlight=False,
        )


@runs_app.command("provenance")
def runs_provenance(run: str) -> None:
    """The data-preparation report bound to a run (its sha256, inputs, rows kept and removed
    per reason, decontamination, output shard digests)."""
    from ito.client.provenance import render_provenance

    Output.finish(_ops().provenance(run), render=render_provenance)


@runs_app.command("cancel")
def runs_cancel(
    run: str,
    confirmation_ref: Annotated[str, typer.Option(help="An approved run.cancel confirmation.")],
    idempotency_key: Annotated[str, typer.Option(help="Your stable retry key.")],
) -> None:
    """Cancel a run (needs its own confirmation and idempotency key)."""
    Output.finish(_ops().cancel(run, confirmation_ref, idempotency_key))


@runs_app.command("cleanup")
def runs_cleanup(
    run: str,
    confirmation_ref: Annotated[str, typer.Option(help="An approved run.cleanup confirmation.")],
    idempotency_key: Annotated[str, typer.Option(help="Your stable retry key.")],
) -> None:
    """Delete a finished run's checkpoints and scratch data (never the booking)."""
    Output.finish(_ops().cleanup(run, confirmation_ref, idempotency_key))


@runs_app.command("restart")
def runs_restart(
    run: str,
    confirmation_ref: Annotated[
        str, typer.Option(help="An approved run.restart_from_checkpoint confirmation.")
    ],
    idempotency_key: Annotated[str, typer.Option(help="Your stable retry key.")],
) -> None:
    """Restart a run that awaits approval from its proposed checkpoint."""
    Output.finish(_ops().restart(run, confirmation_ref, idempotency_key))


@runs_app.command("raise-bound")
def runs_raise_bound(
    run: str,
    confirmation_ref: Annotated[
        str, typer.Option(help="An approved run.raise_cost_bound confirmation.")
    ],
    idempotency_key: Annotated[str, typer.Option(help="Your stable retry key.")],
) -> None:
    """Give a run that waits at its cost bound the new bound a human approved; it resumes."""
    Output.finish(_ops().raise_bound(run, confirmation_ref, idempotency_key))


@runs_app.command("watch")
def runs_watch(
    run: str,
    interval: Annotated[float, typer.Option(help="Seconds between polls.")] = 2.0,
) -> None:
    """Follow a run until it ends or waits for a human: progress bars for humans, one envelope
    per change with --json."""
    from ito.client.follow import watch_run
    from ito.client.run_display import render_watch

    Output.finish(
        watch_run(_ops(), run, interval=max(interval, 0.2), json_mode=Output.json_mode),
        render=render_watch,
    )


@app.command()
def telemetry(
    booking: Annotated[str | None, typer.Option(help="A booking id.")] = None,
    run: Annotated[str | None, typer.Option(help="A run id.")] = None,
) -> None:
    """Goodput, interruption rate, checkpoint bandwidth, tokens/s, MFU."""
    Output.finish(_ops().telemetry(booking=booking, run=run))


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
