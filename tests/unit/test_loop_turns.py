"""How the loop runs its turns (``kasper_py.loop.turns``): once at-least-once; under
exactly-once again after a transient abort, on rebuilt processors, five times at most,
with a fencing error named by the committer. No server, no sleeping."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from kasper_py import CommitError, Config, ProduceError
from kasper_py.exceptions import FencedError
from kasper_py.loop import committer as committer_module
from kasper_py.loop import turns as turns_module
from kasper_py.loop.committer import committer_for
from kasper_py.loop.turns import RetriedTurns, Turns, turns_for
from kasper_py.observability.observe import NoopObserver
from kasper_py.observability.tracing import NOOP_TRACING
from kasper_py.testing import InMemoryBroker

CONFIG = Config(name="turns", bootstrap_servers="in-memory", input_topics=["in"])
EOS = dataclasses.replace(CONFIG, processing_guarantee="exactly_once")


class Transactions(NoopObserver):
    """Keeps how each transaction ended."""

    def __init__(self) -> None:
        self.ended: list[str] = []

    def on_transaction(self, result: str, seconds: float) -> None:
        self.ended.append(result)


class FakeEngine:
    """Fails its first runs with ``errors``, aborting a transaction each time; keeps what
    each run was handed."""

    def __init__(self, errors: list[Exception]) -> None:
        self.errors, self.runs, self.rebuilt, self.aborted = list(errors), 0, 0, 0
        self.result = object()
        self.handed: list[tuple[Any, Any]] = []

    def run(self, batch: Any, meanwhile: Any) -> object:
        self.runs += 1
        self.handed.append((batch, meanwhile))
        if self.errors:
            self.aborted += 1
            raise self.errors.pop(0)
        return self.result

    def rebuild_processors(self) -> None:
        self.rebuilt += 1


def turns(engine: FakeEngine, config: Config = CONFIG, observer: NoopObserver | None = None,
          meanwhile: Any = None) -> Turns:
    broker = InMemoryBroker()
    broker.create_topic("in")
    observer = observer or NoopObserver()
    committer = committer_for(config, broker.clients(config), observer, holding=lambda: False)
    return turns_for(config, engine, committer, observer,  # type: ignore[arg-type]
                     tracing=NOOP_TRACING, meanwhile=meanwhile)


@pytest.fixture(autouse=True)
def no_pause(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(turns_module, "_RETRY_PAUSE", 0.0)


def test_the_mode_is_chosen_from_the_committer() -> None:
    assert type(turns(FakeEngine([]))) is Turns
    assert type(turns(FakeEngine([]), EOS)) is RetriedTurns


def test_a_turn_is_handed_the_batch_and_what_to_do_meanwhile() -> None:
    def read_ahead() -> None:
        pass

    engine = FakeEngine([])
    assert turns(engine, meanwhile=read_ahead).run("batch") is engine.result  # type: ignore[arg-type]
    assert engine.handed == [("batch", read_ahead)]


def test_a_turn_runs_once_whatever_it_raises() -> None:
    """At-least-once never runs a turn again, even for an error Kafka calls transient."""
    engine = FakeEngine([CommitError("transient", retriable=True)])
    with pytest.raises(CommitError):
        turns(engine).run("batch")  # type: ignore[arg-type]
    assert engine.runs == 1 and engine.rebuilt == 0


def test_exactly_once_runs_a_transiently_aborted_turn_again() -> None:
    """Each transient abort is counted and the turn runs again on rebuilt processors."""
    seen = Transactions()
    engine = FakeEngine([CommitError("t1", retriable=True), CommitError("t2", retriable=True)])

    assert turns(engine, EOS, seen).run("batch") is engine.result  # type: ignore[arg-type]
    assert (engine.runs, engine.rebuilt, seen.ended) == (3, 2, ["aborted", "aborted"])


def test_exactly_once_gives_up_after_five_retries_or_a_lasting_error() -> None:
    engine = FakeEngine([CommitError("t", retriable=True) for _ in range(6)])
    with pytest.raises(CommitError):
        turns(engine, EOS).run("batch")  # type: ignore[arg-type]
    assert (engine.runs, engine.rebuilt) == (6, 5)

    engine = FakeEngine([ProduceError("lasting")])
    with pytest.raises(ProduceError):
        turns(engine, EOS).run("batch")  # type: ignore[arg-type]
    assert engine.runs == 1


def test_a_fenced_turn_is_not_run_again_and_names_the_partitions(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A fencing error stops the loop at once, reworded by the committer, keeping the
    batch it leaves uncommitted."""
    monkeypatch.setattr(committer_module, "_FENCED_NOTE_WAIT", 0.0)
    fenced = FencedError("producer fenced")
    fenced.uncommitted = "in[0] 0..3"
    engine = FakeEngine([fenced])
    with pytest.raises(FencedError, match="was fenced: another loop took over partitions "
                                          "all of in") as info:
        turns(engine, EOS).run("batch")  # type: ignore[arg-type]
    assert (engine.runs, engine.rebuilt) == (1, 0)
    assert info.value.uncommitted == "in[0] 0..3"
