"""A processor for the idle-advance CLI test: counts records per key and 2 s tumbling
window (emit="final") in a memory table, advanced by a stream-time timer every 0.5 s,
and sends each final count to ``$EXAMPLE_OUTPUT_TOPIC`` as ``key:start:count``.

    KASPER_IDLE_ADVANCE=2 kasper run idle_module:factory --stores idle_module:stores
"""

from __future__ import annotations

import os

from kasper_py import Message, MessageProcessor, ProcessorContext, Sender
from kasper_py.stores.memory import MemoryTable
from kasper_py.windows import Tumbling, WindowedTable, WindowResult, count


class FinalCounts(MessageProcessor):
    """Final counts per key and window, closed on quiet input through the timer."""

    def __init__(self, context: ProcessorContext) -> None:
        self.output_topic = os.environ["EXAMPLE_OUTPUT_TOPIC"]
        self.table = WindowedTable(context, "windows", Tumbling(2), count(), emit="final")
        context.schedule(0.5, self.tick)

    def tick(self, stream_time: int, sender: Sender) -> None:
        self._send(self.table.advance(stream_time), sender)

    def process(self, messages: list[Message], sender: Sender) -> None:
        self._send(self.table.update((m.key, m.timestamp, m.value) for m in messages), sender)

    def _send(self, results: list[WindowResult], sender: Sender) -> None:
        for result in results:
            sender.send(self.output_topic, f"{result.key!r}:{result.start}:{result.value}")


def factory(context: ProcessorContext) -> FinalCounts:
    return FinalCounts(context)


def stores(_config: object) -> list[MemoryTable]:
    return [MemoryTable("windows", key_serde="bytes")]
