"""What the turn engine holds per input partition (``PartitionState``: its processor
and stores) and how a store's own error is named (``store_call``). Opening and closing
partitions is the engine's; the bookkeeping of what their stores applied is
``effectively_once.py``'s.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from kasper_py.exceptions import KasperError, StoreError
from kasper_py.observability.observe import NOOP_STORE_OBSERVER, StoreObserver
from kasper_py.processor import MessageProcessor, ProcessorFactory
from kasper_py.stores.base import KeyValueStore
from kasper_py.stores.query import Queryable

__all__ = ["PartitionState", "store_call"]

T = TypeVar("T")


@dataclass
class PartitionState:
    """One input partition number's processor and its stores."""

    partition: int
    stores: dict[str, KeyValueStore] = field(default_factory=dict)
    query_tables: dict[str, Queryable] = field(default_factory=dict)
    """What queries read in place of a store (``ProcessorContext.query_tables``)."""
    processor: MessageProcessor | None = None
    factory: ProcessorFactory | None = None
    """What built ``processor``; it builds the next one when the processor is rebuilt."""
    observer: StoreObserver = NOOP_STORE_OBSERVER
    """The partition's metrics, for its processor's ``ProcessorContext.skipped``."""


def store_call(name: str, partition: int, method: Callable[..., T], *args: Any) -> T:
    """A store's own error becomes a ``StoreError`` naming the store and partition."""
    try:
        return method(*args)
    except KasperError:
        raise
    except Exception as exc:
        raise StoreError(f"store {name!r} of partition {partition}: "
                         f"{type(exc).__name__}: {exc}") from exc
