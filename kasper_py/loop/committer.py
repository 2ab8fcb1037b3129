"""Committers: how a loop commits a turn's input offsets, chosen once at start.
``OffsetCommitter`` commits through the consumer (at-least-once); ``TransactionCommitter``
commits them in the turn's transaction (exactly-once) and names the loop that fenced
it. A committer only commits: the engine calls ``commit`` in step 5 of the turn, and
the loop drives the turns (``turns.py``, which retries them). Both write the commit notes
that tell operators' tools a loop is running (announced at start, re-committed as a
heartbeat while idle, "stopped" at close) and refuse to start while another runner's
note is recent: ``check_not_running``, the one check the Spark stream runner uses too.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Iterable
from typing import Literal

import structlog

from kasper_py._support.partition_sets import partition_label, transactional_id_of
from kasper_py.config import Config
from kasper_py.exceptions import AlreadyRunningError, FencedError, KasperError
from kasper_py.kafka.offsets import HEARTBEAT_SECONDS, CommitNote, OffsetTracker, running_elsewhere
from kasper_py.kafka.ports import InputPort, KafkaClients, ProducerPort, Transactions
from kasper_py.message import TopicPartitionKey
from kasper_py.observability.observe import LoopObserver

__all__ = ["OffsetCommitter", "TransactionCommitter", "check_not_running", "committer_for"]

_log = structlog.get_logger("kasper_py")
Offsets = dict[TopicPartitionKey, int]
LoopState = Literal["running", "stopped", "released"]
"""What a loop's commit notes say (``CommitNote.state``)."""
Endpoint = Callable[[], str | None]
"""The URL the loop answers queries on, once its query server is up (else ``None``)."""
Warm = Callable[[], Collection[int]]
"""The partitions the loop keeps warm now (``Standbys.partitions``)."""
_FENCED_NOTE_WAIT = 5.0
"""Fenced: how long to wait for the note of the loop that took over, to name it."""


def _no_endpoint() -> str | None:
    return None


def _nothing_warm() -> Collection[int]:
    return ()


def check_not_running(config: Config, notes: Iterable[CommitNote | None], *, force: bool,
                      refusal: Callable[[CommitNote], str], by_stream: bool = False,
                      fences: Callable[[CommitNote], bool] | None = None) -> None:
    """Refuse to start while another loop or streaming query runs these partitions: its
    last commit note says running (or streaming) and is recent (``offsets.running_window``;
    a note of a process on this host that no longer exists does not count). Raises
    ``AlreadyRunningError`` with ``refusal(note)``, unless ``force`` (then a warning), or
    unless ``fences(note)``: this runner takes the partitions over (exactly-once, the
    same partition set). ``by_stream``: the caller is a streaming query."""
    other = running_elsewhere(config, notes, by_stream=by_stream)
    if other is None:
        return
    if fences is not None and fences(other):
        _log.info("kasper.fencing", processor=config.name, other=other.describe(),
                  transactional_id=config.transactional_id)
        return
    if force:
        _log.warning("kasper.forced_start", processor=config.name, other=other.describe())
        return
    raise AlreadyRunningError(refusal(other))


class OffsetCommitter:
    """At-least-once: commits the input offsets through the consumer, each with this
    loop's note; remembers what it committed, so an offset never goes backwards."""

    transactions: Transactions | None = None
    """What the turn engine wraps each turn in: nothing here."""

    def __init__(self, config: Config, consumer: InputPort, observer: LoopObserver, *,
                 holding: Callable[[], bool], endpoint: Endpoint = _no_endpoint,
                 warm: Warm = _nothing_warm, force: bool = False) -> None:
        """``holding`` says whether records of the next batch are read and not yet
        processed (the consumer's position is then past them). ``endpoint`` gives the
        URL this loop answers queries on (once its query server is up), ``warm`` the
        partitions it keeps warm, both announced in the notes; ``force`` starts despite
        another running loop."""
        self.config = config
        self.offsets = OffsetTracker()
        """The next offsets this loop committed, per topic-partition."""
        self._consumer, self._observer = consumer, observer
        self._endpoint, self._warm = endpoint, warm
        self._holding, self._force = holding, force
        self._last_commit = time.monotonic()
        self._started_at = time.time()

    # -- start ----------------------------------------------------------------------

    @property
    def identity(self) -> dict[str, str]:
        """What names this committer in the start log line: nothing here."""
        return {}

    def begin(self) -> None:
        """The loop starts: notes committed from now on by another loop are newer."""
        self._started_at = time.time()

    def check_not_running(self, keys: list[TopicPartitionKey]) -> None:
        """Refuse ``keys`` while another loop or streaming query runs them (see
        ``check_not_running``), unless forced."""
        notes = [CommitNote.decode(m) for m in self._consumer.notes(keys).values()]
        check_not_running(self.config, notes, force=self._force, refusal=self._refusal,
                          fences=self._fences)

    def _refusal(self, other: CommitNote) -> str:
        who = "a stream (kasper stream)" if other.by_stream else "another loop"
        return (f"processor {self.config.name!r}: {who} is running partitions "
                f"{self.config.partition_set} of {', '.join(self.config.input_topics)} "
                f"(group {self.config.group!r}): {other.describe()}. Both would process "
                "and commit; stop it, or start with force (--force)")

    def _fences(self, _other: CommitNote) -> bool:
        return False

    def take_over(self, keys: list[TopicPartitionKey], previous: str | None) -> list[str]:
        """A standby promoted in place takes ``keys`` over from the loop that ran them
        (``previous``: its partition set). At-least-once nothing can fence that loop: the
        operator must have stopped it (as with ``--force``). Returns the ids fenced."""
        _log.info("kasper.taking_over", processor=self.config.name,
                  previous=previous, partitions=sorted({p for _, p in keys}))
        return []

    def release(self, committed: Offsets) -> None:
        """Say that this loop no longer runs these partitions (released in place): re-commit
        their ``committed`` offsets with a "released" note (exactly-once: in a transaction
        of its own); a failure raises. The caller then forgets them (``offsets.forget``)."""
        if committed:
            self._recommit(committed, "released", fail=True)

    def announce(self, committed: Offsets) -> None:
        """Say at once that these partitions are taken: re-commit the ``committed``
        offsets with this loop's running note; a failure raises."""
        if committed:
            self._recommit(committed, "running", fail=True)
            self._last_commit = time.monotonic()

    # -- turns ----------------------------------------------------------------------

    def stage(self, next_offsets: Offsets) -> None:
        """The engine's turn handed its outputs over and reads no further ahead: nothing
        to do before its acks are in (exactly-once adds the offsets to the transaction
        then)."""

    def commit(self, next_offsets: Offsets) -> None:
        """The engine's commit: the input offsets (moved past transaction markers), with
        a running note. A turn of timers and tasks alone has no input to commit."""
        if next_offsets:
            self._commit_turn(next_offsets)

    def _commit_turn(self, next_offsets: Offsets) -> None:
        offsets = self._turn_offsets(next_offsets)
        self._commit(offsets, "running")
        self._committed_turn(offsets)

    def _turn_offsets(self, next_offsets: Offsets) -> Offsets:
        """A turn's offsets to commit: moved past transaction markers, never backwards."""
        offsets = self._past_markers(next_offsets)
        self.offsets.check(offsets)
        return offsets

    def _committed_turn(self, offsets: Offsets) -> None:
        self.offsets.mark_committed(offsets)
        self._last_commit = time.monotonic()

    def _commit(self, next_offsets: Offsets, state: LoopState, *,
                own: bool = False) -> None:
        """Commit ``next_offsets`` with a ``state`` note (``own``: outside any turn)."""
        self._consumer.commit(next_offsets, self._note(state))

    def _note(self, state: LoopState) -> str:
        return CommitNote.now(state, self.config.partition_set, self._endpoint(),
                              self._warm()).encode()

    def _past_markers(self, next_offsets: Offsets) -> Offsets:
        """Transaction markers (and, read_committed, aborted records) after a batch's last
        record are never returned, but the consumer's position moves past them. When no
        record was consumed beyond the batch (none is held for the next one) that
        position is safe to commit; it keeps the end of a transactional topic from
        showing a lag that never drains."""
        if self._holding():
            return next_offsets  # read ahead: the position is past unprocessed records
        positions = self._consumer.positions()
        return {tp: max(offset, positions.get(tp) or offset)
                for tp, offset in next_offsets.items()}

    # -- idle and stop --------------------------------------------------------------

    def heartbeat(self) -> None:
        """Idle: re-commit the offsets now and then (moved past any transaction markers
        read since), so the note shows a live loop."""
        if time.monotonic() - self._last_commit >= HEARTBEAT_SECONDS:
            self.commit_past_markers(refresh=True)

    def commit_past_markers(self, *, refresh: bool = False) -> None:
        """Idle (every consumed record is committed): re-commit the offsets moved past
        the transaction markers read since; with ``refresh`` also when none moved, for
        a fresh note."""
        committed = self.offsets.all()
        if not committed:
            return
        offsets = self._past_markers(committed)
        if offsets == committed and not refresh:
            return
        self._last_commit = time.monotonic()
        if self._recommit(offsets, "running"):
            self.offsets.mark_committed(offsets)

    def note_stopped(self) -> None:
        """Re-commit the offsets with a "stopped" note: resets need not wait for it. Not
        past the consumer's position: after a failed turn it is ahead of what was done."""
        committed = self.offsets.all()
        if committed:
            try:
                self._recommit(committed, "stopped")
            except FencedError as exc:  # closing anyway: the newer loop's notes stand
                _log.warning("kasper.note_commit_failed", processor=self.config.name,
                             state="stopped", error=str(exc))

    def _recommit(self, offsets: Offsets, state: LoopState, *,
                  fail: bool = False) -> bool:
        """Commit already-processed ``offsets`` with a fresh note; a failure is logged
        (the next turn's commit reports one that lasts) and returns False, or with
        ``fail`` (and always when fenced) raised."""
        try:
            self._commit(offsets, state, own=True)
        except FencedError:
            raise  # a newer loop took over: nothing more of this one may commit
        except KasperError as exc:
            if fail:
                raise
            _log.warning("kasper.note_commit_failed", processor=self.config.name,
                         state=state, error=str(exc))
            return False
        return True


class TransactionCommitter(OffsetCommitter):
    """Exactly-once: the input offsets go into the turn's transaction, which the commit
    commits with them; a loop on the same partition set is fenced, not refused."""

    def __init__(self, config: Config, consumer: InputPort, producer: ProducerPort,
                 observer: LoopObserver, *, holding: Callable[[], bool],
                 endpoint: Endpoint = _no_endpoint, warm: Warm = _nothing_warm,
                 force: bool = False) -> None:
        super().__init__(config, consumer, observer, holding=holding, endpoint=endpoint,
                         warm=warm, force=force)
        self._producer = producer
        self.transactions = producer
        self._staged: tuple[Offsets, Offsets] | None = None
        """The offsets ``stage`` was handed and those it added to the transaction (moved
        past markers), until the commit of that same turn."""

    def begin(self) -> None:
        """Take over this loop's transactional id: fences an older loop with it and
        aborts its open transaction, so the committed offsets (read with require-stable,
        which waits on an open transaction's offsets) and the changelogs' committed ends
        are final. Only a loop with this id is fenced: the same partition set."""
        super().begin()
        self._producer.init_transactions()

    @property
    def identity(self) -> dict[str, str]:
        """The transactional id, which fences any older loop on this partition set."""
        return {"transactional_id": self.config.transactional_id}

    def _fences(self, other: CommitNote) -> bool:
        return other.partitions == self.config.partition_set

    def take_over(self, keys: list[TopicPartitionKey], previous: str | None) -> list[str]:
        """Fence the loop that ran ``keys`` before their changelogs and offsets are read:
        its transactional id (``<name>@<its partition set>``: the set of ``keys`` alone,
        ``previous`` when given, and the sets their last commit notes name) is taken over
        once, so its open transaction is aborted and, alive, it can commit nothing more.
        Returns the ids fenced."""
        sets = {partition_label(p for _, p in keys), *([previous] if previous else [])}
        for text in self._consumer.notes(keys).values():
            note = CommitNote.decode(text)
            if note is not None and not note.is_mine() and note.partitions and \
                    not note.by_stream:
                sets.add(note.partitions)
        fenced = sorted(transactional_id_of(self.config.name, label) for label in sets
                        if label != self.config.partition_set)
        for transactional_id in fenced:
            self._producer.fence(transactional_id)
        _log.info("kasper.taking_over", processor=self.config.name, fenced=fenced,
                  partitions=sorted({p for _, p in keys}))
        return fenced

    def _recommit(self, offsets: Offsets, state: LoopState, *,
                  fail: bool = False) -> bool:
        try:
            return super()._recommit(offsets, state, fail=fail)
        except FencedError as exc:
            raise self.fenced(exc) from exc

    def stage(self, next_offsets: Offsets) -> None:
        """Add the turn's input offsets (past transaction markers, with a running note)
        to its transaction as soon as its outputs are handed over: the round trips run
        while the loop reads ahead and the acks arrive (``Transactions.add_offsets``),
        and the offsets become visible only when ``commit`` commits the transaction, or
        never."""
        offsets = self._turn_offsets(next_offsets)
        self._staged = None
        self._producer.add_offsets(offsets, self._note("running"),
                                   self._consumer.group_metadata())
        self._staged = (next_offsets, offsets)

    def commit(self, next_offsets: Offsets) -> None:
        """The engine's commit: the turn's transaction, with the input offsets if any
        (added already when this turn's were ``stage``d: the engine hands both calls the
        same mapping; offsets staged by a turn that failed went with its aborted
        transaction and are never taken for another's)."""
        staged, self._staged = self._staged, None
        if staged is None or staged[0] is not next_offsets:
            self._commit_turn(next_offsets)
            return
        self._commit({}, "running")  # the offsets are in the transaction already
        self._committed_turn(staged[1])

    def _commit(self, next_offsets: Offsets, state: LoopState, *,
                own: bool = False) -> None:
        """Commit through the turn's transaction, or with ``own`` one opened for this
        commit alone. A note goes with offsets only: none is built without them."""
        note = self._note(state) if next_offsets else None
        started = time.perf_counter()
        try:
            if own:
                self._producer.begin()
            self._producer.commit(next_offsets, note, self._consumer.group_metadata())
        except BaseException:
            if own and self._producer.abort():
                self._observer.on_transaction("aborted", 0.0)
            raise
        self._observer.on_transaction("committed", time.perf_counter() - started)

    def fenced(self, exc: FencedError) -> FencedError:
        """The fencing error, naming the partitions and the loop that took them over
        (from its start note, committed in its first transaction)."""
        newer = self._newer_notes()
        who = (max(newer, key=lambda n: n.at).describe() if newer
               else "a process that has not committed yet")
        fenced = FencedError(
            f"processor {self.config.name!r} was fenced: another loop took over partitions "
            f"{self.config.partition_set} of {', '.join(self.config.input_topics)} "
            f"(transactional id {self.config.transactional_id!r}); it is {who}. This loop "
            "committed nothing more and stops", code=exc.code)
        fenced.uncommitted = exc.uncommitted
        return fenced

    def _newer_notes(self) -> list[CommitNote]:
        """Notes of other loops on these partitions; the loop that fenced this one
        commits its note right after, so wait a little for it."""
        deadline = time.monotonic() + _FENCED_NOTE_WAIT
        while True:
            try:
                notes = [CommitNote.decode(m) for m in self._consumer.notes().values()]
            except KasperError:
                return []
            newer = [n for n in notes
                     if n is not None and not n.is_mine() and n.at >= self._started_at]
            if newer or time.monotonic() > deadline:
                return newer
            time.sleep(0.2)


def committer_for(config: Config, clients: KafkaClients, observer: LoopObserver, *,
                  holding: Callable[[], bool], endpoint: Endpoint = _no_endpoint,
                  warm: Warm = _nothing_warm, force: bool = False) -> OffsetCommitter:
    """The committer ``config.processing_guarantee`` asks for, on ``clients``; its notes
    announce ``endpoint`` (the loop's query server) and the partitions kept ``warm``."""
    if config.exactly_once:
        return TransactionCommitter(config, clients.consumer, clients.producer, observer,
                                    holding=holding, endpoint=endpoint, warm=warm,
                                    force=force)
    return OffsetCommitter(config, clients.consumer, observer, holding=holding,
                           endpoint=endpoint, warm=warm, force=force)
