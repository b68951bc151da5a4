"""The route class of every router: a synchronous endpoint costs one trip to the thread pool.

FastAPI runs a plain ``def`` endpoint in the thread pool, and then — because it was not a
coroutine — validates its answer against the response model in a second trip. Each trip is a
hand-off between the event loop and a thread (a lock, a queue, a wake-up, the GIL twice), which
under load costs more than the work. :class:`OneHopRoute` hands FastAPI the endpoint as a
coroutine that runs the original in the pool once; the answer is then validated on the loop
(pure CPU, no I/O). Parameters, dependencies, response models and the OpenAPI document are the
endpoint's own (FastAPI reads them through ``__wrapped__``). Generator endpoints (streams) are
left as they are.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

from fastapi.routing import APIRoute
from starlette.concurrency import run_in_threadpool

__all__ = ["OneHopRoute", "one_hop"]


class OneHopRoute(APIRoute):
    def __init__(self, path: str, endpoint: Callable[..., Any], **kwargs: Any) -> None:
        super().__init__(path, one_hop(endpoint), **kwargs)


def one_hop(endpoint: Callable[..., Any]) -> Callable[..., Any]:
    """``endpoint`` as a coroutine running it in the thread pool; coroutines and generators
    unchanged."""
    if (
        inspect.iscoroutinefunction(endpoint)
        or inspect.isgeneratorfunction(endpoint)
        or inspect.isasyncgenfunction(endpoint)
        or not inspect.isfunction(endpoint)
    ):
        return endpoint

    @functools.wraps(endpoint)
    async def in_pool(*args: Any, **kwargs: Any) -> Any:
        return await run_in_threadpool(endpoint, *args, **kwargs)

    return in_pool
