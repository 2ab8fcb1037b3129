"""Every example in examples/ runs end to end on the stack and produces exactly what
its docstring promises. Each test uses its own topics, group and state folder."""

from __future__ import annotations

import ast
import importlib
import json
import math
import random
import re
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from confluent_kafka import TopicPartition

from kasper_py import Config, TopicProcessor
from kasper_py.kafka.alignment import SLOW_FETCH
from kasper_py.kafka.consumer import InputConsumer
from kasper_py.kafka.ports import KafkaClients
from kasper_py.kafka.producer import OutputProducer
from tests.kafka_clients import Consumer

pytest.register_assert_rewrite("conftest_stores")
from conftest_stores import free_port  # isort: skip  # noqa: E402 - after register_assert_rewrite

pytest_plugins = ["conftest_stores"]
pytestmark = pytest.mark.integration

EXAMPLES = Path(__file__).parents[2] / "examples"


def example(name: str) -> ModuleType:
    if str(EXAMPLES) not in sys.path:
        sys.path.insert(0, str(EXAMPLES))
    return importlib.import_module(name)


def test_demo_joins_every_tweet_with_its_users_followers(
        bootstrap: str, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    port = free_port()
    monkeypatch.setenv("KASPER_BOOTSTRAP_SERVERS", bootstrap)
    demo = example("demo")
    monkeypatch.setattr(demo, "METRICS_PORT", port)
    monkeypatch.setattr(demo, "TWEET_COUNT", 3000)

    assert demo.main() == 0

    out = capsys.readouterr().out
    assert "every tweet has its reach: True (3000/3000)" in out
    assert f"http://127.0.0.1:{port}/metrics" in out
    summary = json.loads(out.split("output summary:", 1)[1].split("\nevery tweet", 1)[0])
    assert summary["reach_messages"] == 3000 and summary["wrong_reach"] == 0
    committed = re.findall(r"tweets\[\d\]=(\d+)", out)
    assert sum(int(o) for o in committed) == 3000  # every tweet's offset is committed


def test_word_count_sends_increments_that_sum_to_the_exact_counts(
        bootstrap: str, new_topic: Callable[..., str], unique_name: Callable[[str], str],
        kafka: Any) -> None:
    lines_topic, counts_topic = new_topic("lines", partitions=2), new_topic("word-counts")
    lines = [f"the {'kafka ' * (n % 3)}batch {n % 5}" for n in range(400)]
    kafka.produce(lines_topic, [line.encode() for line in lines])
    expected = Counter(word for line in lines for word in line.split())

    assert example("word_count").main([
        "--bootstrap", bootstrap, "--name", unique_name("wc"), "--input", lines_topic,
        "--output", counts_topic, "--until-caught-up"]) == 0

    totals: Counter[str] = Counter()
    for message in kafka.read_all(counts_topic):
        totals[message.key().decode()] += int(message.value())
    assert totals == expected
    # every partition holding lines is committed to its end; a partition the producer
    # left empty has nothing to commit (None), or 0 if an idle turn's note committed it
    committed = kafka.committed(unique_name("wc"), lines_topic, 2)
    highs = {p: _high(kafka, lines_topic, p) for p in (0, 1)}
    assert sum(highs.values()) == len(lines)
    assert {p: committed[p] or 0 for p in (0, 1)} == highs
    assert all(committed[p] is not None for p in (0, 1) if highs[p])


def test_rocksdb_wordcount_keeps_exact_totals_and_restores_them(  # noqa: PLR0917 - fixtures
        bootstrap: str, unique_name: Callable[[str], str], kafka: Any, tmp_path: Path,
        capsys: pytest.CaptureFixture[str], delete_changelogs: None) -> None:
    module = example("rocksdb_wordcount")
    lines_topic, totals_topic = unique_name("lines"), unique_name("word-totals")
    rng = random.Random(7)  # the sample's own generator: the expected totals
    expected = Counter(w for _ in range(500) for w in rng.choices(module.VOCABULARY, k=5))
    args = ["--bootstrap", bootstrap, "--name", unique_name("rocks-wc"), "--input", lines_topic,
            "--output", totals_topic, "--state-dir", str(tmp_path / "state"),
            "--partitions", "1", "--until-caught-up"]

    assert module.main([*args, "--sample", "500"]) == 0

    last_total = {m.key().decode(): int(m.value()) for m in kafka.read_all(totals_topic)}
    assert last_total == dict(expected)
    assert_top_words(capsys.readouterr().out, expected)

    # Lose the local folder: the next run restores the totals from the changelog first.
    for path in sorted((tmp_path / "state").rglob("*"), reverse=True):
        path.unlink() if path.is_file() else path.rmdir()
    assert module.main(args) == 0
    assert_top_words(capsys.readouterr().out, expected)


def assert_top_words(out: str, expected: Counter[str]) -> None:
    """The ``top words: [...]`` line lists five true totals, and the five highest ones
    (which words among equal totals is not fixed)."""
    line = next(line for line in out.splitlines() if line.startswith("top words: "))
    printed = ast.literal_eval(line.removeprefix("top words: "))
    assert all(expected[word] == total for word, total in printed), (printed, expected)
    assert [total for _, total in printed] == [total for _, total in expected.most_common(5)]


def test_redis_enrichment_attaches_every_clicks_profile(
        bootstrap: str, unique_name: Callable[[str], str], kafka: Any, redis_url: str) -> None:
    prefix, name = unique_name("enrich") + "-", unique_name("redis-enrichment")

    assert example("redis_enrichment").main([
        "--bootstrap", bootstrap, "--redis-url", redis_url, "--name", name, "--prefix", prefix,
        "--sample", "300", "--until-caught-up"]) == 0

    enriched = [json.loads(m.value()) for m in kafka.read_all(prefix + "enriched-clicks")]
    assert len(enriched) == 300
    wrong = [e for e in enriched if (e["profile"] or {}).get("name") != f"user {e['user'][1:]}"]
    assert wrong == []


@pytest.mark.cassandra
def test_cassandra_aggregation_totals_equal_the_sample(
        bootstrap: str, unique_name: Callable[[str], str], kafka: Any,
        cassandra_contact: tuple[str, int], capsys: pytest.CaptureFixture[str]) -> None:
    host, port = cassandra_contact
    purchases, totals_topic = unique_name("purchases"), unique_name("customer-totals")

    assert example("cassandra_aggregation").main([
        "--bootstrap", bootstrap, "--cassandra", f"{host}:{port}",
        "--name", unique_name("spend").replace("-", "_"), "--input", purchases,
        "--output", totals_topic, "--sample", "300", "--until-caught-up"]) == 0

    out = capsys.readouterr().out
    spent = re.search(r"sample: 300 purchases, ([\d.]+) spent", out)
    stored = re.search(r"in Cassandra: (\d+) purchases, ([\d.]+) spent", out)
    assert spent is not None and stored is not None, out
    assert stored.group(1) == "300"
    assert float(stored.group(2)) == pytest.approx(float(spent.group(1)), abs=0.011)
    last = {m.key().decode(): json.loads(m.value()) for m in kafka.read_all(totals_topic)}
    assert sum(t["count"] for t in last.values()) == 300


def test_pageviews_windowed_sends_each_minutes_final_count_once(  # noqa: PLR0917 - fixtures
        bootstrap: str, unique_name: Callable[[str], str], kafka: Any, tmp_path: Path,
        capsys: pytest.CaptureFixture[str], delete_changelogs: None) -> None:
    """Out-of-order views within the 10 s grace all count; the late views are dropped and
    counted; each closed minute's count is sent once and printed, equal to the sample's."""
    module = example("pageviews_windowed")
    views, counts = unique_name("pageviews"), unique_name("pageviews-per-minute")

    assert module.main(["--bootstrap", bootstrap, "--name", unique_name("pv"), "--input", views,
                        "--output", counts, "--state-dir", str(tmp_path), "--sample", "1500",
                        "--until-caught-up"]) == 0

    out = capsys.readouterr().out
    start = int(re.search(r"sample start: (\d+)", out).group(1))  # type: ignore[union-attr]
    expected = module.expected_counts(module.sample_views(1500, start))
    printed = re.findall(r"^  (\w+) +(\d+) (\d+)$", out, re.MULTILINE)
    assert {(user, int(at)): int(n) for user, at, n in printed} == dict(expected)
    assert len(printed) == len(expected)
    assert f"late views dropped: {module.LATE}" in out
    sent = [json.loads(m.value()) for m in kafka.read_all(counts)]
    assert sorted((s["user"], s["start"], s["views"]) for s in sent) == sorted(
        (user, at, n) for (user, at), n in expected.items())


def test_pageviews_app_sends_each_users_minutes_with_their_profile(  # noqa: PLR0917 - fixtures
        bootstrap: str, unique_name: Callable[[str], str], kafka: Any, tmp_path: Path,
        capsys: pytest.CaptureFixture[str], delete_changelogs: None) -> None:
    """The three-step app: views keyed by session are re-keyed by user through the app's
    repartition topic, counted per minute, and each closed minute is sent once with the
    profile of its user (none for the user without one); broken events are dropped, and
    every input offset, the repartition topic's too, is committed."""
    module = example("pageviews_app")
    prefix, name = unique_name("pva") + "-", unique_name("pva")

    assert module.main(["--bootstrap", bootstrap, "--name", name, "--prefix", prefix,
                        "--state-dir", str(tmp_path), "--sample", "600",
                        "--until-caught-up"]) == 0

    out = capsys.readouterr().out
    start = int(re.search(r"sample start: (\d+)", out).group(1))  # type: ignore[union-attr]
    expected = module.expected_counts(module.sample_views(600, start))
    assert len(expected) == 16 and sum(e["views"] for e in expected) == 600
    sent = [json.loads(m.value()) for m in kafka.read_all(prefix + "views-per-minute")]
    assert sorted(sent, key=lambda s: (s["user"], s["start"])) == expected
    assert {(s["name"], s["plan"]) for s in sent if s["user"] == "jo"} == {(None, None)}
    assert f"events without a user dropped: {module.BROKEN}" in out
    repartition = f"{name}-by-user-repartition"
    for topic in (prefix + "page-views", prefix + "user-profiles", repartition):
        assert kafka.committed(name, topic, 2) == {p: _high(kafka, topic, p) for p in (0, 1)}


def test_stream_table_join_sends_each_order_with_the_profile_of_its_time(
        bootstrap: str, unique_name: Callable[[str], str], kafka: Any, tmp_path: Path,
        delete_changelogs: None) -> None:
    """Every order comes out once with a profile of its customer from the local table,
    never one stamped after the order: at most the level the customer had when the order
    was written (the sample records it in the order); most orders see exactly that one."""
    name = unique_name("stj")
    enriched = _stream_table_join(example("stream_table_join"), bootstrap, name, tmp_path,
                                  kafka, orders=300)
    assert sum(e["customer"]["level"] == e["level"] for e in enriched) > 150


def test_stream_table_join_holds_back_orders_read_a_batch_ahead_of_the_profiles(
        bootstrap: str, unique_name: Callable[[str], str], kafka: Any, tmp_path: Path,
        delete_changelogs: None) -> None:
    """2,000 orders, batches of 500: a partition's orders are read a batch or more ahead
    of its profiles, and held, not released, until the profiles of their time are read
    (the orders' fetch held back meanwhile), so no order meets a later profile; every
    order comes out once and every offset ends committed."""
    name = unique_name("stjb")
    _stream_table_join(example("stream_table_join"), bootstrap, name, tmp_path, kafka,
                       orders=2000)
    _committed_to_the_end(kafka, name)


class FirstFetchLate:
    """The real consumer, with one topic-partition paused (librdkafka fetches nothing of
    it, so its lag is not known) for its first ``late`` seconds: a loaded broker slow to
    answer that partition's first fetch."""

    def __init__(self, consumer: InputConsumer, key: tuple[str, int], late: float) -> None:
        self._consumer, self._key, self._late = consumer, key, late
        self._until: float | None = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._consumer, name)

    def consume(self, max_count: int, timeout: float) -> list[Any]:
        client, now = self._consumer._consumer, time.monotonic()
        if self._until is None:
            self._until = now + self._late
            client.pause([TopicPartition(*self._key)])
        elif self._until < now < self._until + 3600:
            client.resume([TopicPartition(*self._key)])
            self._until = -math.inf
        return self._consumer.consume(max_count, timeout)


def test_stream_table_join_waits_for_a_slow_first_fetch_of_the_orders(  # noqa: PLR0917
        bootstrap: str, unique_name: Callable[[str], str], kafka: Any, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, delete_changelogs: None) -> None:
    """The example run while orders[1]'s first fetch answers only after the slow-fetch
    warning's seconds (its lag not known meanwhile): no profile of partition 1 is
    applied before the orders stamped earlier, so every order still comes out once with
    a profile of its time or before, and every offset ends committed."""
    module, name = example("stream_table_join"), unique_name("stjl")

    def processor(config: Config, factory: Any, **kwargs: Any) -> TopicProcessor:
        consumer = FirstFetchLate(InputConsumer(config), (name + "-orders", 1), SLOW_FETCH + 1)
        clients = KafkaClients(consumer, OutputProducer(config))  # type: ignore[arg-type]
        return TopicProcessor(config, factory, clients=clients, **kwargs)

    monkeypatch.setattr(module, "TopicProcessor", processor)
    _stream_table_join(module, bootstrap, name, tmp_path, kafka, orders=300)
    _committed_to_the_end(kafka, name)


def _stream_table_join(module: ModuleType, bootstrap: str, name: str, tmp_path: Path,
                       kafka: Any, *, orders: int) -> list[dict[str, Any]]:
    """Run the example on a sample of ``orders`` (topics prefixed ``name-``) until caught
    up; check every order came out once, with a profile of its time or before; return
    the enriched orders."""
    assert module.main(["--bootstrap", bootstrap, "--name", name, "--prefix", name + "-",
                        "--state-dir", str(tmp_path), "--sample", str(orders),
                        "--until-caught-up"]) == 0
    enriched = [json.loads(m.value()) for m in kafka.read_all(name + "-enriched-orders")]
    assert sorted(e["order"] for e in enriched) == list(range(orders))
    assert [e for e in enriched if not 1 <= e["customer"]["level"] <= e["level"]] == []
    return enriched


def _committed_to_the_end(kafka: Any, name: str) -> None:
    for topic in (name + "-customers", name + "-orders"):
        assert kafka.committed(name, topic, 2) == {p: _high(kafka, topic, p) for p in range(2)}


def _high(kafka: Any, topic: str, partition: int) -> int:
    consumer = Consumer({"bootstrap.servers": kafka.bootstrap, "group.id": "kasper-tests-high"})
    try:
        return int(consumer.get_watermark_offsets(TopicPartition(topic, partition), 10)[1])
    finally:
        consumer.close()
