"""A two-stage app for the `kasper app` and `kasper run module:app` tests: page views
``user,page`` (keyed by session) from ``$APP_SOURCE_TOPIC`` are parsed and repartitioned
by user, then counted per user in a RocksDB table, each new count sent to
``$APP_OUTPUT_TOPIC`` keyed by user. ``$APP_REPARTITION_PARTITIONS`` declares the
repartition's partition count (unset: the sources').

    kasper run app_module:app --app-dir tests/integration --config kasper.toml
"""

from __future__ import annotations

import os

from kasper_py import Message, MessageProcessor, ProcessorContext, Sender
from kasper_py.app import App
from kasper_py.stores.rocksdb import RocksDBTable

STORE = "counts"


class Parse(MessageProcessor):
    """``user,page`` -> the page, keyed by user, through the ``by-user`` repartition."""

    def process(self, messages: list[Message], sender: Sender) -> None:
        for message in messages:
            user, page = message.value.decode().split(",")
            sender.repartition("by-user", page.encode(), user.encode())


class Count(MessageProcessor):
    """Counts pages per user; sends each user's new count to the output topic."""

    def __init__(self, context: ProcessorContext) -> None:
        self.counts = context.store(STORE)
        self.output_topic = os.environ["APP_OUTPUT_TOPIC"]

    def process(self, messages: list[Message], sender: Sender) -> None:
        for message in messages:
            user = message.key.decode()
            count = int(self.counts.get(user) or 0) + 1
            self.counts.put(user, count)
            sender.send(self.output_topic, str(count).encode(), key=user.encode())


def build() -> App:
    """The app, reading and writing the topics the environment names."""
    partitions = os.environ.get("APP_REPARTITION_PARTITIONS")
    clicks = App("clicks")
    by_user = clicks.repartition("by-user",
                                 partitions=int(partitions) if partitions else None)
    clicks.processor("parse", Parse, inputs=[os.environ["APP_SOURCE_TOPIC"]],
                     outputs=[by_user])
    clicks.processor("count", Count, inputs=[by_user],
                     outputs=[os.environ["APP_OUTPUT_TOPIC"]], stores=[RocksDBTable(STORE)])
    return clicks


app = build()
