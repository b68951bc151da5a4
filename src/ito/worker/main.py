"""``ito-worker --booking B --executor local|slurm``: authenticates with a booking-bound worker
key (``ITO_API_KEY``), then leases and runs that booking's runs until stopped."""

from __future__ import annotations

import logging
import signal
import sys
import threading
from typing import Annotated

import typer

from ito.console import Output, run_app
from ito.core.envelope import ok_envelope
from ito.core.errors import ItoError

app = typer.Typer(add_completion=False, help="ito-training worker for one booking.")


@app.command()
def main_command(
    booking: Annotated[str, typer.Option(help="The booking this worker serves.")],
    executor: Annotated[str, typer.Option(help="local | slurm")] = "local",
    once: Annotated[
        bool, typer.Option("--once", help="Handle what is waiting, then exit.")
    ] = False,
    poll_seconds: Annotated[float, typer.Option(help="Seconds between idle polls.")] = 1.0,
) -> None:
    """Lease and run the booking's runs."""
    from ito.connection import build
    from ito.worker.api import WorkerApi
    from ito.worker.loop import WorkerLoop
    from ito.worker.settings import WorkerSettings

    settings = build(WorkerSettings)
    if settings.api_key is None:
        raise ItoError("not_authenticated", "set ITO_API_KEY to a worker key of the booking")
    api = WorkerApi(
        settings.api_url,
        settings.api_key.get_secret_value(),
        connect_timeout=settings.connect_timeout,
        timeout=settings.timeout,
    )
    me = api.me()
    if me["role"] != "worker" or me["booking_id"] != booking:
        raise ItoError("forbidden_scope", "the key is not a worker key of this booking")
    factory = _executor_factory(executor)
    home = settings.home / "worker" / booking
    home.mkdir(parents=True, exist_ok=True, mode=0o700)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s", stream=sys.stderr
    )
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    loop = WorkerLoop(
        api,
        home,
        factory,
        poll_seconds=poll_seconds,
        stop=stop,
        spec_overrides=settings.fault_injection,
    )
    if once:
        while loop.tick():
            pass
    else:
        loop.run_forever()
    Output.finish(ok_envelope({"booking_id": booking}, "the worker stopped"))


def _executor_factory(name: str):  # type: ignore[no-untyped-def]
    if name == "local":
        from ito.worker.executors import LocalExecutor

        return LocalExecutor
    if name == "slurm":
        from ito.worker.slurm import SlurmExecutor

        return SlurmExecutor
    raise ItoError("invalid_arguments", "executor must be local or slurm")


def main() -> None:
    run_app(app, sys.argv[1:], "ito-worker")
