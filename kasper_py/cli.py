"""The ``kasper`` command line: run a processor, manage its group's offsets, show its
lag, and start the local stack. Configuration comes from a TOML file, then
``KASPER_*`` environment variables, then flags (each overrides the one before).

Errors are one line on stderr, no traceback, with an exit code per cause:

    0  success              3  bad configuration (the message names the field)
    1  the processor failed 4  Kafka unreachable
    2  bad command line     5  refused (offsets reset while the group is active)
                            130 interrupted twice (forced stop)
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import os
import signal
import sys
import time
import tomllib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, TextIO

import structlog

from kasper_py.config import Config
from kasper_py.exceptions import ConfigError, KasperError, TopicError

__all__ = ["EXIT_BROKER", "EXIT_CONFIG", "EXIT_FAILED", "EXIT_INTERRUPTED", "EXIT_REFUSED",
           "CliError", "load_config", "main"]

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_CONFIG = 3
EXIT_BROKER = 4
EXIT_REFUSED = 5
EXIT_INTERRUPTED = 130

ENV_PREFIX = "KASPER_"
_OVERRIDE_ENV = {"CLIENT": "client_overrides", "CONSUMER": "consumer_overrides",
                 "PRODUCER": "producer_overrides"}
_INT_FIELDS = {"batch_size", "metrics_port"}
_FLOAT_FIELDS = {"batch_wait", "delivery_timeout"}
_NULLABLE = {"metrics_port", "input_partitions", "group_id"}
_ADMIN_TIMEOUT = 15.0

_log = structlog.get_logger("kasper_py.cli")


class CliError(Exception):
    """A failure reported as one line on stderr and the exit ``code``."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


# -- configuration: TOML, then KASPER_* environment variables, then flags ---------------

_FIELDS = {f.name: f for f in dataclasses.fields(Config)}


def load_config(path: str | None, env: Mapping[str, str],
                flags: Mapping[str, Any] | None = None) -> Config:
    """Build the ``Config`` from a TOML file, ``env`` and ``flags``, later ones winning.

    Raises ``CliError(EXIT_CONFIG)`` naming the field, and where its value came from.
    """
    layers = [(path or "", _read_toml(path) if path else {}), ("environment", _from_env(env)),
              ("flags", {k: v for k, v in (flags or {}).items() if v is not None})]
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for source, layer in layers:
        for name, value in layer.items():
            if name not in _FIELDS:
                raise CliError(EXIT_CONFIG, f"{source}: unknown config field {name!r}; known "
                               f"fields: {', '.join(_FIELDS)}")
            if name.endswith("_overrides"):
                value = {**values.get(name, {}), **_mapping(name, value, source)}
            values[name] = value
            sources[name] = source or "config file"
    return _build(values, sources)


def _build(values: dict[str, Any], sources: Mapping[str, str]) -> Config:
    missing = [name for name, f in _FIELDS.items() if name not in values
               and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    if missing:
        hints = ", ".join(f"{n!r} (TOML key, {ENV_PREFIX}{n.upper()} or --{_flag(n)})"
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
    except tomllib.TOMLDecodeError as exc:
        raise CliError(EXIT_CONFIG, f"config file {path!r} is not valid TOML: {exc}") from None
    return data


def _from_env(env: Mapping[str, str]) -> dict[str, Any]:
    """``KASPER_<FIELD>`` for each field; ``KASPER_CLIENT__SASL_PASSWORD`` sets the
    ``client_overrides`` key ``sasl.password`` (likewise ``CONSUMER__``, ``PRODUCER__``)."""
    values: dict[str, Any] = {}
    for name in _FIELDS:
        raw = env.get(f"{ENV_PREFIX}{name.upper()}")
        if raw is not None and not name.endswith("_overrides"):
            values[name] = _parse_env(name, raw, f"{ENV_PREFIX}{name.upper()}")
    for variable, raw in env.items():
        prefix, sep, key = variable.removeprefix(ENV_PREFIX).partition("__")
        if variable.startswith(ENV_PREFIX) and sep and prefix in _OVERRIDE_ENV and key:
            field = _OVERRIDE_ENV[prefix]
            values.setdefault(field, {})[key.lower().replace("_", ".")] = raw
    return values


def _parse_env(name: str, raw: str, variable: str) -> Any:
    text = raw.strip()
    if name in _NULLABLE and text.lower() in ("", "none"):
        return None
    try:
        if name in _INT_FIELDS:
            return int(text)
        if name in _FLOAT_FIELDS:
            return float(text)
        if name == "input_partitions":
            return [int(p) for p in text.split(",") if p.strip()]
    except ValueError:
        raise CliError(EXIT_CONFIG, f"config field {name!r}: {variable}={raw!r} is not "
                       "a number" + (" list" if name == "input_partitions" else "")) from None
    if name == "input_topics":
        return [t.strip() for t in text.split(",") if t.strip()]
    return text


def _mapping(name: str, value: Any, source: str) -> dict[str, Any]:
    if not isinstance(value, Mapping):
        raise CliError(EXIT_CONFIG, f"config field {name!r}: must be a table of librdkafka "
                       f"settings (from {source or 'config file'})")
    return dict(value)


def _flag(name: str) -> str:
    return name.replace("_", "-")


# -- argument parsing ---------------------------------------------------------------

_CONFIG_FLAGS: dict[str, tuple[Callable[[str], Any], str]] = {
    "name": (str, "processor name (and default consumer group)"),
    "bootstrap_servers": (str, "Kafka bootstrap servers, host:port[,...]"),
    "input_topics": (lambda s: [t for t in s.split(",") if t], "comma-separated input topics"),
    "input_partitions": (lambda s: [int(p) for p in s.split(",") if p],
                         "comma-separated partition numbers (default: all)"),
    "group_id": (str, "consumer group (default: the name)"),
    "batch_size": (int, "messages per batch at most"),
    "batch_wait": (float, "seconds to wait for a batch to fill"),
    "metrics_port": (int, "serve /metrics and /health on this port"),
}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kasper", description="Run and operate kasper_py processors.",
        epilog="Exit codes: 0 ok, 1 processor failed, 2 usage, 3 bad config, "
               "4 Kafka unreachable, 5 refused.")
    parser.add_argument("--version", action="version", version=f"kasper {_version()}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    run = commands.add_parser("run", help="run a processor until SIGTERM/SIGINT")
    run.add_argument("target", help="module:factory, a ProcessorFactory (or processor class)")
    run.add_argument("--stores", metavar="MODULE:ATTR",
                     help="StoreSpecs to open: a sequence, or a callable taking the Config")
    run.add_argument("--app-dir", default=".", help="prepended to sys.path (default: .)")
    run.add_argument("--metrics-host", default="0.0.0.0",  # noqa: S104 - scraped from outside
                     help="address the metrics server binds (default: 0.0.0.0)")
    run.add_argument("--until-caught-up", action="store_true",
                     help="exit 0 once every partition is consumed to its end")
    _add_config_flags(run)
    commands.add_parser("stack", help="start/stop the local stack (see `kasper stack -h`)",
                        add_help=False)
    _add_offsets_parser(commands)
    _add_config_flags(commands.add_parser("lag", help="the group's lag per partition"))
    return parser


def _add_offsets_parser(commands: Any) -> None:
    offsets = commands.add_parser("offsets", help="show or reset the group's offsets")
    actions = offsets.add_subparsers(dest="action", required=True, metavar="ACTION")
    _add_config_flags(actions.add_parser("show", help="committed offsets and watermarks"))
    reset = actions.add_parser("reset", help="move the committed offsets (group must be idle)")
    reset.add_argument("--to", required=True, type=_reset_target, metavar="WHERE",
                       help="earliest, latest, an ISO-8601 time (UTC if no zone) or epoch ms")
    reset.add_argument("--dry-run", action="store_true", help="show the plan, change nothing")
    _add_config_flags(reset)


def _add_config_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", "-c", metavar="FILE", help="TOML file of Config fields")
    for name, (parse, text) in _CONFIG_FLAGS.items():
        parser.add_argument(f"--{_flag(name)}", dest=name, type=parse, help=text)
    parser.add_argument("--log-format", choices=("auto", "json", "console"), default="auto",
                        help="auto: JSON unless stderr is a terminal")
    parser.add_argument("--log-level", default="INFO", help="DEBUG, INFO, WARNING, ERROR")


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


def _version() -> str:
    from kasper_py import __version__  # noqa: PLC0415 - avoids a cycle at import time

    return __version__


# -- entry point --------------------------------------------------------------------

def main(argv: Sequence[str] | None = None) -> int:
    """Run ``kasper``; returns the exit code (the console script exits with it)."""
    args_list = list(sys.argv[1:] if argv is None else argv)
    if args_list[:1] == ["stack"]:
        return _stack(args_list[1:])
    args = _parser().parse_args(args_list)
    try:
        return _dispatch(args)
    except CliError as exc:
        _error(str(exc))
        return exc.code


def _dispatch(args: argparse.Namespace) -> int:
    from kasper_py.logging import configure_logging  # noqa: PLC0415 - configures nothing on import

    json_logs = {"auto": None, "json": True, "console": False}[args.log_format]
    try:
        configure_logging(json=json_logs, level=args.log_level)
    except ValueError as exc:
        raise CliError(EXIT_USAGE, str(exc)) from None
    flags = {name: getattr(args, name) for name in _CONFIG_FLAGS}
    config = load_config(args.config, os.environ, flags)
    if args.command == "run":
        return _run(config, args)
    from kasper_py import _cli_offsets as offsets  # type: ignore[attr-defined]

    return int(offsets.dispatch(config, args))


def _stack(argv: list[str]) -> int:
    from kasper_py import stack  # noqa: PLC0415 - only `kasper stack` needs it

    return int(stack.main(argv))


def _error(message: str) -> None:
    print(f"kasper: error: {message}", file=sys.stderr, flush=True)
