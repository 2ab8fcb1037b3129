"""``stream()``: check the group and the checkpoint, start a Structured Streaming query
whose every micro-batch runs the reprocessing job's partition-wise tasks
(``kasper_py.spark.session.run_job``), then commit the micro-batch's end offsets to
the live group with a ``streaming`` note. ``StreamingRun`` is the handle.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

import structlog

from kasper_py.config import Config
from kasper_py.exceptions import KasperError, StreamError
from kasper_py.kafka.admin import KafkaAdmin
from kasper_py.kafka.offsets import (
    HEARTBEAT_SECONDS,
    STREAM_PREFIX,
    CommitNote,
    NoteState,
    running_window,
    start_offset,
)
from kasper_py.kafka.topics import input_partitions
from kasper_py.loop.committer import check_not_running
from kasper_py.message import TopicPartitionKey
from kasper_py.processor import ProcessorFactory
from kasper_py.reprocess import ReprocessRange
from kasper_py.spark.session import (
    partition_wise,
    require_pyspark,
    run_job,
    source_options,
    spark_reason,
    spark_session,
    spread,
)
from kasper_py.spark.task import PartitionStats, TaskSpec
from kasper_py.stores.base import StoreSpec
from kasper_py.stores.specs import check_unique_names
from kasper_py.stream._metrics import StreamMetrics

__all__ = ["STREAM_SPARK_CONF", "MicroBatch", "Starting", "StreamingRun", "stream"]

Starting = Literal["group", "earliest", "latest"]

_log = structlog.get_logger("kasper_py.stream")
_WATCH_SECONDS = 0.5
STREAM_SPARK_CONF = {"spark.task.maxFailures": "4"}
"""What a session the stream builds is given: task attempts per Spark task (Spark's own
default on a cluster); a retried task runs its partitions of the micro-batch again,
which at-least-once output tolerates."""


@dataclass(frozen=True)
class MicroBatch:
    """What one completed micro-batch did, as the driver saw it."""

    batch_id: int
    messages: int
    produced: int
    seconds: float
    """Wall time of the micro-batch's tasks and its offset commit."""
    ends: dict[TopicPartitionKey, int]
    """Next offset to read per topic-partition it read, as committed to the group."""
    task_seconds: float = 0.0
    """Seconds its tasks spent in the turn engine (processing, producing, waiting for
    acks), summed over partitions: ``seconds`` less this, per task slot, is Spark's
    scheduling, the Kafka read, the Arrow hand-over and the offset commit."""


def stream(
    config: Config,
    factory: ProcessorFactory,
    *,
    checkpoint: str | Path,
    stores: Sequence[StoreSpec] = (),
    master: str | None = None,
    trigger: float = 1.0,
    starting: Starting = "group",
    spark_conf: Mapping[str, str] | None = None,
    kafka_options: Mapping[str, str] | None = None,
    force: bool = False,
    spark: Any | None = None,
) -> StreamingRun:
    """Start ``factory``'s processors live on Spark Structured Streaming; return the handle.

    Every ``trigger`` seconds a micro-batch reads what arrived on the input topics and
    runs each partition number's records (every input topic's, in offset order) through
    the turn engine in one Spark task, in batches of ``config.largest_batch``; the output
    is produced and acknowledged inside the tasks, then the micro-batch's end offsets
    are committed to ``config.group`` with a ``streaming`` note, and only then does
    Spark's checkpoint (``checkpoint``, any Hadoop path) advance: at-least-once,
    duplicates bounded by one micro-batch. A new checkpoint starts at the group's
    committed offsets (``starting="group"``, else ``config.auto_offset_reset`` where
    none is committed) or at ``earliest``/``latest``; an existing one resumes.

    ``master`` (default local[2]) and ``spark_conf`` build the session unless ``spark``
    is given; ``kafka_options`` are extra Kafka source options (``maxOffsetsPerTrigger``,
    ``kafka.*`` client settings). Raises ``AlreadyRunningError`` while a live loop (or
    another stream) commits to the group, unless ``force``; ``StreamError`` for bad
    arguments, RocksDB tables (their state lives on one machine, while a partition's
    micro-batches run wherever Spark places them) or a checkpoint older than the
    group's offsets; ``TopicError`` when the input topics are not as configured.
    """
    _check_arguments(stores, trigger, starting, str(checkpoint), master=master, spark=spark)
    require_pyspark()
    spec = TaskSpec(replace(config, processing_guarantee="at_least_once"), factory,
                    tuple(stores))
    facts = KafkaAdmin(config, client_id=f"{config.name}-reprocess", failure=StreamError)
    try:
        keys = input_partitions(config, facts.metadata())
        _check_not_running(config, facts, keys, force)
        session = spark or spark_session(master or "local[2]",
                                         conf={**STREAM_SPARK_CONF, **(spark_conf or {})})
        run = StreamingRun(spec, facts, session, owns_session=spark is None)
    except BaseException:
        facts.close()
        raise
    run.start(keys, str(checkpoint), trigger, starting, dict(kafka_options or {}))
    return run


def _check_arguments(stores: Sequence[StoreSpec], trigger: float, starting: str,
                     checkpoint: str, *, master: str | None, spark: Any | None) -> None:
    if isinstance(trigger, bool) or not isinstance(trigger, (int, float)) or trigger <= 0:
        raise StreamError(f"trigger must be a positive number of seconds, got {trigger!r}")
    if starting not in ("group", "earliest", "latest"):
        raise StreamError(f"starting must be 'group', 'earliest' or 'latest', "
                          f"got {starting!r}")
    if not checkpoint.strip():
        raise StreamError("checkpoint must name a directory (local, hdfs://, s3a://...) "
                          "where Spark keeps the query's offsets")
    if master is not None and spark is not None:
        raise StreamError("pass either master or spark (a session has its master already)")
    check_unique_names(stores, StreamError)
    local = [spec.name for spec in stores if type(spec).__name__ == "RocksDBTable"]
    if local:
        raise StreamError(
            f"store {local[0]!r} is a RocksDB table, which streaming does not support: "
            "its state lives in files on one machine, but each micro-batch runs a "
            "partition wherever Spark places its task, so the state would have to move "
            "(or be restored from the changelog) every micro-batch; use a Redis or "
            "Cassandra table, or the live loop")


def _check_not_running(config: Config, facts: KafkaAdmin, keys: list[TopicPartitionKey],
                       force: bool) -> None:
    """Refuse while a live loop (or another stream) commits to the group."""
    check_not_running(config, facts.commit_notes(keys), force=force, by_stream=True,
                      refusal=lambda other: _refusal(config, other))


def _refusal(config: Config, other: CommitNote) -> str:
    return (f"processor {config.name!r}: group {config.group!r} is being processed by a "
            f"{'stream' if other.by_stream else 'live loop'} that is {other.describe()}; "
            "both would process and commit. Stop it first (its last commit then says "
            "stopped), or pass force=True (--force) if it is gone (it counts as running "
            f"for {running_window(config):.0f} s after its last commit)")


class StreamingRun:
    """A running streaming query: ``stop()``, ``await_termination()``, ``batches``."""

    def __init__(self, spec: TaskSpec, facts: KafkaAdmin, spark: Any, *,
                 owns_session: bool) -> None:
        self.config = spec.config
        self.spark = spark
        self.batches: list[MicroBatch] = []
        """Every micro-batch completed by this run, in order."""
        self.query: Any = None
        """The pyspark ``StreamingQuery`` (``lastProgress``, ``status``...)."""
        self._spec, self._facts, self._owns_session = spec, facts, owns_session
        self._committed: dict[TopicPartitionKey, int] = {}
        self._last_commit = 0.0
        self._lock = threading.Condition()
        self._in_batch = False
        self._stopping = False
        self._stopped = False
        self._spread = 1
        self._checkpoint = ""
        self._keys: set[TopicPartitionKey] = set()
        self._seen_progress = -1
        self._metrics = StreamMetrics(self.config)
        self._watcher = threading.Thread(target=self._watch, name="kasper-stream-watch",
                                         daemon=True)

    # -- start -------------------------------------------------------------------

    def start(self, keys: list[TopicPartitionKey], checkpoint: str, trigger: float,
              starting: Starting, kafka_options: dict[str, str]) -> None:
        """Plan the start (1, 2), announce it on the group (3), start the query (4)."""
        self._checkpoint, self._keys = checkpoint, set(keys)
        try:
            resumes = self._checkpoint_exists(checkpoint)
            starts = self._starts(keys, starting, resumes)                            # 1
            options = {**source_options(self.config, kafka_options, "stream"),       # 2
                       "assign": starts.spark_assign(),
                       "startingOffsets": starts.spark_offsets("start")}
            self._spread = spread(self.spark, starts.partitions)
            self._committed = {k: v for k, v in starts.starts.items() if v >= 0}
            self._commit("streaming")                                                 # 3
            self.query = self._start_query(options, checkpoint, trigger)              # 4
        except BaseException:
            self._release()
            raise
        _log.info("kasper.stream_started", processor=self.config.name, resumes=resumes,
                  checkpoint=checkpoint, starts=starts.describe(), trigger=trigger)
        self._watcher.start()

    def _planned_ends(self, batch_id: int) -> dict[TopicPartitionKey, int]:
        """The end offsets Spark planned for micro-batch ``batch_id`` (its offset log,
        written before the batch runs), for the partitions this stream reads. Past the
        last record they also cover what ``read_committed`` never returns (transaction
        markers, aborted records), so the group's offsets reach a transactional input's
        end rather than stopping one short of every commit marker. Empty when the log
        cannot be read: the last records' offsets + 1 are committed then."""
        text = self._read_checkpoint(f"offsets/{batch_id}")
        lines = [line for line in (text or "").splitlines() if line.startswith("{")]
        try:
            planned = json.loads(lines[-1]) if len(lines) >= 2 else {}  # metadata, then the source
        except ValueError:
            return {}
        return {(topic, int(partition)): int(offset)
                for topic, offsets in planned.items() if isinstance(offsets, dict)
                for partition, offset in offsets.items()
                if (topic, int(partition)) in self._keys and int(offset) >= 0}

    def _read_checkpoint(self, name: str) -> str | None:
        """A file of the checkpoint, read through Hadoop's FileSystem (any checkpoint
        URL), or None when it is not there."""
        jvm = self.spark._jvm
        fs, path = self._hadoop_path(self._checkpoint, name)
        if not fs.exists(path):
            return None
        stream = fs.open(path)
        try:
            reader = jvm.java.io.BufferedReader(jvm.java.io.InputStreamReader(stream, "UTF-8"))
            lines = []
            while (line := reader.readLine()) is not None:
                lines.append(str(line))
            return "\n".join(lines)
        finally:
            stream.close()

    def _hadoop_path(self, checkpoint: str, name: str) -> tuple[Any, Any]:
        """Hadoop's FileSystem (any checkpoint URL: local, hdfs://, s3a://) and the path
        of ``name`` in ``checkpoint``."""
        path = self.spark._jvm.org.apache.hadoop.fs.Path(f"{checkpoint.rstrip('/')}/{name}")
        return path.getFileSystem(self.spark._jsparkSession.sessionState().newHadoopConf()), path

    def _checkpoint_exists(self, checkpoint: str) -> bool:
        """True when ``checkpoint`` holds offsets of an earlier run; refused when a live
        loop committed to the group after that run (resuming would repeat its work)."""
        fs, path = self._hadoop_path(checkpoint, "offsets")
        if not fs.exists(path) or len(fs.listStatus(path)) == 0:
            return False
        keys = input_partitions(self.config, self._facts.metadata())
        notes = [n for n in self._facts.commit_notes(keys) if n]
        newest = max(notes, key=lambda note: note.at, default=None)
        if newest is not None and not newest.by_stream:
            raise StreamError(
                f"checkpoint {checkpoint!r} holds an earlier run's offsets, but a live loop "
                f"committed to group {self.config.group!r} since ({newest.describe()}): "
                "resuming would process again what it did. Start with a new checkpoint "
                "directory; the stream then starts at the group's offsets")
        return True

    def _starts(self, keys: list[TopicPartitionKey], starting: Starting,
                resumes: bool) -> ReprocessRange:
        """Where a new checkpoint starts: the group's offsets, or the reset policy's
        (``earliest``/``latest``) where none is committed or asked for."""
        watermarks = self._facts.watermarks(keys)
        committed = self._facts.committed(keys)
        reset = self.config.auto_offset_reset if starting == "group" else starting
        starts = {key: start_offset(committed.get(key) if starting == "group" or resumes
                                    else None, *watermarks[key], reset) for key in keys}
        return ReprocessRange(starts, {key: high for key, (_, high) in watermarks.items()})

    def _start_query(self, options: dict[str, str], checkpoint: str, trigger: float) -> Any:
        try:
            source = self.spark.readStream.format("kafka").options(**options).load()
            return (source.writeStream.foreachBatch(self._on_batch)
                    .option("checkpointLocation", checkpoint)
                    .trigger(processingTime=f"{trigger} seconds")
                    .queryName(f"kasper-{self.config.name}").start())
        except Exception as exc:
            raise StreamError(f"starting the stream of {self.config.name!r} failed: "
                              f"{spark_reason(exc)}") from exc

    # -- each micro-batch (on the driver, in Spark's query thread) ---------------

    def _on_batch(self, frame: Any, batch_id: int) -> None:
        with self._batch_gate():
            started = time.perf_counter()
            laid = partition_wise(frame, self.config, self._spread)
            stats = run_job(self.spark, self._spec, laid, None, retry_safe=True)
            ends = _ends(stats)
            for key, end in self._planned_ends(batch_id).items():
                ends[key] = max(end, ends.get(key, end))
            with self._lock:
                self._committed.update(ends)
            self._commit("streaming")
            batch = MicroBatch(batch_id, sum(s.messages for s in stats),
                               sum(s.produced for s in stats), time.perf_counter() - started,
                               ends, sum(s.seconds for s in stats))
            self.batches.append(batch)
            self._metrics.observe_batch(batch.messages, batch.produced, batch.seconds)
            _log.info("kasper.stream_batch", processor=self.config.name, batch_id=batch_id,
                      messages=batch.messages, produced=batch.produced,
                      seconds=round(batch.seconds, 3),
                      offsets=", ".join(f"{t}[{p}] {o}" for (t, p), o in sorted(ends.items())))

    @contextmanager
    def _batch_gate(self) -> Iterator[None]:
        """A micro-batch starts only while the run is not stopping; ``stop()`` waits for
        the one in hand, so a clean stop leaves no micro-batch half produced."""
        with self._lock:
            if self._stopping:
                raise _StoppingError("the stream is stopping: this micro-batch is not run")
            self._in_batch = True
        try:
            yield
        finally:
            with self._lock:
                self._in_batch = False
                self._lock.notify_all()

    # -- the watcher: progress metrics, heartbeat notes -----------------------------

    def _watch(self) -> None:
        while not self._stopped:
            try:
                self._report_progress()
                if time.monotonic() - self._last_commit >= HEARTBEAT_SECONDS:
                    self._commit("streaming")
            except Exception as exc:  # the next round tries again; the query is unaffected
                _log.warning("kasper.stream_watch_failed", processor=self.config.name,
                             error=str(exc))
            time.sleep(_WATCH_SECONDS)

    def _report_progress(self) -> None:
        query = self.query
        for progress in list(query.recentProgress if query is not None else []):
            batch_id = int(progress["batchId"])
            if batch_id <= self._seen_progress:
                continue
            self._seen_progress = batch_id
            lag = self._metrics.observe_progress(progress)
            if progress["numInputRows"]:
                _log.info("kasper.stream_progress", processor=self.config.name,
                          batch_id=batch_id, input_rows=progress["numInputRows"],
                          rows_per_second=round(progress["processedRowsPerSecond"] or 0.0, 1),
                          lag=lag)

    # -- offsets -----------------------------------------------------------------

    def _commit(self, state: NoteState) -> None:
        with self._lock:
            offsets = dict(self._committed)
        if not offsets:
            return
        note = CommitNote.now(state, STREAM_PREFIX + self.config.partition_set).encode()
        self._facts.commit(offsets, note)
        self._last_commit = time.monotonic()

    @property
    def committed(self) -> dict[TopicPartitionKey, int]:
        """The next offsets to read this run committed to the group, per topic-partition."""
        with self._lock:
            return dict(self._committed)

    def caught_up(self) -> bool:
        """True when the committed offsets reach the input's high watermarks now."""
        committed = self.committed
        highs = self._facts.watermarks(sorted(committed))
        return all(committed[key] >= high for key, (_, high) in highs.items())

    def await_caught_up(self, timeout: float | None = None, poll: float = 0.5) -> bool:
        """Wait until ``caught_up()`` (True) or ``timeout`` seconds pass (False); raises
        the query's error if it fails meanwhile."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self.caught_up():
            if self.await_termination(poll):
                return self.caught_up()
            if deadline is not None and time.monotonic() > deadline:
                return False
        return True

    # -- stop --------------------------------------------------------------------

    def await_termination(self, timeout: float | None = None) -> bool:
        """Wait for the query to end (True) or ``timeout`` seconds (False). A failed
        query raises ``StreamError`` naming the cause (a task's exception, say)."""
        try:
            ended = self.query.awaitTermination(timeout)
        except Exception as exc:
            if self._stopping and _StoppingError.__name__ in str(exc):
                return True
            raise StreamError(f"the stream of {self.config.name!r} failed: "
                              f"{spark_reason(exc)}") from exc
        return True if ended is None else bool(ended)

    def stop(self) -> None:
        """Let the micro-batch in hand finish, stop the query, commit the offsets with a
        ``stopped`` note (a live loop may then take over at once) and release the
        session it built. Idempotent."""
        if self._stopped:
            return
        with self._lock:
            self._stopping = True
            while self._in_batch:
                self._lock.wait()
        try:
            if self.query is not None:
                self.query.stop()
        finally:
            self._stopped = True
            try:
                self._commit("stopped")
            except KasperError as exc:
                _log.warning("kasper.note_commit_failed", processor=self.config.name,
                             state="stopped", error=str(exc))
            self._release()
            _log.info("kasper.stream_stopped", processor=self.config.name,
                      batches=len(self.batches))

    def _release(self) -> None:
        self._stopped = True
        self._metrics.close()
        self._facts.close()
        if self._owns_session:
            self.spark.stop()

    def __enter__(self) -> StreamingRun:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stop()


class _StoppingError(Exception):
    """Raised into Spark by a micro-batch that starts while the run is stopping."""


def _ends(stats: Sequence[PartitionStats]) -> dict[TopicPartitionKey, int]:
    """Next offset to read per topic-partition the micro-batch processed."""
    return {(topic, s.partition): last + 1 for s in stats
            for topic, (_, last) in s.ranges.items()}
