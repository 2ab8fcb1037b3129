"""The steps of a turn, named and numbered once (``STEPS``): the engine runs them in this
order, the metrics time them (``TIMED``: the ``step`` label of
``kasper_step_duration_seconds``), fault injection and tracing stop at their boundaries
(``BOUNDARIES``), and the docs' table of the turn is checked against them. Nothing here
runs a step; ``engine.py`` does.
"""

from __future__ import annotations

from typing import NamedTuple

__all__ = ["BOUNDARIES", "STEPS", "TIMED", "Step"]


class Step(NamedTuple):
    """One step of a turn."""

    number: int
    """Its number, on every page of the docs and in every module docstring."""
    name: str
    """Its name: the docs' first column, and in bold in guarantees.md."""
    timed: tuple[str, ...]
    """The ``TurnResult.durations`` keys (and metric labels) its time counts under."""
    after: str | None
    """The boundary hook (``on_step``) called once it is done, if any."""


STEPS: tuple[Step, ...] = (
    Step(1, "process", ("process",), "after_process"),
    Step(2, "flush", ("flush",), "after_flush"),
    Step(3, "produce", ("produce", "read_ahead"), None),
    Step(4, "wait", ("produce",), "after_produce"),
    Step(5, "commit", ("commit",), "after_commit"),
    Step(6, "report", (), None),
)
"""The turn, in order. Before step 1 an effectively-once store's applied input is
skipped and, with exactly-once, the transaction begins; with an effectively-once store
the order is 1, 3, 4, 2, 5, 6 (exactly-once: 1, 3, 4, 5, 2, 6). Step 3 hands the output
over; while its acks are outstanding the runner reads ahead (``read_ahead``); the ack
wait (4) counts as ``produce``. Step 6 is the runner's."""

BOUNDARIES: tuple[str, ...] = ("before_process",
                               *(step.after for step in STEPS if step.after is not None))
"""Where the engine calls its ``on_step`` hook: before step 1, then after steps 1, 2, 4
and 5. The in-memory broker's ``crash_at`` steps, and where trace spans open and close."""

TIMED: tuple[str, ...] = tuple(dict.fromkeys(key for step in STEPS for key in step.timed))
"""The step durations a turn reports, in order: the ``step`` label values of
``kasper_step_duration_seconds`` (process, flush, produce, read_ahead, commit)."""
