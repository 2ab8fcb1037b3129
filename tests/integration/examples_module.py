"""A tiny processor for the CLI and dashboard tests: upper-cases each value to
``$EXAMPLE_OUTPUT_TOPIC`` and counts values per key in an in-memory store, reporting
that store's operations through kasper_py.metrics the way the real stores do.

    kasper run examples_module:factory --stores examples_module:stores --config kasper.toml
"""

from __future__ import annotations

import os

from kasper_py import Message, MessageProcessor, ProcessorContext, Sender
from kasper_py.metrics import report_restore_progress, timed_store_op
from kasper_py.stores.memory import MemoryTable

STORE = "counts"


class Upper(MessageProcessor):
    """Sends ``value.upper()`` for every message; keeps a count per key."""

    def __init__(self, context: ProcessorContext) -> None:
        self.processor = context.config.name
        self.output_topic = os.environ["EXAMPLE_OUTPUT_TOPIC"]
        self.counts = context.store(STORE)
        if os.environ.get("EXAMPLE_FAIL_ON"):
            self.fail_on: bytes | None = os.environ["EXAMPLE_FAIL_ON"].encode()
        else:
            self.fail_on = None
        # Nothing to restore from a memory store; report the (empty) restore as done.
        report_restore_progress(self.processor, STORE, context.partition, 0, 0)

    def process(self, messages: list[Message], sender: Sender) -> None:
        keys = {m.key for m in messages}
        with timed_store_op(self.processor, STORE, "get_many"):
            counts = self.counts.get_many(keys)
        for message in messages:
            if self.fail_on is not None and message.value == self.fail_on:
                raise ValueError(f"refusing {message.value!r}")
            counts[message.key] = counts.get(message.key, 0) + 1
            sender.send(self.output_topic, message.value.upper(), key=message.key)
        with timed_store_op(self.processor, STORE, "put_many"):
            self.counts.put_many(counts)


factory = Upper


def stores(_config: object) -> list[MemoryTable]:
    """The store the processor uses, for ``--stores examples_module:stores``."""
    return [MemoryTable(STORE)]
