"""A two-stage application for the guarantee tests, run as users run one:
``kasper run rekey_app_module:app --app-dir tests/integration --config FILE``.

Page views keyed by session, each value ``"<user>,<page>"``, are re-keyed by user
through the app's repartition ``by-user``; the second stage counts each user's views
in the RocksDB table ``counts`` and sends every count update, key the user and value
the new count, to the output topic. The topics come from the environment, read at
import: ``PAGEVIEWS_SOURCE`` and ``PAGEVIEWS_OUTPUT``; ``PAGEVIEWS_PAUSE`` (seconds)
slows each batch of either stage down so that kills land mid-stream;
``PAGEVIEWS_REPARTITION_PARTITIONS`` gives the repartition its own partition count
(unset: the source's). Give the config
``key_serde = "str"`` and ``value_serde = "str"``.
"""

from __future__ import annotations

import os
import time

from kasper_py import Message, MessageProcessor, ProcessorContext, Sender
from kasper_py.app import App
from kasper_py.stores.rocksdb import RocksDBTable

SOURCE = os.environ.get("PAGEVIEWS_SOURCE", "page-views")
OUTPUT = os.environ.get("PAGEVIEWS_OUTPUT", "user-counts")
PAUSE = float(os.environ.get("PAGEVIEWS_PAUSE", "0"))


class ByUser(MessageProcessor):
    """Stage one: each page view, re-keyed by its user."""

    def process(self, messages: list[Message], sender: Sender) -> None:
        for message in messages:
            sender.repartition("by-user", message.value, key=message.value.split(",")[0])
        if PAUSE:
            time.sleep(PAUSE)


class CountPerUser(MessageProcessor):
    """Stage two: each user's views counted in ``counts`` (one get_many, one put_many per
    batch), each new count sent to ``OUTPUT``."""

    def __init__(self, context: ProcessorContext) -> None:
        super().__init__(context)
        self.counts = context.store("counts")

    def process(self, messages: list[Message], sender: Sender) -> None:
        totals = self.counts.get_many({m.key for m in messages})
        for message in messages:
            count = totals[message.key] = totals.get(message.key, 0) + 1
            sender.send(OUTPUT, str(count), message.key)
        self.counts.put_many(totals)
        if PAUSE:
            time.sleep(PAUSE)


app = App("pageviews")
by_user = app.repartition("by-user", partitions=int(os.environ.get(
    "PAGEVIEWS_REPARTITION_PARTITIONS", "0")) or None)
app.processor("rekey", ByUser, inputs=[SOURCE], outputs=[by_user])
app.processor("count", CountPerUser, inputs=[by_user], outputs=[OUTPUT],
              stores=[RocksDBTable("counts")])
