"""Run a processor live on Spark Structured Streaming (not ``kasper_py.dsl.Stream``, the
streams DSL's record stream): the same ``MessageProcessor`` factory as the live loop,
each micro-batch partition-wise through the turn engine in the reprocessing job's
tasks, its end offsets committed to the live group.

    from kasper_py.stream import stream
    run = stream(config, WordCount, checkpoint="/data/checkpoints/wc", master="local[2]")
    run.await_termination()

Importing this package needs no pyspark; running needs the ``kasper-py[spark]`` extra.
Errors: ``AlreadyRunningError`` while a live loop commits to the group, ``StreamError``
for bad arguments, RocksDB tables, a stale checkpoint or a failed query, ``TopicError``
when the input topics are not as configured.
"""

from kasper_py.stream._cli import main
from kasper_py.stream._query import MicroBatch, Starting, StreamingRun, stream

__all__ = ["MicroBatch", "Starting", "StreamingRun", "main", "stream"]
