"""Leaving a ``torch.distributed`` process without the interpreter's teardown.

After ``destroy_process_group`` a gloo thread can still be joinable while Python finalises its
modules; its ``std::thread`` destructor then calls ``std::terminate`` ("terminate called without
an active exception") and the process dies of SIGABRT although its work is done and reported.
Seen on torch 2.13 CPU builds in about one process in a few hundred (the test suite's
two-process checks, one round in ten of a benchmark's baseline). torchrun reads that as a crashed
rank and, for a training run, restarts a run that had already finished. A process whose result is
written leaves with :func:`leave` instead: the standard streams and logging handlers are flushed,
then ``os._exit`` ends it with the status it chose.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from typing import NoReturn

__all__ = ["leave"]


def leave(status: int) -> NoReturn:
    """Flush what this process printed and logged, then end it with ``status`` at once."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        # A closed or broken pipe: nothing more can be said on it.
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(status)
