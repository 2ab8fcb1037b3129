"""The processor of the standby tests through ``kasper run``: counts messages per key
(str) in the RocksDB table "counts"; a message whose value is ``fail`` also sends 10 kB
to ``$STANDBY_OUTPUT_TOPIC`` when it is set (a topic whose broker takes less, so the
turn fails, or one that never acks, so it hangs) after the table's changelog records
were written: an aborted, or an open, transaction under exactly-once.

    kasper run standby_module:Count --stores standby_module:stores
"""

from __future__ import annotations

import os

from kasper_py import Config, Message, MessageProcessor, Sender
from kasper_py.stores.rocksdb import RocksDBTable


class Count(MessageProcessor):
    """Counts messages per key in "counts"."""

    def process(self, messages: list[Message], sender: Sender) -> None:
        counts = self.context.store("counts")
        totals = counts.get_many({m.key for m in messages})
        for m in messages:
            totals[m.key] = totals.get(m.key, 0) + 1
            if m.value == "fail" and "STANDBY_OUTPUT_TOPIC" in os.environ:
                sender.send(os.environ["STANDBY_OUTPUT_TOPIC"], b"x" * 10_000, m.key)
        counts.put_many(totals)


def stores(config: Config) -> list[RocksDBTable]:
    """The counts table, str keys."""
    return [RocksDBTable("counts", key_serde="str", value_serde="json")]
