"""``reprocess()``: plan the range, check the handoff is possible, run the Spark job,
then hand the end offsets to the live group. Each step is its own function, in order.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import structlog

from kasper_py.config import Config
from kasper_py.exceptions import ReprocessError
from kasper_py.message import TopicPartitionKey
from kasper_py.processor import ProcessorFactory
from kasper_py.reprocess._handoff import HandoffRefusedError, check_group_idle, commit_handoff
from kasper_py.reprocess._kafka import KafkaFacts
from kasper_py.reprocess._progress import JobProgress
from kasper_py.spark.range import Position, ReprocessRange, plan_range
from kasper_py.spark.session import read_input, require_pyspark, run_job, session_for
from kasper_py.spark.task import Output, PartitionStats, TaskSpec
from kasper_py.stores.base import StoreSpec
from kasper_py.stores.specs import check_unique_names

__all__ = ["ReprocessResult", "hand_off", "reprocess", "resolve_range"]


_log = structlog.get_logger("kasper_py.reprocess")


@dataclass
class ReprocessResult:
    """What a job did: its range, each partition's stats, and whether it handed off."""

    range: ReprocessRange
    partitions: list[PartitionStats] = field(default_factory=list)
    seconds: float = 0.0
    """Wall time of the Spark job (not of planning or the handoff)."""
    handed_off: bool = False
    """True when the live group's offsets were set to ``range.ends``."""

    @property
    def messages(self) -> int:
        """Input messages processed."""
        return sum(p.messages for p in self.partitions)

    @property
    def produced(self) -> int:
        """Output messages produced (and acknowledged)."""
        return sum(p.produced for p in self.partitions)

    @property
    def undecodable(self) -> int:
        """Input messages that did not decode, set aside by ``Config.on_decode_error``."""
        return sum(p.undecodable for p in self.partitions)


def reprocess(
    config: Config,
    factory: ProcessorFactory,
    *,
    start: Position = "earliest",
    end: Position = "latest",
    stores: Sequence[StoreSpec] = (),
    output: Output = "kafka",
    handoff: bool = False,
    force: bool = False,
    spark: Any | None = None,
    kafka_options: Mapping[str, str] | None = None,
) -> ReprocessResult:
    """Run ``factory``'s processors over the input topics from ``start`` to ``end``.

    Each partition number's messages, every input topic's in offset order, go to one
    Spark task and reach its processor in batches of ``config.largest_batch`` through a
    ``Sender``. ``output="kafka"`` produces what they send (idempotent, acks=all);
    ``output="stores"`` only writes the ``stores`` and discards it. With ``handoff``,
    a successful job commits its end offsets to the live group (``config.group``), which
    must be idle unless ``force``. ``spark`` defaults to a local[2] session, stopped
    afterwards; ``kafka_options`` are extra Spark Kafka reader options (``kafka.*``
    client settings such as SASL). Raises ``TopicError`` when the input topics are not as
    configured, else ``ReprocessError`` (``RangeError`` for a bad range,
    ``HandoffRefusedError`` for an active group) naming what is wrong.
    """
    _check_arguments(stores, output)
    require_pyspark()
    # Spark's tasks produce at-least-once (a task is not a transaction; a failed job is
    # rerun whole), so they never take the live loop's transactional id.
    spec = TaskSpec(replace(config, processing_guarantee="at_least_once"),
                    factory, tuple(stores), output)
    facts = KafkaFacts(config)
    try:
        plan = _plan(facts, start, end)                                            # 1
        before = _before_job(config, facts, plan, handoff, force)                   # 2
        result = _run(spec, plan, spark, dict(kafka_options or {}))                 # 3
        if handoff:
            _hand_off_result(config, facts, result, before)                         # 4
    finally:
        facts.close()
    return result


def resolve_range(config: Config, start: Position = "earliest",
                  end: Position = "latest") -> ReprocessRange:
    """The offsets ``reprocess`` would cover, without running anything."""
    facts = KafkaFacts(config)
    try:
        return _plan(facts, start, end)
    finally:
        facts.close()


def hand_off(config: Config, ends: Mapping[TopicPartitionKey, int], *,
             force: bool = False) -> None:
    """Commit ``ends`` (e.g. ``result.range.ends``) to the live group; refused while
    the group is active unless ``force``."""
    facts = KafkaFacts(config)
    try:
        if not force:
            check_group_idle(config, facts, ends)
        commit_handoff(config, facts, ends, None)
    finally:
        facts.close()


def _check_arguments(stores: Sequence[StoreSpec], output: str) -> None:
    if output not in ("kafka", "stores"):
        raise ReprocessError(f"output must be 'kafka' or 'stores', got {output!r}")
    if output == "stores" and not stores:
        raise ReprocessError("output='stores' needs the stores to write: pass stores=[...]")
    check_unique_names(stores, ReprocessError)


def _plan(facts: KafkaFacts, start: Position, end: Position) -> ReprocessRange:
    watermarks = facts.watermarks(facts.input_keys())
    return plan_range(watermarks, start, end,
                      lambda millis: facts.offsets_at(millis, watermarks))


def _before_job(config: Config, facts: KafkaFacts, plan: ReprocessRange, handoff: bool,
                force: bool) -> dict[TopicPartitionKey, int | None] | None:
    """With a handoff (not forced): refuse now if the group is active, and remember its
    offsets to see whether a live loop commits while the job runs."""
    _log.info("kasper.reprocess_range", processor=config.name, range=plan.describe(),
              messages=plan.messages, handoff=handoff)
    if not handoff or force:
        return None
    check_group_idle(config, facts, plan.keys)
    return facts.committed(plan.keys)


def _run(spec: TaskSpec, plan: ReprocessRange, spark: Any | None,
         kafka_options: dict[str, str]) -> ReprocessResult:
    result = ReprocessResult(plan)
    if plan.messages == 0:
        _log.info("kasper.reprocess_empty", processor=spec.config.name)
        return result
    started = time.perf_counter()
    with session_for(spark) as session:
        frame = read_input(session, spec.config, plan, kafka_options)
        with JobProgress(session, spec.config.name, plan) as progress:
            result.partitions = run_job(session, spec, frame, progress.accumulator)
    result.seconds = time.perf_counter() - started
    _check_partitions(result.partitions)
    _log.info("kasper.reprocess_finished", processor=spec.config.name,
              messages=result.messages, produced=result.produced,
              undecodable=result.undecodable, seconds=round(result.seconds, 2))
    return result


def _hand_off_result(config: Config, facts: KafkaFacts, result: ReprocessResult,
                     before: Mapping[TopicPartitionKey, int | None] | None) -> None:
    try:
        commit_handoff(config, facts, result.range.ends, before)
    except HandoffRefusedError as exc:
        error = HandoffRefusedError(
            f"{exc} -- the job itself succeeded; once the live loop is stopped, hand off "
            f"its end offsets with hand_off(config, error.result.range.ends): "
            f"{result.range.describe()}")
        error.result = result
        raise error from exc
    result.handed_off = True
    _log.info("kasper.reprocess_handoff", processor=config.name, group=config.group,
              offsets=result.range.describe())


def _check_partitions(partitions: Sequence[PartitionStats]) -> None:
    """Each partition number must have been processed by exactly one task."""
    seen: set[int] = set()
    for stats in partitions:
        if stats.partition in seen:
            raise ReprocessError(f"partition {stats.partition} was processed by more than one "
                                 "task, so its state was split: the reader must not split "
                                 "Kafka partitions")
        seen.add(stats.partition)
