"""What the command lines of the two Spark front ends (``kasper reprocess`` and
``kasper stream``) share: the parser's common arguments in one order, and the start of
a run (logging, then the ``Config``). The Spark machinery they drive lives in
``kasper_py.spark``; the commands' own flags in ``reprocess._cli`` and ``stream._cli``.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence

from kasper_py.cli.base import (
    add_config_flags,
    add_target_arguments,
    config_from_args,
    setup_logging,
)
from kasper_py.config import Config
from kasper_py.spark.session import add_spark_arguments

__all__ = ["SPARK_CONFIG_FLAGS", "spark_config", "spark_parser"]

SPARK_CONFIG_FLAGS = ("name", "bootstrap_servers", "input_topics", "input_partitions",
                      "group_id", "batch_size")
"""The Config fields every Spark command takes as flags (batch_wait is the live loop's)."""


def spark_parser(prog: str, description: str,
                 add_arguments: Callable[[argparse.ArgumentParser], None],
                 flags: Sequence[str] = ()) -> argparse.ArgumentParser:
    """A Spark command's parser: the target, the command's own arguments
    (``add_arguments``), ``--master`` and ``--kafka-option``, then the config flags
    (``SPARK_CONFIG_FLAGS`` and ``flags``)."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    add_target_arguments(parser)
    add_arguments(parser)
    add_spark_arguments(parser)
    add_config_flags(parser, (*SPARK_CONFIG_FLAGS, *flags))
    return parser


def spark_config(args: argparse.Namespace) -> Config:
    """Logging set up from the flags, then the ``Config`` they give."""
    setup_logging(args)
    return config_from_args(args)
