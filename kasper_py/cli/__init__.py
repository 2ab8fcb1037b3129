"""The ``kasper`` command line (the parser, the dispatch and ``kasper run`` live in
``commands``). ``main`` imports them only once ``kasper run`` holds SIGTERM and SIGINT
(``kasper_py._support.signals``): importing the library takes about half a second, and
a signal then must stop the process cleanly, exit 0, not kill it. Every other name is
``commands``'s, imported on first use; its helpers are imported from it.
"""

from __future__ import annotations

import importlib
import sys
import typing
from collections.abc import Sequence

from kasper_py._support.signals import holding_stop_signals

if typing.TYPE_CHECKING:
    from kasper_py.cli.commands import (
        EXIT_BROKER,
        EXIT_CONFIG,
        EXIT_FAILED,
        EXIT_INTERRUPTED,
        EXIT_REFUSED,
        CliError,
        load_config,
    )

__all__ = ["EXIT_BROKER", "EXIT_CONFIG", "EXIT_FAILED", "EXIT_INTERRUPTED", "EXIT_REFUSED",
           "CliError", "load_config", "main"]

_INTERRUPTED = 130  # commands.EXIT_INTERRUPTED, known before commands is imported


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``kasper``; returns the exit code (the console script exits with it)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] != ["run"]:
        return _commands(args)
    try:
        with holding_stop_signals():
            return _commands(args)
    except KeyboardInterrupt:  # a second signal while starting: a forced stop
        print("kasper: error: interrupted", file=sys.stderr, flush=True)
        return _INTERRUPTED


def _commands(args: list[str]) -> int:
    from kasper_py.cli.commands import main as run  # noqa: PLC0415 - after the handlers

    return run(args)


def __getattr__(name: str) -> object:
    """A name of ``__all__`` from ``commands``, imported on first use."""
    if name not in __all__:
        raise AttributeError(f"module 'kasper_py.cli' has no attribute {name!r}")
    return getattr(importlib.import_module("kasper_py.cli.commands"), name)
