"""Changelog topics of local tables: created compacted with one partition per input
partition, and read back to restore a table (or to keep a global table current).
What a table does with the records it reads lives in its backend module (rocksdb.py).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

import structlog
from confluent_kafka import Consumer, KafkaException, TopicPartition

from kasper_py.config import Config
from kasper_py.exceptions import RestoreError, StoreError
from kasper_py.kafka.admin import topic_admin
from kasper_py.kafka.client_log import with_client_log
from kasper_py.kafka.topics import changelog_spec, topic_problem
from kasper_py.observability.observe import StoreObserver

__all__ = ["ChangelogReader", "ensure_changelog", "restore_plan"]

_log = structlog.get_logger("kasper_py")
_TIMEOUT = 30.0
_CHUNK = 20_000
_PROGRESS_EVERY = 2.0

ApplyRecords = Callable[[int, list[Any]], None]
"""Called with a partition number and its next records (confluent-kafka messages, in
offset order); it must apply them and record ``records[-1].offset() + 1``."""


def restore_plan(recorded: int | None, low: int, high: int) -> tuple[int, bool, str]:
    """Where a local copy resumes reading its changelog partition.

    Returns (offset to read from, whether to wipe the local copy first, reason). Local
    files record the next changelog offset they applied: ``None`` means missing (or
    written for another topic); past ``high`` means the topic was recreated or
    truncated; below ``low`` means records it never saw were deleted.
    """
    if recorded is None:
        return low, True, "missing"
    if recorded > high:
        return low, True, "ahead of changelog"
    if recorded < low:
        return low, True, "older than changelog start"
    if recorded < high:
        return recorded, False, "behind"
    return high, False, "up to date"


def ensure_changelog(config: Config, topic: str, *, replication_factor: int = -1,
                     topic_config: Mapping[str, str] | None = None) -> int:
    """Create ``topic`` (``cleanup.policy=compact``, one partition per partition number
    the loop runs: the input topics' largest count) when it is absent
    (``KafkaAdmin.ensure``); return its partition count.

    ``replication_factor=-1`` takes the broker's default. Raises ``StoreError`` when the
    input topic is missing, ``TopicError`` when an existing changelog has fewer
    partitions than the input or is not compacted.
    """
    admin = topic_admin(config)
    topics = admin.metadata().topics
    source = topics.get(config.input_topics[0])
    if topic_problem(source) is not None:
        raise StoreError(f"cannot create changelog {topic!r}: input topic "
                         f"{config.input_topics[0]!r} does not exist")
    wanted = max(len(topics[t].partitions) for t in config.input_topics
                 if topic_problem(topics.get(t)) is None)  # the loop's partition numbers
    spec = changelog_spec(topic, wanted, replication_factor, topic_config)
    admin.ensure([spec])
    existing = topics.get(topic)
    return wanted if topic_problem(existing) is not None else len(existing.partitions)


class ChangelogReader:
    """A group-less consumer of one changelog topic: watermarks, restore and catch-up."""

    def __init__(self, config: Config, topic: str, *, timeout: float = 600.0) -> None:
        conf = config.to_consumer_conf()
        conf.update({
            "group.id": f"{config.name}-changelog-reader",
            "client.id": f"{config.name}-changelog-reader",
            "auto.offset.reset": "earliest",
            # Restores read whole partitions: fetch big chunks, do not wait for more.
            "max.partition.fetch.bytes": 16 * 1024 * 1024,
            "fetch.wait.max.ms": 50,
        })
        self.topic = topic
        self._servers = config.bootstrap_servers
        self.timeout = timeout
        """Seconds a restore may take before it fails with ``RestoreError``."""
        self._consumer = Consumer(with_client_log(conf, config.name, "consumer"))
        self._positions: dict[int, int] = {}
        self._assigned_at = time.monotonic()

    def partition_count(self) -> int:
        """Partitions of the changelog; ``RestoreError`` when the topic does not exist."""
        try:
            meta = self._consumer.list_topics(self.topic, timeout=_TIMEOUT).topics[self.topic]
        except KafkaException as exc:
            raise RestoreError(f"cannot read changelog {self.topic!r} from {self._servers} "
                               f"within {_TIMEOUT:g}s: {exc.args[0]}") from exc
        if meta.error is not None or not meta.partitions:
            reason = meta.error.str() if meta.error is not None else "no partitions"
            raise RestoreError(f"changelog {self.topic!r}: {reason}")
        return len(meta.partitions)

    def watermarks(self, partition: int) -> tuple[int, int]:
        """(low, high) offsets of a changelog partition; retried while a new topic's
        metadata propagates."""
        deadline = time.monotonic() + _TIMEOUT
        while True:
            try:
                low, high = self._consumer.get_watermark_offsets(
                    TopicPartition(self.topic, partition), timeout=_TIMEOUT)
                return int(low), int(high)
            except KafkaException as exc:
                if time.monotonic() > deadline:
                    raise RestoreError(f"cannot read offsets of changelog {self.topic}"
                                       f"[{partition}] from {self._servers} within "
                                       f"{_TIMEOUT:g}s: {exc.args[0]}") from exc
                time.sleep(0.2)

    def assign(self, starts: Mapping[int, int]) -> None:
        """Read partition ``p`` from offset ``starts[p]`` on."""
        self._positions = dict(starts)
        self._assigned_at = time.monotonic()
        self._consumer.assign([TopicPartition(self.topic, p, o) for p, o in starts.items()])

    def unassign(self) -> None:
        """Stop reading (the consumer stays open for the next partition)."""
        self._consumer.unassign()
        self._positions = {}

    @property
    def positions(self) -> dict[int, int]:
        """Next offset to apply per assigned partition."""
        return dict(self._positions)

    def read_until(self, ends: Mapping[int, int], apply: ApplyRecords,
                   observer: StoreObserver, *, processor: str, table: str,
                   reason: str = "") -> int:
        """Apply records until every partition reached its ``ends`` offset; log progress
        and report it to ``observer``; return how many records were applied."""
        starts = dict(self._positions)
        progress = _Progress(self.topic, processor, table, starts, ends,
                             began=self._assigned_at, observer=observer)
        remaining = {p: e for p, e in ends.items() if starts.get(p, e) < e}
        progress.started(reason)
        while remaining:
            # Ask for no more than is left, so the last chunk returns without waiting.
            left = sum(e - self._positions[p] for p, e in remaining.items())
            progress.applied += self._read_chunk(apply, 0.5, min(left, _CHUNK))
            remaining = {p: e for p, e in remaining.items() if self._positions[p] < e}
            if progress.elapsed() > self.timeout:
                raise RestoreError(f"restoring from {self.topic} did not finish within "
                                   f"{self.timeout}s: {self._lagging(remaining)}")
            progress.tick(self._positions)
        progress.done(self._positions)
        return progress.applied

    def read_available(self, apply: ApplyRecords) -> int:
        """Apply what already arrived, without waiting; return how many records."""
        applied = 0
        while True:
            count = self.read_chunk(apply)
            if not count:
                return applied
            applied += count

    def read_chunk(self, apply: ApplyRecords) -> int:
        """Apply one chunk (up to ``_CHUNK`` records) of what already arrived, without
        waiting; return how many records."""
        return self._read_chunk(apply, 0.0, _CHUNK)

    def close(self) -> None:
        """Close the consumer (it never committed anything)."""
        self._consumer.close()

    def _read_chunk(self, apply: ApplyRecords, timeout: float, count: int) -> int:
        try:
            records: list[Any] = self._consumer.consume(count, timeout)
        except KafkaException as exc:
            raise RestoreError(f"reading changelog {self.topic}: {exc.args[0]}") from exc
        by_partition: dict[int, list[Any]] = {}
        for record in records:
            error = record.error()
            if error is not None:
                raise RestoreError(f"reading changelog {self.topic}[{record.partition()}]: "
                                   f"{error.str()}", code=error.code())
            by_partition.setdefault(record.partition(), []).append(record)
        for partition, chunk in by_partition.items():
            apply(partition, chunk)
            self._positions[partition] = chunk[-1].offset() + 1
        self._past_markers()
        return len(records)

    def _past_markers(self) -> None:
        """Move positions past what read_committed never returns: transaction markers and
        aborted records (an exactly-once changelog ends with a commit marker, so the
        last record's offset + 1 never reaches the high watermark)."""
        if not self._positions:
            return
        asked = [TopicPartition(self.topic, p) for p in self._positions]
        try:
            found = self._consumer.position(asked)
        except KafkaException as exc:
            raise RestoreError(f"reading changelog {self.topic}: {exc.args[0]}") from exc
        for tp in found:
            if tp.offset >= 0 and tp.offset > self._positions.get(tp.partition, tp.offset):
                self._positions[tp.partition] = tp.offset

    def _lagging(self, remaining: Mapping[int, int]) -> str:
        return ", ".join(f"[{p}] at {self._positions[p]} of {end}"
                         for p, end in sorted(remaining.items()))


class _Progress:
    """Logs a restore (structlog) and reports it to the store's observer."""

    def __init__(self, topic: str, processor: str, table: str, starts: Mapping[int, int],
                 ends: Mapping[int, int], *, began: float, observer: StoreObserver) -> None:
        self.table, self.observer = table, observer
        self.starts, self.ends = dict(starts), dict(ends)
        self.total = sum(max(e - starts.get(p, e), 0) for p, e in ends.items())
        self.applied = 0
        self._fields = {"processor": processor, "table": table, "topic": topic}
        self._began, self._last = began, time.monotonic()

    def elapsed(self) -> float:
        return time.monotonic() - self._began

    def started(self, reason: str) -> None:
        if self.total:
            spans = {p: [self.starts[p], e] for p, e in self.ends.items()
                     if self.starts.get(p, e) < e}
            _log.info("kasper.restore_started", records=self.total, reason=reason,
                      partitions=spans, **self._fields)
        for partition, end in self.ends.items():
            self.observer.on_restore_started(self.table, partition,
                                             max(end - self.starts.get(partition, end), 0))
        self._report(self.starts)

    def tick(self, positions: Mapping[int, int]) -> None:
        now = time.monotonic()
        if now - self._last < _PROGRESS_EVERY:
            return
        self._last = now
        _log.info("kasper.restore_progress", applied=self.applied, of=self.total,
                  records_per_s=round(self.applied / self.elapsed()), **self._fields)
        self._report(positions)

    def done(self, positions: Mapping[int, int]) -> None:
        if self.total:
            seconds = self.elapsed()
            _log.info("kasper.restore_done", applied=self.applied, seconds=round(seconds, 3),
                      records_per_s=round(self.applied / max(seconds, 1e-9)), **self._fields)
        self._report(positions)

    def _report(self, positions: Mapping[int, int]) -> None:
        for partition, end in self.ends.items():
            start = self.starts.get(partition, end)
            total = max(end - start, 0)
            restored = min(max(positions.get(partition, start) - start, 0), total)
            self.observer.on_restore_progress(self.table, partition, restored, total)
