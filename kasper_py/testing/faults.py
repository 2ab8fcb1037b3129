"""``Faults``: the faults armed on an ``InMemoryBroker`` and fired by the clients and
stores bound to it, between the steps of a turn (``CRASH_STEPS``). Public through
``kasper_py.testing``; the broker and its clients live in ``memory``,
``memory_cluster`` and ``memory_clients``.
"""

from __future__ import annotations

from dataclasses import dataclass

from kasper_py.turn import BOUNDARIES

__all__ = ["CRASH_STEPS", "INJECTED", "Faults", "positive"]

CRASH_STEPS = BOUNDARIES
"""The step boundaries of a turn at which ``Faults.crash_at`` can stop a process."""
INJECTED = "injected by InMemoryBroker.faults"
"""How the errors a fault raises say so."""


@dataclass
class _Trigger:
    """Lets ``nth - 1`` events pass, then fires on ``times`` events in a row."""

    nth: int
    times: int = 1
    seen: int = 0
    retriable: bool = False
    """The error it raises says the failure is transient (``KasperError.retriable``)."""

    def fire(self) -> bool:
        self.seen += 1
        return self.nth <= self.seen < self.nth + self.times

    @property
    def spent(self) -> bool:
        return self.seen >= self.nth + self.times - 1


class Faults:
    """Faults armed on an ``InMemoryBroker`` and fired by the clients and stores bound to
    it. Each fires once (or ``times`` times) and is then spent; events are counted from
    when the fault is armed, across every process on the broker. Arming a fault of a
    kind already armed replaces it."""

    def __init__(self) -> None:
        self._armed: dict[str, _Trigger] = {}

    def fail_produce(self, nth: int = 1) -> None:
        """The ``nth`` message a loop hands to its producer raises ``ProduceError`` at
        enqueue (as a full or refused queue would); the turn stops uncommitted."""
        self._armed["produce"] = _Trigger(positive("nth", nth))

    def fail_delivery(self, nth: int = 1) -> None:
        """The ``nth`` message a loop hands to its producer gets a failed delivery
        report: it is not appended (the others are), and ``wait_for_acks`` raises
        ``ProduceError``."""
        self._armed["delivery"] = _Trigger(positive("nth", nth))

    def fail_commit(self, times: int = 1, *, nth: int = 1, retriable: bool = False) -> None:
        """The ``nth`` offset commit (exactly-once: transaction commit) and the
        ``times - 1`` after it raise ``CommitError``; nothing is committed, and an open
        transaction is left for the loop to abort. A restarted loop's first commit is
        its start note's. ``retriable`` marks the error transient, as Kafka marks an
        abortable transaction error: an exactly-once loop runs the turn again."""
        self._armed["commit"] = _Trigger(positive("nth", nth), positive("times", times),
                                         retriable=retriable)

    def fail_store_write(self, store: str, times: int = 1) -> None:
        """The next ``times`` flushes (of any partition) of the broker store ``store``
        that have something to write raise ``StoreError``; nothing is written."""
        self._armed[f"store:{store}"] = _Trigger(1, positive("times", times))

    def crash_at(self, step: str, turn: int = 1) -> None:
        """Kill the process the ``turn``-th time a loop reaches ``step`` (one of
        ``CRASH_STEPS``): ``SimulatedCrash`` stops ``run_loop`` with no cleanup."""
        if step not in CRASH_STEPS:
            raise ValueError(f"crash_at step must be one of {', '.join(CRASH_STEPS)}, "
                             f"got {step!r}")
        self._armed[f"crash:{step}"] = _Trigger(positive("turn", turn))

    def armed(self) -> list[str]:
        """The faults not yet spent (``produce``, ``store:counts``, ``crash:after_flush``...):
        a test can assert the ones it armed did fire."""
        return sorted(self._armed)

    def clear(self) -> None:
        """Disarm every fault."""
        self._armed.clear()

    def _fires(self, kind: str) -> bool:
        """Count one event of ``kind``; True when an armed fault fires on it."""
        return self._fired(kind) is not None

    def _fired(self, kind: str) -> _Trigger | None:
        """Count one event of ``kind``; the armed fault that fires on it, if one does."""
        trigger = self._armed.get(kind)
        if trigger is None:
            return None
        fired = trigger.fire()
        if trigger.spent:
            del self._armed[kind]
        return trigger if fired else None


def positive(name: str, value: int) -> int:
    """``value``, checked to be an int >= 1 (``ValueError`` naming ``name`` otherwise)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    return value
