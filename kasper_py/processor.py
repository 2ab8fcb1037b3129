"""``MessageProcessor``, the class users subclass, and ``ProcessorContext``, what a
factory receives to build the processor of one partition.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypeVar, overload

from kasper_py.stores.base import KeyValueStore

if TYPE_CHECKING:
    from kasper_py.config import Config
    from kasper_py.message import Message
    from kasper_py.sender import Sender

__all__ = ["MessageProcessor", "ProcessorContext", "ProcessorFactory"]

S = TypeVar("S", bound=KeyValueStore)


@dataclass(frozen=True)
class ProcessorContext:
    """What the processor of one partition may use: its partition, config and stores."""

    partition: int
    config: Config
    stores: Mapping[str, KeyValueStore] = field(default_factory=dict)
    """The partition's state stores by name, as declared on the TopicProcessor."""

    @overload
    def store(self, name: str) -> KeyValueStore: ...

    @overload
    def store(self, name: str, kind: type[S]) -> S: ...

    def store(self, name: str, kind: type[KeyValueStore] = KeyValueStore) -> KeyValueStore:
        """Return the store called ``name``; ``KeyError`` lists the declared ones.

        ``kind`` (``RocksDBStore``, say) types the result for backend-specific calls;
        a store of another class is a ``TypeError``.
        """
        try:
            store = self.stores[name]
        except KeyError:
            raise KeyError(f"no store {name!r}; declared: {sorted(self.stores)}") from None
        if not isinstance(store, kind):
            raise TypeError(f"store {name!r} is a {type(store).__name__}, "
                            f"not a {kind.__name__}")
        return store


class MessageProcessor(ABC):
    """Processes the batches of one partition number, across every input topic.

    One instance exists per partition, so plain attributes are per-partition state.
    """

    @abstractmethod
    def process(self, messages: list[Message], sender: Sender) -> None:
        """Handle one batch: every input topic's messages for this partition, grouped
        topic by topic (in the order the topics first arrived), each in offset order.

        Put output with ``sender.send``; it is produced after this returns. Raising
        stops the loop and leaves the batch uncommitted, so it is processed again.
        """

    def close(self) -> None:  # noqa: B027 - an optional hook, empty by default
        """Called once when the loop stops; release what the processor holds."""


ProcessorFactory = Callable[[ProcessorContext], MessageProcessor]
