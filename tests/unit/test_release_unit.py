"""Releasing promoted partitions, without a broker: the way back after a promotion. The
admin endpoint routes ``POST /standby/release`` to the loop, ``kasper standby release``
asks it, and on ``InMemoryBroker`` a release at a turn boundary commits the partitions'
offsets with a "released" note, stops processing them, lets their owner start again,
and refusals change nothing."""

from __future__ import annotations

import dataclasses
import json
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from kasper_py import Config, TopicProcessor
from kasper_py.cli.standby import main as standby_cli
from kasper_py.exceptions import CommitError
from kasper_py.kafka.batching import Batch, OffsetRange
from kasper_py.kafka.offsets import CommitNote
from kasper_py.loop.promotion import Promotions
from kasper_py.message import Message
from kasper_py.observability.http import HttpServer
from kasper_py.testing import InMemoryBroker
from tests.unit.test_loop_assignment import CONFIG, GROUP, broker_with, parts
from tests.unit.test_promotion_unit import (
    BASE,
    Upper,
    _fields,
    _Never,
    filled_broker,
    post,
    wait_until,
)


def test_the_endpoint_and_the_cli_ask_the_loop_to_release(
        capsys: pytest.CaptureFixture[str]) -> None:
    """``POST /standby/release`` reaches the loop's release handover (not the promotion's);
    ``kasper standby release`` prints its answer (0), or says why with exit code 5."""
    promotions = Promotions(served=True)
    server = HttpServer("127.0.0.1", 0, name="admin")
    server.mount(promotions.app(), post=True)
    endpoint = f"http://127.0.0.1:{server.port}"
    asked: list[tuple[str, tuple[int, ...]]] = []

    def serve() -> None:
        wait_until(lambda: promotions.waking(_Never()).due())
        promotions.serve({
            "promote": lambda p, _: asked.append(("promote", p)) or {},
            "release": lambda p, _: asked.append(("release", p)) or {"partitions": list(p)}})

    loop = threading.Thread(target=serve)
    try:
        loop.start()
        assert standby_cli(["release", "--endpoint", endpoint, "--partitions", "0,2"]) == 0
        loop.join(10)
        assert asked == [("release", (0, 2))]
        assert json.loads(capsys.readouterr().out) == {"partitions": [0, 2]}
        assert post(f"{endpoint}/standby/release?partitions=x")[0] == 400
        promotions.close()
        assert standby_cli(["release", "--endpoint", endpoint, "--partitions", "0"]) == 5
        assert "the loop is stopping" in capsys.readouterr().err
    finally:
        server.close()


def test_a_batch_without_released_partitions_keeps_the_others_whole() -> None:
    """The batch in hand at a release loses the released partitions' records and ranges
    (their next owner reads them), and keeps the others'; none released: the same."""
    messages = {p: [Message("in", p, 5, b"k", b"v", 0)] for p in (0, 1)}
    ranges = {("in", p): OffsetRange(5, 5) for p in (0, 1)}
    batch = Batch(messages, ranges)
    assert batch.without(set()) is batch
    kept = batch.without({0})
    assert (list(kept.by_partition), list(kept.ranges)) == ([1], [("in", 1)])
    assert kept.next_offsets() == {("in", 1): 6}


def test_a_release_drops_the_partition_from_the_batch_in_hand_and_closes_it() -> None:
    """Served between two turns, a release of partition 0: its offset re-committed with
    a "released" note, its processor closed, unassigned, and the batch read for the next
    turn handed back without its records (never processed nor committed here);
    partition 1 stays assigned and in the batch."""
    broker, promotions = broker_with(), Promotions(served=True)
    run = parts(broker, dataclasses.replace(CONFIG, input_partitions=[0, 1]),
                promotions=promotions)
    run.assignment.start(2)
    run.committer.offsets.mark_committed({("in", 0): 2, ("in", 1): 3})
    batch = Batch({p: [Message("in", p, 2, None, b"x")] for p in (0, 1)},
                  {("in", p): OffsetRange(2, 2) for p in (0, 1)})
    answers: list[Any] = []
    asking = threading.Thread(target=lambda: answers.append(promotions.ask((0,), None, 10,
                                                                           action="release")))
    asking.start()
    wait_until(lambda: promotions.waking(_Never()).due())
    kept = run.assignment.after_consume(batch)
    asking.join(10)
    assert (answers[0].status, answers[0].body["committed"]) == (200, {"in[0]": 2})
    assert (list(kept.ranges), list(kept.by_partition)) == ([("in", 1)], [1])
    assert (run.clients.consumer.assigned, run.built.closed) == ([("in", 1)], [0])
    last = broker.commits(GROUP)[-1]
    note = CommitNote.decode(last.metadata)
    assert (last.partition, last.offset, note and note.state) == (0, 2, "released")
    assert run.committer.offsets.all() == {("in", 1): 3}


@pytest.fixture
def broker() -> InMemoryBroker:
    return filled_broker()


@pytest.fixture(params=["exactly_once", "at_least_once"])
def base(request: pytest.FixtureRequest) -> dict[str, Any]:
    """The loops' fields, under each processing guarantee."""
    return {**_fields(BASE), "processing_guarantee": request.param}


@pytest.fixture
def promoting(broker: InMemoryBroker, base: dict[str, Any]
              ) -> Iterator[tuple[TopicProcessor, str, list[BaseException]]]:
    """A ran partition 0 and stopped; B, owner of partition 1 with an admin endpoint,
    runs in a thread. Yields B, its endpoint's URL up to ``/standby/`` and what its
    ``run_loop`` raised."""
    config_a = Config(**{**base, "input_partitions": [0]})
    TopicProcessor(config_a, Upper, clients=broker.clients(config_a)).run_loop(
        until_caught_up=True)
    config = Config(**{**base, "input_partitions": [1], "admin_port": 0})
    processor = TopicProcessor(config, Upper, clients=broker.clients(config))
    errors: list[BaseException] = []

    def run() -> None:
        try:
            processor.run_loop()
        except Exception as exc:  # handed to the test
            errors.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    wait_until(lambda: broker.committed("wc").get(("in", 1)) == 1)
    assert processor.admin_address is not None
    yield processor, f"http://127.0.0.1:{processor.admin_address[1]}/standby/", errors
    processor.close(10)
    thread.join(10)


def outputs(broker: InMemoryBroker) -> list[bytes]:
    return sorted(m.value for m in broker.read("out"))


def test_refused_releases_change_nothing(
        broker: InMemoryBroker, promoting: tuple[TopicProcessor, str, list[Any]]) -> None:
    """B refuses to release a partition it does not own (409), one that does not exist
    (404) and its last partitions (409, a static loop runs one at least); nothing is
    committed and it goes on processing its own."""
    _, url, errors = promoting
    committed = broker.committed("wc")
    assert post(url + "release?partitions=0")[1]["message"] == (
        "processor 'wc' does not own partitions [0] here (it owns [1])")
    assert post(url + "release?partitions=2") == (404, {
        "error": "PromotionRefused", "status": 404,
        "message": "partitions [2] do not exist: the input topics ['in'] have 2"})
    status, answer = post(url + "release?partitions=1")
    assert (status, answer["message"]) == (409, (
        "processor 'wc' would own no partition: it owns only [1], and a static loop "
        "runs one at least; stop it instead"))
    assert broker.committed("wc") == committed
    broker.produce("in", "b1", "k", partition=1)
    wait_until(lambda: broker.committed("wc").get(("in", 1)) == 2)
    assert outputs(broker) == [b"A0", b"A1", b"A2", b"B0", b"B1"]
    assert errors == []


def test_a_released_partition_is_committed_left_alone_and_its_owner_starts(
        broker: InMemoryBroker, promoting: tuple[TopicProcessor, str, list[Any]],
        base: dict[str, Any]) -> None:
    """Promoted, B runs partition 0; released, its offset is committed (exactly-once: in
    a transaction) with a "released" note, B processes no more of it (its next records wait), and A,
    started again on 0 at once, is not refused: it runs them from B's committed offset,
    each output once. B can take 0 over again afterwards."""
    _, url, errors = promoting
    broker.produce("in", "a3", "k3", partition=0)
    assert post(url + "promote?partitions=0")[0] == 200
    wait_until(lambda: broker.committed("wc").get(("in", 0)) == 4)
    status, answer = post(url + "release?partitions=0")
    assert status == 200
    assert {k: answer[k] for k in ("partitions", "owned", "committed")} == {
        "partitions": [0], "owned": [1], "committed": {"in[0]": 4}}
    note = CommitNote.decode(broker.commits("wc")[-1].metadata)
    assert note is not None and (note.state, note.partitions) == ("released", "1")
    broker.produce("in", "a4", "k4", partition=0)
    broker.produce("in", "b1", "k", partition=1)
    wait_until(lambda: broker.committed("wc").get(("in", 1)) == 2)
    assert broker.committed("wc")[("in", 0)] == 4
    assert outputs(broker) == [b"A0", b"A1", b"A2", b"A3", b"B0", b"B1"]
    config_a = Config(**{**base, "input_partitions": [0]})
    TopicProcessor(config_a, Upper, clients=broker.clients(config_a)).run_loop(
        until_caught_up=True)
    assert broker.committed("wc") == {("in", 0): 5, ("in", 1): 2}
    assert outputs(broker) == [b"A0", b"A1", b"A2", b"A3", b"A4", b"B0", b"B1"]
    broker.produce("in", "a5", "k5", partition=0)
    assert post(url + "promote?partitions=0")[0] == 200
    wait_until(lambda: broker.committed("wc").get(("in", 0)) == 6)
    assert outputs(broker)[:6] == [b"A0", b"A1", b"A2", b"A3", b"A4", b"A5"]
    assert errors == []


def test_a_release_whose_commit_fails_stops_the_loop_uncommitted(
        broker: InMemoryBroker, promoting: tuple[TopicProcessor, str, list[Any]],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """When the release's commit fails, the request is answered 500 and the loop stops
    (as a failed turn does), raising the error: the partition's offset stays where the
    last turn put it."""
    processor, url, errors = promoting
    assert post(url + "promote?partitions=0")[0] == 200
    wait_until(lambda: broker.committed("wc").get(("in", 0)) == 3)
    committer = processor._committer  # the fault goes where the commit is

    def fail(offsets: Any, state: Any, *, own: bool = False) -> None:
        raise CommitError("broker gone")

    monkeypatch.setattr(committer, "_commit", fail)
    status, answer = post(url + "release?partitions=0")
    assert (status, answer["message"]) == (500, "CommitError: broker gone")
    wait_until(lambda: bool(errors))
    assert [type(e) for e in errors] == [CommitError]
    assert broker.committed("wc") == {("in", 0): 3, ("in", 1): 1}
