"""Assignments: which input partitions a loop runs, chosen once at start.
``StaticAssignment`` takes the partition set of ``Config.input_partitions`` at start
(refusing it while another loop runs it); ``GroupAssignment`` joins the consumer group,
and partitions arrive and leave through rebalance callbacks between turns. Both open a
partition the same way (its stores restored, its processor built), close it the same way
(a static loop's release, a group's revoke), and say when the loop is caught up
(``run_loop(until_caught_up=True)``).
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any

import structlog

from kasper_py.config import Config
from kasper_py.kafka.batching import Batch
from kasper_py.kafka.offsets import lowered, partition_lag
from kasper_py.kafka.ports import KafkaClients
from kasper_py.kafka.topics import owned_partitions
from kasper_py.loop.committer import OffsetCommitter
from kasper_py.loop.partitions import Partitions, RestoreTally
from kasper_py.loop.peers import PeerWait
from kasper_py.loop.prefetch import Prefetcher
from kasper_py.loop.promotion import PromotionRefusedError, Promotions
from kasper_py.loop.standby import NoStandbys, Standbys
from kasper_py.message import TopicPartitionKey
from kasper_py.observability.observe import LoopObserver

__all__ = ["Assignment", "GroupAssignment", "StaticAssignment", "assignment_for"]

_log = structlog.get_logger("kasper_py")
_GROUP_CHECK_SECONDS = 1.0
"""Group mode, ``until_caught_up``: once this member's own partitions are consumed to
their ends, how often it reads the group's committed offsets and every input
partition's end to see whether the group holds any lag."""


class Assignment(ABC):
    """Which partitions a loop runs, opened and closed through ``partitions``; the
    ``committer`` announces them and keeps their committed offsets."""

    reads_ahead: bool
    """Whether the next batch may be read while a turn's acks are outstanding."""

    def __init__(self, config: Config, clients: KafkaClients, *, partitions: Partitions,
                 committer: OffsetCommitter, prefetcher: Prefetcher,
                 observer: LoopObserver, standbys: Standbys | None = None) -> None:
        self.config = config
        self._consumer, self._clock = clients.consumer, clients.clock
        self._partitions, self._committer, self._prefetcher = partitions, committer, prefetcher
        self._observer = observer
        self._standbys = standbys or NoStandbys()
        self._partition_count: int | None = None

    def partition_count(self) -> int | None:
        """Partitions of each input topic; ``None`` until ``start``."""
        return self._partition_count

    def _take(self, partitions: list[int], tally: RestoreTally | None = None) -> None:
        """Open ``partitions`` as their owner: a warm copy kept here (``standbys``) hands
        its folder over first, so the open reads only the changelog's tail; a partition
        kept nowhere here restores in full."""
        self._standbys.promote(partitions)
        self._partitions.open(partitions, tally)

    def _give_up(self, keys: list[TopicPartitionKey], partitions: list[int]) -> None:
        """Close ``partitions`` (all their ``keys`` no longer read here): records gathered
        for the next batch dropped (their next owner reads them from the committed
        offsets), their offsets forgotten, processors and stores closed, and those this
        process keeps standbys of kept warm again."""
        self._prefetcher.drop(keys)
        self._committer.offsets.forget(keys)
        self._partitions.close(partitions)
        self._standbys.revoked(partitions)

    @abstractmethod
    def start(self, partition_count: int) -> None:
        """Begin running partitions of the input topics (``partition_count`` each)."""

    @abstractmethod
    def ensure_assigned(self) -> bool:
        """True when partitions are assigned, so what is left of them can be measured."""

    @abstractmethod
    def caught_up(self, consumed_all: Callable[[], bool]) -> bool:
        """``run_loop(until_caught_up=True)`` may return (``consumed_all``: every
        partition assigned here is consumed to its end)."""

    @abstractmethod
    def after_turn(self, durations: dict[str, float]) -> None:
        """A turn that took ``durations`` (seconds per step) is done."""

    @abstractmethod
    def after_consume(self, batch: Batch) -> Batch:
        """The loop read its next ``batch`` (group mode: the rebalance callbacks ran);
        returns the batch to run."""

    def _log_started(self, **details: Any) -> None:
        _log.info("kasper.started", processor=self.config.name, **details,
                  topics=list(self.config.input_topics), group=self.config.group,
                  processing_guarantee=self.config.processing_guarantee)


class StaticAssignment(Assignment):
    """A static partition set: assigned at start at the committed offsets, after this
    loop's running note is announced and the partitions' stores are restored. Between
    turns it serves ``promotions``: partitions taken over in place (a standby promoted),
    or released (given back to an owner that returned)."""

    reads_ahead = True

    def __init__(self, config: Config, clients: KafkaClients, *, partitions: Partitions,
                 committer: OffsetCommitter, prefetcher: Prefetcher,
                 observer: LoopObserver, standbys: Standbys | None = None,
                 promotions: Promotions | None = None) -> None:
        super().__init__(config, clients, partitions=partitions, committer=committer,
                         prefetcher=prefetcher, observer=observer, standbys=standbys)
        self._promotions = promotions or Promotions()

    def start(self, partition_count: int) -> None:
        """Take this loop's partitions of ``partition_count``: refuse them while another
        loop runs them, say at once that they are taken (before restoring tables takes
        its time), open them, and assign them where their processing stands."""
        self._partition_count = partition_count
        self._committer.begin()
        partitions = owned_partitions(self.config, partition_count)
        keys = self._consumer.keys(partitions)
        self._committer.check_not_running(keys)
        committed = self._consumer.committed(keys)
        self._committer.announce({tp: o for tp, o in committed.items() if o is not None})
        self._partitions.open(partitions)
        self._partitions.record_starts(committed)
        committed = self._consumer.assign(partitions, self._partitions.resume_from())
        self._committer.offsets.mark_committed(
            {tp: o for tp, o in committed.items() if o is not None})
        self._observer.on_start(self._consumer.assigned)
        self._log_started(partitions=list(partitions), **self._committer.identity)

    def ensure_assigned(self) -> bool:
        """True when partitions are assigned to measure: before the loop starts, assign
        this loop's own (at their committed offsets, nothing announced)."""
        if not self._consumer.assigned:
            self._consumer.assign(owned_partitions(self.config,
                                                   self._consumer.partition_count()))
        return True

    def caught_up(self, consumed_all: Callable[[], bool]) -> bool:
        """Every assigned partition is consumed to its end; the offsets are then
        committed past the transaction markers read since the last commit, so a
        transactional input (an app's repartition under exactly-once) shows no lag."""
        if not consumed_all():
            return False
        self._committer.commit_past_markers()
        return True

    def after_turn(self, durations: dict[str, float]) -> None:
        """Nothing to check: a static member has no poll budget."""

    def after_consume(self, batch: Batch) -> Batch:
        """Between two turns: promotion and release requests (``POST /standby/promote``,
        ``/standby/release``) are served (a static set holds every topic of its
        partitions: nothing else to check). Returns ``batch`` less the records of the
        partitions released, which their next owner reads from the committed offsets."""
        if not self._promotions.waiting():  # the common case: nothing to serve
            return batch
        owned = set(self._owned())
        self._promotions.serve({"promote": self._promote, "release": self._release})
        return batch.without(owned - set(self._owned()))

    def _promote(self, partitions: tuple[int, ...], previous: str | None) -> dict[str, Any]:
        """Take ``partitions`` over in place, as their owner: refused (nothing changed)
        when unknown or owned here; else the loop that ran them is fenced (exactly-once;
        ``previous``: its partition set), each is opened (from its warm copy when kept
        here) and assigned at its committed offsets, announced, and the next turn runs
        it. Returns what the request is answered."""
        self._check_promotable(partitions)
        started, tally, wanted = time.perf_counter(), RestoreTally(), list(partitions)
        keys = self._consumer.keys(wanted)
        fenced = self._committer.take_over(keys, previous)
        self._take(wanted, tally)
        self._partitions.record_starts(self._consumer.committed(keys))
        starts = self._consumer.assign_more(wanted, self._partitions.resume_from())
        committed = {tp: o for tp, o in starts.items() if o is not None}
        self._committer.offsets.mark_committed(committed)
        self._committer.announce(committed)
        self._observer.on_start(self._consumer.assigned)
        answer = {"partitions": wanted, "owned": self._owned(), "restored": tally.records,
                  "from_standby": bool(tally.tables) and tally.from_standby == tally.tables,
                  "fenced": fenced, "seconds": round(time.perf_counter() - started, 3)}
        _log.info("kasper.promoted", processor=self.config.name, **answer)
        return answer

    def _release(self, partitions: tuple[int, ...], _previous: str | None) -> dict[str, Any]:
        """Stop running ``partitions`` here, the last turn committed: refused (nothing
        changed) when unknown, not owned here, or all this loop owns; else their
        committed offsets are re-committed with a "released" note (so their next owner
        starts unrefused), they are unassigned and closed as a group's revoke closes
        them, and kept warm again where this process keeps standbys of them."""
        self._check_releasable(partitions)
        started, wanted = time.perf_counter(), list(partitions)
        keys = [tp for tp in self._consumer.assigned if tp[1] in partitions]
        committed = {tp: o for tp in keys
                     if (o := self._committer.offsets.committed(*tp)) is not None}
        self._committer.release(committed)
        self._consumer.unassign(wanted)
        self._give_up(keys, wanted)
        self._observer.on_start(self._consumer.assigned)
        answer = {"partitions": wanted, "owned": self._owned(),
                  "committed": {f"{t}[{p}]": o for (t, p), o in sorted(committed.items())},
                  "seconds": round(time.perf_counter() - started, 3)}
        _log.info("kasper.released", processor=self.config.name, **answer)
        return answer

    def _check_releasable(self, partitions: tuple[int, ...]) -> None:
        """``PromotionRefusedError`` for partitions the input topics lack, this loop does
        not own, or that are all it owns (a static loop runs one partition at least)."""
        self._check_known(partitions)
        owned = self._owned()
        foreign = [p for p in partitions if p not in owned]
        if foreign:
            raise PromotionRefusedError(409, f"processor {self.config.name!r} does not own "
                                        f"partitions {foreign} here (it owns {owned})")
        if not set(owned) - set(partitions):
            raise PromotionRefusedError(409, f"processor {self.config.name!r} would own no "
                                        f"partition: it owns only {owned}, and a static "
                                        "loop runs one at least; stop it instead")

    def _check_known(self, partitions: tuple[int, ...]) -> None:
        """``PromotionRefusedError`` (404) for partitions the input topics lack."""
        count = self._partition_count or 0
        unknown = [p for p in partitions if p >= count]
        if unknown:
            raise PromotionRefusedError(404, f"partitions {unknown} do not exist: the input "
                                   f"topics {list(self.config.input_topics)} have {count}")

    def _check_promotable(self, partitions: tuple[int, ...]) -> None:
        """``PromotionRefusedError`` for partitions the input topics lack or this loop owns."""
        self._check_known(partitions)
        owned = [p for p in partitions if p in self._owned()]
        if owned:
            raise PromotionRefusedError(409, f"processor {self.config.name!r} already owns "
                                   f"partitions {owned} here (it owns {self._owned()})")

    def _owned(self) -> list[int]:
        return sorted({p for _, p in self._consumer.assigned})


class GroupAssignment(Assignment):
    """Group membership: subscribe at start; partitions arrive (and leave) through the
    rebalance callbacks, which run inside ``consume``, so between turns: the loop reads
    no batch ahead, and every turn is committed before the next consume. A partition
    this member keeps warm (``standbys``) is promoted when it arrives: its copy hands
    over its folder and the open reads only the changelog's tail."""

    reads_ahead = False

    def __init__(self, config: Config, clients: KafkaClients, *, partitions: Partitions,
                 committer: OffsetCommitter, prefetcher: Prefetcher,
                 observer: LoopObserver, standbys: Standbys | None = None) -> None:
        super().__init__(config, clients, partitions=partitions, committer=committer,
                         prefetcher=prefetcher, observer=observer, standbys=standbys)
        self._poll_budget_ms = float(config.to_consumer_conf().get("max.poll.interval.ms",
                                                                   300_000))
        self._next_group_check = 0.0
        """``until_caught_up``: when (on ``clock``) to look at the group's lag next."""
        self._group_lagging: list[TopicPartitionKey] = []
        self._peers = PeerWait(config, self._clock, self._consumer.keys)
        self._running: set[TopicPartitionKey] = set()
        """The keys the open partitions were opened with."""

    def start(self, partition_count: int) -> None:
        """Join the group (exactly-once: after taking over the transactional id)."""
        self._partition_count = partition_count
        self._committer.begin()
        self._consumer.subscribe(self._assigned, self._revoked)
        self._observer.on_start([])
        assignor = self._peers.assignor
        self._log_started(assignment="group", group_protocol=assignor.protocol,
                          assignor=assignor.assignor)

    def _assigned(self, keys: list[TopicPartitionKey]) -> dict[TopicPartitionKey, int]:
        """The group added ``keys``. A partition held of every input topic runs: opened
        (tables restored, processors built) unless it is already. One whose peers the
        group has not assigned here yet (KIP-848 hands a joining member each partition
        as its previous owner releases it, in any order) waits, its topics paused, so
        that no processor sees one side of a join alone; its peers' arrival opens and
        resumes it. Returns where an effectively-once store is behind the committed
        offsets."""
        held = {*self._consumer.assigned, *keys}
        ready, short = self._peers.split({p for _, p in keys}, held)
        self._consumer.pause([tp for tp in keys if tp[1] in short])
        self._peers.wait(short, held)
        # an open partition given more of its topics (another group read together)
        # reopens, so their stores are restored to what the previous owner committed
        self._partitions.close(sorted({p for t, p in keys if p in ready and (t, p) not in
                                       self._running and self._partitions.is_open(p)}))
        return self._run(ready, keys, self._peers.arrived(ready), held)

    def _run(self, partitions: list[int], keys: list[TopicPartitionKey],
             waited: list[int], held: set[TopicPartitionKey]) -> dict[TopicPartitionKey, int]:
        """Open ``partitions``, ``held`` with their peers now (``keys`` just assigned).
        The topics of those that ``waited`` for their peers, paused, are resumed where
        their processing stands. Returns the starts of ``keys`` lower than their
        committed offsets."""
        started = time.perf_counter()
        self._take(partitions)
        ready = [tp for tp in self._consumer.keys(partitions) if tp in held]
        self._running.update(ready)
        committed = self._consumer.committed(ready)
        self._partitions.record_starts(committed)
        starts = lowered(committed, self._partitions.resume_from())
        self._committer.offsets.mark_committed(
            {tp: o for tp, o in starts.items() if o is not None})
        if waited:
            self._consumer.resume({tp: o for tp, o in starts.items()
                                   if tp[1] in waited and tp not in keys})
        self._observer.on_start(self._consumer.assigned)
        if partitions:
            _log.info("kasper.partitions_assigned", processor=self.config.name,
                      partitions=partitions, seconds=round(time.perf_counter() - started, 3))
        return {tp: o for tp, o in starts.items()
                if tp in keys and o is not None and o != committed[tp]}

    def _revoked(self, keys: list[TopicPartitionKey]) -> None:
        """The group took ``keys`` away. Every processed batch is already committed (no
        consume happens inside a turn), so only records gathered for the next batch are
        dropped (the new owner reads them from the committed offsets); the partitions'
        processors and stores close, the others stay. A partition left here with whole
        groups of topics read together runs on with them, untouched; one left with some
        topic only waits again for the peers taken away, paused."""
        gone = set(keys)
        held = set(self._consumer.assigned) - gone
        kept, _ = self._peers.split({p for _, p in keys}, held)
        kept = [p for p in kept if any(tp[1] == p for tp in held)]
        partitions = sorted({p for _, p in keys} - set(kept))
        left = [tp for tp in held if tp[1] in partitions]
        self._peers.forget(partitions)
        self._give_up([*keys, *left], partitions)
        self._running.difference_update([*keys, *left])
        self._consumer.pause(left)
        self._peers.wait(sorted({p for _, p in left}), held)
        _log.info("kasper.partitions_revoked", processor=self.config.name,
                  partitions=sorted({p for _, p in keys}))

    def ensure_assigned(self) -> bool:
        """True when the group assigned this member partitions (none yet: nothing to
        measure)."""
        return bool(self._consumer.assigned)

    def caught_up(self, consumed_all: Callable[[], bool]) -> bool:
        """This member's own partitions first, at no cost to the broker; once they are
        done, the group's lag on every input partition, read at most every
        ``_GROUP_CHECK_SECONDS``: caught up when the group holds none and no transaction
        is open on any input partition (internal ones included). Under ``read_committed``
        an open transaction hides its records and holds the partition's visible end below
        them: a killed member's (until the broker aborts it) or a live member's turn in
        flight would otherwise let the group end with those records unread."""
        if self._consumer.assigned and not consumed_all():
            return False
        now = self._clock()
        if now < self._next_group_check:
            return False
        self._next_group_check = now + _GROUP_CHECK_SECONDS
        self._committer.commit_past_markers()  # the group's offsets reach the end
        keys = self._consumer.keys(range(self._partition_count or 0))
        # first the open transactions: one that commits after this read shows as lag
        lagging = dict.fromkeys(self._consumer.open_transactions(keys), 0)
        lagging.update(self._group_lag(keys))
        if sorted(lagging) != self._group_lagging:
            self._group_lagging = sorted(lagging)
            if lagging:
                _log.info("kasper.waiting_for_group", processor=self.config.name,
                          group=self.config.group, lag=sum(lagging.values()),
                          partitions=[f"{t}[{p}]" for t, p in self._group_lagging])
        return not lagging

    def _group_lag(self, keys: list[TopicPartitionKey]) -> dict[TopicPartitionKey, int]:
        """The group's lag on each partition of ``keys`` that has any, read
        from the broker (one committed-offsets request, then each partition's end):
        ``offsets.partition_lag`` of the group's committed offset. Empty when the group
        has processed and committed everything written so far. The consumer reads
        committed offsets as stable ones (``read_committed``): while a transaction holds
        offsets pending (a killed exactly-once member's, until it times out) the read
        waits for it, so the answer is final."""
        committed = self._consumer.committed(keys)
        lags = {}
        for tp in keys:
            reset = ("earliest" if tp[0] in self._consumer.from_start
                     else self.config.auto_offset_reset)
            behind = partition_lag(committed.get(tp), *self._consumer.watermarks(tp), reset)
            if behind:
                lags[tp] = behind
        return lags

    def after_consume(self, batch: Batch) -> Batch:
        """Raise ``TopicError`` once a partition has waited for its peers longer than the
        group may take to bring them (``peers.peer_wait_seconds``); ``batch`` runs."""
        self._peers.check(self._consumer.assigned)
        return batch

    def after_turn(self, durations: dict[str, float]) -> None:
        """The loop consumes only between turns, so a turn must stay well inside the
        group's poll budget (``max.poll.interval.ms``), or the member is dropped and its
        partitions move. A turn over half the budget is reported."""
        budget = self._poll_budget_ms
        seconds = sum(durations.values())
        if seconds * 1000 > budget / 2:
            _log.warning("kasper.turn_near_poll_budget", processor=self.config.name,
                         turn_seconds=round(seconds, 3), budget_seconds=budget / 1000,
                         hint="lower batch_size, or raise max.poll.interval.ms in "
                              "consumer_overrides")


def assignment_for(config: Config, clients: KafkaClients, *, partitions: Partitions,
                   committer: OffsetCommitter, prefetcher: Prefetcher,
                   observer: LoopObserver, standbys: Standbys | None = None,
                   promotions: Promotions | None = None) -> Assignment:
    """The assignment ``config.assignment`` asks for; a group member promotes the
    partitions it keeps warm in ``standbys`` as they arrive, a static loop those that
    ``promotions`` (the admin endpoint's requests) ask for."""
    if config.group_mode:
        return GroupAssignment(config, clients, partitions=partitions, committer=committer,
                               prefetcher=prefetcher, observer=observer, standbys=standbys)
    return StaticAssignment(config, clients, partitions=partitions, committer=committer,
                            prefetcher=prefetcher, observer=observer, standbys=standbys,
                            promotions=promotions)
