"""``AsyncMessageProcessor``: a ``MessageProcessor`` whose batch is a coroutine, so a
batch's I/O (HTTP lookups, database calls) runs concurrently. To the turn it is an
ordinary processor: ``process()`` returns once every coroutine of the batch is done.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from kasper_py.aio.loop import concurrently, run_batch
from kasper_py.processor import MessageProcessor

if TYPE_CHECKING:
    from kasper_py.message import Message
    from kasper_py.sender import Sender

__all__ = ["AsyncMessageProcessor"]

_DEFAULT_CONCURRENCY = 64
"""``Config.async_concurrency``'s default, for a processor built with no context."""


class AsyncMessageProcessor(MessageProcessor):
    """A processor written as coroutines, run on one event loop per process.

    Define ``async def process_message(self, message, sender)`` for one message: the
    batch's messages run concurrently, at most ``Config.async_concurrency`` at once in
    the process, and one key's messages one after another in offset order (set
    ``key_ordered = False`` on the class to let them overlap). Or define
    ``async def process(self, messages, sender)`` (or ``process_batch``) for the whole
    batch, awaiting ``self.concurrently(...)`` where it fans out.

    Every coroutine runs on the thread of the turn, so ``sender.send`` and store calls
    are safe from any of them (a store call blocks the loop while it runs: read a
    batch's keys with one ``get_many`` before fanning out). The turn flushes its stores,
    produces and commits only after every coroutine of the batch is done. A coroutine
    that raises cancels the others and fails the batch as a synchronous ``process()``
    would (uncommitted, or ``Config.on_process_error``'s way); so does a batch still
    running after ``Config.async_timeout`` seconds, with a ``TimeoutError``.
    """

    key_ordered: ClassVar[bool] = True
    """Whether one key's ``process_message`` calls wait for each other (in offset order);
    messages with no key never wait."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        batch = cls.__dict__.get("process")
        if batch is not None and inspect.iscoroutinefunction(batch):
            # ``async def process``: the batch coroutine; process() stays the runner.
            cls.process_batch = batch  # type: ignore[method-assign]
            cls.process = AsyncMessageProcessor.process  # type: ignore[method-assign]

    def process(self, messages: list[Message], sender: Sender) -> None:
        """Run the batch's coroutine on the process's event loop until every call it
        started is done (or ``Config.async_timeout`` passes: ``TimeoutError``)."""
        config = getattr(getattr(self, "context", None), "config", None)
        run_batch(self.process_batch(messages, sender),
                  None if config is None else config.async_timeout)

    async def process_batch(self, messages: list[Message], sender: Sender) -> None:
        """The batch as one coroutine: ``process_message`` for each message, through
        ``concurrently``. Override it (or define ``async def process``) to do more."""
        await self.concurrently(messages, lambda message: self.process_message(message, sender))

    async def process_message(self, message: Message, sender: Sender) -> None:
        """Handle one message; the default ``process_batch`` awaits it for each."""
        raise NotImplementedError(f"{type(self).__name__} defines neither process_message "
                                  "nor an async process/process_batch")

    async def concurrently(self, messages: Sequence[Message],
                           call: Callable[[Message], Awaitable[None]], *,
                           key_ordered: bool | None = None) -> None:
        """Await ``call(message)`` for each of ``messages``: at most
        ``Config.async_concurrency`` calls in flight in the process, one key's in offset
        order unless ``key_ordered`` (default: the class's) is false. The first call to
        raise cancels the others, and its exception is raised."""
        config = getattr(getattr(self, "context", None), "config", None)
        await concurrently(
            messages, call,
            concurrency=_DEFAULT_CONCURRENCY if config is None else config.async_concurrency,
            key_ordered=self.key_ordered if key_ordered is None else key_ordered)
