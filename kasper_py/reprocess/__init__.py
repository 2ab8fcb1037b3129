"""Reprocess history with Spark: the same ``MessageProcessor`` over an offset range of
the input topics, partition-wise, with output to Kafka or to the stores, and an
optional handoff of the end offsets to the live loop's group.

    from kasper_py.reprocess import reprocess
    result = reprocess(config, WordCount, start="earliest", end="latest", handoff=True)

Importing this package needs no pyspark; running a job needs the ``kasper-py[spark]``
extra (pyspark, pandas, pyarrow). Errors, ``ReprocessError`` from kasper_py, except
that input topics Kafka does not hold as configured are a ``TopicError``, as for the
live loop:

    ReprocessError            the job failed (a task raised, Spark failed)
    ├── RangeError             a partition that is not an input, offsets outside the
    │                          watermarks, end before start
    ├── HandoffRefusedError    the live group is active (unless forced)
    └── BrokerUnreachableError Kafka did not answer the driver
"""

from kasper_py.reprocess._cli import main, parse_position
from kasper_py.reprocess._handoff import HandoffRefusedError
from kasper_py.reprocess._job import ReprocessResult, hand_off, reprocess, resolve_range
from kasper_py.reprocess._kafka import BrokerUnreachableError
from kasper_py.spark.range import Position, RangeError, ReprocessRange
from kasper_py.spark.session import spark_session
from kasper_py.spark.task import PartitionStats

__all__ = [
    "BrokerUnreachableError",
    "HandoffRefusedError",
    "PartitionStats",
    "Position",
    "RangeError",
    "ReprocessRange",
    "ReprocessResult",
    "hand_off",
    "main",
    "parse_position",
    "reprocess",
    "resolve_range",
    "spark_session",
]
