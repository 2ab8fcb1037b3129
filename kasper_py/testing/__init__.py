"""Test a ``MessageProcessor`` with no broker, two ways:

- ``InMemoryBroker``: the real ``TopicProcessor`` on in-memory topics, offsets and
  stores, with faults injected on demand (a failed produce, delivery, commit or store
  write, or a crash between two steps of a turn, then a restart);
- ``ProcessorDriver``: lists of messages in, what the processor sent out; its wall
  clock and stream time move only when the test says (``advance_wall_clock``,
  ``advance_stream_time``), so timers and tasks are tested in milliseconds.

The driver runs the loop's own turn (``kasper_py.turn``): skipping
input an effectively-once store applied, process, dead letters, outputs first for
effectively-once stores, flush, "produce" and wait for the "acks", and the offset
checks (with ``processing_guarantee="exactly_once"``, in a transaction per turn); so a
processor that passes here behaves the same way inside ``TopicProcessor``.

    driver = ProcessorDriver(WordCount, value_serde="str")
    driver.process([make_message("lines", "a b a")])
    assert driver.outputs("counts") == [("a", "2"), ("b", "1")]
    driver.advance_wall_clock(60)   # wall-clock timers and tasks due by then fire

The broker is ``memory`` (what a test calls), ``memory_cluster`` (what it holds),
``memory_clients`` (the consumer and producer it hands a loop) and ``faults``; the
driver is ``driver``. The library below never imports them: a ``TopicProcessor`` gets
the broker's clients through its ``clients=`` port (``kasper_py.kafka.ports``).

For integration tests against real servers, ``containers`` starts Kafka and Redis in
containers and ``container_fixtures`` is its pytest plugin; they need the
``containers`` extra and are not imported here.
"""

from __future__ import annotations

from kasper_py.exceptions import SimulatedCrash
from kasper_py.testing.driver import ProcessorDriver, make_message
from kasper_py.testing.faults import Faults
from kasper_py.testing.memory import InMemoryBroker
from kasper_py.testing.memory_cluster import Commit

__all__ = ["Commit", "Faults", "InMemoryBroker", "ProcessorDriver", "SimulatedCrash",
           "make_message"]
