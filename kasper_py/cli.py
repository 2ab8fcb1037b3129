"""The ``kasper`` command line: run a processor, manage its group's offsets, show its
lag, replay its dead letters (``_dlq_replay``), and start the local stack.
Configuration comes from a TOML file, then
``KASPER_*`` environment variables, then flags (each overrides the one before); that
loading, targets and exit codes live in ``_cli_base``, shared with ``kasper reprocess``.

Errors are one line on stderr, no traceback, with an exit code per cause:

    0  success              3  bad configuration (the message names the field)
    1  the processor failed 4  Kafka unreachable
    2  bad command line     5  refused (offsets reset while the group is active, or
                               kasper run while another loop runs these partitions)
                            130 interrupted twice (forced stop)
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, TextIO

import structlog
from confluent_kafka import (
    Consumer,
    ConsumerGroupTopicPartitions,
    KafkaException,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient

import kasper_py
from kasper_py._cli_base import (
    EXIT_BROKER,
    EXIT_CONFIG,
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_REFUSED,
    EXIT_USAGE,
    CliError,
    add_config_flags,
    add_target_arguments,
    add_tasks_argument,
    config_from_args,
    exit_code,
    load_config,
    load_target,
    load_tasks,
    load_views,
    print_error,
    setup_logging,
)
from kasper_py._client_log import ClientKind, with_client_log
from kasper_py._dlq_replay import add_dlq_parser, replay
from kasper_py.config import Config
from kasper_py.exceptions import AlreadyRunningError, ConfigError, KasperError, TopicError
from kasper_py.metrics import PrometheusObserver, observer_for
from kasper_py.observe import LoopObserver, NoopStoreObserver, with_store_observer
from kasper_py.offsets import (
    GROUP_ACTIVE_ERRORS,
    IDLE_GROUP_STATES,
    CommitNote,
    partition_lag,
    running_loop,
    running_window,
)
from kasper_py.processor import ProcessorFactory
from kasper_py.query import View
from kasper_py.query._cli import main as query_main
from kasper_py.stores.base import StoreSpec
from kasper_py.supervisor import Supervisor, WorkerSpec, split_partitions
from kasper_py.time import Task
from kasper_py.topic_processor import TopicProcessor
from kasper_py.topics import (
    ensure_output_topics,
    input_partitions,
    owned_partitions,
    partition_count,
)

__all__ = ["EXIT_BROKER", "EXIT_CONFIG", "EXIT_FAILED", "EXIT_INTERRUPTED", "EXIT_REFUSED",
           "CliError", "load_config", "main"]

_PROG = "kasper"
_log = structlog.get_logger("kasper_py.cli")


# -- argument parsing ---------------------------------------------------------------

def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kasper", description="Run and operate kasper_py processors.",
        epilog="Exit codes: 0 ok, 1 processor failed, 2 usage, 3 bad config, "
               "4 Kafka unreachable, 5 refused.")
    parser.add_argument("--version", action="version", version=f"kasper {_version()}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    run = commands.add_parser("run", help="run a processor until SIGTERM/SIGINT")
    add_target_arguments(run)
    add_tasks_argument(run)
    run.add_argument("--metrics-host", default="0.0.0.0",
                     help="address the metrics server binds (default: 0.0.0.0)")
    run.add_argument("--force", action="store_true",
                     help="start although another loop's recent commit says it is running "
                          "these partitions (two loops would both process and commit)")
    run.add_argument("--until-caught-up", action="store_true",
                     help="exit 0 once caught up: every assigned partition consumed to its "
                          "end; with --assignment group, every partition of the input "
                          "topics committed to its end by the group (until then the member "
                          "processes whatever the group assigns it)")
    run.add_argument("--create-topics", action="store_true",
                     help="create the declared output topics (output_topics) that do not "
                          "exist, with their partitions and settings; without it a missing "
                          "one refuses to start. Either way an existing one must have the "
                          "declared partition count. Undeclared topics are never created: "
                          "the first send to a missing one fails the turn, uncommitted")
    run.add_argument("--processes", type=int, nargs="?", const=os.cpu_count() or 1,
                     metavar="N", help="run N worker processes (default: the core count) on "
                     "disjoint partition sets, or all in the group with --assignment group; "
                     "the metrics port, if set, serves the supervisor, workers the next ones")
    _add_config_flags(run)
    commands.add_parser("stack", help="start/stop the local stack (see `kasper stack -h`)",
                        add_help=False)
    commands.add_parser("reprocess", add_help=False,
                        help="run a processor over history with Spark (see `kasper reprocess -h`)")
    commands.add_parser("stream", add_help=False,
                        help="run a processor live on Spark Structured Streaming "
                             "(see `kasper stream -h`)")
    commands.add_parser("query", add_help=False,
                        help="read a running processor's tables (see `kasper query -h`)")
    _add_offsets_parser(commands)
    _add_config_flags(commands.add_parser("lag", help="the group's lag per partition"))
    add_dlq_parser(commands, _add_config_flags)
    return parser


def _add_offsets_parser(commands: Any) -> None:
    offsets = commands.add_parser("offsets", help="show or reset the group's offsets")
    actions = offsets.add_subparsers(dest="action", required=True, metavar="ACTION")
    _add_config_flags(actions.add_parser("show", help="committed offsets and watermarks"))
    reset = actions.add_parser("reset", help="move the committed offsets (group must be idle)")
    where = reset.add_mutually_exclusive_group(required=True)
    where.add_argument("--to", type=_reset_target, metavar="WHERE",
                       help="every input partition to earliest, latest, an ISO-8601 time "
                            "(UTC if no zone) or epoch ms")
    # Same dest as --to: the reset receives one target, a list when given as offsets.
    where.add_argument("--to-offset", dest="to", action="append", type=_offset_target,
                       metavar="TOPIC:PARTITION=OFFSET",
                       help="only this partition, to this offset (repeat for more); e.g. "
                            "past a record that fails every run: its offset + 1")
    reset.add_argument("--dry-run", action="store_true", help="show the plan, change nothing")
    reset.add_argument("--force", action="store_true",
                       help="reset although a kasper loop committed recently without saying "
                            "it stopped (one killed with -9, say): make sure it is gone")
    _add_config_flags(reset)


def _add_config_flags(parser: argparse.ArgumentParser) -> None:
    add_config_flags(parser)
    parser.add_argument("--connect-timeout", type=float, default=10.0, metavar="SECONDS",
                        help="how long to wait for Kafka before giving up (default: 10)")


ExplicitOffset = tuple[str, int, int]
"""One ``--to-offset``: topic, partition, offset."""
ResetTarget = str | int | list[ExplicitOffset]
"""``--to``: earliest, latest or epoch ms; or the ``--to-offset`` list."""


def _reset_target(text: str) -> str | int:
    """``earliest``/``latest``, or a timestamp in epoch milliseconds."""
    if text in ("earliest", "latest"):
        return text
    if text.isdigit():
        return int(text)
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not earliest, latest, an ISO-8601 time or epoch milliseconds") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return int(moment.timestamp() * 1000)


def _offset_target(text: str) -> ExplicitOffset:
    """``TOPIC:PARTITION=OFFSET``; Kafka topic names cannot hold ``:`` or ``=``."""
    place, _, offset = text.rpartition("=")
    topic, _, partition = place.rpartition(":")
    if not topic or not partition.isdigit() or not offset.isdigit():
        raise argparse.ArgumentTypeError(
            f"{text!r} is not TOPIC:PARTITION=OFFSET (e.g. orders:3=1234)")
    return topic, int(partition), int(offset)


def _version() -> str:
    return str(kasper_py.__version__)


# -- entry point --------------------------------------------------------------------

def main(argv: Sequence[str] | None = None) -> int:
    """Run ``kasper``; returns the exit code (the console script exits with it)."""
    args_list = list(sys.argv[1:] if argv is None else argv)
    own_parser = _OWN_PARSERS.get(args_list[0]) if args_list else None
    if own_parser is not None:  # a command with its own parser and options
        return own_parser(args_list[1:])
    args = _parser().parse_args(args_list)
    args.argv = args_list
    try:
        return _dispatch(args)
    except (CliError, TopicError) as exc:  # a TopicError is bad configuration: exit 3
        print_error(_PROG, str(exc))
        return exit_code(exc)
    except KeyboardInterrupt:
        print_error(_PROG, "interrupted")
        return EXIT_INTERRUPTED
    except Exception as exc:
        _log.exception("kasper.cli_failed", command=args.command)
        print_error(_PROG, f"{type(exc).__name__}: {exc}")
        return EXIT_FAILED


def _dispatch(args: argparse.Namespace) -> int:
    setup_logging(args)
    config = config_from_args(args)
    if args.command == "run":
        return _run(config, args)
    if args.command == "lag":
        return _lag(config, args.connect_timeout)
    if args.command == "dlq":
        return replay(config, args)
    if args.action == "show":
        return _offsets_show(config, args.connect_timeout)
    return _offsets_reset(config, args.to, args.dry_run, args.connect_timeout, args.force)


def _stack(argv: list[str]) -> int:
    from kasper_py import stack  # noqa: PLC0415 - only `kasper stack` needs it

    return int(stack.main(argv))


def _reprocess(argv: list[str]) -> int:
    from kasper_py.reprocess import main as reprocess_main  # noqa: PLC0415 - needs PySpark

    return int(reprocess_main(argv, prog="kasper reprocess"))


def _stream(argv: list[str]) -> int:
    from kasper_py.stream import main as stream_main  # noqa: PLC0415 - needs PySpark

    return int(stream_main(argv, prog="kasper stream"))


_OWN_PARSERS: dict[str, Callable[[list[str]], int]] = {
    "stack": _stack, "reprocess": _reprocess, "stream": _stream, "query": query_main}


# -- kasper run ---------------------------------------------------------------------

def _run(config: Config, args: argparse.Namespace) -> int:
    if args.processes is not None:
        return _supervise(config, args)
    factory, stores = load_target(args, config)
    tasks, views = load_tasks(args, config), load_views(args, config)
    metadata = _probe(config, args.connect_timeout)
    input_partitions(config, metadata)  # topics exist?
    _output_topics(config, metadata, args.create_topics)
    observer = _observer(config, args.metrics_host)
    try:
        processor = _build_processor(config, factory, stores, tasks,
                                     with_store_observer(observer, _RestoreDisplay()),
                                     force=args.force, views=views)
        _log.info("kasper.run", processor=config.name, target=args.target, config=repr(config))
        return _run_loop(processor, args.until_caught_up)
    finally:
        if isinstance(observer, PrometheusObserver):
            observer.close()


def _supervise(config: Config, args: argparse.Namespace) -> int:
    """``kasper run --processes N``: N workers, each this same command without
    ``--processes``, given its partitions (static) and its metrics port."""
    if args.processes < 1:
        raise CliError(EXIT_USAGE, f"--processes must be at least 1, got {args.processes}")
    load_target(args, config)  # a bad target fails here, not N times in the workers
    load_tasks(args, config)
    load_views(args, config)
    metadata = _probe(config, args.connect_timeout)
    owned = owned_partitions(config, partition_count(config, metadata))
    _output_topics(config, metadata, args.create_topics)  # once, before the workers
    base = [*_kasper_command(), *_without_processes(args.argv)]
    if config.group_mode:
        sets: list[list[int] | None] = [None] * args.processes
    else:
        try:
            sets = list(split_partitions(owned, args.processes))
        except ValueError as exc:
            raise CliError(EXIT_USAGE, str(exc)) from None
    if config.query_endpoint is not None and args.processes > 1:
        raise CliError(EXIT_USAGE, "query_endpoint names one instance, but --processes runs "
                       f"{args.processes}: leave it unset, and each worker announces its own")
    port = config.metrics_port
    workers = []
    for index, partitions in enumerate(sets):
        command = list(base)
        if partitions is not None:
            command += ["--input-partitions", ",".join(map(str, partitions))]
        worker_port = None if port is None else port + 1 + index
        if worker_port is not None:
            command += ["--metrics-port", str(worker_port)]
        if config.query_port is not None:  # 0 stays 0: any free port, announced in notes
            command += ["--query-port", str(config.query_port and config.query_port + index)]
        workers.append(WorkerSpec(index, command, worker_port))
    _log.info("kasper.supervising", processor=config.name, workers=len(workers),
              assignment=config.assignment,
              partitions="group" if config.group_mode else sets)
    metrics = None if port is None else (args.metrics_host, port)
    return Supervisor(workers, env=dict(os.environ), metrics=metrics).run()


def _output_topics(config: Config, metadata: Any, create: bool) -> None:
    """The declared output topics checked (and with ``create`` the absent ones created,
    each logged) before the processor starts; ``TopicError`` (exit 3) otherwise."""
    if config.output_topics:
        ensure_output_topics(config, create=create, admin=_admin(config, []), metadata=metadata)


def _kasper_command() -> list[str]:
    return [sys.executable, "-m", "kasper_py"]


def _without_processes(argv: Sequence[str]) -> list[str]:
    """The command line minus ``--processes [N]`` (a worker runs one process)."""
    kept, skip = [], False
    for index, token in enumerate(argv):
        if skip:
            skip = False
            continue
        if token.startswith("--processes="):
            continue
        if token == "--processes":
            following = argv[index + 1] if index + 1 < len(argv) else ""
            skip = following.isdigit()
            continue
        kept.append(token)
    return kept


def _observer(config: Config, host: str) -> LoopObserver:
    try:
        observer = observer_for(config, host)
    except ImportError as exc:
        raise CliError(EXIT_CONFIG, f"config field 'metrics_port': {exc}") from None
    except OSError as exc:
        raise CliError(EXIT_CONFIG, f"config field 'metrics_port': cannot listen on "
                       f"{host}:{config.metrics_port}: {exc.strerror or exc}") from None
    if isinstance(observer, PrometheusObserver) and observer.server is not None:
        _log.info("kasper.metrics_serving", processor=config.name, host=host,
                  port=observer.server.port)
    return observer


def _build_processor(config: Config, factory: ProcessorFactory, stores: list[StoreSpec],
                     tasks: list[Task], observer: LoopObserver, *, force: bool = False,
                     views: Mapping[str, View] | None = None) -> TopicProcessor:
    try:
        return TopicProcessor(config, factory, stores=stores, observer=observer, force=force,
                              tasks=tasks, views=views)
    except ConfigError as exc:  # the query server's port or TLS files
        raise CliError(EXIT_CONFIG, str(exc)) from None
    except ValueError as exc:  # a view path, a store name given twice
        raise CliError(EXIT_CONFIG, str(exc)) from None
    except KafkaException as exc:
        raise CliError(EXIT_CONFIG, "librdkafka refused the client settings "
                       f"(client_overrides, consumer_overrides, producer_overrides): "
                       f"{_reason(exc)}") from None


def _run_loop(processor: TopicProcessor, until_caught_up: bool) -> int:
    try:
        with processor:
            processor.run_until_stopped(until_caught_up=until_caught_up)
    except KeyboardInterrupt:
        _log.warning("kasper.interrupted", processor=processor.config.name)
        return EXIT_INTERRUPTED
    except AlreadyRunningError as exc:
        raise CliError(EXIT_REFUSED, f"processor {processor.config.name!r} refused to "
                       f"start: {exc}") from None
    except KasperError as exc:
        raise CliError(EXIT_FAILED, f"processor {processor.config.name!r} stopped: {exc}") from None
    except Exception as exc:
        _log.exception("kasper.crashed", processor=processor.config.name)
        raise CliError(EXIT_FAILED, f"processor {processor.config.name!r} crashed: "
                       f"{type(exc).__name__}: {exc}") from None
    return EXIT_OK


# -- Kafka access for the operating commands ----------------------------------------

def _quiet(config: Config, conf: dict[str, Any], errors: list[str],
           client: ClientKind) -> dict[str, Any]:
    """A client's settings with librdkafka's logs quiet: the first error it reports is
    kept in ``errors`` for the message instead; what it still logs goes into the JSON
    log through ``with_client_log``."""
    quiet = {**conf, "log_level": 2, "error_cb": lambda error: errors.append(error.str())}
    return with_client_log(quiet, config.name, client)


def _admin(config: Config, errors: list[str]) -> Any:
    try:
        return AdminClient(_quiet(config, config.to_admin_conf(), errors, "admin"))
    except KafkaException as exc:
        raise CliError(EXIT_CONFIG,
                       f"librdkafka refused client_overrides: {_reason(exc)}") from None


def _consumer(config: Config, errors: list[str]) -> Any:
    """A consumer of the processor's group, as the loop's but never subscribing (so
    never a member) and under its own client id."""
    # read_uncommitted: the committed offsets as they stand, not waited on while a killed
    # exactly-once loop's open transaction holds offsets (until its successor aborts it)
    conf = {**_quiet(config, config.to_consumer_conf(), errors, "consumer"),
            "client.id": f"{config.name}-cli", "isolation.level": "read_uncommitted"}
    try:
        return Consumer(conf)
    except KafkaException as exc:
        raise CliError(EXIT_CONFIG, "librdkafka refused client_overrides/consumer_overrides: "
                       f"{_reason(exc)}") from None


def _probe(config: Config, timeout: float) -> Any:
    """Cluster metadata, or ``CliError(EXIT_BROKER)`` when no broker answers."""
    errors: list[str] = []
    admin = _admin(config, errors)
    try:
        return admin.list_topics(timeout=timeout)
    except KafkaException as exc:
        admin.poll(0)  # serves error_cb, which holds the cause (refused, DNS, TLS, SASL)
        detail = errors[0] if errors else _reason(exc)
        raise CliError(EXIT_BROKER, f"cannot reach Kafka at {config.bootstrap_servers} "
                       f"within {timeout:g}s: {detail}") from None


def _reason(exc: BaseException) -> str:
    error = exc.args[0] if exc.args else exc
    text = error.str() if hasattr(error, "str") else str(error)
    return str(text)


@dataclass
class PartitionOffsets:
    """The group's committed offset and the watermarks of one input partition."""

    topic: str
    partition: int
    committed: int | None
    low: int
    high: int
    note: CommitNote | None = None
    """Who made the committed offset's commit, when a kasper loop did."""

    def lag(self, auto_offset_reset: str) -> int:
        """Messages left to process; from the reset policy when nothing is committed."""
        return partition_lag(self.committed, self.low, self.high, auto_offset_reset)


def _read_offsets(config: Config, metadata: Any, timeout: float) -> list[PartitionOffsets]:
    keys = input_partitions(config, metadata)
    errors: list[str] = []
    consumer = _consumer(config, errors)
    progress = Progress("reading offsets", len(keys))
    try:
        committed = consumer.committed([TopicPartition(t, p) for t, p in keys], timeout=timeout)
        rows = []
        for tp in committed:
            low, high = consumer.get_watermark_offsets(tp, timeout=timeout)
            rows.append(PartitionOffsets(tp.topic, tp.partition,
                                         tp.offset if tp.offset >= 0 else None, low, high,
                                         CommitNote.decode(tp.metadata)))
            progress.advance()
        return rows
    except KafkaException as exc:
        raise CliError(EXIT_BROKER, f"reading offsets of group {config.group!r} failed: "
                       f"{_reason(exc)}") from None
    finally:
        progress.finish()
        consumer.close()


# -- kasper offsets show / kasper lag ------------------------------------------------

def _offsets_show(config: Config, timeout: float) -> int:
    metadata = _probe(config, timeout)
    state, members = _group_state(config, timeout)
    rows = _read_offsets(config, metadata, timeout)
    print(f"group {config.group} ({state.lower()}, {len(members)} members)")
    owners = _owners(members)
    table = [["TOPIC", "PARTITION", "COMMITTED", "LOW", "HIGH", "LAG", "MEMBER"]]
    table += [[r.topic, str(r.partition), "-" if r.committed is None else str(r.committed),
               str(r.low), str(r.high), str(r.lag(config.auto_offset_reset)),
               owners.get((r.topic, r.partition), "-")] for r in rows]
    print(_format_table(table))
    notes = [r.note for r in rows if r.note is not None]
    if notes:
        print(f"last commit by a kasper loop: {max(notes, key=lambda n: n.at).describe()}")
    return EXIT_OK


def _lag(config: Config, timeout: float) -> int:
    rows = _read_offsets(config, _probe(config, timeout), timeout)
    owners = _owners(_group_state(config, timeout)[1])
    lags = [r.lag(config.auto_offset_reset) for r in rows]
    table = [["TOPIC", "PARTITION", "LAG", "MEMBER"]]
    table += [[r.topic, str(r.partition), str(lag), owners.get((r.topic, r.partition), "-")]
              for r, lag in zip(rows, lags, strict=True)]
    print(_format_table(table))
    print(f"total lag of group {config.group}: {sum(lags)} messages")
    return EXIT_OK


def _format_table(rows: list[list[str]]) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True))
                     .rstrip() for row in rows)


# -- kasper offsets reset -------------------------------------------------------------

def _offsets_reset(config: Config, to: ResetTarget, dry_run: bool, timeout: float,
                   force: bool = False) -> int:
    metadata = _probe(config, timeout)
    _refuse_if_active(config, timeout)
    current = _read_offsets(config, metadata, timeout)
    if not force:
        _refuse_if_running(config, current)
    targets = _targets(config, current, to, timeout)
    table = [["TOPIC", "PARTITION", "COMMITTED", "NEW"]]
    table += [[r.topic, str(r.partition), "-" if r.committed is None else str(r.committed),
               str(targets[r.topic, r.partition])]
              for r in current if (r.topic, r.partition) in targets]
    print(_format_table(table))
    if dry_run:
        print(f"dry run: group {config.group} unchanged")
        return EXIT_OK
    _alter_offsets(config, targets, timeout)
    print(f"group {config.group}: {len(targets)} partitions reset to {_describe_target(to)}")
    return EXIT_OK


def _describe_target(to: ResetTarget) -> str:
    if isinstance(to, list):
        return ", ".join(f"{topic}:{partition}={offset}" for topic, partition, offset in to)
    if isinstance(to, str):
        return to
    moment = datetime.fromtimestamp(to / 1000, tz=UTC)
    return f"{moment.isoformat(timespec='milliseconds')} ({to} ms)"


@dataclass(frozen=True)
class GroupMember:
    """A member of the consumer group (group mode) and what it is assigned."""

    client_id: str
    host: str
    partitions: tuple[tuple[str, int], ...]

    def describe(self) -> str:
        """``client-id@host``."""
        return f"{self.client_id}@{self.host.lstrip('/')}"


def _group_state(config: Config, timeout: float) -> tuple[str, list[GroupMember]]:
    """The group's state name and its members, with their assignments."""
    admin = _admin(config, [])  # must outlive the future, or the future never completes
    future = admin.describe_consumer_groups([config.group], request_timeout=timeout)
    try:
        description = future[config.group].result(timeout=timeout + 5)
    except KafkaException as exc:
        raise CliError(EXIT_BROKER, f"describing group {config.group!r} failed: "
                       f"{_reason(exc)}") from None
    members = [GroupMember(m.client_id, m.host, tuple(sorted(
        (tp.topic, tp.partition) for tp in (m.assignment.topic_partitions if m.assignment
                                            else ())))) for m in description.members]
    return description.state.name, members


def _owners(members: list[GroupMember]) -> dict[tuple[str, int], str]:
    return {tp: member.describe() for member in members for tp in member.partitions}


def _refuse_if_active(config: Config, timeout: float) -> None:
    state, members = _group_state(config, timeout)
    if members or state not in IDLE_GROUP_STATES:
        listed = ", ".join(m.describe() for m in members) or "none"
        raise CliError(EXIT_REFUSED, f"group {config.group!r} is active ({state.lower()}, "
                       f"members: {listed}): stop its processors first")


def _refuse_if_running(config: Config, current: list[PartitionOffsets]) -> None:
    """A loop with a static assignment is no group member, but its commit notes show it:
    a reset under a running loop would be overwritten by its next commit."""
    note = running_loop(config, [r.note for r in current])
    if note is not None:
        raise CliError(EXIT_REFUSED, f"group {config.group!r} is being processed: a kasper "
                       f"loop is {note.describe()}, and its next commit would undo the "
                       "reset; stop it first (its last commit then says it stopped), or "
                       "pass --force if it is gone (a loop counts as running for "
                       f"{running_window(config):.0f} s after its last commit)")


def _targets(config: Config, current: list[PartitionOffsets], to: ResetTarget,
             timeout: float) -> dict[tuple[str, int], int]:
    if isinstance(to, list):
        return _explicit_targets(config, current, to)
    if to == "earliest":
        return {(r.topic, r.partition): r.low for r in current}
    if to == "latest":
        return {(r.topic, r.partition): r.high for r in current}
    errors: list[str] = []
    consumer = _consumer(config, errors)
    progress = Progress(f"finding offsets at {to} ms", len(current))
    try:
        targets = {}
        for row in current:  # one request per partition, so progress is visible
            found = consumer.offsets_for_times(
                [TopicPartition(row.topic, row.partition, int(to))], timeout=timeout)[0]
            # -1: no message at or after the time; start after the last one.
            targets[row.topic, row.partition] = found.offset if found.offset >= 0 else row.high
            progress.advance()
        return targets
    except KafkaException as exc:
        raise CliError(EXIT_BROKER, f"offsets_for_times failed: {_reason(exc)}") from None
    finally:
        progress.finish()
        consumer.close()


def _explicit_targets(config: Config, current: list[PartitionOffsets],
                      wanted: list[ExplicitOffset]) -> dict[tuple[str, int], int]:
    """The ``--to-offset`` targets, each checked against its partition's watermarks:
    Kafka answers an offset it no longer (or not yet) holds with "out of range", and
    the next run would silently start at ``auto_offset_reset`` instead."""
    rows = {(r.topic, r.partition): r for r in current}
    targets: dict[tuple[str, int], int] = {}
    for topic, partition, offset in wanted:
        row = rows.get((topic, partition))
        if row is None:
            owned = ", ".join(f"{t}:{p}" for t, p in rows)
            raise CliError(EXIT_USAGE, f"--to-offset {topic}:{partition}: not an input "
                           f"partition of group {config.group!r} (its partitions: {owned})")
        if (topic, partition) in targets:
            raise CliError(EXIT_USAGE, f"--to-offset {topic}:{partition} is given twice")
        if not row.low <= offset <= row.high:
            raise CliError(EXIT_USAGE, f"--to-offset {topic}:{partition}={offset}: topic "
                           f"{topic!r} partition {partition} holds offsets {row.low}..{row.high}"
                           f" (low to high watermark; {row.high} is the end, after its last "
                           "record)")
        targets[topic, partition] = offset
    return targets


def _alter_offsets(config: Config, targets: dict[tuple[str, int], int], timeout: float) -> None:
    request = ConsumerGroupTopicPartitions(
        config.group, [TopicPartition(t, p, o) for (t, p), o in sorted(targets.items())])
    admin = _admin(config, [])  # must outlive the future, or the future never completes
    future = admin.alter_consumer_group_offsets([request], request_timeout=timeout)
    try:
        result = future[config.group].result(timeout=timeout + 5)
    except KafkaException as exc:
        code = exc.args[0].code() if exc.args and hasattr(exc.args[0], "code") else None
        if code in GROUP_ACTIVE_ERRORS:
            raise CliError(EXIT_REFUSED, f"group {config.group!r} became active: "
                           f"{_reason(exc)}") from None
        raise CliError(EXIT_FAILED, f"resetting offsets failed: {_reason(exc)}") from None
    refused = [tp for tp in result.topic_partitions if tp.error is not None]
    if refused:
        active = all(tp.error.code() in GROUP_ACTIVE_ERRORS for tp in refused)
        causes = "; ".join(f"{tp.topic}[{tp.partition}]: {tp.error.str()}" for tp in refused)
        if active:
            raise CliError(EXIT_REFUSED, f"group {config.group!r} became active: {causes}")
        raise CliError(EXIT_FAILED, f"resetting offsets failed for {causes}")


# -- progress display ------------------------------------------------------------------

class Progress:
    """Progress of long work: one line redrawn in place on a terminal; elsewhere a
    ``kasper.progress`` log line at most every ``log_every`` seconds and at the end."""

    def __init__(self, label: str, total: int, stream: TextIO | None = None,
                 log_every: float = 10.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.label, self.total, self.done = label, total, 0
        self._stream = stream or sys.stderr
        self._tty = bool(getattr(self._stream, "isatty", lambda: False)())
        self._clock, self._log_every = clock, log_every
        self._last_shown = clock()
        self._finished = False

    def advance(self, count: int = 1) -> None:
        """``count`` more units are done."""
        self.update(self.done + count)

    def update(self, done: int, total: int | None = None) -> None:
        """``done`` of ``total`` units are done; redraws when worth it."""
        self.done, self.total = done, self.total if total is None else total
        now = self._clock()
        interval = 0.1 if self._tty else self._log_every
        if now - self._last_shown >= interval or self.done >= self.total:
            self._last_shown = now
            self._show()

    def finish(self) -> None:
        """End the display (a newline on a terminal, a last log line elsewhere)."""
        if self._finished:
            return
        self._finished = True
        if self._tty:
            self._show()
            self._stream.write("\n")
            self._stream.flush()
        elif self.total >= 100:
            _log.info("kasper.progress", task=self.label, done=self.done, total=self.total)

    def _show(self) -> None:
        percent = 100 * self.done / self.total if self.total else 100.0
        if self._tty:
            self._stream.write(f"\r{self.label}: {self.done}/{self.total} ({percent:.0f}%)")
            self._stream.flush()
        elif 0 < self.done < self.total:
            _log.info("kasper.progress", task=self.label, done=self.done, total=self.total)


class _RestoreDisplay(NoopStoreObserver):
    """Shows the changelog restores the processor's stores report."""

    def __init__(self) -> None:
        self._bars: dict[tuple[str, int], Progress] = {}

    def on_restore_progress(self, store: str, partition: int, restored: int,
                            total: int) -> None:
        key = (store, partition)
        bar = self._bars.get(key)
        if bar is None and total <= 0:
            return  # nothing to restore: no bar
        if bar is None:
            bar = self._bars[key] = Progress(f"restoring {store}[{partition}]", total)
        bar.update(restored, total)
        if restored >= total:
            bar.finish()
