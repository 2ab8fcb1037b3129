"""The Spark side of a job: the session (local by default, with the Kafka connector
jars as ``spark.jars``), the user's code shipped to executors, the Kafka batch read
laid out partition-wise, and the ``mapInArrow`` that runs ``_task.run_task`` in every
task. pyspark is imported here and in no other kasper_py module.
"""

from __future__ import annotations

import argparse
import atexit
import importlib
import os
import shutil
import sys
import tempfile
import uuid
import zipfile
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from kasper_py.config import Config
from kasper_py.exceptions import ReprocessError
from kasper_py.spark.range import ReprocessRange
from kasper_py.spark.task import COLUMNS, STATS_SCHEMA, PartitionStats, TaskSpec, run_task

__all__ = ["add_spark_arguments", "partition_wise", "read_input", "require_pyspark", "run_job",
           "session_for", "ship_modules", "ship_target", "source_options", "spark_reason",
           "spark_session", "spread", "submitted_session"]

# Reader options that would split one Kafka partition over several tasks, which would
# split the processor's state: refused.
_SPLITTING_OPTIONS = ("minPartitions", "maxRecordsPerPartition")
# Records per Arrow batch handed to a task. Bigger batches cost Spark more than they save.
_ARROW_BATCH = "10000"
_DEFAULT_READER_OPTIONS = {
    "kafka.isolation.level": "read_committed",  # what the live loop's consumer reads
    "kafka.max.poll.records": "20000",
}


def require_pyspark() -> Any:
    """Import pyspark (and what ``mapInArrow`` needs); return ``SparkSession``, or raise
    ImportError naming the extra to install."""
    try:
        # By name: pandas and pyarrow ship no type stubs, and mypy's config stays as is.
        for module in ("pandas", "pyarrow", "pyspark"):
            importlib.import_module(module)
        from pyspark.sql import SparkSession  # noqa: PLC0415
    except ImportError as exc:
        raise ImportError(f"kasper_py.reprocess needs pyspark with pandas and pyarrow "
                          f"({exc.name} is missing): pip install 'kasper-py[spark]'") from exc
    return SparkSession


def spark_session(master: str = "local[2]", jars: Sequence[str] | None = None,
                  conf: Mapping[str, str] | None = None) -> Any:
    """A SparkSession (local[2] by default) whose ``spark.jars`` are the Kafka connector's,
    resolved by ``kasper_py.stack.spark_jars()`` (Maven Central through mvn, no Ivy).

    Python workers run this interpreter unless ``PYSPARK_PYTHON`` says otherwise.
    """
    session_class = require_pyspark()
    if jars is None:
        from kasper_py.stack import spark_jars  # noqa: PLC0415 - resolves with mvn once

        jars = spark_jars()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = (session_class.builder.master(master).appName("kasper-reprocess")
               .config("spark.jars", ",".join(jars)))
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("WARN")
    return session


def ship_modules(spark: Any, targets: Sequence[str], app_dir: str) -> list[str]:
    """Add the code that ``targets`` (``module:attr`` names, already imported) come from
    to the session's Python files when it lies under ``app_dir``, so executors import it
    on any master: a module's file as is, a package zipped whole. Code installed in the
    driver's Python, kasper_py included, is expected installed where executors run too.
    Returns the files added."""
    root, installed = Path(app_dir).resolve(), Path(sys.prefix).resolve()
    shipped = []
    for top in dict.fromkeys(target.partition(":")[0].split(".")[0] for target in targets):
        origin = getattr(sys.modules.get(top), "__file__", None)
        if origin is None or top == "kasper_py":
            continue
        path = Path(origin).resolve()
        path = path.parent if path.name == "__init__.py" else path
        if path.is_relative_to(root) and not path.is_relative_to(installed):
            shipped.append(str(_zipped(path) if path.is_dir() else path))
            spark.sparkContext.addPyFile(shipped[-1])
    return shipped


def _zipped(package: Path) -> Path:
    """``package`` in a zip of its own (a unique name: Spark refuses a second file of the
    same name), removed when this process exits."""
    folder = Path(tempfile.mkdtemp(prefix="kasper-py-files-"))
    atexit.register(shutil.rmtree, folder, True)
    archive = folder / f"{package.name}-{uuid.uuid4().hex[:8]}.zip"
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as zipped:
        for file in sorted(package.rglob("*")):
            if file.is_file() and "__pycache__" not in file.parts:
                zipped.write(file, file.relative_to(package.parent))
    return archive


@contextmanager
def session_for(spark: Any | None) -> Iterator[Any]:
    """``spark`` as given, else a new local session that is stopped afterwards."""
    if spark is not None:
        yield spark
        return
    session_class = require_pyspark()
    existing = session_class.getActiveSession()
    session = existing or spark_session()
    try:
        yield session
    finally:
        if existing is None:
            session.stop()


def read_input(spark: Any, config: Config, plan: ReprocessRange,
               kafka_options: Mapping[str, str]) -> Any:
    """The range's records as a DataFrame of ``COLUMNS``, laid out partition-wise."""
    options = {**source_options(config, kafka_options, "reprocess"),
               "assign": plan.spark_assign(), "startingOffsets": plan.spark_offsets("start"),
               "endingOffsets": plan.spark_offsets("end")}
    try:
        source = spark.read.format("kafka").options(**options).load()
    except Exception as exc:  # e.g. AnalysisException: no Kafka source on the classpath
        raise ReprocessError(f"reading Kafka for {config.name!r} failed: "
                             f"{spark_reason(exc)}") from exc
    return partition_wise(source, config, spread(spark, plan.partitions))


def source_options(config: Config, kafka_options: Mapping[str, str], runner: str
                   ) -> dict[str, str]:
    """The Kafka source's options for ``config`` (``kafka_options`` checked and on top);
    the caller adds the partitions and offsets to read."""
    require_pyspark()
    _check_reader_options(kafka_options)
    return {**_DEFAULT_READER_OPTIONS, **kafka_options,
            "kafka.bootstrap.servers": config.bootstrap_servers, "includeHeaders": "true",
            "groupIdPrefix": f"kasper-{runner}-{config.name}"}


def partition_wise(source: Any, config: Config, partitions: int) -> Any:
    """The Kafka source's records as ``COLUMNS``: each partition number's records in one
    task, every topic's in offset order; ``partitions`` is ``spread()``'s count."""
    from pyspark.sql import functions  # noqa: PLC0415

    frame = source.select(
        "topic", "partition", "offset", "key", "value",
        functions.unix_millis("timestamp").alias("timestamp"), "timestampType",
        # An array column costs Spark's Arrow writer far more than its JSON text.
        functions.to_json("headers").alias("headers"))
    if len(config.input_topics) == 1:
        # The Kafka source reads each partition's range in one task, in offset order.
        return frame
    return _co_partitioned(frame, config, partitions, functions)


def _check_reader_options(kafka_options: Mapping[str, str]) -> None:
    """Refuse reader options that would break a guarantee of the job: splitting a Kafka
    partition over tasks, skipping records lost to retention (the job would still
    succeed and hand off past them), or reading what the live loop does not."""
    splitting = [key for key in kafka_options if key in _SPLITTING_OPTIONS]
    if splitting:
        raise ReprocessError(f"reader option {splitting[0]!r} would split a Kafka partition "
                             "over several tasks, and its processor state with it")
    if str(kafka_options.get("failOnDataLoss", "true")).lower() == "false":
        raise ReprocessError("reader option failOnDataLoss=false would skip records deleted "
                             "by retention while the job still succeeds (and hands off)")
    isolation = kafka_options.get("kafka.isolation.level", "read_committed")
    if isolation != "read_committed":
        raise ReprocessError(f"reader option kafka.isolation.level={isolation!r}: the live "
                             "loop reads read_committed, and reprocessing must read the same")


def spread(spark: Any, partitions: Sequence[int]) -> int:
    """The fewest shuffle partitions that give each Kafka partition number its own task.

    Spark's hash partitioning is ``pmod(hash(partition), n)``; colliding numbers would
    share a task and run one after the other, so ``n`` grows until none collide.
    """
    from pyspark.sql import functions  # noqa: PLC0415

    hashes = spark.range(1).select(*[functions.hash(functions.lit(p).cast("int"))
                                     for p in partitions]).first()
    for count in range(len(partitions), 8 * len(partitions) + 1):
        if len({value % count for value in hashes}) == len(partitions):
            return count
    return len(partitions)


def _co_partitioned(frame: Any, config: Config, partitions: int, functions: Any) -> Any:
    """Every topic's records of a partition number in one task, interleaved by time.

    Each topic keeps its offset order: the interleaving key is the running maximum of
    the topic-partition's timestamps, ties broken by the order of ``input_topics``.
    """
    from pyspark.sql import Window  # noqa: PLC0415

    topic_order = functions.array_position(
        functions.array(*[functions.lit(t) for t in config.input_topics]), functions.col("topic"))
    so_far = (Window.partitionBy("partition", "topic").orderBy("offset")
              .rowsBetween(Window.unboundedPreceding, Window.currentRow))
    return (frame.repartition(partitions, "partition")
            .withColumn("_clock", functions.max("timestamp").over(so_far))
            .withColumn("_topic_order", topic_order)
            .sortWithinPartitions("partition", "_clock", "_topic_order", "offset")
            .select(*COLUMNS))


def run_job(spark: Any, spec: TaskSpec, frame: Any, report: Any | None, *,
            retry_safe: bool | None = None) -> list[PartitionStats]:
    """Run every task; return the stats of each partition processed. A retried task
    fails the job unless ``retry_safe`` (default: ``retries_are_safe(spec)``)."""
    if spark.sparkContext.getConf().get("spark.speculation", "false").lower() == "true":
        raise ReprocessError("spark.speculation=true would run a Kafka partition's task "
                             "twice at once, duplicating its output and store writes; "
                             "turn it off for reprocessing")
    previous = spark.conf.get("spark.sql.execution.arrow.maxRecordsPerBatch")
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", _ARROW_BATCH)
    add = None if report is None else report.add
    if retry_safe is None:
        retry_safe = retries_are_safe(spec)

    def task(batches: Iterator[Any]) -> Iterator[Any]:
        if not retry_safe:
            _refuse_retried_attempt()
        return run_task(spec, batches, add)

    context, group = spark.sparkContext, f"kasper-{spec.config.name}-{uuid.uuid4().hex[:12]}"
    context.setJobGroup(group, f"kasper_py: {spec.config.name}")
    try:
        rows = frame.mapInArrow(task, STATS_SCHEMA).collect()
    except Exception as exc:
        raise ReprocessError(f"running {spec.config.name!r} on Spark failed: "
                             f"{spark_reason(exc)}") from exc
    finally:
        context.setLocalProperty("spark.jobGroup.id", None)
        spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", previous)
    if not retry_safe:
        _refuse_rerun_stages(context, group)
    return [PartitionStats.from_row(row) for row in rows]


def _refuse_rerun_stages(context: Any, group: str) -> None:
    """After the job: fail it when Spark ran any of its stages again or retried a task.
    A lost executor's shuffle output makes Spark resubmit the stage, whose new tasks
    start at attempt 0 again, so ``_refuse_retried_attempt`` cannot see them: a
    partition may have been processed twice, its output produced twice. The job then
    hands nothing off and says so, as for a retried task."""
    tracker = context.statusTracker()
    for job in tracker.getJobIdsForGroup(group):
        info = tracker.getJobInfo(job)
        for stage in (info.stageIds if info is not None else []):
            described = tracker.getStageInfo(stage)
            if described is not None and (described.currentAttemptId > 0
                                          or described.numFailedTasks > 0):
                raise ReprocessError(
                    f"Spark retried tasks of stage {stage} (stage attempt "
                    f"{described.currentAttemptId}, {described.numFailedTasks} failed "
                    "tasks), after losing an executor or its shuffle output: partitions "
                    "may have been processed twice, their output and store writes "
                    "duplicated, so the job fails and hands nothing off; run it again "
                    "(only output='stores' with effectively-once stores is retried)")


def retries_are_safe(spec: TaskSpec) -> bool:
    """A retried task runs its partitions again from the start of the range. Only
    effectively-once stores, with no Kafka output, absorb that without duplicates."""
    return spec.output == "stores" and bool(spec.stores) and all(
        getattr(store, "effectively_once", False) for store in spec.stores)


def _refuse_retried_attempt() -> None:
    """Inside a task: fail rather than run a partition a second time (an executor lost
    mid-task, say). The first attempt's output is
    already in Kafka with another producer, so the idempotent producer cannot drop
    the repeat; the job fails, hands nothing off, and can be run again."""
    from pyspark import TaskContext  # noqa: PLC0415 - runs on the executor, inside Spark

    context = TaskContext.get()
    if context is None or context.attemptNumber() == 0:
        return
    raise ReprocessError(
        f"Spark retried task {context.partitionId()} (attempt {context.attemptNumber()}): "
        "running its Kafka partitions again would duplicate their output and store "
        "writes, so the job fails instead; run it again (only output='stores' with "
        "effectively-once stores is retried)")


def spark_reason(exc: BaseException) -> str:
    """The useful line of a Spark error: the Python exception a task raised, else the
    first line, with a hint when the Kafka connector is missing."""
    text = str(exc)
    if "Failed to find data source: kafka" in text:
        return ("Spark has no Kafka source: set spark.jars to the paths printed by "
                "`python -m kasper_py.stack spark-jars` (" + text.splitlines()[0] + ")")
    lines = [line.strip().lstrip(": ") for line in text.splitlines() if line.strip()]
    raised = [line for line in lines if line.startswith("kasper_py.")]
    if raised:
        return raised[-1]
    errors = [line for line in lines if "Error: " in line or "Exception: " in line]
    return (errors or lines or [type(exc).__name__])[-1][:2000]


# -- what every Spark command line shares ---------------------------------------------

def add_spark_arguments(parser: argparse.ArgumentParser) -> None:
    """``--master`` and ``--kafka-option``, for every command that runs on Spark."""
    parser.add_argument("--master", help="Spark master (default: spark-submit's, else local[2])")
    parser.add_argument("--kafka-option", type=_option, action="append", default=[],
                        metavar="KEY=VALUE", help="Spark Kafka reader option, e.g. "
                        "kafka.security.protocol=SASL_SSL (repeatable)")


def _option(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"{text!r} is not KEY=VALUE")
    return key, value


def ship_target(spark: Any, args: argparse.Namespace) -> None:
    """Ship the code of ``add_target_arguments``' target and ``--stores`` to the
    session's executors (``ship_modules``, from ``--app-dir``)."""
    ship_modules(spark, [args.target, *([args.stores] if args.stores else [])], args.app_dir)


def submitted_session(master: str | None, conf: dict[str, str] | None = None) -> Any:
    """The session to run on, stopped by the caller: spark-submit's (it set the master
    and the jars), one for ``--master``, or ``None`` for ``session_for``'s local[2] one
    (or the process's active session)."""
    if master is not None:
        return spark_session(master, conf=conf)
    if os.environ.get("PYSPARK_GATEWAY_PORT"):  # set by spark-submit for its driver
        return require_pyspark().builder.getOrCreate()
    return None
