"""The processor bench_failover.py runs with ``kasper run``: counts messages per key in
the RocksDB table "counts" (one changelog record per key and turn)."""

from __future__ import annotations

from kasper_py import Config, Message, MessageProcessor, Sender
from kasper_py.stores.rocksdb import RocksDBTable


class Count(MessageProcessor):
    def process(self, messages: list[Message], sender: Sender) -> None:
        counts = self.context.store("counts")
        totals = counts.get_many({m.key for m in messages})
        for m in messages:
            totals[m.key] = totals.get(m.key, 0) + 1
        counts.put_many(totals)


def stores(config: Config) -> list[RocksDBTable]:
    return [RocksDBTable("counts", key_serde="bytes", value_serde="json")]
