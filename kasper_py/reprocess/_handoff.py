"""Handing a finished job's end offsets to the live loop's consumer group, so
``run_loop`` resumes exactly where reprocessing ended: no gap, no overlap.

Refused while the group is active: a member would keep its own position and commit
over the handoff. Three checks, before the job and again before the commit: the group
has no members (a subscribed consumer); no kasper loop's commit note says it is running
(a loop with a static assignment is not a member, but re-commits its offsets); and the
committed offsets did not move while the job ran. ``force`` skips them; the broker
still refuses a commit while the group has members.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from kasper_py.config import Config
from kasper_py.exceptions import ReprocessError
from kasper_py.kafka.offsets import (
    GROUP_ACTIVE_ERRORS,
    IDLE_GROUP_STATES,
    running_loop,
    running_window,
)
from kasper_py.message import TopicPartitionKey
from kasper_py.reprocess._kafka import KafkaFacts

__all__ = ["HandoffRefusedError", "check_group_idle", "commit_handoff"]


class HandoffRefusedError(ReprocessError):
    """The live group is active, so its offsets were not moved.

    Raised after a successful job, ``result`` holds that job's ``ReprocessResult``.
    """

    result: Any = None


def check_group_idle(config: Config, facts: KafkaFacts,
                     keys: Iterable[TopicPartitionKey]) -> None:
    """Raise ``HandoffRefusedError`` when the live group has members or is rebalancing,
    or when a kasper loop's last commit of ``keys`` says it is running."""
    state, members = facts.group_state()
    if members or state not in IDLE_GROUP_STATES:
        raise HandoffRefusedError(
            f"refusing the handoff: the live group {config.group!r} is active "
            f"({state.lower()}, members: {', '.join(members) or 'none'}); stop its "
            "processors first, or pass force=True (--force) to skip this check")
    note = running_loop(config, facts.commit_notes(keys))
    if note is not None:
        raise HandoffRefusedError(
            f"refusing the handoff: a live loop of group {config.group!r} is "
            f"{note.describe()} and would commit over the handoff; stop it first, or pass "
            f"force=True (--force) if it is gone (it counts as running for "
            f"{running_window(config):.0f} s after its last commit)")


def commit_handoff(config: Config, facts: KafkaFacts, ends: Mapping[TopicPartitionKey, int],
                   before: Mapping[TopicPartitionKey, int | None] | None) -> None:
    """Commit ``ends`` as the live group's next offsets.

    ``before`` is the group's committed offsets read when the job started; unless it is
    ``None`` (forced), the group must still be idle and its offsets unchanged.
    """
    if before is not None:
        check_group_idle(config, facts, ends)
        _check_unmoved(config, before, facts.committed(before))
    try:
        facts.commit(ends)
    except ReprocessError as exc:
        if exc.code in GROUP_ACTIVE_ERRORS:
            raise HandoffRefusedError(
                f"refusing the handoff: the broker says group {config.group!r} is active: "
                f"{exc}") from exc
        raise


def _check_unmoved(config: Config, before: Mapping[TopicPartitionKey, int | None],
                   now: Mapping[TopicPartitionKey, int | None]) -> None:
    moved = [f"{topic}[{partition}] {before[topic, partition]} -> {offset}"
             for (topic, partition), offset in sorted(now.items())
             if offset != before.get((topic, partition))]
    if moved:
        raise HandoffRefusedError(
            f"refusing the handoff: group {config.group!r} committed offsets while "
            f"reprocessing ran ({', '.join(moved)}), so a live loop is running; stop it "
            "and run the handoff again, or pass force=True (--force)")
