"""The ``kasper`` command line behind ``kasper_py.cli.main``: run a processor or an app
(here), manage its group's offsets and show its lag (``offsets``), replay its dead
letters (``dlq``), describe or reset an app (``app``), read its tables (``query``), and
dispatch ``kasper reprocess``/``stream``/``stack`` and the topic commands (``topics``,
``produce``, ``consume``) to their own parsers. Configuration
comes from a TOML file, then ``KASPER_*`` environment variables, then flags (each
overrides the one before); that loading, targets and exit codes live in ``base`` (the
field types in ``fields``), shared by every command.

Errors are one line on stderr, no traceback, with an exit code per cause:

    0  success              3  bad configuration (the message names the field)
    1  the processor failed 4  Kafka unreachable
    2  bad command line     5  refused (offsets reset or app reset while the group is
                               active or a loop runs it, or kasper run while another
                               loop runs these partitions)
                            130 interrupted twice (forced stop)
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import structlog
from confluent_kafka import KafkaException

import kasper_py
from kasper_py._support.signals import held_signal
from kasper_py.app import App, plan_for
from kasper_py.cli.app import add_app_parsers, app_command
from kasper_py.cli.base import (
    CONFIG_FLAGS,
    EXIT_BROKER,
    EXIT_CONFIG,
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_REFUSED,
    EXIT_USAGE,
    OPERATE_FLAGS,
    CliError,
    add_config_flags,
    add_target_arguments,
    add_tasks_argument,
    config_from_args,
    exit_code,
    load_config,
    load_runnable,
    load_tasks,
    load_views,
    print_error,
    setup_logging,
)
from kasper_py.cli.consume import main as consume_main
from kasper_py.cli.dlq import add_dlq_parser, replay
from kasper_py.cli.offsets import (
    Progress,
    add_offsets_parsers,
    admin_for,
    clear_running_notes,
    lag,
    offsets_reset,
    offsets_show,
    probe,
)
from kasper_py.cli.produce import main as produce_main
from kasper_py.cli.query import main as query_main
from kasper_py.cli.standby import main as standby_main
from kasper_py.cli.topics import main as topics_main
from kasper_py.config import Config
from kasper_py.exceptions import AlreadyRunningError, ConfigError, KasperError, TopicError
from kasper_py.kafka.admin import ensure_output_topics, reason
from kasper_py.kafka.topics import (
    check_internal_topics,
    owned_partitions,
)
from kasper_py.message import TopicPartitionKey
from kasper_py.observability.observe import NoopStoreObserver
from kasper_py.processor import ProcessorFactory
from kasper_py.query import View
from kasper_py.stack import prometheus_target
from kasper_py.stores.base import StoreSpec
from kasper_py.supervisor import Supervisor, WorkerSpec, split_partitions, standby_sets
from kasper_py.time import Task
from kasper_py.topic_processor import TopicProcessor

__all__ = ["EXIT_BROKER", "EXIT_CONFIG", "EXIT_FAILED", "EXIT_INTERRUPTED", "EXIT_REFUSED",
           "CliError", "load_config", "main"]

_PROG = "kasper"
_log = structlog.get_logger("kasper_py.cli")
_CLEAR_TIMEOUT = 5.0
"""Seconds a forced stop waits for Kafka to clear its running notes."""


# -- argument parsing ---------------------------------------------------------------

def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kasper", description="Run and operate kasper_py processors.",
        epilog="Exit codes: 0 ok, 1 processor failed, 2 usage, 3 bad config, "
               "4 Kafka unreachable, 5 refused.")
    parser.add_argument("--version", action="version", version=f"kasper {_version()}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    run = commands.add_parser("run", help="run a processor or an app until SIGTERM/SIGINT")
    add_target_arguments(run)
    add_tasks_argument(run)
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
    _add_config_flags(run, tuple(CONFIG_FLAGS))
    commands.add_parser("stack", help="start/stop the local stack (see `kasper stack -h`)",
                        add_help=False)
    commands.add_parser("reprocess", add_help=False,
                        help="run a processor over history with Spark (see `kasper reprocess -h`)")
    commands.add_parser("stream", add_help=False,
                        help="run a processor live on Spark Structured Streaming "
                             "(see `kasper stream -h`)")
    commands.add_parser("query", add_help=False,
                        help="read a running processor's tables (see `kasper query -h`)")
    commands.add_parser("standby", add_help=False,
                        help="promote a running process's warm copies in place "
                             "(see `kasper standby promote -h`)")
    commands.add_parser("topics", add_help=False,
                        help="create, list, describe, delete topics (see `kasper topics -h`)")
    commands.add_parser("produce", add_help=False,
                        help="write lines or JSON records to a topic (see `kasper produce -h`)")
    commands.add_parser("consume", add_help=False,
                        help="read a topic's records, decoded (see `kasper consume -h`)")
    add_offsets_parsers(commands, _add_config_flags)
    add_dlq_parser(commands, _add_config_flags)
    add_app_parsers(commands, _add_config_flags)
    return parser


def _add_config_flags(parser: argparse.ArgumentParser,
                      fields: Sequence[str] = OPERATE_FLAGS) -> None:
    """The config flags of ``fields`` (by default those of a command working on a
    group from outside) and ``--connect-timeout``."""
    add_config_flags(parser, fields)
    parser.add_argument("--connect-timeout", type=float, default=10.0, metavar="SECONDS",
                        help="how long to wait for Kafka before giving up (default: 10)")


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
        return lag(config, args.connect_timeout)
    if args.command == "dlq":
        return replay(config, args)
    if args.command == "app":
        return app_command(config, args)
    if args.action == "show":
        return offsets_show(config, args.connect_timeout)
    return offsets_reset(config, args.to, args.dry_run, args.connect_timeout, args.force)


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
    "stack": _stack, "reprocess": _reprocess, "stream": _stream, "query": query_main,
    "topics": topics_main, "produce": produce_main, "consume": consume_main,
    "standby": standby_main}


# -- kasper run ---------------------------------------------------------------------

def _run(config: Config, args: argparse.Namespace) -> int:
    if args.processes is not None:
        return _supervise(config, args)
    factory, stores = load_runnable(args, config)
    tasks, views = load_tasks(args, config), load_views(args, config)
    if _stopped_before_start(config):
        return EXIT_OK
    metadata = _metadata(config, args.connect_timeout)
    owned_partitions(config, plan_for(factory, config).partition_numbers(metadata))
    _output_topics(config, metadata, args.create_topics)
    _internal_topics(config, factory, metadata)
    processor = _build_processor(config, factory, stores, tasks, force=args.force,
                                 views=views)
    _log.info("kasper.run", processor=config.name, target=args.target, config=repr(config))
    with prometheus_target(config.name, processor.metrics_address):
        return _run_loop(processor, args.until_caught_up)


def _supervise(config: Config, args: argparse.Namespace) -> int:
    """``kasper run --processes N``: N workers, each this same command without
    ``--processes``, given its partitions (static) and its metrics port."""
    if args.processes < 1:
        raise CliError(EXIT_USAGE, f"--processes must be at least 1, got {args.processes}")
    factory, _ = load_runnable(args, config)  # a bad target fails here, not N times
    load_tasks(args, config)
    load_views(args, config)
    if _stopped_before_start(config):
        return EXIT_OK
    metadata = _metadata(config, args.connect_timeout)
    owned = owned_partitions(config, plan_for(factory, config).partition_numbers(metadata))
    _output_topics(config, metadata, args.create_topics)  # once, before the workers
    _internal_topics(config, factory, metadata)
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
    warm = standby_sets(sets, config.num_standby_replicas)
    for index, partitions in enumerate(sets):
        command = list(base)
        if partitions is not None:
            command += ["--input-partitions", ",".join(map(str, partitions))]
        if warm[index]:  # a warm copy cannot share its owner's folder: one per worker
            command += ["--standby-partitions", ",".join(map(str, warm[index])),
                        "--state-dir", str(Path(config.state_dir) / f"worker-{index}")]
        worker_port = None if port is None else port + 1 + index
        if worker_port is not None:
            command += ["--metrics-port", str(worker_port)]
        if config.query_port is not None:  # 0 stays 0: any free port, announced in notes
            command += ["--query-port", str(config.query_port and config.query_port + index)]
        if config.admin_port is not None:  # one admin endpoint per worker, as queries
            command += ["--admin-port", str(config.admin_port and config.admin_port + index)]
        workers.append(WorkerSpec(index, command, worker_port))
    _log.info("kasper.supervising", processor=config.name, workers=len(workers),
              assignment=config.assignment,
              partitions="group" if config.group_mode else sets)
    metrics = None if port is None else (config.metrics_host, port)
    return Supervisor(workers, env=dict(os.environ), metrics=metrics).run()


def _stopped_before_start(config: Config) -> bool:
    """True when a signal came while ``kasper run`` was starting (held since its first
    moment): it stops before connecting anywhere, exit 0. One that comes later is the
    loop's or the supervisor's to honour."""
    held = held_signal()
    if held is not None:
        _log.info("kasper.stopped_by_signal", processor=config.name, signal=held,
                  before_start=True)
    return held is not None


def _output_topics(config: Config, metadata: Any, create: bool) -> None:
    """The declared output topics checked (and with ``create`` the absent ones created,
    each logged) before the processor starts; ``TopicError`` (exit 3) otherwise."""
    if config.output_topics:
        ensure_output_topics(config, create=create, metadata=metadata)


def _internal_topics(config: Config, target: ProcessorFactory | App, metadata: Any) -> None:
    """An app's repartition topics checked before it starts (the loop creates the absent
    ones): a declared or existing partition count unlike the sources' is a
    ``TopicError`` (exit 3) naming both, not a failed run."""
    plan = plan_for(target, config)
    if plan.app is not None:
        check_internal_topics(config, plan.sources, plan.internal, metadata)


def _metadata(config: Config, timeout: float) -> Any:
    """Cluster metadata, or ``CliError(EXIT_BROKER)`` when no broker answers."""
    with admin_for(config, timeout) as admin:
        return probe(config, admin, timeout)


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


def _build_processor(config: Config, factory: ProcessorFactory | App, stores: list[StoreSpec],
                     tasks: list[Task], *, force: bool = False,
                     views: Mapping[str, View] | None = None) -> TopicProcessor:
    """The loop, serving its own metrics (``Config.metrics_port``), with the stores'
    restore progress shown on a terminal."""
    try:
        return TopicProcessor(config, factory, stores=stores, force=force, tasks=tasks,
                              views=views, store_observer=_RestoreDisplay())
    except ImportError as exc:  # metrics without prometheus-client
        raise CliError(EXIT_CONFIG, f"config field 'metrics_port': {exc}") from None
    except OSError as exc:  # the metrics port (the query server's is a ConfigError)
        raise CliError(EXIT_CONFIG, f"config field 'metrics_port': cannot listen on "
                       f"{config.metrics_host}:{config.metrics_port}: "
                       f"{exc.strerror or exc}") from None
    except ConfigError as exc:  # the query server's port or TLS files
        raise CliError(EXIT_CONFIG, str(exc)) from None
    except ValueError as exc:  # a view path, a store name given twice
        raise CliError(EXIT_CONFIG, str(exc)) from None
    except KafkaException as exc:
        raise CliError(EXIT_CONFIG, "librdkafka refused the client settings "
                       f"(client_overrides, consumer_overrides, producer_overrides): "
                       f"{reason(exc)}") from None


def _run_loop(processor: TopicProcessor, until_caught_up: bool) -> int:
    try:
        with processor:
            processor.run_until_stopped(until_caught_up=until_caught_up)
    except KeyboardInterrupt:
        _log.warning("kasper.interrupted", processor=processor.config.name)
        _clear_notes(processor.config)
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


def _clear_notes(config: Config) -> None:
    """A forced stop leaves commit notes saying running: clear this process's own (the
    loop has stopped consuming), so a reset need not wait ``running_window``."""
    try:
        cleared = clear_running_notes(config, _CLEAR_TIMEOUT)
    except KeyboardInterrupt:  # a third signal: leave the notes to expire
        return
    if cleared:
        _log.info("kasper.notes_cleared", processor=config.name, partitions=cleared)


class _RestoreDisplay(NoopStoreObserver):
    """Shows the changelog restores the processor's stores report."""

    def __init__(self) -> None:
        self._bars: dict[TopicPartitionKey, Progress] = {}

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
