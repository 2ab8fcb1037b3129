"""Progress of a running job, on the driver: a log line per finished partition, with
the partitions and messages done so far. Tasks report their partitions through a Spark
accumulator, which Spark merges on the driver as each task ends.
"""

from __future__ import annotations

import threading
import time
from types import TracebackType
from typing import Any

import structlog

from kasper_py.spark.range import ReprocessRange
from kasper_py.spark.task import PartitionStats

__all__ = ["JobProgress"]

_log = structlog.get_logger("kasper_py.reprocess")


class StatsList:
    """Accumulator param: a list of ``PartitionStats``, merged by concatenation."""

    def zero(self, _value: list[PartitionStats]) -> list[PartitionStats]:
        """An empty list, the accumulator's start in each task."""
        return []

    def addInPlace(  # noqa: N802 - the name pyspark calls
            self, value: list[PartitionStats], more: list[PartitionStats]
    ) -> list[PartitionStats]:
        """Append ``more`` to ``value``."""
        value.extend(more)
        return value


class JobProgress:
    """Logs ``kasper.reprocess_partition`` as partitions finish, polling every ``interval``."""

    def __init__(self, spark: Any, name: str, plan: ReprocessRange, interval: float = 0.5
                 ) -> None:
        self.accumulator = spark.sparkContext.accumulator([], StatsList())
        self._name, self._interval = name, interval
        self._partitions = len([p for p in plan.partitions
                                if any(plan.ends[t, q] > plan.starts[t, q]
                                       for t, q in plan.keys if q == p)])
        self._messages = plan.messages
        self._seen = 0
        self._done_messages = 0
        self._started = time.perf_counter()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="kasper-reprocess-progress",
                                        daemon=True)

    def __enter__(self) -> JobProgress:
        _log.info("kasper.reprocess_running", processor=self._name,
                  partitions=self._partitions, messages=self._messages)
        self._thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self._stop.set()
        self._thread.join()
        self._report_new()

    def _watch(self) -> None:
        while not self._stop.wait(self._interval):
            self._report_new()

    def _report_new(self) -> None:
        finished: list[PartitionStats] = list(self.accumulator.value)
        for stats in finished[self._seen:]:
            self._seen += 1
            self._done_messages += stats.messages
            percent = 100 * self._done_messages / self._messages if self._messages else 100.0
            _log.info("kasper.reprocess_partition", processor=self._name,
                      partition=stats.partition, messages=stats.messages,
                      produced=stats.produced, seconds=round(stats.seconds, 2),
                      done=f"{self._seen}/{self._partitions} partitions",
                      messages_done=self._done_messages, percent=round(percent, 1),
                      elapsed=round(time.perf_counter() - self._started, 1))
