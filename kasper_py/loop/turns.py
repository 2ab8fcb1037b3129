"""How the loop runs a turn of its engine, chosen once at start: ``Turns`` runs each
turn once, and whatever it raises stops the loop (at-least-once: the batch is replayed
on restart); ``RetriedTurns`` (exactly-once) runs a turn aborted for an error Kafka
calls transient again, on rebuilt processors, and names the loop that fenced this one.
Either traces the turn, retries included, and after each committed turn purges an
app's repartitions up to what was committed (``kafka/purge.py``). Committing is the
committer's (``committer.py``), called by the engine in step 5; reporting (step 6) the
loop's.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import structlog

from kasper_py.config import Config, OutputTopic
from kasper_py.exceptions import FencedError, KasperError
from kasper_py.kafka.batching import Batch
from kasper_py.kafka.purge import RepartitionPurge, purge_for
from kasper_py.loop.committer import OffsetCommitter, TransactionCommitter
from kasper_py.observability.observe import LoopObserver
from kasper_py.observability.tracing import Tracing
from kasper_py.turn import TurnEngine, TurnResult

__all__ = ["RetriedTurns", "Turns", "turns_for"]

_log = structlog.get_logger("kasper_py")
_TURN_RETRIES = 5
"""Exactly-once: aborted turns in a row, for errors Kafka calls transient, run again
before the loop stops."""
_RETRY_PAUSE = 0.5
"""Seconds to wait before the first retry; the n-th waits n times as long."""


Meanwhile = Callable[[], object] | None
"""What the loop does while a turn's acks are outstanding (reads the next batch)."""


class Turns:
    """Runs each turn of ``engine`` once, traced by ``tracing``, with ``meanwhile``;
    once it is committed, ``purge`` is handed the offsets ``committer`` committed."""

    def __init__(self, engine: TurnEngine, tracing: Tracing, meanwhile: Meanwhile, *,
                 committer: OffsetCommitter, purge: RepartitionPurge) -> None:
        self._engine, self._tracing, self._meanwhile = engine, tracing, meanwhile
        self._committer, self._purge = committer, purge

    def run(self, batch: Batch) -> TurnResult:
        """One turn over ``batch``, committed by the engine's commit (step 5)."""
        with self._tracing.turn(batch):
            result = self._attempts(batch)
        if self._purge.due():
            self._purge.after_commit(self._committer.offsets.all())
        return result

    def _attempts(self, batch: Batch) -> TurnResult:
        return self._engine.run(batch, self._meanwhile)


class RetriedTurns(Turns):
    """Exactly-once: a turn aborted for a transient error runs again, up to
    ``_TURN_RETRIES`` times in a row; every abort is reported to ``observer``, and a
    fencing error is named by ``fenced`` (the committer's, which reads the notes)."""

    def __init__(self, config: Config, engine: TurnEngine, tracing: Tracing,
                 meanwhile: Meanwhile, *, committer: TransactionCommitter,
                 purge: RepartitionPurge, observer: LoopObserver) -> None:
        super().__init__(engine, tracing, meanwhile, committer=committer, purge=purge)
        self.config = config
        self._observer, self._fenced = observer, committer.fenced

    def _attempts(self, batch: Batch) -> TurnResult:
        attempt = 0
        while True:
            aborted = self._engine.aborted
            try:
                return self._engine.run(batch, self._meanwhile)
            except KasperError as exc:
                for _ in range(self._engine.aborted - aborted):
                    self._observer.on_transaction("aborted", 0.0)
                if isinstance(exc, FencedError):
                    raise self._fenced(exc) from exc
                attempt += 1
                if not exc.retriable or attempt > _TURN_RETRIES:
                    raise
                self._retry(exc, attempt)

    def _retry(self, exc: KasperError, attempt: int) -> None:
        """After a transient abort nothing of the turn is visible and its store writes
        are dropped; rebuild the processors (plain Python state as after a restart) and
        run the same batch again, read from the committed offsets."""
        _log.warning("kasper.turn_retried", processor=self.config.name, attempt=attempt,
                     of=_TURN_RETRIES, error=str(exc))
        time.sleep(_RETRY_PAUSE * attempt)
        self._engine.rebuild_processors()


def turns_for(config: Config, engine: TurnEngine, committer: OffsetCommitter,
              observer: LoopObserver, *, tracing: Tracing, meanwhile: Meanwhile,
              repartitions: Sequence[OutputTopic] = ()) -> Turns:
    """The turns ``committer``'s mode asks for: retried under exactly-once; purging
    ``repartitions`` (an app's, on a real broker) after each."""
    purge = purge_for(config, repartitions)
    if isinstance(committer, TransactionCommitter):
        return RetriedTurns(config, engine, tracing, meanwhile, committer=committer,
                            purge=purge, observer=observer)
    return Turns(engine, tracing, meanwhile, committer=committer, purge=purge)
