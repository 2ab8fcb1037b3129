"""A two-phase global top-k: the K most frequent items of a topic, over all of it.

    items (P partitions, keyed by item) ──local──▶ <name>-tops-repartition ──global──▶ top-k
                                                   (ONE partition)

- `local` runs on each of the source's partitions: it counts every item of its
  partition in the RocksDB table `counts` and keeps the partition's top K in `local-top`.
  An item's records are all on one partition (the source is keyed by item), so the
  partition's top K is exact; counts only grow, so after a batch the new top K is among
  the old top K and the items the batch counted. Each batch that changes it sends the
  partition's top K, keyed by the partition, to the repartition `tops`.
- `tops` is declared with **one partition** (`app.repartition("tops", partitions=1)`),
  a count of its own: `global` reads it alone, on one partition number, in one
  process (static sets, `--processes` and group mode alike: whoever owns partition
  number 0). It keeps each source partition's latest top K in `global-top` and, after
  each batch, sends the global top K (the best K of at most P x K candidates) to the
  output topic, key `top`, value `[[item, count], ...]` by count, then item.

Under exactly-once (`processing_guarantee = "exactly_once"`), counts, top lists,
repartition records and offsets commit together: after any kill -9 and a restart, the
last record of the output is the exact top K of everything read.

    kasper run global_topk:app --app-dir examples --config topk.toml
    # topk.toml: name, bootstrap_servers, key_serde = "str", value_serde = "str";
    # TOPK_SOURCE, TOPK_OUTPUT and TOPK_K (default 3) in the environment
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable

from kasper_py import Message, MessageProcessor, ProcessorContext, Sender
from kasper_py.app import App
from kasper_py.stores.rocksdb import RocksDBTable

SOURCE = os.environ.get("TOPK_SOURCE", "items")
OUTPUT = os.environ.get("TOPK_OUTPUT", "top-items")
K = int(os.environ.get("TOPK_K", "3"))
TOP = "top"


def best(counts: Iterable[tuple[str, int]], k: int = K) -> list[list[object]]:
    """The ``k`` largest counts, ties by item: ``[[item, count], ...]``."""
    return [[item, n] for item, n in sorted(counts, key=lambda c: (-c[1], c[0]))[:k]]


class LocalTopK(MessageProcessor):
    """Phase one: counts per item of this partition, and the partition's top K."""

    def __init__(self, context: ProcessorContext) -> None:
        super().__init__(context)
        self.counts, self.top = context.store("counts"), context.store("local-top")

    def process(self, messages: list[Message], sender: Sender) -> None:
        counts = self.counts.get_many({m.key for m in messages})
        for message in messages:
            counts[message.key] = counts.get(message.key, 0) + 1
        self.counts.put_many(counts)
        old = self.top.get(TOP) or []
        top = best({**dict(old), **counts}.items())
        if top != old:
            self.top.put(TOP, top)
            sender.repartition("tops", json.dumps(top), f"p{self.context.partition}")


class GlobalTopK(MessageProcessor):
    """Phase two, on the one partition: each source partition's latest top K, merged."""

    def __init__(self, context: ProcessorContext) -> None:
        super().__init__(context)
        self.tops = context.store("global-top")

    def process(self, messages: list[Message], sender: Sender) -> None:
        latest = {m.key: json.loads(m.value) for m in messages}
        partitions = sorted({*(self.tops.get(TOP) or []), *latest})
        lists = {**self.tops.get_many(set(partitions) - set(latest)), **latest}
        self.tops.put_many({**latest, TOP: partitions})
        candidates = [(item, n) for found in lists.values() for item, n in found]
        sender.send(OUTPUT, json.dumps(best(candidates)), TOP)


app = App("global-topk")
tops = app.repartition("tops", partitions=1)
app.processor("local", LocalTopK, inputs=[SOURCE], outputs=[tops],
              stores=[RocksDBTable("counts"), RocksDBTable("local-top")])
app.processor("global", GlobalTopK, inputs=[tops], outputs=[OUTPUT],
              stores=[RocksDBTable("global-top")])
