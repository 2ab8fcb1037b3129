"""Event-time windows and windowed joins, used inside ``process()``: the batch API stays
the heart, and every window's state lives in a local table (``MemoryTable`` or a
changelog-backed ``RocksDBTable``), flushed and committed by the turn like any store
write.

    views = WindowedTable(context, "views", Tumbling(60, grace=10), count(), emit="final")
    for result in views.update((m.key, ctx.event_time(m), m.value) for m in messages):
        sender.send("views-per-minute", result.value, key=result.key)

- kinds.py: ``Tumbling``, ``Hopping``, ``Sliding``, ``Session`` (durations in seconds),
  and ``JoinWindows`` for the DSL's stream-stream joins
- aggregation.py: ``Aggregation``, ``count``, ``sum_of``, ``reduce``
- table.py: ``WindowedTable`` and the ``WindowResult`` it emits
- join.py: ``StreamJoin``, a windowed join of two co-partitioned topics
- dedup.py: ``Deduplicator``, the first record of each id within a window of event time
"""

from kasper_py.windows.aggregation import Aggregation, count, reduce, sum_of
from kasper_py.windows.dedup import Deduplicator
from kasper_py.windows.join import JoinResult, StreamJoin
from kasper_py.windows.kinds import Hopping, JoinWindows, Session, Sliding, Tumbling, WindowKind
from kasper_py.windows.table import WindowedTable, WindowResult

__all__ = [
    "Aggregation",
    "Deduplicator",
    "Hopping",
    "JoinResult",
    "JoinWindows",
    "Session",
    "Sliding",
    "StreamJoin",
    "Tumbling",
    "WindowKind",
    "WindowResult",
    "WindowedTable",
    "count",
    "reduce",
    "sum_of",
]
