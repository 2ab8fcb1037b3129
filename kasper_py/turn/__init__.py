"""The turn, written once for every runner (the live loop, the Spark task and the
testing driver), one concern a module:

- ``engine``: ``TurnEngine``, which opens partitions and runs the steps in order;
- ``poison``: poison messages found by bisection (``on_process_error="dead_letter"``);
- ``effectively_once``: what effectively-once stores applied, and where they stand;
- ``topics``: the topics a turn sends to must exist;
- ``partitions``: ``PartitionState``, one partition's processor and stores.

What a runner does around a turn (polling, retries, committing) lives in the runner.
The steps of a turn, named and numbered once, are ``kasper_py.steps``'s (the metrics and
tracing below this package read them); their names are offered here too.
"""

from __future__ import annotations

from kasper_py.steps import BOUNDARIES, STEPS, TIMED, Step
from kasper_py.turn.engine import Commit, TurnEngine, TurnResult
from kasper_py.turn.partitions import PartitionState

__all__ = ["BOUNDARIES", "STEPS", "TIMED", "Commit", "PartitionState", "Step", "TurnEngine",
           "TurnResult"]
