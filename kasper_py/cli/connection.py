"""What ``kasper topics``, ``kasper produce`` and ``kasper consume`` share: the connection
flags (``--bootstrap-servers``, ``--config``, ``KASPER_*`` as every command reads them),
the serde flags with the registry formats, the admin, and the exit codes of a topic or
record that is not as asked. The commands themselves live in ``topics``, ``produce``
and ``consume``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from kasper_py.cli.base import (
    EXIT_BROKER,
    EXIT_CONFIG,
    EXIT_FAILED,
    EXIT_OK,
    CliError,
    ExitCodes,
    load_config,
    run_command,
)
from kasper_py.config import Config
from kasper_py.exceptions import BrokerUnreachableError, ConfigError, SerdeError, TopicError
from kasper_py.kafka.admin import KafkaAdmin
from kasper_py.kafka.topics import topic_problem
from kasper_py.registry import FORMATS, RegistryConfig
from kasper_py.serdes import Serde, bound_to, serde_for

__all__ = ["CODES", "EPILOG", "SERDES", "add_connection_flags", "add_record_flags",
           "client_config", "record_serdes", "render", "run_printing", "topic_admin_for",
           "topic_partitions"]

SERDES = ("str", "bytes", "json", *FORMATS)
"""The serde names ``--key-serde``/``--value-serde`` take: ``serdes.serde_for``'s and
the schema registry formats (``kasper_py.registry``)."""

CODES: ExitCodes = ((BrokerUnreachableError, EXIT_BROKER), (TopicError, EXIT_FAILED),
                    (SerdeError, EXIT_FAILED), (ConfigError, EXIT_CONFIG))
"""A topic that exists or does not, or a record that cannot be encoded or decoded,
fails the command (1); no broker answering is 4; a bad setting is 3."""

EPILOG = ("The broker comes from --bootstrap-servers, KASPER_BOOTSTRAP_SERVERS or the "
          "--config file's bootstrap_servers (client_overrides apply too). Exit codes: 0 "
          "ok, 1 failed (the topic, record or line is named), 2 usage, 3 bad "
          "configuration, 4 Kafka unreachable, 5 refused.")

_CLIENT_NAME = "kasper-cli"


def run_printing(parser: argparse.ArgumentParser, run: Callable[[argparse.Namespace], int],
                 argv: Sequence[str] | None, prog: str) -> int:
    """``base.run_command`` with ``CODES``, where a reader that closed the pipe (``|
    head``) ends the command quietly, exit 0, as it does for ``cat``."""
    try:
        return run_command(parser, run, argv, prog, CODES)
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # the interpreter's last flush goes nowhere
        return EXIT_OK


def add_connection_flags(parser: argparse.ArgumentParser,
                         config_flags: Sequence[str] = ("--config", "-c")) -> None:
    """``--bootstrap-servers``, the TOML file's flag (``config_flags``: ``--config`` but
    where a topic setting has that name) and ``--timeout``."""
    parser.add_argument("--bootstrap-servers", "-b", metavar="HOST:PORT",
                        help="Kafka bootstrap servers (default: KASPER_BOOTSTRAP_SERVERS, "
                             "or the config file's)")
    parser.add_argument(*config_flags, dest="config", metavar="FILE",
                        help="a TOML file of Config fields (a processor's: its "
                             "bootstrap_servers, client_overrides, registry, serdes)")
    parser.add_argument("--timeout", type=float, default=10.0, metavar="SECONDS",
                        help="how long to wait for Kafka before giving up (default: 10)")


def add_record_flags(parser: argparse.ArgumentParser, *, writing: bool) -> None:
    """``--key-serde``, ``--value-serde``, the registry's ``--registry-url`` and schemas
    (``writing``: the schemas encode; else they are the readers'), then the connection
    flags."""
    role = "encodes" if writing else "decodes"
    for part in ("key", "value"):
        parser.add_argument(f"--{part}-serde", choices=SERDES, metavar="SERDE",
                            help=f"{role} the {part}s: {', '.join(SERDES)} (default: the "
                                 f"--config file's {part}_serde, else str)")
    parser.add_argument("--registry-url", metavar="URL",
                        help="the schema registry of avro, protobuf and json_schema "
                             "(default: KASPER_REGISTRY, or the --config file's [registry])")
    for part in ("key", "value"):
        parser.add_argument(f"--{part}-schema", metavar="SCHEMA",
                            help=f"the {part}'s schema: a file or the schema's text (avro, "
                                 "json_schema), or module:Class (protobuf)"
                                 + ("" if writing else "; avro reads with it as the "
                                    "reader's schema, json_schema validates against it"))
    add_connection_flags(parser)


def record_serdes(config: Config, topic: str) -> tuple[Serde, Serde]:
    """The key and value serdes of ``config`` for ``topic`` (a registry serde bound to
    its subjects)."""
    return (bound_to(serde_for(config.key_serde), topic),
            bound_to(serde_for(config.value_serde), topic))


def client_config(args: argparse.Namespace, topic: str,
                  env: Mapping[str, str] = os.environ) -> Config:
    """The ``Config`` the command's clients are built from: ``--config``, ``KASPER_*``
    and the flags, as for every command; ``name`` and ``input_topics`` need not be
    given (the CLI's own, and ``topic``); the serdes default to ``str``."""
    defaults = {"name": _CLIENT_NAME, "input_topics": [topic], "key_serde": "str",
                "value_serde": "str"}
    flags: dict[str, Any] = {"bootstrap_servers": args.bootstrap_servers}
    registry_flags = {"url": getattr(args, "registry_url", None),
                      "key_schema": getattr(args, "key_schema", None),
                      "value_schema": getattr(args, "value_schema", None)}
    if any(value is not None for value in registry_flags.values()):
        # the file's or environment's registry, the serdes left aside until it is known
        base = load_config(args.config, env, {**flags, "key_serde": "bytes",
                                              "value_serde": "bytes"}, defaults=defaults)
        registry = base.registry
        known = {} if not isinstance(registry, RegistryConfig) else {
            "url": registry.url, "basic_auth": registry.basic_auth,
            "key_schema": registry.key_schema, "value_schema": registry.value_schema}
        merged = {**known, **{k: v for k, v in registry_flags.items() if v is not None}}
        if "url" not in merged:
            raise CliError(EXIT_CONFIG, "a schema was given but no schema registry: set "
                           "--registry-url, KASPER_REGISTRY or the --config file's "
                           "[registry] url")
        flags["registry"] = merged
    flags["key_serde"] = getattr(args, "key_serde", None)
    flags["value_serde"] = getattr(args, "value_serde", None)
    return load_config(args.config, env, flags, defaults=defaults)


def topic_admin_for(config: Config, timeout: float, *, consumer: bool = False,
                    read_committed: bool = False) -> KafkaAdmin:
    """The command's ``KafkaAdmin``: its failures ``TopicError``s (exit 1), no broker
    answering ``BrokerUnreachableError`` (exit 4); a consumer (never in a group) when
    watermarks or offsets for a time are read."""
    try:
        return KafkaAdmin(config, timeout=timeout, client_id=f"{_CLIENT_NAME}-admin",
                          consumer=consumer, read_committed=read_committed,
                          group=f"{_CLIENT_NAME}-never-joined", failure=TopicError,
                          unreachable=BrokerUnreachableError)
    except ConfigError as exc:
        raise CliError(EXIT_CONFIG, str(exc)) from None


def topic_partitions(admin: KafkaAdmin, config: Config, topic: str) -> Any:
    """``topic``'s metadata (its ``partitions``: number -> leader, replicas, isrs);
    ``TopicError`` naming the topic and the broker when it does not exist."""
    meta = admin.metadata(topic).topics.get(topic)
    problem = topic_problem(meta)
    if problem is not None:
        raise TopicError(f"topic {topic!r} {problem} on {config.bootstrap_servers}")
    return meta


def render(value: Any) -> Any:
    """A decoded key or value as JSON can hold it: text as it is, bytes as UTF-8 (an
    invalid byte as ``\\xNN``), a protobuf message as its JSON mapping, anything else
    the JSON encoder cannot write as its ``repr``."""
    if isinstance(value, bytes):
        return value.decode("utf-8", "backslashreplace")
    if hasattr(value, "DESCRIPTOR"):
        from google.protobuf.json_format import (  # type: ignore[import-untyped]  # noqa: PLC0415
            MessageToDict,
        )

        return MessageToDict(value)
    if isinstance(value, str | int | float | bool) or value is None:
        return value
    return json.loads(json.dumps(value, default=_unjson))


def _unjson(value: Any) -> Any:
    if isinstance(value, bytes):
        return value.decode("utf-8", "backslashreplace")
    return repr(value) if not hasattr(value, "isoformat") else value.isoformat()
