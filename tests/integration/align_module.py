"""A processor for the alignment CLI test: each event of ``$EXAMPLE_EVENTS_TOPIC`` sent
to ``$EXAMPLE_OUTPUT_TOPIC`` as ``event:table value`` with the value of
``$EXAMPLE_TABLE_TOPIC`` current at its timestamp (a batch's messages in timestamp
order, table records first at equal timestamps).

    KASPER_MAX_TASK_IDLE=1.5 kasper run align_module:factory --until-caught-up
"""

from __future__ import annotations

import os

from kasper_py import Message, MessageProcessor, ProcessorContext, Sender


class TableJoin(MessageProcessor):
    """The table's latest value per partition, joined to each event."""

    def __init__(self, context: ProcessorContext) -> None:
        self.table_topic = os.environ["EXAMPLE_TABLE_TOPIC"]
        self.output_topic = os.environ["EXAMPLE_OUTPUT_TOPIC"]
        self.partition = context.partition
        self.value: str | None = None

    def process(self, messages: list[Message], sender: Sender) -> None:
        for message in sorted(messages, key=lambda m: (m.timestamp, m.topic != self.table_topic)):
            if message.topic == self.table_topic:
                self.value = message.value
            else:
                sender.send(self.output_topic, f"{message.value}:{self.value}",
                            partition=self.partition)


def factory(context: ProcessorContext) -> TableJoin:
    return TableJoin(context)
