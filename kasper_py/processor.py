"""``MessageProcessor``, the class users subclass, and ``ProcessorContext``, what a
factory receives to build the processor of one partition.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kasper_py.config import Config
    from kasper_py.message import Message
    from kasper_py.sender import Sender

__all__ = ["MessageProcessor", "ProcessorContext", "ProcessorFactory"]


@dataclass(frozen=True)
class ProcessorContext:
    """What the processor of one partition may use: its partition, config and stores."""

    partition: int
    config: Config
    stores: Mapping[str, Any] = field(default_factory=dict)
    """The partition's state stores by name, as declared on the TopicProcessor."""

    def store(self, name: str) -> Any:
        """Return the store called ``name``; ``KeyError`` lists the declared ones."""
        try:
            return self.stores[name]
        except KeyError:
            raise KeyError(f"no store {name!r}; declared: {sorted(self.stores)}") from None


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
