"""The ``KASPER_*`` environment variables that are not ``Config`` fields, in one place
(the stack's, Spark's, the dashboards', the examples'), and the check that finds a
variable nothing reads, with the closest known name: ``KASPER_BATCHSIZE`` is a typo of
``KASPER_BATCH_SIZE``, not a setting silently ignored.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping

__all__ = ["OTHER_VARIABLES", "PREFIX", "unknown_variables"]

PREFIX = "KASPER_"
OTHER_VARIABLES = frozenset({
    "KASPER_STACK_DIR",             # the stack's folder (kasper stack)
    "KASPER_STACK_CACHE",           # the stack's per-user cache of built jars
    "KASPER_REDIS_PERSISTENCE",     # the stack's Redis: aof or none
    "KASPER_SPARK_WORKER_CORES",    # the stack's Spark worker
    "KASPER_SPARK_WORKER_MEMORY",
    "KASPER_SPARK_MASTER",          # an existing Spark cluster instead of the stack's
    "KASPER_SCHEMA_REGISTRY_URL",   # an existing schema registry instead of the stack's
    "KASPER_REDIS_URL",             # an existing Redis for the tests
    "KASPER_GRAFANA_DIR",           # grafana/provisioning's dashboards folder
})
"""Variables read by something other than ``Config``; besides these, any
``KASPER_*_PORT`` (the stack's and the examples' ports)."""
_SUFFIXES = ("_PORT",)


def unknown_variables(env: Mapping[str, str], known: Iterable[str]
                      ) -> list[tuple[str, str | None]]:
    """Each ``KASPER_*`` variable of ``env`` that is neither in ``known`` (the
    ``Config`` fields' variables, and table prefixes such as ``KASPER_CLIENT__``) nor
    one of ``OTHER_VARIABLES``, with the closest known name (or ``None``), sorted."""
    names = set(known)
    prefixes = tuple(name for name in names if name.endswith("__"))
    # compared without the prefix every name shares, which would make any two look alike
    candidates = {name.removeprefix(PREFIX): name for name in sorted(names | OTHER_VARIABLES)}
    found = []
    for variable in sorted(env):
        if (not variable.startswith(PREFIX) or variable in names
                or variable in OTHER_VARIABLES or variable.endswith(_SUFFIXES)
                or (prefixes and variable.startswith(prefixes))):
            continue
        found.append((variable, _closest(variable, candidates)))
    return found


def _closest(variable: str, candidates: Mapping[str, str]) -> str | None:
    """The known name closest to ``variable``; for ``KASPER_CONSUMR__FETCH_MAX_BYTES``,
    the table prefix's with the same key (``KASPER_CONSUMER__FETCH_MAX_BYTES``)."""
    head, sep, key = variable.removeprefix(PREFIX).partition("__")
    close = difflib.get_close_matches(head + sep, candidates, n=1, cutoff=0.75)
    return candidates[close[0]] + (key if sep else "") if close else None
