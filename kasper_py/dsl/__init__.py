"""Streams and tables: a high-level API on the batch engine (``Builder``). Operators
(``filter``, ``map``, ``group_by``, ``count``, joins, windows...) compile into an
``App`` whose processors run each operator once per batch. See docs/streams-dsl.md.

``Stream`` here is Kafka Streams' KStream, a stream of records in a pipeline; it has
nothing to do with ``kasper_py.stream``, which runs a processor or an app live on Spark
Structured Streaming.
"""

from kasper_py.dsl._ops import Windowed
from kasper_py.dsl._times import Timestamps
from kasper_py.dsl.builder import Builder, GlobalTable, Grouped, Stream, Table, WindowedGrouped

__all__ = ["Builder", "GlobalTable", "Grouped", "Stream", "Table", "Timestamps",
           "Windowed", "WindowedGrouped"]
