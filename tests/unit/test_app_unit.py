"""Applications (``kasper_py.app``): declarations and their errors, the turn order of
processors, repartitions and channels through the testing driver and the real loop on
the in-memory broker, and crashes at every step boundary of a turn that carries
messages through a channel."""

from __future__ import annotations

import collections
import dataclasses
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from kasper_py import (
    Config,
    ConfigError,
    ConsumeError,
    KasperError,
    Message,
    MessageProcessor,
    ProcessingError,
    Sender,
    TopicError,
    TopicProcessor,
)
from kasper_py.app import App, RunTarget, describe, plan_for
from kasper_py.exceptions import SimulatedCrash
from kasper_py.kafka.partitioner import murmur2_partition
from kasper_py.observability.metrics import PrometheusObserver
from kasper_py.stores.memory import MemoryTable
from kasper_py.testing import InMemoryBroker, ProcessorDriver, make_message
from kasper_py.testing.faults import CRASH_STEPS


class Split(MessageProcessor):
    """Lines keyed by document: each word to the repartition "by-word"."""

    def process(self, messages: list[Message], sender: Sender) -> None:
        for message in messages:
            for word in message.value.split():
                sender.repartition("by-word", "1", key=word)


class CountWords(MessageProcessor):
    """Counts per word in "counts", sending each new count to "word-counts"."""

    def process(self, messages: list[Message], sender: Sender) -> None:
        store = self.context.store("counts")
        counts = store.get_many({m.key for m in messages})
        for message in messages:
            counts[message.key] = counts.get(message.key, 0) + 1
            sender.send("word-counts", str(counts[message.key]), key=message.key)
        store.put_many(counts)


def word_count_app(name: str = "words") -> App:
    app = App(name)
    by_word = app.repartition("by-word")
    app.processor("split", Split, inputs=["lines"], outputs=[by_word])
    app.processor("count", CountWords, inputs=[by_word], outputs=["word-counts"],
                  stores=[MemoryTable("counts")])
    return app


def final_counts(pairs: list[tuple[Any, Any]]) -> dict[str, int]:
    last: dict[str, int] = {}
    for key, value in pairs:
        last[key] = int(value)
    return last


# -- declarations ---------------------------------------------------------------------


def test_declaration_errors_name_what_is_wrong() -> None:
    """Each mistake in declaring an app is a ConfigError naming the part at fault."""
    app = App("a")
    r = app.repartition("r")
    with pytest.raises(ConfigError, match="'r': the name is taken by a repartition"):
        app.channel("r")
    with pytest.raises(ConfigError, match="processor 'p' reads nothing"):
        app.processor("p", Split, inputs=[])
    with pytest.raises(ConfigError, match="'bad topic' is not a topic name"):
        app.processor("p", Split, inputs=["bad topic"])
    other = App("b").repartition("r")
    with pytest.raises(ConfigError, match="not a topic name, nor a repartition or channel "
                                          "declared on app 'a'"):
        app.processor("p", Split, inputs=[other])
    app.processor("p", Split, inputs=["in"], outputs=[r], stores=[MemoryTable("s")])
    with pytest.raises(ConfigError, match=r"store names \['s'\] are taken"):
        app.processor("q", CountWords, inputs=[r], stores=[MemoryTable("s")])
    with pytest.raises(ConfigError, match="repartition 'r' of app 'a': no processor reads it"):
        app.ordered()
    with pytest.raises(ConfigError, match="app 'empty' has no processor"):
        App("empty").ordered()
    with pytest.raises(ConfigError, match="an app name must match"):
        App("no spaces")


def test_channel_cycles_and_unused_channels_are_refused() -> None:
    """A cycle of channels has no turn order; a channel nobody writes or reads is a
    mistake; both refused before anything runs."""
    app = App("cyclic")
    a, b = app.channel("a"), app.channel("b")
    app.processor("x", Split, inputs=["in", a], outputs=[b])
    app.processor("y", Split, inputs=[b], outputs=[a])
    with pytest.raises(ConfigError, match=r"processors \['x', 'y'\] form a cycle of channels"):
        app.ordered()
    lonely = App("lonely")
    unread = lonely.channel("c")
    lonely.processor("x", Split, inputs=["in"], outputs=[unread])
    with pytest.raises(ConfigError, match="channel 'c' of app 'lonely': no processor reads"):
        lonely.ordered()
    own = App("own")
    c = own.channel("c")
    own.processor("x", Split, inputs=["in", c], outputs=[c])
    with pytest.raises(ConfigError, match="processor 'x' reads a channel it writes"):
        own.ordered()


def test_turn_order_puts_every_channel_writer_before_its_readers() -> None:
    """Declared readers first still run after their writers; the rest keep their
    declaration order."""
    app = App("order")
    c1, c2 = app.channel("c1"), app.channel("c2")
    app.processor("last", Split, inputs=[c2])
    app.processor("middle", Split, inputs=[c1], outputs=[c2])
    app.processor("first", Split, inputs=["in"], outputs=[c1])
    app.processor("alone", Split, inputs=["in"])
    assert [n.name for n in app.ordered()] == ["first", "middle", "last", "alone"]


def test_plan_checks_inputs_and_stores_and_adds_the_repartition_topics() -> None:
    """The run config reads the sources and the app's repartition topics; a config
    listing other inputs, or stores passed beside the app, is refused."""
    app = word_count_app()
    config = Config(name="wc", bootstrap_servers="x:1", input_topics=["lines"])
    plan = plan_for(app, config)
    assert plan.config.input_topics == ("lines", "wc-by-word-repartition")
    assert [t.name for t in plan.internal] == ["wc-by-word-repartition"]
    assert plan.sources == ("lines",)
    assert [s.name for s in plan.stores] == ["counts"]
    with pytest.raises(ConfigError, match=r"app 'words' reads \['lines'\], but input_topics "
                                          r"lists \['other'\]"):
        plan_for(app, dataclasses.replace(config, input_topics=["other"]))
    with pytest.raises(ConfigError, match="declares its stores per processor"):
        plan_for(app, config, stores=[MemoryTable("x")])
    topology = describe(app, config)
    assert topology["internal_topics"] == ["wc-by-word-repartition"]
    assert topology["processors"][1] == {
        "name": "count", "inputs": ["repartition:by-word (wc-by-word-repartition)"],
        "outputs": ["topic:word-counts"], "stores": [{"name": "counts", "kind": "MemoryTable"}]}


def test_run_target_tells_an_app_from_a_factory_once() -> None:
    """``RunTarget.of`` sets ``app`` for an App and ``factory`` for anything else; a
    lone factory's plan is the factory itself, with the config unchanged."""
    app = word_count_app()
    assert RunTarget.of(app) == RunTarget(app=app)
    assert RunTarget.of(Split) == RunTarget(factory=Split)
    config = Config(name="split", bootstrap_servers="x:1", input_topics=["lines"])
    plan = plan_for(Split, config)
    assert (plan.factory, plan.config, plan.app, plan.internal) == (Split, config, None, ())


# -- the testing driver ----------------------------------------------------------------


def test_driver_runs_an_app_through_its_repartition() -> None:
    """The driver reads back what the app sends to its repartition, on the partition
    the key hashes to, so the counts are those of the whole input."""
    driver = ProcessorDriver(word_count_app(), key_serde="str", value_serde="str",
                             partitions=4)
    driver.process([make_message("lines", "a b a", "doc1"),
                    make_message("lines", "b c", "doc2", partition=1)])
    assert final_counts(driver.outputs("word-counts")) == {"a": 2, "b": 2, "c": 1}
    for word in "abc":
        partition = murmur2_partition(word.encode(), 4)
        assert driver.store("counts", partition).get(word) is not None
    hops = [m for m in driver.sent if m.topic == "words-by-word-repartition"]
    assert sorted(m.key for m in hops) == [b"a", b"a", b"b", b"b", b"c"]
    assert driver.committed[("words-by-word-repartition", murmur2_partition(b"a", 4))] >= 2


class Tag(MessageProcessor):
    def process(self, messages: list[Message], sender: Sender) -> None:
        for message in messages:
            sender.channel("tagged", f"{message.topic}:{message.partition}:{message.offset}",
                           message.key)


class CountTagged(MessageProcessor):
    """Counts per key in "counts" and sends each tag to "out"."""

    def process(self, messages: list[Message], sender: Sender) -> None:
        store = self.context.store("counts")
        counts = store.get_many({m.key for m in messages})
        for message in messages:
            assert message.topic == "tagged"
            counts[message.key] = counts.get(message.key, 0) + 1
            sender.send("out", message.value, key=message.key)
        store.put_many(counts)


def channel_app(store: Any) -> App:
    app = App("tags")
    tagged = app.channel("tagged")
    app.processor("count", CountTagged, inputs=[tagged], outputs=["out"], stores=[store])
    app.processor("tag", Tag, inputs=["in"], outputs=[tagged])
    return app


def test_channel_messages_reach_their_reader_in_the_same_turn() -> None:
    """A channel's reader gets, in the same turn, Messages with the channel's name as
    topic, the sender's partition, offsets counting the turn's channel messages, the
    value as sent (no serde) and the batch's timestamp."""
    seen: list[Message] = []

    class Record(MessageProcessor):
        def process(self, messages: list[Message], sender: Sender) -> None:
            seen.extend(messages)

    class Send(MessageProcessor):
        def process(self, messages: list[Message], sender: Sender) -> None:
            for message in messages:
                sender.channel("c", {"v": message.value}, message.key)

    app = App("ch")
    c = app.channel("c")
    app.processor("send", Send, inputs=["in"], outputs=[c])
    app.processor("record", Record, inputs=[c])
    driver = ProcessorDriver(app, value_serde="str")
    driver.process([make_message("in", "x", b"k", partition=2, timestamp=5),
                    make_message("in", "y", b"k", partition=2, timestamp=7)])
    assert [(m.topic, m.partition, m.offset, m.key, m.value, m.timestamp) for m in seen] == [
        ("c", 2, 0, b"k", {"v": "x"}, 7), ("c", 2, 1, b"k", {"v": "y"}, 7)]
    assert driver.sent == []


def test_sends_outside_the_declared_topology_fail_the_turn_naming_the_processor() -> None:
    """A send to an undeclared repartition or channel, a repartition without a key, or
    a channel from a task fails the turn with errors naming the processor and app;
    a lone processor cannot use either."""

    class Stray(MessageProcessor):
        def process(self, messages: list[Message], sender: Sender) -> None:
            sender.repartition("by-word", "1", key="w")

    app = App("stray")
    r = app.repartition("by-word")
    app.processor("stray", Stray, inputs=["in"])
    app.processor("split", Split, inputs=["lines"], outputs=[r])
    app.processor("count", CountWords, inputs=[r], stores=[MemoryTable("counts")])
    driver = ProcessorDriver(app, value_serde="str")
    with pytest.raises(ProcessingError, match=r"processor 'stray' sends to repartition "
                                              r"'by-word', which it does not declare.*"
                                              r"\[in processor 'stray' of app 'stray'\]"):
        driver.process([make_message("in", "x")])
    assert driver.committed == {}

    class Keyless(MessageProcessor):
        def process(self, messages: list[Message], sender: Sender) -> None:
            sender.repartition("by-word", "1", key=None)

    app.nodes[0] = dataclasses.replace(app.nodes[0], factory=Keyless, outputs=(r,))
    with pytest.raises(ProcessingError, match="repartition 'by-word' needs a key"):
        ProcessorDriver(app, value_serde="str").process([make_message("in", "x")])
    with pytest.raises(ProcessingError, match=r"sender.repartition\(\) is for the processors "
                                              "of an App"):
        ProcessorDriver(Stray).process([make_message("input", b"x")])

    def task(_now: int, sender: Sender) -> None:
        sender.channel("tagged", "x")

    tasked = channel_app(MemoryTable("counts"))
    tasked.task(task, every=1.0)
    driver = ProcessorDriver(tasked, value_serde="str", wall_clock_start=0)
    with pytest.raises(KasperError, match="only process\\(\\) sends to one"):
        driver.advance_wall_clock(1.0)


# -- the loop on the in-memory broker ----------------------------------------------------


def wc_broker(lines: int = 40, partitions: int = 3) -> InMemoryBroker:
    broker = InMemoryBroker()
    broker.create_topic("lines", partitions)
    broker.create_topic("word-counts", partitions)
    for n in range(lines):
        broker.produce("lines", f"w{n % 5} w{n % 3} x", key=f"doc{n}")
    return broker


WC = Config(name="wc", bootstrap_servers="in-memory", input_topics=["lines"],
            key_serde="str", value_serde="str", batch_size=7, auto_offset_reset="latest")


def run_app(broker: InMemoryBroker, app: App, config: Config = WC) -> TopicProcessor:
    processor = TopicProcessor(config, app, clients=broker.clients(config))
    processor.run_loop(until_caught_up=True)
    processor.close()
    return processor


def test_the_loop_creates_and_drains_the_repartition_topic() -> None:
    """The loop creates the repartition topic with the sources' partition count and
    returns from until_caught_up only once it is consumed too; the counts are exact."""
    broker = wc_broker()
    run_app(broker, word_count_app(), dataclasses.replace(WC, auto_offset_reset="earliest"))
    assert broker.watermarks("wc-by-word-repartition", 2)[1] > 0
    with pytest.raises(ConsumeError, match=r"wc-by-word-repartition\[3\]"):
        broker.watermarks("wc-by-word-repartition", 3)
    words = collections.Counter(w for m in broker.read("lines") for w in m.value.decode().split())
    got = final_counts([(m.key.decode(), m.value.decode()) for m in broker.read("word-counts")])
    assert got == dict(words)
    committed = broker.committed("wc")
    for p in range(3):
        assert committed[("wc-by-word-repartition", p)] == broker.watermarks(
            "wc-by-word-repartition", p)[1]
        assert committed[("lines", p)] == broker.watermarks("lines", p)[1]


def test_a_repartition_is_read_from_its_start_whatever_auto_offset_reset_says() -> None:
    """With auto_offset_reset latest and nothing committed, the sources start at their
    end but a repartition topic at its start: what an upstream turn sent before a crash
    is counted."""
    broker = wc_broker(lines=0)
    broker.create_topic("wc-by-word-repartition", 3)
    for word in ("a", "b", "a"):
        broker.produce("wc-by-word-repartition", "1", key=word)
    broker.produce("lines", "ignored", key="doc")
    run_app(broker, word_count_app())
    got = final_counts([(m.key.decode(), m.value.decode()) for m in broker.read("word-counts")])
    assert got == {"a": 2, "b": 1}


def test_internal_topic_partition_counts_are_checked() -> None:
    """A processor reading a source and a repartition declared with another count
    refuses to start naming both counts (they are read together); an existing
    repartition topic with another count than the app runs it with refuses too."""
    app = App("wc")
    r = app.repartition("by-word", partitions=5)
    app.processor("split", Split, inputs=["lines"], outputs=[r])
    app.processor("count", CountWords, inputs=[r, "lines"], stores=[MemoryTable("counts")])
    broker = wc_broker()
    with pytest.raises(TopicError, match=r"read together must have the same partition count "
                                         r"to be processed partition-wise; found lines=3, "
                                         r"wc-by-word-repartition=5"):
        run_app(broker, app)
    broker = wc_broker()
    broker.create_topic("wc-by-word-repartition", 2)
    with pytest.raises(TopicError, match=r"'wc-by-word-repartition' has 2 partitions .* the "
                                         r"app runs it with 3"):
        run_app(broker, word_count_app())


@pytest.mark.parametrize("guarantee", ["at_least_once", "exactly_once"])
@pytest.mark.parametrize("effectively_once", [False, True], ids=["plain", "effectively-once"])
@pytest.mark.parametrize("step", CRASH_STEPS)
def test_channel_crash_at_each_step_commits_nothing_early(step: str, effectively_once: bool,
                                                           guarantee: str) -> None:
    """A process killed at any step boundary of turn 3 of an app whose processors talk
    through a channel: at the crash, every committed input has its downstream effects
    (its output acked and its count flushed): nothing the channel carried was committed
    upstream first. After a restart every input has its output, duplicates come only
    from the crashed turn (none under exactly-once), and an effectively-once store's
    counts are exact."""
    broker = InMemoryBroker()
    broker.create_topic("in", 2)
    broker.create_topic("out", 2)
    for n in range(30):
        broker.produce("in", f"v{n}", key=f"k{n % 5}")
    spec = broker.store("counts", effectively_once=effectively_once)
    config = Config(name="tags", bootstrap_servers="in-memory", input_topics=["in"],
                    key_serde="str", value_serde="str", batch_size=4,
                    processing_guarantee=guarantee)  # type: ignore[arg-type]
    broker.faults.crash_at(step, turn=3)
    with pytest.raises(SimulatedCrash, match=step):
        run_app(broker, channel_app(spec), config)
    tags = {f"{m.topic}:{m.partition}:{m.offset}": m.key.decode() for m in broker.read("in")}
    committed = broker.committed("tags")
    done = {t for t in tags if int(t.split(":")[2]) < committed.get(
        ("in", int(t.split(":")[1])), 0)}
    produced = collections.Counter(m.value.decode() for m in broker.read("out"))
    assert done <= set(produced)
    flushed = broker.table("counts")
    for key, n in collections.Counter(tags[t] for t in done).items():
        assert flushed.get(key, 0) >= n

    run_app(broker, channel_app(spec), config)
    produced = collections.Counter(m.value.decode() for m in broker.read("out"))
    assert set(produced) == set(tags)
    duplicates = {t for t, n in produced.items() if n > 1}
    if guarantee == "exactly_once":
        assert duplicates == set()
    assert len(duplicates) <= config.batch_size * 2
    exact = collections.Counter(tags.values())
    counts = broker.table("counts")
    if effectively_once:
        assert counts == exact
    else:
        assert all(counts[key] >= exact[key] for key in exact)
    assert broker.committed("tags") == {("in", p): broker.watermarks("in", p)[1]
                                        for p in (0, 1)}


def test_each_processor_of_an_app_has_its_own_metrics() -> None:
    """The loop's metrics count the messages handed to each processor of the app and
    the time it spent, labelled app_processor: every line to split, every word to
    count."""
    broker = wc_broker(lines=20)
    config = dataclasses.replace(WC, auto_offset_reset="earliest")
    observer = PrometheusObserver(config, registry=CollectorRegistry())
    processor = TopicProcessor(config, word_count_app(), clients=broker.clients(config),
                               observer=observer)
    processor.run_loop(until_caught_up=True)
    samples = {(s.name, s.labels.get("app_processor")): s.value
               for family in text_string_to_metric_families(
                   generate_latest(observer.registry).decode())
               for s in family.samples if s.name.startswith("kasper_app_processor")}
    processor.close()
    words = sum(len(m.value.split()) for m in broker.read("lines"))
    assert samples[("kasper_app_processor_messages_total", "split")] == 20
    assert samples[("kasper_app_processor_messages_total", "count")] == words
    assert samples[("kasper_app_processor_seconds_total", "count")] > 0


def test_a_one_processor_app_runs_where_a_lone_processor_does() -> None:
    """An app of one processor without repartitions, channels or tasks gives its factory
    and stores to the runners that take a lone processor (Spark); any other app is a
    ConfigError saying why."""
    lone = App("lone")
    lone.processor("count", CountWords, inputs=["words"], stores=[MemoryTable("counts")])
    factory, stores = lone.as_processor()
    assert factory is CountWords
    assert [s.name for s in stores] == ["counts"]
    with pytest.raises(ConfigError, match="app 'words' has 2 processors, 1 repartitions"):
        word_count_app().as_processor()
