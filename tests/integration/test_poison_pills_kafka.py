"""``on_process_error="dead_letter"`` on a real broker: poison messages among many reach
the dead-letter topic alone, the rest is processed and committed past them; a passed
limit stops the loop uncommitted; ``kasper dlq replay`` sends dead letters back."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from kasper_py import (
    Config,
    DeadLetterLimitError,
    Message,
    MessageProcessor,
    ProcessorContext,
    Sender,
    TopicProcessor,
)
from kasper_py.cli import main
from kasper_py.stores.base import StoreSpec
from kasper_py.stores.redis import RedisTable
from kasper_py.stores.rocksdb import RocksDBTable
from tests.kafka_clients import AdminClient, Producer

pytest.register_assert_rewrite("conftest_stores")
from conftest_stores import read_counts  # isort: skip  # noqa: E402 - after register_assert_rewrite

pytest_plugins = ["conftest_stores"]

pytestmark = pytest.mark.integration


class Forward(MessageProcessor):
    """Forwards every value to ``output``; a value starting with b"poison" raises."""

    def __init__(self, context: ProcessorContext, output: str) -> None:
        self.output = output

    def process(self, messages: list[Message], sender: Sender) -> None:
        for message in messages:
            if message.value.startswith(b"poison"):
                raise ValueError(f"cannot forward {message.value.decode()}")
            sender.send(self.output, message.value, key=message.key)


def produce(bootstrap: str, topic: str, count: int, poisoned: set[int]) -> None:
    """``count`` values to partition 0, ``poison-<n>`` at the offsets in ``poisoned``
    (with key and a header), ``v<n>`` elsewhere."""
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20})
    for n in range(count):
        while True:
            try:
                if n in poisoned:
                    producer.produce(topic, b"poison-%d" % n, key=b"key-%d" % n, partition=0,
                                     headers=[("trace", b"t-%d" % n)])
                else:
                    producer.produce(topic, b"v%d" % n, partition=0)
                break
            except BufferError:
                producer.poll(0.1)
    assert producer.flush(60) == 0


def make_config(bootstrap: str, name: str, source: str, dead: str, **kwargs: Any) -> Config:
    values: dict[str, Any] = {"batch_size": 10_000, "batch_wait": 0.3,
                              "on_process_error": "dead_letter", "dead_letter_topic": dead}
    return Config(name=name, bootstrap_servers=bootstrap, input_topics=[source],
                  **{**values, **kwargs})


def run(cfg: Config, output: str) -> None:
    with TopicProcessor(cfg, lambda c: Forward(c, output)) as processor:
        processor.run_loop(until_caught_up=True)


def test_three_poison_messages_among_100k(bootstrap, new_topic, kafka, unique_name) -> None:
    """Exactly the 3 poison messages reach the dead-letter topic, with their key, value,
    header and the kasper.* headers; every other message's output is there once; the
    committed offset is past them all."""
    source, output, dead = new_topic("in"), new_topic("out"), new_topic("dlq")
    name = unique_name("poison-100k")
    poisoned = {17, 50_001, 99_999}
    produce(bootstrap, source, 100_000, poisoned)
    run(make_config(bootstrap, name, source, dead), output)
    letters = sorted(kafka.read_all(dead), key=lambda m: m.offset())
    assert [(m.key(), m.value()) for m in letters] == [
        (b"key-%d" % n, b"poison-%d" % n) for n in sorted(poisoned)]
    for letter, n in zip(letters, sorted(poisoned), strict=True):
        headers = dict(letter.headers())
        assert letter.headers()[0] == ("trace", b"t-%d" % n)
        assert headers["kasper.error"] == b"cannot forward poison-%d" % n
        assert headers["kasper.error.type"] == b"ValueError"
        assert headers["kasper.processor"] == name.encode()
        assert (headers["kasper.source.topic"], headers["kasper.source.partition"],
                headers["kasper.source.offset"]) == (source.encode(), b"0", b"%d" % n)
        assert int(headers["kasper.source.timestamp"]) > 0
    outputs = [m.value() for m in kafka.read_all(output)]
    assert len(outputs) == 100_000 - 3
    assert set(outputs) == {b"v%d" % n for n in range(100_000) if n not in poisoned}
    assert kafka.committed(name, source) == {0: 100_000}


def test_a_passed_limit_stops_uncommitted(bootstrap, new_topic, kafka, unique_name) -> None:
    """3 poison messages in one turn against dead_letter_max_per_turn=2: the loop stops
    with DeadLetterLimitError, nothing is committed, no output or dead letter is there."""
    source, output, dead = new_topic("in"), new_topic("out"), new_topic("dlq")
    name = unique_name("poison-limit")
    produce(bootstrap, source, 50, {3, 20, 40})
    with pytest.raises(DeadLetterLimitError, match=r"over dead_letter_max_per_turn=2"):
        run(make_config(bootstrap, name, source, dead, dead_letter_max_per_turn=2), output)
    assert kafka.committed(name, source) == {0: None}
    assert kafka.read_all(output) == [] and kafka.read_all(dead) == []


def test_dlq_replay_sends_dead_letters_back_once(bootstrap, new_topic, kafka, unique_name,  # noqa: PLR0917 - pytest fixtures
                                                 monkeypatch, capsys) -> None:
    """``kasper dlq replay`` appends each dead letter's key, value and own headers (no
    kasper.* header) to its source topic and partition; a dry run sends nothing, and a
    second replay resumes past what the first sent (nothing new to send). A ``--to``
    topic that does not exist refuses the replay (exit 3) and is not created."""
    source, output, dead = new_topic("in"), new_topic("out"), new_topic("dlq")
    name = unique_name("poison-replay")
    produce(bootstrap, source, 6, {1, 4})
    run(make_config(bootstrap, name, source, dead), output)
    monkeypatch.setenv("KASPER_ON_PROCESS_ERROR", "dead_letter")
    monkeypatch.setenv("KASPER_DEAD_LETTER_TOPIC", dead)
    argv = ["dlq", "replay", "--name", name, "--bootstrap-servers", bootstrap,
            "--input-topics", source, "--log-level", "WARNING"]
    missing = unique_name("no-such-target")
    assert main([*argv, "--to", missing]) == 3
    assert f"--to topic {missing!r}: does not exist" in capsys.readouterr().err
    assert missing not in AdminClient({"bootstrap.servers": bootstrap}).list_topics(
        timeout=30).topics
    assert main([*argv, "--dry-run", "--error-type", "ValueError"]) == 0
    assert "would send 2 to " + source in capsys.readouterr().out
    assert len(kafka.read_all(source)) == 6
    assert main(argv) == 0
    assert f"sent 2 to {source}" in capsys.readouterr().out
    replayed = sorted(kafka.read_all(source), key=lambda m: m.offset())[6:]
    assert [(m.partition(), m.key(), m.value(), m.headers()) for m in replayed] == [
        (0, b"key-1", b"poison-1", [("trace", b"t-1")]),
        (0, b"key-4", b"poison-4", [("trace", b"t-4")])]
    assert main(argv) == 0
    assert f"{dead}: sent 0, 0 left out by the filters" in capsys.readouterr().out
    assert len(kafka.read_all(source)) == 8


class CountForward(MessageProcessor):
    """Counts values per last digit in the "counts" store and forwards each value; a
    poison value raises after the batch's earlier messages were counted and sent, so the
    failed attempt's store writes and output must be undone."""

    def __init__(self, context: ProcessorContext, output: str) -> None:
        self.counts = context.store("counts")
        self.output = output

    def process(self, messages: list[Message], sender: Sender) -> None:
        totals = self.counts.get_many({m.value[-1:].decode() for m in messages})
        for message in messages:
            if message.value.startswith(b"poison"):
                self.counts.put_many(totals)  # a half-done batch, to be rolled back
                raise ValueError(f"cannot count {message.value.decode()}")
            digit = message.value[-1:].decode()
            totals[digit] = totals.get(digit, 0) + 1
            sender.send(self.output, message.value)
        self.counts.put_many(totals)


@pytest.mark.parametrize("kind", ["rocksdb-exactly-once", "redis-at-least-once"])
def test_poison_messages_with_a_store_count_once(bootstrap, new_topic, kafka, unique_name,  # noqa: PLR0917 - pytest fixtures
                                                 tmp_path, redis_url, kind) -> None:
    """Poison at the first offset, mid-run and at the last offset, with a store the
    processor writes before it raises: the store's counts and the outputs hold every
    other message once (the failed attempts' writes and output rolled back), exactly
    the poison messages are dead letters, and the committed offset is past them."""
    source, output, dead = new_topic("in"), new_topic("out"), new_topic("dlq")
    name = unique_name("poison-store")
    count, poisoned = 20_000, {0, 7_777, 19_999}
    produce(bootstrap, source, count, poisoned)
    if kind.startswith("rocksdb"):
        table: StoreSpec = RocksDBTable("counts", value_serde="json")
        extra: dict[str, Any] = {"processing_guarantee": "exactly_once",
                                 "state_dir": str(tmp_path)}
    else:
        table = RedisTable("counts", url=redis_url, prefix=name)
        extra = {}
    config = make_config(bootstrap, name, source, dead, batch_size=5_000, **extra)
    try:
        with TopicProcessor(config, lambda c: CountForward(c, output),
                            stores=[table]) as processor:
            processor.run_loop(until_caught_up=True)
        kept = [n for n in range(count) if n not in poisoned]
        expected = Counter(str(n % 10) for n in kept)
        assert read_counts(table, config, 1, list(expected)) == expected
        assert sorted(m.value() for m in kafka.read_all(output)) == sorted(
            b"v%d" % n for n in kept)
        assert sorted(m.value() for m in kafka.read_all(dead)) == sorted(
            b"poison-%d" % n for n in poisoned)
        assert kafka.committed(name, source) == {0: count}
    finally:
        table.close()
