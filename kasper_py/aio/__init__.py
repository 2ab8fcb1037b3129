"""Concurrent I/O inside a batch: ``AsyncMessageProcessor`` and the process's event loop
(``event_loop()``, to bind a shared async client to). docs/concepts.md#async-processors.
"""

from kasper_py.aio.loop import event_loop
from kasper_py.aio.processor import AsyncMessageProcessor

__all__ = ["AsyncMessageProcessor", "event_loop"]
