"""The process's event loop, on which every ``AsyncMessageProcessor`` batch runs, and
the bounded, key-ordered fan-out of a batch's calls. Nothing here knows about turns: a
batch's coroutine runs to its end (or its timeout) before ``process()`` returns.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable, Coroutine, Hashable, Sequence
from typing import Any

from kasper_py.message import Message

__all__ = ["concurrently", "event_loop", "run_batch"]


class _LoopState(threading.local):
    """One event loop per thread that runs turns (the loop's, a Spark task's), kept open
    across batches so clients bound to it (an ``httpx.AsyncClient``) stay usable."""

    loop: asyncio.AbstractEventLoop | None = None
    limits: dict[int, asyncio.Semaphore]

    def __init__(self) -> None:
        self.limits = {}


_state = _LoopState()


def event_loop() -> asyncio.AbstractEventLoop:
    """The event loop this process runs its async batches on (created on first use and
    kept until the process exits): the one to bind a shared async client to."""
    if _state.loop is None or _state.loop.is_closed():
        _state.loop = asyncio.new_event_loop()
        _state.limits = {}
    return _state.loop


def _limit(concurrency: int) -> asyncio.Semaphore:
    """The process-wide semaphore of ``concurrency`` calls in flight (one per setting)."""
    limit = _state.limits.get(concurrency)
    if limit is None:
        limit = _state.limits[concurrency] = asyncio.Semaphore(concurrency)
    return limit


def run_batch(batch: Coroutine[Any, Any, None], timeout: float | None) -> None:
    """Run ``batch`` on the process's event loop until it and every call it started are
    done. Past ``timeout`` seconds it is cancelled and ``TimeoutError`` is raised."""
    loop = event_loop()
    if loop.is_running():
        batch.close()
        raise RuntimeError("an AsyncMessageProcessor runs its batch on kasper_py's own "
                           "event loop; process() was called from inside a running one")
    if timeout is None:
        loop.run_until_complete(batch)
        return
    try:
        loop.run_until_complete(asyncio.wait_for(batch, timeout))
    except TimeoutError:
        raise TimeoutError(f"the batch's coroutines were not done after async_timeout="
                           f"{timeout}s; they were cancelled") from None


def _lanes(messages: Sequence[Message], key_ordered: bool) -> list[list[Message]]:
    """The batch split into lanes run one call after another: one lane per key (in
    offset order) when ``key_ordered``, else (and for messages with no key) one each."""
    if not key_ordered:
        return [[message] for message in messages]
    lanes: dict[Hashable, list[Message]] = {}
    alone: list[list[Message]] = []
    for message in messages:
        key = message.key
        if key is None:
            alone.append([message])
            continue
        if not isinstance(key, Hashable):
            key = repr(key)
        lanes.setdefault(key, []).append(message)
    return [*lanes.values(), *alone]


async def concurrently(messages: Sequence[Message],
                       call: Callable[[Message], Awaitable[None]], *,
                       concurrency: int, key_ordered: bool) -> None:
    """Await ``call(message)`` for every message, at most ``concurrency`` in flight in
    this process; with ``key_ordered`` a key's calls run one after another, in offset
    order. The first call to raise cancels the rest, and its exception is raised."""
    limit = _limit(concurrency)
    lanes = iter(_lanes(messages, key_ordered))

    async def worker() -> None:
        for lane in lanes:
            for message in lane:
                async with limit:
                    await call(message)

    workers = [asyncio.ensure_future(worker()) for _ in range(min(concurrency, len(messages)))]
    await _all_or_first_error(workers)


async def _all_or_first_error(tasks: Sequence[asyncio.Future[None]]) -> None:
    """Wait for every task; on the first failure (or when cancelled) cancel the others,
    wait for them to unwind, and raise it: no call outlives its batch."""
    try:
        for done in asyncio.as_completed(tasks):
            await done
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
