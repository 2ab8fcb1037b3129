"""The turn, written once for every runner (the live loop, the Spark task and the
testing driver), one concern a module:

- ``steps``: the steps of a turn, named and numbered once (``STEPS``), their timed
  names (``TIMED``, the metrics' labels) and boundaries (``BOUNDARIES``);
- ``engine``: ``TurnEngine``, which opens partitions and runs the steps in order;
- ``poison``: poison messages found by bisection (``on_process_error="dead_letter"``);
- ``effectively_once``: what effectively-once stores applied, and where they stand;
- ``topics``: the topics a turn sends to must exist;
- ``partitions``: ``PartitionState``, one partition's processor and stores.

What a runner does around a turn (polling, retries, committing) lives in the runner.
Names are imported on first use, so the metrics can read ``steps`` without the engine.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kasper_py._support.lazy import lazy_names

if TYPE_CHECKING:
    from kasper_py.turn.engine import Commit, TurnEngine, TurnResult
    from kasper_py.turn.partitions import PartitionState
    from kasper_py.turn.steps import BOUNDARIES, STEPS, TIMED, Step

__all__ = ["BOUNDARIES", "STEPS", "TIMED", "Commit", "PartitionState", "Step", "TurnEngine",
           "TurnResult"]

__getattr__, __dir__ = lazy_names(__name__, {
    "kasper_py.turn.engine": "Commit TurnEngine TurnResult",
    "kasper_py.turn.partitions": "PartitionState",
    "kasper_py.turn.steps": "BOUNDARIES STEPS TIMED Step"}, __all__)
