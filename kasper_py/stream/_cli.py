"""``kasper stream`` / ``python -m kasper_py.stream`` / ``spark-submit``: run a processor
factory live on Spark Structured Streaming until SIGTERM or Ctrl-C (or, with
``--until-caught-up``, until the input's current end is committed). Configuration as
for ``kasper run``; exit codes are the CLI's: 0 ok, 1 the stream failed, 2 usage,
3 bad configuration or arguments, 4 Kafka unreachable, 5 refused (a live loop runs).
"""

from __future__ import annotations

import argparse
import signal
import threading
from collections.abc import Sequence
from typing import Any

from kasper_py.cli.base import (
    EXIT_BROKER,
    EXIT_CONFIG,
    EXIT_REFUSED,
    CliError,
    ExitCodes,
    load_target,
    run_command,
)
from kasper_py.cli.spark import spark_config, spark_parser
from kasper_py.exceptions import AlreadyRunningError, BrokerUnreachableError, StreamError
from kasper_py.spark.session import (
    ship_target,
    spark_session,
    submitted_session,
)
from kasper_py.stream._query import STREAM_SPARK_CONF, StreamingRun, stream

__all__ = ["main"]

_EXIT_CODES: ExitCodes = ((ImportError, EXIT_CONFIG), (AlreadyRunningError, EXIT_REFUSED),
                          (BrokerUnreachableError, EXIT_BROKER))


def _parser(prog: str) -> argparse.ArgumentParser:
    return spark_parser(prog, "Run a processor live on Spark Structured Streaming, "
                        "committing each micro-batch's offsets to the live group.",
                        _add_arguments, flags=("metrics_port",))


def _add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--checkpoint", metavar="DIR",
                        help="Spark checkpoint directory (default: checkpoints/<name>)")
    parser.add_argument("--trigger", type=float, default=1.0, metavar="SECONDS",
                        help="start a micro-batch this often (default: 1)")
    parser.add_argument("--starting", choices=("group", "earliest", "latest"), default="group",
                        help="where a new checkpoint starts: the group's offsets (default)")
    parser.add_argument("--until-caught-up", action="store_true",
                        help="stop once the input's end at start-up is committed")
    parser.add_argument("--force", action="store_true",
                        help="start even if a live loop's note says it is running")


def main(argv: Sequence[str] | None = None, prog: str = "python -m kasper_py.stream") -> int:
    """Run the command line; returns the exit code."""
    return run_command(_parser(prog), _run, argv, prog, _EXIT_CODES)


def _run(args: argparse.Namespace) -> int:
    config = spark_config(args)
    factory, stores = load_target(args, config)
    # the command owns its session, so the target's code can be shipped to executors
    spark = (submitted_session(args.master, conf=STREAM_SPARK_CONF)
             or spark_session("local[2]", conf=STREAM_SPARK_CONF))
    try:
        ship_target(spark, args)
        run = stream(config, factory, stores=stores, checkpoint=args.checkpoint or
                     f"checkpoints/{config.name}", trigger=args.trigger,
                     starting=args.starting, kafka_options=dict(args.kafka_option),
                     force=args.force, spark=spark)
    except StreamError as exc:  # refused at start: the arguments or the checkpoint
        spark.stop()
        raise CliError(EXIT_CONFIG, str(exc)) from None
    except BaseException:
        spark.stop()
        raise
    try:
        _wait(run, args.until_caught_up)
    finally:
        run.stop()
        spark.stop()
    print(f"streamed {sum(b.messages for b in run.batches)} messages in "
          f"{len(run.batches)} micro-batches; group {config.group} resumes at "
          + ", ".join(f"{t}[{p}] {o}" for (t, p), o in sorted(run.committed.items())),
          flush=True)
    return 0


def _wait(run: StreamingRun, until_caught_up: bool) -> None:
    """Until caught up, the query ends, or SIGTERM / Ctrl-C."""
    stopping = threading.Event()
    previous: Any = signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    try:
        while not stopping.is_set():
            if until_caught_up and run.caught_up():
                return
            if run.await_termination(0.5):
                return
    except KeyboardInterrupt:
        return
    finally:
        signal.signal(signal.SIGTERM, previous)
