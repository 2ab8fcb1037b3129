"""The repartition purge with no broker: what it asks to delete, and when. It deletes
only below the offsets committed, only on repartition topics, at most once per
interval, and a failed purge keeps the records and is tried again."""

from __future__ import annotations

from collections.abc import Mapping

import pytest
from structlog.testing import capture_logs

from kasper_py.exceptions import AdminError
from kasper_py.kafka.purge import RepartitionPurge
from kasper_py.message import TopicPartitionKey

REPARTITION = "app-by-user-repartition"


class Deleter:
    """Records each ``delete_records`` request; raises ``failure`` when set."""

    def __init__(self) -> None:
        self.requests: list[dict[TopicPartitionKey, int]] = []
        self.failure: Exception | None = None

    def delete_records(self, offsets: Mapping[TopicPartitionKey, int]
                       ) -> dict[TopicPartitionKey, int]:
        if self.failure is not None:
            raise self.failure
        self.requests.append(dict(offsets))
        return dict(offsets)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def purge(deleter: Deleter, clock: Clock, topics: tuple[str, ...] = (REPARTITION,)
          ) -> RepartitionPurge:
    return RepartitionPurge("app", topics, lambda: deleter, interval=30.0, clock=clock)


def test_only_committed_offsets_of_repartition_topics_are_purged() -> None:
    """The request is exactly the committed next offsets of the repartition topic's
    partitions: the records below them; a source topic is never purged."""
    deleter, clock = Deleter(), Clock()
    purger = purge(deleter, clock)
    clock.now += 30
    purger.after_commit({(REPARTITION, 0): 120, (REPARTITION, 1): 7, ("source", 0): 500})
    assert deleter.requests == [{(REPARTITION, 0): 120, (REPARTITION, 1): 7}]


def test_at_most_once_per_interval_and_never_the_same_offset_twice() -> None:
    """Before the interval has passed nothing is asked; a partition whose committed
    offset has not moved since its last purge is left out."""
    deleter, clock = Deleter(), Clock()
    purger = purge(deleter, clock)
    purger.after_commit({(REPARTITION, 0): 10})
    clock.now += 29.9
    purger.after_commit({(REPARTITION, 0): 10})
    assert deleter.requests == []
    clock.now += 0.1
    purger.after_commit({(REPARTITION, 0): 10, (REPARTITION, 1): 4})
    clock.now += 10
    purger.after_commit({(REPARTITION, 0): 50, (REPARTITION, 1): 4})
    clock.now += 30
    purger.after_commit({(REPARTITION, 0): 50, (REPARTITION, 1): 4})
    clock.now += 30
    purger.after_commit({(REPARTITION, 0): 60, (REPARTITION, 1): 4})
    assert deleter.requests == [{(REPARTITION, 0): 10, (REPARTITION, 1): 4},
                                {(REPARTITION, 0): 50}, {(REPARTITION, 0): 60}]


def test_a_failed_purge_is_logged_and_tried_again_at_the_next_interval() -> None:
    """A purge the broker refuses does not fail the loop: it is logged, and the same
    offsets are asked for again one interval later."""
    deleter, clock = Deleter(), Clock()
    purger = purge(deleter, clock)
    deleter.failure = AdminError("deleting the records failed")
    clock.now += 30
    with capture_logs() as logs:
        purger.after_commit({(REPARTITION, 0): 10})
    assert [(log["event"], log["error"]) for log in logs] == [
        ("kasper.repartition_purge_failed", "deleting the records failed")]
    deleter.failure = None
    clock.now += 30
    purger.after_commit({(REPARTITION, 0): 10})
    assert deleter.requests == [{(REPARTITION, 0): 10}]


def test_a_processor_without_repartitions_never_makes_an_admin() -> None:
    """No repartition topics: no admin is made, nothing is asked."""
    def no_admin() -> Deleter:
        raise AssertionError("an admin was made")
    clock = Clock()
    purger = RepartitionPurge("app", (), no_admin, interval=30.0, clock=clock)
    clock.now += 60
    purger.after_commit({("source", 0): 10})


def test_due_only_with_repartitions_once_the_interval_has_passed() -> None:
    clock = [0.0]
    purger = RepartitionPurge("app", [REPARTITION], lambda: pytest.fail("no admin"),
                              interval=30.0, clock=lambda: clock[0])
    assert not purger.due()
    clock[0] = 30.0
    assert purger.due()
    lone = RepartitionPurge("lone", [], lambda: pytest.fail("no admin"), interval=30.0,
                            clock=lambda: clock[0])
    clock[0] = 1000.0
    assert not lone.due()
