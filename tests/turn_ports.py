"""An output port for the turn engine's own tests: what it produced counts as acked at
once, and every call is written to ``log`` (in order with whatever else writes there)."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

from kasper_py.message import OutgoingMessage, OutgoingRecord


class ListPort:
    """An ``OutputPort`` with ``Transactions``, keeping what it was handed."""

    def __init__(self, log: list[str] | None = None) -> None:
        self.acked: list[OutgoingMessage] = []
        self.log = log if log is not None else []

    def produce(self, messages: Sequence[OutgoingRecord]) -> None:
        self.acked.extend(map(OutgoingMessage.of, messages))
        self.log.append(f"produce {len(messages)}")

    def wait_for_acks(self, waiting: Any = None) -> None:
        self.log.append("acks")

    def missing_topics(self, topics: Collection[str]) -> dict[str, str]:
        return {}

    def begin(self) -> None:
        self.log.append("begin")

    def add_offsets(self, next_offsets: Any, note: Any = None, group: Any = None) -> None:
        self.log.append("add offsets")

    def commit(self, next_offsets: Any, note: Any = None, group: Any = None) -> None:
        self.log.append("commit transaction")

    def abort(self) -> bool:
        self.log.append("abort")
        return True
