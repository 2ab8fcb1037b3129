"""What every runner checks of the store specs it is given, in one place: the loop,
the Spark reprocessing job and the Spark stream runner. The specs themselves
(``StoreSpec``) live in ``base``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kasper_py.stores.base import StoreSpec

__all__ = ["check_unique_names"]


def check_unique_names(stores: Sequence[StoreSpec],
                       error: type[Exception] = ValueError) -> None:
    """Raise ``error`` when two of ``stores`` share a name: a processor finds its stores
    by name, and each name is a table of its own (its key prefix, changelog, database)."""
    names = [spec.name for spec in stores]
    if len(set(names)) != len(names):
        raise error(f"store names must be unique, got {names}")
