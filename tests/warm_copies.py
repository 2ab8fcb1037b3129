"""Warm copies the unit tests of standby reads hand to ``Tables`` (``warm=``): a
stand-in for a standby's copy of a table, with a known lag."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from kasper_py.stores.query import WarmCopy

__all__ = ["Warm"]


class Warm(WarmCopy):
    """A warm copy holding ``{"alice": 3}``, 7 offsets behind."""

    lag = 7

    def query_get_many(self, keys: Iterable[Any]) -> dict[Any, Any]:
        return {k: 3 for k in keys if k == "alice"}
