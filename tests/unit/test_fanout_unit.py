"""Stages with their own partition count (fan-in to one partition, fan-out to more) on
the in-memory broker: which topics are read together, how many partition numbers the
loop runs and which keys each has, exact counts through a repartition of another
count, static partition sets that share the keys out once each, and group members
that run a partition number with only the topics read together."""

from __future__ import annotations

import dataclasses
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kasper_py import (
    Config,
    ConfigError,
    Message,
    MessageProcessor,
    Sender,
    TopicError,
    TopicProcessor,
)
from kasper_py.app import App, describe, plan_for
from kasper_py.app.plan import read_together
from kasper_py.cli.app import render
from kasper_py.dsl import Builder
from kasper_py.kafka.topics import task_count, topic_keys
from kasper_py.stores.base import StoreSpec
from kasper_py.stores.memory import MemoryTable
from kasper_py.testing import InMemoryBroker


class Forward(MessageProcessor):
    """Each record to the repartition "by-key", keyed by its value."""

    def process(self, messages: list[Message], sender: Sender) -> None:
        for message in messages:
            sender.repartition("by-key", "1", key=message.value)


class Count(MessageProcessor):
    """Counts per key in "counts", each new count to "counted"."""

    def process(self, messages: list[Message], sender: Sender) -> None:
        store = self.context.store("counts")
        counts = store.get_many({m.key for m in messages})
        for message in messages:
            counts[message.key] = counts.get(message.key, 0) + 1
            sender.send("counted", str(counts[message.key]), key=message.key)
        store.put_many(counts)


def fan_app(partitions: int, store: StoreSpec | None = None) -> App:
    app = App("fan")
    by_key = app.repartition("by-key", partitions=partitions)
    app.processor("forward", Forward, inputs=["src"], outputs=[by_key])
    app.processor("count", Count, inputs=[by_key], outputs=["counted"],
                  stores=[store or MemoryTable("counts")])
    return app


CONFIG = Config(name="fan", bootstrap_servers="in-memory", input_topics=["src"],
                key_serde="str", value_serde="str", batch_size=5,
                auto_offset_reset="earliest")
KEYS = 7


def fan_broker(sources: int, records: int = 60) -> InMemoryBroker:
    broker = InMemoryBroker()
    broker.create_topic("src", sources)
    broker.create_topic("counted", 2)
    for n in range(records):
        broker.produce("src", f"k{n % KEYS}", key=f"r{n}")
    return broker


def final_counts(broker: InMemoryBroker) -> dict[str, list[int]]:
    found: dict[str, list[int]] = {}
    for message in broker.read("counted"):
        found.setdefault(message.key.decode(), []).append(int(message.value.decode()))
    return found


def expected(records: int = 60) -> dict[str, list[int]]:
    per_key = Counter(f"k{n % KEYS}" for n in range(records))
    return {key: list(range(1, n + 1)) for key, n in per_key.items()}


def run(broker: InMemoryBroker, app: App, config: Config = CONFIG) -> None:
    processor = TopicProcessor(config, app, clients=broker.clients(config))
    processor.run_loop(until_caught_up=True)
    processor.close()


# -- which topics are read together ------------------------------------------------------


def test_topics_one_processor_reads_are_read_together_and_groups_sharing_one_merge() -> None:
    assert read_together([frozenset({"a"}), frozenset({"r"})]) == (("a",), ("r",))
    assert read_together([frozenset({"a", "b"}), frozenset({"c"}), frozenset({"b", "c"}),
                          frozenset({"d"})]) == (("a", "b", "c"), ("d",))


def test_an_apps_plan_reads_its_stages_as_groups() -> None:
    """The plan's config reads the source and the repartition as two groups."""
    plan = plan_for(fan_app(1), CONFIG)
    assert plan.config.input_groups == (("src",), ("fan-by-key-repartition",))
    assert plan.internal[0].partitions == 1
    assert plan_for(Forward, CONFIG).config.input_groups is None  # a lone processor: one


def test_the_loop_runs_the_largest_count_and_each_topic_where_it_has_the_partition() -> None:
    config = dataclasses.replace(CONFIG, input_topics=["a", "b", "r"],
                                 input_groups=[["a", "b"], ["r"]])
    assert task_count(config, {"a": 4, "b": 4, "r": 1}) == 4
    assert task_count(config, {"a": 2, "b": 2, "r": 6}) == 6
    assert topic_keys(config.input_topics, {"a": 2, "b": 2, "r": 6}, [1, 3]) == [
        ("a", 1), ("b", 1), ("r", 1), ("r", 3)]
    with pytest.raises(TopicError, match=r"read together must have the same partition count "
                                         r"to be processed partition-wise; found a=4, b=2"):
        task_count(config, {"a": 4, "b": 2, "r": 1})
    with pytest.raises(TopicError, match="found a=4, b=4, r=1"):  # one group unless told
        task_count(dataclasses.replace(config, input_groups=None), {"a": 4, "b": 4, "r": 1})


def test_input_groups_must_cover_the_input_topics() -> None:
    with pytest.raises(ConfigError, match="'input_groups': must be lists of input topics "
                                          r"covering every one of \['a', 'b'\], or None"):
        Config(name="x", bootstrap_servers="k:9092", input_topics=["a", "b"],
               input_groups=[["a"]])


# -- through the loop ----------------------------------------------------------------------


@pytest.mark.parametrize("sources, partitions", [(4, 1), (2, 6)])
def test_a_repartition_with_its_own_count_counts_exactly(sources: int, partitions: int) -> None:
    """A 4-partition source into a 1-partition repartition, and a 2-partition source into
    6: the repartition is created with its count, every key's counts are exact, and
    every partition of both topics is committed to its end."""
    broker = fan_broker(sources)
    run(broker, fan_app(partitions))
    assert final_counts(broker) == expected()
    topic = "fan-by-key-repartition"
    assert broker._partition_count(topic) == partitions
    committed = broker.committed("fan")
    for name, count in (("src", sources), (topic, partitions)):
        for p in range(count):
            assert committed.get((name, p), 0) == broker.watermarks(name, p)[1]


def test_a_query_finds_a_key_by_its_stages_own_count() -> None:
    """The counts of a one-partition repartition of a 4-partition source are all in
    partition 0: a query routes each key there (the stage's count), not to the
    partition the largest count, 4, would give it."""
    broker = fan_broker(4)
    processor = TopicProcessor(CONFIG, fan_app(1), clients=broker.clients(CONFIG))
    processor.run_loop(until_caught_up=True)
    try:
        assert processor.tables.keys_partitions("counts") == 1
        assert {key: processor.query("counts", key) for key in expected()} == {
            key: counts[-1] for key, counts in expected().items()}
    finally:
        processor.close()


def test_a_repartition_without_a_count_over_sources_that_differ_is_refused() -> None:
    broker = fan_broker(2)
    broker.create_topic("src2", 3)
    app = App("fan")
    by_key = app.repartition("by-key")
    app.processor("forward", Forward, inputs=["src"], outputs=[by_key])
    app.processor("other", Forward, inputs=["src2"], outputs=[by_key])
    app.processor("count", Count, inputs=[by_key], stores=[MemoryTable("counts")])
    config = dataclasses.replace(CONFIG, input_topics=["src", "src2"])
    with pytest.raises(TopicError, match=r"internal topic 'fan-by-key-repartition' has no "
                                         r"partition count of its own and the input topics "
                                         r"differ \(src=2, src2=3\): declare one"):
        run(broker, app, config)


@pytest.mark.parametrize("sources, partitions", [(4, 1), (2, 6)])
def test_static_sets_split_the_partition_numbers_and_count_exactly(sources: int,
                                                                   partitions: int) -> None:
    """Two static sets, 0..n/2 and the rest of the largest count, run one after the
    other until neither has anything left: the counts are exact."""
    broker = fan_broker(sources)
    count = max(sources, partitions)
    halves = [list(range(count // 2)), list(range(count // 2, count))]
    store = broker.store("counts")  # kept in the broker: outlives each run
    for _ in range(3):  # each set feeds the other through the repartition
        for half in halves:
            run(broker, fan_app(partitions, store),
                dataclasses.replace(CONFIG, input_partitions=half))
    assert final_counts(broker) == expected()


@settings(max_examples=60, deadline=None)
@given(counts=st.lists(st.integers(1, 8), min_size=1, max_size=4),
       sets=st.integers(1, 4))
def test_static_sets_hold_every_key_exactly_once(counts: list[int], sets: int) -> None:
    """Whatever the topics' counts, splitting the loop's partition numbers into static
    sets gives every partition of every topic to exactly one set."""
    topics = [f"t{i}" for i in range(len(counts))]
    by_topic = dict(zip(topics, counts, strict=True))
    config = Config(name="x", bootstrap_servers="k:9092", input_topics=topics,
                    input_groups=[[t] for t in topics])
    numbers = list(range(task_count(config, by_topic)))
    held = [k for i in range(sets) for k in topic_keys(topics, by_topic, numbers[i::sets])]
    assert sorted(held) == sorted((t, p) for t, n in by_topic.items() for p in range(n))


# -- the DSL ---------------------------------------------------------------------------------


def dsl_counts(partitions: int, how: str) -> App:
    b = Builder("fan", stores="memory", cache=False)
    stream = b.stream("src")
    if how == "group_by":
        grouped = stream.group_by(lambda k, v: v, name="by-value", partitions=partitions)
    else:
        grouped = (stream.select_key(lambda k, v: v)
                   .repartition(name="by-value", partitions=partitions).group_by_key())
    grouped.count("counts").to_stream().map_values(str).to("counted")
    return b.build()


@pytest.mark.parametrize("how", ["group_by", "repartition"])
@pytest.mark.parametrize("sources, partitions", [(4, 1), (2, 6)])
def test_the_dsl_gives_a_repartition_its_own_count(sources: int, partitions: int,
                                                   how: str) -> None:
    """``group_by(..., partitions=N)`` and ``repartition(partitions=N)``: the repartition
    is created with N partitions and the counts downstream of it are exact."""
    broker = fan_broker(sources)
    app = dsl_counts(partitions, how)
    assert describe(app)["internal_topics"] == ["fan-by-value-repartition"]
    run(broker, app, dataclasses.replace(CONFIG, key_serde="str", value_serde="str"))
    assert broker._partition_count("fan-by-value-repartition") == partitions
    assert final_counts(broker) == expected()


def test_group_by_key_with_a_count_repartitions_even_when_the_keys_are_kept() -> None:
    b = Builder("fan", stores="memory")
    b.stream("src").group_by_key(partitions=1).count("counts").to_stream().to("counted")
    assert describe(b.build())["internal_topics"] == ["fan-counts-by-key-repartition"]


def test_describe_tells_each_repartitions_count_and_who_runs_it() -> None:
    """A static set runs the repartition's partitions among its partition numbers;
    `kasper app describe` prints it."""
    static = dataclasses.replace(CONFIG, input_partitions=[0, 2])
    topology = describe(fan_app(1), static)
    assert topology["partitions"] == {"fan-by-key-repartition": {"count": 1, "runs": [0]}}
    assert render(topology).splitlines()[-1] == (
        "  fan-by-key-repartition: 1 partitions; this process runs: 0")
    grouped = describe(fan_app(6), dataclasses.replace(CONFIG, assignment="group"))
    assert grouped["partitions"] == {"fan-by-key-repartition": {"count": 6, "runs": "group"}}
    assert describe(fan_app(6), dataclasses.replace(CONFIG, input_partitions=[1]))[
        "partitions"]["fan-by-key-repartition"]["runs"] == [1]


def test_describe_names_the_member_holding_each_partition_in_group_mode() -> None:
    """With the group's owners read (`kasper app describe --members`), each partition of
    the repartition is listed with its member, `-` for one the group holds nowhere; the
    source's owners are not the repartition's."""
    grouped = dataclasses.replace(CONFIG, assignment="group")
    topic = "fan-by-key-repartition"
    owners = {(topic, p): f"m{p % 2}@h" for p in range(5)} | {("src", 5): "m9@h"}
    topology = describe(fan_app(6), grouped, owners)
    assert topology["partitions"][topic]["members"] == {
        "0": "m0@h", "1": "m1@h", "2": "m0@h", "3": "m1@h", "4": "m0@h", "5": "-"}
    assert render(topology).splitlines()[-6:] == [
        "    partition 0: m0@h", "    partition 1: m1@h", "    partition 2: m0@h",
        "    partition 3: m1@h", "    partition 4: m0@h", "    partition 5: -"]
    assert "members" not in describe(fan_app(6), CONFIG, owners)["partitions"][topic]
