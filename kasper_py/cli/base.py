"""What the ``kasper`` commands share, below all of them: the ``Config`` from a TOML file,
``KASPER_*`` environment variables and flags (one flag table), ``module:attr`` targets
and store specs, exit codes, and the one-line error. It imports no command, so
``kasper run`` and ``kasper reprocess`` both build on it without importing each other.
"""

from __future__ import annotations

import argparse
import os
import sys
import tomllib
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from kasper_py._support.names import NameResolutionError, resolve_name
from kasper_py._support.secrets import scrub
from kasper_py._support.variables import unknown_variables
from kasper_py.app import App, RunTarget
from kasper_py.cli.fields import FIELDS, parse_flag, parse_variable
from kasper_py.config import Config
from kasper_py.exceptions import ConfigError, KasperError, TopicError
from kasper_py.observability.logging import configure_logging
from kasper_py.processor import ProcessorFactory
from kasper_py.stores.base import StoreSpec
from kasper_py.time import Task, extractor_for

__all__ = ["CONFIG_FLAGS", "ENV_PREFIX", "EXIT_BROKER", "EXIT_CONFIG", "EXIT_FAILED",
           "EXIT_INTERRUPTED", "EXIT_OK", "EXIT_REFUSED", "EXIT_USAGE", "OFFLINE",
           "OPERATE_FLAGS", "CliError", "ExitCodes", "add_config_flags",
           "add_target_arguments", "add_tasks_argument", "config_from_args", "exit_code",
           "flag_name", "load_attr", "load_config", "load_runnable", "load_target",
           "load_tasks", "load_views", "print_error", "run_command", "setup_logging"]

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_CONFIG = 3
EXIT_BROKER = 4
EXIT_REFUSED = 5
EXIT_INTERRUPTED = 130

ExitCodes = Sequence[tuple[type[BaseException], int]]
"""Exception types and their exit codes, the first that matches winning."""

ENV_PREFIX = "KASPER_"
# KASPER_CLIENT__..., KASPER_CONSUMER__..., KASPER_PRODUCER__...: a key of that table
_OTEL_EXPORTER = "OTEL_TRACES_EXPORTER"
_OVERRIDE_ENV = {name.removesuffix("_overrides").upper(): name
                 for name, kind in FIELDS.items() if kind.table}


class CliError(Exception):
    """A failure reported as one line on stderr and the exit ``code``."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


# -- errors and exit codes ----------------------------------------------------------

def exit_code(error: BaseException, codes: ExitCodes = ()) -> int:
    """The exit code for ``error``: a ``CliError``'s own, else the first of ``codes``
    it is an instance of; a ``TopicError`` is bad configuration; anything else failed."""
    if isinstance(error, CliError):
        return error.code
    table: list[tuple[type[BaseException], int]] = [*codes, (TopicError, EXIT_CONFIG)]
    return next((code for kind, code in table if isinstance(error, kind)), EXIT_FAILED)


def run_command(parser: argparse.ArgumentParser, run: Callable[[argparse.Namespace], int],
                argv: Sequence[str] | None, prog: str, codes: ExitCodes = ()) -> int:
    """Parse ``argv`` (default: the process's) and ``run`` the command; a ``CliError``,
    ``KasperError`` or ``ImportError`` becomes ``prog: error: ...`` on stderr and the
    exit code ``exit_code`` gives it (with ``codes``)."""
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    try:
        return run(args)
    except (CliError, KasperError, ImportError) as exc:
        print_error(prog, str(exc))
        return exit_code(exc, codes)


def print_error(prog: str, message: str) -> None:
    """``prog: error: message`` on stderr, every remembered secret masked: librdkafka's
    error strings may quote a setting's value."""
    print(f"{prog}: error: {scrub(message)}", file=sys.stderr, flush=True)


# -- flags: the Config fields a command line may set, and logging --------------------

_FLAG_HELP = {
    "name": "processor name (its consumer group and state prefix by default)",
    "bootstrap_servers": "Kafka bootstrap servers, host:port[,...]",
    "input_topics": "comma-separated input topics",
    "input_partitions": "comma-separated partition numbers (default: all)",
    "output_topics": "comma-separated output topics to declare, NAME[:PARTITIONS][@SERDE] "
                     "(created with the input's partition count when none; SERDE encodes "
                     "the values sent there); see --create-topics",
    "group_id": "the processor's consumer group (default: the name)",
    "batch_size": "messages per batch at most (default: 20,000 with a latency target, "
                  "1,000 with --max-latency none)",
    "batch_wait": "seconds to wait for a batch to fill",
    "max_latency": "seconds of end-to-end latency to size batches for (default 0.05; "
                   "'none': classic batches of batch-size or batch-wait)",
    "admin_port": "serve the admin endpoint (POST /standby/promote, for kasper standby "
                  "promote) on this port of 127.0.0.1 (default: not served)",
    "metrics_port": "serve /metrics and /health on this port",
    "metrics_host": "the address the metrics server binds (default: 0.0.0.0)",
    "query_port": "serve the tables and views (/tables) on this port, apart from the "
                  "metrics (default: not served)",
    "query_host": "the address the query server binds (default: 127.0.0.1; beyond "
                  "loopback set query_token, from TOML or KASPER_QUERY_TOKEN)",
    "tracing": "OpenTelemetry spans of every turn: otlp (exported over OTLP/HTTP), console "
               "or none (default; OTEL_TRACES_EXPORTER sets it too)",
    "otlp_endpoint": "the OTLP/HTTP collector's URL, e.g. http://127.0.0.1:4318 (default: "
                     "OTEL_EXPORTER_OTLP_ENDPOINT, else http://localhost:4318)",
    "processing_guarantee": "at_least_once (default) or exactly_once",
    "assignment": "static (default: input_partitions) or group (join the consumer group; "
                  "processes come and go)",
    "async_concurrency": "an AsyncMessageProcessor's calls in flight at once in this "
                         "process (default 64)",
    "async_timeout": "seconds an AsyncMessageProcessor's batch may take ('none': no limit, "
                     "the default)",
    "state_dir": "folder of the local RocksDB tables (default: kasper-state)",
    "num_standby_replicas": "warm copies of each partition's local tables kept in other "
                            "processes (default 0; placed over the workers of --processes)",
    "standby_partitions": "comma-separated partitions whose local tables this process "
                          "keeps warm (static assignment)",
}

CONFIG_FLAGS: dict[str, tuple[Callable[[str], Any], str]] = {
    name: (parse_flag(name), text) for name, text in _FLAG_HELP.items()}
"""The Config fields a command line may set: each one's parser (from the field's
annotation, ``cli.fields``) and help."""
OPERATE_FLAGS = ("name", "bootstrap_servers", "input_topics", "input_partitions",
                 "group_id", "batch_wait")
"""The flags of a command that works on a processor's group from outside (offsets, lag,
dlq, app reset): which group, topics and partitions, and ``batch_wait`` (how long a loop
that did not say it stopped counts as running). ``kasper run`` takes every one."""
OFFLINE = "(offline)"
"""``bootstrap_servers`` of a command that never connects (``kasper app describe``)."""


def flag_name(field: str) -> str:
    """The command-line flag of a Config field, without the dashes."""
    return field.replace("_", "-")


def add_config_flags(parser: argparse.ArgumentParser,
                     fields: Iterable[str] = tuple(CONFIG_FLAGS)) -> None:
    """``--config``, a flag for each of ``fields`` (keys of ``CONFIG_FLAGS``), and the
    logging flags ``setup_logging`` reads."""
    parser.add_argument("--config", "-c", metavar="FILE", help="TOML file of Config fields")
    for name in fields:
        parse, text = CONFIG_FLAGS[name]
        choices = FIELDS[name].choices or None  # listed in the usage and in -h
        parser.add_argument(f"--{flag_name(name)}", dest=name, type=parse, help=text,
                            choices=choices)
    parser.add_argument("--log-format", choices=("auto", "json", "console"), default="auto",
                        help="auto: JSON unless stderr is a terminal")
    parser.add_argument("--log-level", default="INFO", help="DEBUG, INFO, WARNING, ERROR")


def setup_logging(args: argparse.Namespace) -> None:
    """Configure logging from ``--log-format`` and ``--log-level``; an unknown level is a
    usage error."""
    json_logs = {"auto": None, "json": True, "console": False}[args.log_format]
    try:
        configure_logging(json=json_logs, level=args.log_level)
    except ValueError as exc:
        raise CliError(EXIT_USAGE, str(exc)) from None


def config_from_args(args: argparse.Namespace, env: Mapping[str, str] = os.environ) -> Config:
    """The ``Config`` from ``--config``, ``env`` and whichever config flags were added;
    when the command's target is an ``App``, its name and input topics come first (a
    layer under the file: ``name`` and ``input_topics`` need not be given). A command
    that sets ``offline`` (never connects) needs no ``bootstrap_servers``."""
    flags = {name: getattr(args, name, None) for name in CONFIG_FLAGS}
    defaults = _app_defaults(args)
    if getattr(args, "offline", False):  # never connects: Kafka need not be named
        defaults.setdefault("bootstrap_servers", OFFLINE)
    return load_config(args.config, env, flags, defaults=defaults)


def _app_defaults(args: argparse.Namespace) -> dict[str, Any]:
    """``name`` and ``input_topics`` of the command's target when it is an ``App``."""
    target = getattr(args, "target", None)
    if not isinstance(target, str) or not hasattr(args, "app_dir"):
        return {}
    try:
        found = RunTarget.of(load_attr(target, args.app_dir, "target")).app
    except CliError:
        return {}  # a bad target is reported once the config is known (load_runnable)
    if found is None:
        return {}
    try:
        found.ordered()
    except ConfigError as exc:
        raise CliError(EXIT_CONFIG, f"target {target!r}: {exc}") from None
    return {"name": found.name, "input_topics": list(found.sources)}


# -- configuration: TOML, then KASPER_* environment variables, then flags ---------------

def load_config(path: str | None, env: Mapping[str, str],
                flags: Mapping[str, Any] | None = None, *,
                defaults: Mapping[str, Any] | None = None) -> Config:
    """Build the ``Config`` from ``defaults`` (an app's), a TOML file, ``env`` and
    ``flags``, later ones winning.

    Raises ``CliError(EXIT_CONFIG)`` naming the field, and where its value came from.
    """
    layers = [("the app", dict(defaults or {})), (_OTEL_EXPORTER, _from_standard_env(env)),
              (path or "", _read_toml(path) if path else {}), ("environment", _from_env(env)),
              ("flags", {k: v for k, v in (flags or {}).items() if v is not None})]
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for source, layer in layers:
        for name, given in layer.items():
            if name not in FIELDS:
                raise CliError(EXIT_CONFIG, f"{source}: unknown config field {name!r}; known "
                               f"fields: {', '.join(FIELDS)}")
            kind = FIELDS[name]
            # TOML has no null, and a flag's None means "not given": "none" clears a number
            value = None if (kind.nullable and kind.item is not str and isinstance(given, str)
                             and given.strip().lower() in ("", "none")) else given
            if kind.table:
                values[name] = {**values.get(name, {}), **_mapping(name, value, source)}
            else:
                values[name] = value
            sources[name] = source or "config file"
    return _build(values, sources)


def _build(values: dict[str, Any], sources: Mapping[str, str]) -> Config:
    missing = [name for name, kind in FIELDS.items() if kind.required and name not in values]
    if missing:
        hints = ", ".join(f"{n!r} (TOML key, {ENV_PREFIX}{n.upper()} or --{flag_name(n)})"
                          for n in missing)
        raise CliError(EXIT_CONFIG, f"config field {missing[0]!r}: missing; set {hints}")
    try:
        return Config(**values)
    except ConfigError as exc:
        where = sources.get(exc.field)
        raise CliError(EXIT_CONFIG, f"{exc} (from {where})" if where else str(exc)) from None


def _read_toml(path: str) -> dict[str, Any]:
    try:
        with open(path, "rb") as file:
            data = tomllib.load(file)
    except FileNotFoundError:
        raise CliError(EXIT_CONFIG, f"config file {path!r} not found") from None
    except OSError as exc:
        raise CliError(EXIT_CONFIG, f"cannot read config file {path!r}: {exc}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise CliError(EXIT_CONFIG, f"config file {path!r} is not valid TOML: {exc}") from None
    return data


def _from_env(env: Mapping[str, str]) -> dict[str, Any]:
    """``KASPER_<FIELD>`` for each field; ``KASPER_CLIENT__SASL_PASSWORD`` sets the
    ``client_overrides`` key ``sasl.password`` (likewise ``CONSUMER__``, ``PRODUCER__``)."""
    _warn_unknown(env)
    values: dict[str, Any] = {}
    for name, kind in FIELDS.items():
        raw = env.get(f"{ENV_PREFIX}{name.upper()}")
        if raw is not None and not kind.table:
            values[name] = _parse_env(name, raw, f"{ENV_PREFIX}{name.upper()}")
    for variable, raw in env.items():
        prefix, sep, key = variable.removeprefix(ENV_PREFIX).partition("__")
        if variable.startswith(ENV_PREFIX) and sep and prefix in _OVERRIDE_ENV and key:
            field = _OVERRIDE_ENV[prefix]
            values.setdefault(field, {})[key.lower().replace("_", ".")] = raw
    return values


_WARNED: set[str] = set()
"""Unknown variables already warned about in this process (configs load more than once)."""


def _warn_unknown(env: Mapping[str, str]) -> None:
    """``kasper: warning: ...`` on stderr for each ``KASPER_*`` variable nothing reads,
    with the closest known name: a typo would otherwise be silently ignored."""
    known = [f"{ENV_PREFIX}{name.upper()}" for name, kind in FIELDS.items() if not kind.table]
    known += [f"{ENV_PREFIX}{prefix}__" for prefix in _OVERRIDE_ENV]
    for variable, close in unknown_variables(env, known):
        if variable in _WARNED:
            continue
        _WARNED.add(variable)
        hint = f"; did you mean {close}?" if close else ""
        print(f"kasper: warning: environment variable {variable} is not a setting kasper "
              f"reads (ignored){hint}", file=sys.stderr, flush=True)


def _from_standard_env(env: Mapping[str, str]) -> dict[str, Any]:
    """OpenTelemetry's ``OTEL_TRACES_EXPORTER``: ``tracing`` below every setting of ours
    (the SDK reads its other variables itself, see ``observability.otel_export``)."""
    exporter = env.get(_OTEL_EXPORTER, "").strip()
    return {"tracing": exporter} if exporter else {}


def _parse_env(name: str, raw: str, variable: str) -> Any:
    try:
        return parse_variable(name, raw)
    except ValueError:
        raise CliError(EXIT_CONFIG, f"config field {name!r}: {variable}={raw!r} is not "
                       "a number" + (" list" if FIELDS[name].is_list else "")) from None


def _mapping(name: str, value: Any, source: str) -> dict[str, Any]:
    if not isinstance(value, Mapping):
        raise CliError(EXIT_CONFIG, f"config field {name!r}: must be a table of librdkafka "
                       f"settings (from {source or 'config file'})")
    return dict(value)


# -- the user's code: module:attr targets and store specs ------------------------------

def add_target_arguments(parser: argparse.ArgumentParser, *, stores: bool = True) -> None:
    """The processor to run (``target``), its ``--stores`` (unless ``stores`` is False: a
    command taking an App alone, which declares its own) and the ``--app-dir`` they are
    imported from."""
    parser.add_argument("target", help="module:factory, a ProcessorFactory (or processor "
                        "class); `kasper run` also takes an App (kasper_py.app)")
    if stores:
        parser.add_argument("--stores", metavar="MODULE:ATTR", help="StoreSpecs to open: "
                            "a sequence, or a callable taking the Config")
    else:
        parser.set_defaults(stores=None)
    parser.add_argument("--app-dir", default=".", help="prepended to sys.path (default: .)")


def load_target(args: argparse.Namespace, config: Config
                ) -> tuple[ProcessorFactory, list[StoreSpec]]:
    """The factory and store specs ``add_target_arguments`` named (``load_runnable``,
    for a command that runs only a lone processor: an ``App`` of one processor without
    repartitions, channels or tasks is taken as that processor)."""
    factory, stores = load_runnable(args, config)
    run = RunTarget.of(factory)
    if run.app is not None:
        try:
            return run.app.as_processor()
        except ConfigError as exc:
            raise CliError(EXIT_CONFIG, f"target {args.target!r}: {exc}") from None
    assert run.factory is not None
    return run.factory, stores


def load_runnable(args: argparse.Namespace, config: Config
                  ) -> tuple[ProcessorFactory | App, list[StoreSpec]]:
    """The factory or ``App``, and the store specs, ``add_target_arguments`` named,
    imported and checked before anything connects, so a typo is a config error rather
    than a crash later; a ``timestamp_extractor`` given by name is imported too, from
    the same ``--app-dir``."""
    factory = load_attr(args.target, args.app_dir, "target")
    if RunTarget.of(factory).app is not None:
        if args.stores:
            raise CliError(EXIT_CONFIG, f"target {args.target!r} is an App, which declares "
                           "its stores per processor: drop --stores")
    elif not callable(factory):
        raise CliError(EXIT_CONFIG, f"target {args.target!r} is not callable: it must build "
                       "a MessageProcessor from a ProcessorContext")
    stores = _load_specs(args.stores, args.app_dir, config, StoreSpec, "--stores") \
        if args.stores else []
    try:
        extractor_for(config.timestamp_extractor)
    except ConfigError as exc:
        raise CliError(EXIT_CONFIG, str(exc)) from None
    return factory, stores


def add_tasks_argument(parser: argparse.ArgumentParser) -> None:
    """``--tasks``: the scheduled tasks a loop runs (``kasper_py.time.Task``), and
    ``--views``: the web views its query server answers."""
    parser.add_argument("--tasks", metavar="MODULE:ATTR",
                        help="Tasks to run on the wall clock: a sequence, or a callable "
                             "taking the Config")
    parser.add_argument("--views", metavar="MODULE:ATTR",
                        help="web views served beside /tables on the query port: a "
                             "mapping of paths to views (kasper_py.query.View), or a "
                             "callable taking the Config")


def load_views(args: argparse.Namespace, config: Config) -> dict[str, Any]:
    """The views ``--views`` named (none without it), imported and checked: a mapping of
    absolute paths to callables; serving them needs ``query_port``."""
    if not args.views:
        return {}
    found = load_attr(args.views, args.app_dir, "--views")
    if callable(found) and not isinstance(found, Mapping):
        found = found(config)
    if not isinstance(found, Mapping) or not all(
            isinstance(path, str) and callable(view) for path, view in found.items()):
        raise CliError(EXIT_CONFIG, f"--views {args.views!r} must give a mapping of paths to "
                       "views (callables of a Request and the Tables)")
    if found and config.query_port is None:
        raise CliError(EXIT_CONFIG, f"--views {args.views!r}: views are served on the query "
                       "server; set query_port (--query-port)")
    return dict(found)


def load_tasks(args: argparse.Namespace, config: Config) -> list[Task]:
    """The tasks ``--tasks`` named (none without it), imported and checked."""
    return _load_specs(args.tasks, args.app_dir, config, Task, "--tasks") if args.tasks else []


def load_attr(spec: str, app_dir: str, what: str) -> Any:
    """Import ``module:attr`` (attr may be dotted), with ``app_dir`` on sys.path."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise CliError(EXIT_CONFIG, f"{what} {spec!r} must look like module:attribute")
    path = os.path.abspath(app_dir)
    if path not in sys.path:
        sys.path.insert(0, path)
    try:
        return resolve_name(spec)
    except NameResolutionError as exc:
        searched = f" (searched {path} and sys.path)" if exc.missing_module else ""
        raise CliError(EXIT_CONFIG, f"{what} {spec!r}: {exc}{searched}") from None


def _load_specs(spec: str, app_dir: str, config: Config, kind: type, flag: str) -> list[Any]:
    """``--stores`` or ``--tasks``: a sequence of ``kind``, or a callable building one
    from the ``Config``."""
    found = load_attr(spec, app_dir, flag)
    if callable(found):
        found = found(config)
    if not isinstance(found, Sequence) or not all(isinstance(s, kind) for s in found):
        raise CliError(EXIT_CONFIG, f"{flag} {spec!r} must give a sequence of {kind.__name__}")
    return list(found)
