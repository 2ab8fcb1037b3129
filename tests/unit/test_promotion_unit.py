"""Promotion of a static standby in its running process, without a broker: the admin
endpoint's request handling (``loop.promotion``), and the handover at a turn boundary of
a ``TopicProcessor`` on ``InMemoryBroker``: refused requests change nothing, a promoted
partition runs from its committed offset, and the previous owner is fenced."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from kasper_py import Config, Message, MessageProcessor, Sender, TopicProcessor
from kasper_py.cli.standby import main as standby_cli
from kasper_py.exceptions import FencedError
from kasper_py.loop import committer
from kasper_py.loop.promotion import PromotionRefusedError, Promotions, promotions_for
from kasper_py.observability.http import HttpServer, Request
from kasper_py.testing import InMemoryBroker

BASE = Config(name="wc", bootstrap_servers="in-memory", input_topics=["in"],
              key_serde="str", value_serde="str", batch_size=10,
              processing_guarantee="exactly_once")


class Upper(MessageProcessor):
    """Sends each value upper-cased to "out"."""

    def process(self, messages: list[Message], sender: Sender) -> None:
        for m in messages:
            sender.send("out", m.value.upper(), m.key)


def post(url: str) -> tuple[int, dict[str, Any]]:
    request = urllib.request.Request(url, data=b"", method="POST")
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def ask_in_thread(promotions: Promotions, partitions: tuple[int, ...]
                  ) -> Callable[[], Any]:
    """Ask from another thread (as the endpoint's do); returns the answer's getter."""
    answers: list[Any] = []
    thread = threading.Thread(target=lambda: answers.append(
        promotions.ask(partitions, None, timeout=10)))
    thread.start()

    def answer() -> Any:
        thread.join(10)
        return answers[0]

    return answer


def serve_when_asked(promotions: Promotions, promote: Callable[..., Any]) -> None:
    deadline = time.monotonic() + 10
    while not promotions.waking(_Never()).due():
        assert time.monotonic() < deadline
        time.sleep(0.001)
    promotions.serve({"promote": promote, "release": promote})


class _Never:
    def due(self) -> bool:
        return False

    def seconds_until_due(self) -> float | None:
        return None


def test_a_request_waits_for_the_loop_and_gets_its_answer() -> None:
    """The loop's ``serve`` answers each waiting request: the promotion's result, a
    refusal with its status, or a failure (500, and raised in the loop)."""
    promotions = Promotions(served=True)
    answer = ask_in_thread(promotions, (0,))
    serve_when_asked(promotions, lambda partitions, previous: {"partitions": list(partitions)})
    assert (answer().status, answer().body) == (200, {"partitions": [0]})

    def refuse(partitions: tuple[int, ...], previous: str | None) -> Any:
        raise PromotionRefusedError(409, "already owns partitions [0]")

    answer = ask_in_thread(promotions, (0,))
    serve_when_asked(promotions, refuse)
    assert answer().status == 409
    assert answer().body["message"] == "already owns partitions [0]"

    def fail(partitions: tuple[int, ...], previous: str | None) -> Any:
        raise OSError("disk full")

    answer = ask_in_thread(promotions, (0,))
    with pytest.raises(OSError, match="disk full"):
        serve_when_asked(promotions, fail)
    assert (answer().status, answer().body["message"]) == (500, "OSError: disk full")


def test_requests_are_refused_by_a_group_member_and_after_close() -> None:
    """Group mode answers 409 at once; a stopped loop 503, waiting requests included;
    a loop with no admin endpoint never wakes for requests."""
    group = promotions_for(Config(name="wc", bootstrap_servers="x:1", input_topics=["in"],
                                  assignment="group", admin_port=0))
    assert group.ask((0,), None).status == 409
    promotions = Promotions(served=True)
    answer = ask_in_thread(promotions, (0,))
    deadline = time.monotonic() + 10
    while not promotions.waking(_Never()).due():
        assert time.monotonic() < deadline
    promotions.close()
    assert answer().status == 503
    assert promotions.ask((0,), None).status == 503
    quiet = promotions_for(BASE)
    schedule = _Never()
    assert quiet.waking(schedule) is schedule


def test_the_endpoint_answers_post_only_and_checks_its_parameters() -> None:
    """``POST /standby/promote?partitions=...``: bad partitions are a 400; GET finds no
    such path; a POST elsewhere is a 405."""
    promotions = Promotions(refusal="not here")
    server = HttpServer("127.0.0.1", 0, name="admin")
    server.mount(promotions.app(), post=True)
    base = f"http://127.0.0.1:{server.port}"
    try:
        assert post(f"{base}/standby/promote?partitions=a")[0] == 400
        assert post(f"{base}/standby/promote?partitions=")[0] == 400
        assert post(f"{base}/standby/promote?partitions=0,1") == (409, {
            "error": "PromotionRefused", "status": 409, "message": "not here"})
        assert post(f"{base}/elsewhere")[0] == 405
        with pytest.raises(urllib.error.HTTPError, match="404"):
            urllib.request.urlopen(f"{base}/standby/promote", timeout=10)
        handler = promotions.app()
        assert handler(Request("POST", "/other")) is None
    finally:
        server.close()


@pytest.fixture
def broker() -> InMemoryBroker:
    return filled_broker()


def filled_broker() -> InMemoryBroker:
    """Topics "in" (a0..a2 in partition 0, b0 in 1) and "out"."""
    broker = InMemoryBroker()
    broker.create_topic("in", partitions=2)
    broker.create_topic("out", partitions=1)
    for i in range(3):
        broker.produce("in", f"a{i}", f"k{i}", partition=0)
    broker.produce("in", "b0", "k", partition=1)
    return broker


@pytest.fixture
def standby(broker: InMemoryBroker) -> Iterator[TopicProcessor]:
    """B: owner of partition 1, with an admin endpoint, running in a thread."""
    config = Config(**{**_fields(BASE), "input_partitions": [1], "admin_port": 0})
    processor = TopicProcessor(config, Upper, clients=broker.clients(config))
    thread = threading.Thread(target=processor.run_loop, daemon=True)
    thread.start()
    wait_until(lambda: broker.committed("wc").get(("in", 1)) == 1)
    yield processor
    processor.close(10)
    thread.join(10)


def _fields(config: Config) -> dict[str, Any]:
    return {name: getattr(config, name) for name in ("name", "bootstrap_servers",
            "input_topics", "key_serde", "value_serde", "batch_size",
            "processing_guarantee")}


def wait_until(condition: Callable[[], bool]) -> None:
    deadline = time.monotonic() + 10
    while not condition():
        assert time.monotonic() < deadline, "waited too long"
        time.sleep(0.005)


def test_a_partition_is_taken_over_between_turns_and_its_owner_fenced(
        broker: InMemoryBroker, standby: TopicProcessor, monkeypatch: pytest.MonkeyPatch
        ) -> None:
    """A ran partition 0 and stays open (a zombie). B refuses partitions it owns or that
    do not exist, committing nothing; promoted, it fences A's transactional id (from A's
    commit notes) and the one of the set the request names, runs 0
    from A's committed offset (each record's output once), and A's next turn is
    refused as fenced."""
    # both loops in this process: A would wait for a note not its own to name B
    monkeypatch.setattr(committer, "_FENCED_NOTE_WAIT", 0.0)
    config_a = Config(**{**_fields(BASE), "input_partitions": [0]})
    owner = TopicProcessor(config_a, Upper, clients=broker.clients(config_a))
    owner.run_loop(until_caught_up=True)
    committed = broker.committed("wc")
    assert committed == {("in", 0): 3, ("in", 1): 1}
    assert standby.admin_address is not None
    url = f"http://127.0.0.1:{standby.admin_address[1]}/standby/promote?partitions="
    assert post(url + "1") == (409, {
        "error": "PromotionRefused", "status": 409,
        "message": "processor 'wc' already owns partitions [1] here (it owns [1])"})
    assert post(url + "0,2")[1]["message"] == (
        "partitions [2] do not exist: the input topics ['in'] have 2")
    assert broker.committed("wc") == committed
    broker.produce("in", "a3", "k3", partition=0)
    status, answer = post(url + "0&previous=0-3")  # the set A's notes name too
    assert status == 200
    assert {k: answer[k] for k in ("partitions", "owned", "fenced", "restored")} == {
        "partitions": [0], "owned": [0, 1], "fenced": ["wc@0", "wc@0-3"], "restored": 0}
    wait_until(lambda: broker.committed("wc").get(("in", 0)) == 4)
    assert sorted(m.value for m in broker.read("out")) == [b"A0", b"A1", b"A2", b"A3", b"B0"]
    assert post(url + "0")[0] == 409
    broker.produce("in", "a4", "k4", partition=0)
    with pytest.raises(FencedError, match="was fenced"):
        owner.run_loop(until_caught_up=True)


def test_the_cli_prints_the_answer_or_says_why_with_its_exit_code(
        capsys: pytest.CaptureFixture[str]) -> None:
    """``kasper standby promote``: 0 and the answer's JSON; 5 and the message when
    refused; 2 for a bad request; 3 when nothing answers."""
    promotions = Promotions(served=True)
    server = HttpServer("127.0.0.1", 0, name="admin")
    server.mount(promotions.app(), post=True)
    endpoint = f"http://127.0.0.1:{server.port}"
    loop = threading.Thread(target=serve_when_asked, args=(promotions, lambda p, _: {
        "partitions": list(p)}))
    try:
        loop.start()
        assert standby_cli(["promote", "--endpoint", endpoint, "--partitions", "2"]) == 0
        loop.join(10)
        assert json.loads(capsys.readouterr().out) == {"partitions": [2]}
        assert standby_cli(["promote", "--endpoint", endpoint, "--partitions", "x"]) == 2
        assert "partitions must be comma-separated numbers" in capsys.readouterr().err
        promotions.close()
        assert standby_cli(["promote", "--endpoint", endpoint, "--partitions", "2"]) == 5
        assert "the loop is stopping" in capsys.readouterr().err
    finally:
        server.close()
    assert standby_cli(["promote", "--endpoint", endpoint, "--partitions", "2"]) == 3
    assert "no process answered" in capsys.readouterr().err
