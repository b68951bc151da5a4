"""Shared command-line plumbing of ``ito`` and ``ito-server``: the ``--json`` switch, the
envelope on stdout, readable output for humans, and exit codes (0 ok, 1 refused, 2 usage).

``--json`` may stand anywhere on the command line (the ECC bridge moves it first); it is taken
out before parsing.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

import typer

from ito.core.envelope import error_envelope
from ito.core.errors import ItoError

__all__ = ["Output", "run_app"]


class Output:
    """Where a command's single envelope goes."""

    json_mode: bool = False

    @classmethod
    def finish(
        cls, envelope: dict[str, Any], render: Callable[[dict[str, Any]], None] | None = None
    ) -> NoReturn:
        if cls.json_mode:
            sys.stdout.write(json.dumps(envelope, indent=2, sort_keys=False) + "\n")
        elif envelope["ok"]:
            (render or _render_default)(envelope)
        else:
            _render_error(envelope)
        raise typer.Exit(0 if envelope["ok"] else 1)

    @classmethod
    def fail(
        cls, error: ItoError, *, live_api_contacted: bool, notice: str | None = None
    ) -> NoReturn:
        cls.finish(error_envelope(error, notice, live_api_contacted=live_api_contacted))


def _render_default(envelope: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.pretty import Pretty

    console = Console()
    console.print(f"[green]✓[/green] {envelope['notice']}")
    data = envelope.get("data")
    if data not in (None, {}, []):
        console.print(Pretty(data, expand_all=False))


def _render_error(envelope: dict[str, Any]) -> None:
    from rich.console import Console

    console = Console(stderr=True)
    error = envelope["error"]
    console.print(
        f"[red]Error[/red] [bold]{error['code']}[/bold]: {error['message']}",
        highlight=False,
        markup=True,
    )
    for reason in error.get("reasons") or []:
        console.print(f"  - {reason['code']}: {reason['message']}", highlight=False, markup=False)
    details = error.get("details")
    if details:
        console.print(json.dumps(details, indent=2), highlight=False, markup=False)
    console.print(envelope["notice"], style="dim", highlight=False, markup=False)


def run_app(
    app: typer.Typer, argv: Sequence[str], prog_name: str, refusal_notice: str = "nothing was sent"
) -> NoReturn:
    args = list(argv)
    json_count = args.count("--json")
    Output.json_mode = json_count > 0
    args = [a for a in args if a != "--json"]
    if json_count > 1:
        _usage_error("--json may be given at most once")
    command = typer.main.get_command(app)
    try:
        result = command.main(args=args, prog_name=prog_name, standalone_mode=False)
    except typer.TyperException as exc:
        _usage_error(exc.format_message())
    except typer.Exit as exc:
        raise SystemExit(exc.exit_code) from None
    except typer.Abort:
        raise SystemExit(1) from None
    except ItoError as exc:
        try:
            Output.fail(exc, live_api_contacted=False, notice=refusal_notice)
        except typer.Exit as done:
            raise SystemExit(done.exit_code) from None
    raise SystemExit(result if isinstance(result, int) else 0)


def _usage_error(message: str) -> NoReturn:
    envelope = error_envelope(
        ItoError("invalid_arguments", message), "nothing was sent", live_api_contacted=False
    )
    if Output.json_mode:
        sys.stdout.write(json.dumps(envelope, indent=2) + "\n")
    if message:
        sys.stderr.write(f"Usage error: {message}\n")
    raise SystemExit(2)
