"""One topic admin on the real broker: ``KafkaAdmin.ensure`` creates and checks every
kind of topic (partition counts, a changelog's cleanup.policy, a repartition's
retention), and an app's repartition topic keeps its records until the downstream stage
has committed them, then is purged up to (never past) the committed offsets."""

from __future__ import annotations

import contextlib
import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from kasper_py import Config, Message, MessageProcessor, OutputTopic, Sender, TopicError
from kasper_py.app import App
from kasper_py.kafka.admin import KafkaAdmin, topic_admin
from kasper_py.kafka.topics import TopicSpec, changelog_spec, internal_specs
from kasper_py.topic_processor import TopicProcessor


def config_for(bootstrap: str, name: str, *inputs: str, **fields: Any) -> Config:
    return Config(name=name, bootstrap_servers=bootstrap, input_topics=list(inputs), **fields)


@pytest.fixture
def admin(bootstrap: str, unique_name: Callable[[str], str]) -> Iterator[KafkaAdmin]:
    """The topic admin of a fresh processor name; the topics named by ``unique_name``
    that it made are deleted after."""
    admin = topic_admin(config_for(bootstrap, unique_name("admin"), "unused"))
    yield admin
    run = unique_name("")
    with contextlib.suppress(Exception):  # cleanup is best-effort
        admin.delete_topics([t for t in admin.metadata().topics if t.endswith(run)])


def test_ensure_creates_absent_topics_and_waits_until_they_are_listed(
        admin: KafkaAdmin, unique_name: Callable[[str], str]) -> None:
    """An absent topic is created with its partitions and settings and is in the
    metadata when ``ensure`` returns; a second ``ensure`` creates nothing."""
    name = unique_name("made")
    spec = TopicSpec(name, "output", 3, config={"retention.ms": "3600000"})
    assert admin.ensure([spec]) == [name]
    assert len(admin.metadata().topics[name].partitions) == 3
    assert admin.topic_configs([name])[name]["retention.ms"] == "3600000"
    assert admin.ensure([spec]) == []


def test_ensure_names_a_topic_with_the_wrong_partition_count(
        admin: KafkaAdmin, bootstrap: str, unique_name: Callable[[str], str]) -> None:
    """An existing output topic with another count than declared, an internal topic
    unlike its sources and a changelog with fewer partitions than the input are
    ``TopicError``s naming the topic, both counts and the fix."""
    name = unique_name("counted")
    admin.ensure([TopicSpec(name, "output", 3)])
    with pytest.raises(TopicError) as raised:
        admin.ensure([TopicSpec(name, "output", 2)])
    assert str(raised.value) == (
        f"output topic {name!r} is declared with 2 partitions but has 3 on {bootstrap}: "
        "fix the declaration (Config.output_topics), or recreate the topic")
    with pytest.raises(TopicError, match=f"internal topic {name!r} has 3 partitions on "
                                         f"{bootstrap}, but the app runs it with 4: "):
        admin.ensure([TopicSpec(name, "internal", 4)])
    with pytest.raises(TopicError, match=f"changelog {name!r} has 3 partitions but the "
                                         "input has 4; delete it"):
        admin.ensure([changelog_spec(name, 4)])
    assert admin.ensure([changelog_spec(name, 2, config={"cleanup.policy": "delete"})]) == []


def test_a_changelog_that_is_not_compacted_is_refused(
        admin: KafkaAdmin, new_topic: Callable[..., str]) -> None:
    """A changelog made elsewhere with the delete policy would lose keys on restore:
    a ``TopicError`` naming it, its policy and the fix."""
    name = new_topic("changelog", partitions=2)
    with pytest.raises(TopicError) as raised:
        admin.ensure([changelog_spec(name, 2)])
    assert str(raised.value) == (
        f"changelog {name!r} has cleanup.policy=delete: a changelog must be compacted, or "
        "a restore loses keys; alter it to cleanup.policy=compact, or delete it and let "
        "kasper_py create it")
    compacted = new_topic("compacted", partitions=2, **{"cleanup.policy": "compact"})
    admin.ensure([changelog_spec(compacted, 2)])  # compacted: taken as it is


def test_repartition_topics_keep_their_records_by_time(
        admin: KafkaAdmin, new_topic: Callable[..., str],
        unique_name: Callable[[str], str]) -> None:
    """A repartition topic is created with retention.ms=-1; one made before with a
    retention time is altered to -1 at start, its other settings left alone."""
    source = new_topic("source", partitions=2)
    fresh = OutputTopic(unique_name("fresh-repartition"))
    assert admin.ensure(internal_specs({source: 2}, [fresh])) == [fresh.name]
    settings = admin.topic_configs([fresh.name])[fresh.name]
    assert (settings["retention.ms"], settings["cleanup.policy"]) == ("-1", "delete")
    old = new_topic("old-repartition", partitions=2,
                    **{"retention.ms": "86400000", "segment.bytes": "10485760"})
    admin.ensure(internal_specs({source: 2}, [OutputTopic(old)]))  # exists: altered
    deadline = time.monotonic() + 10  # the broker applies an altered setting soon after
    while (settings := admin.topic_configs([old])[old])["retention.ms"] != "-1" \
            and time.monotonic() < deadline:
        time.sleep(0.2)
    assert (settings["retention.ms"], settings["segment.bytes"]) == ("-1", "10485760")


# -- the purge ---------------------------------------------------------------------------

class ByUser(MessageProcessor):
    """A view (its value: the user) keyed by its user, through the ``by-user``
    repartition."""

    def process(self, messages: list[Message], sender: Sender) -> None:
        sender.repartition_many("by-user", [(m.value, m.value, None, None) for m in messages])


class Count(MessageProcessor):
    """Counts pages per user (plain state: one run); sends each new count to ``output``."""

    def __init__(self, output: str) -> None:
        self.output = output
        self.counts: Counter[str] = Counter()

    def process(self, messages: list[Message], sender: Sender) -> None:
        for message in messages:
            user = message.key.decode()
            self.counts[user] += 1
            sender.send(self.output, str(self.counts[user]).encode(), key=message.key)


def test_the_downstream_stage_commits_then_the_repartition_is_purged_up_to_it(
        bootstrap: str, new_topic: Callable[..., str], kafka: Any,
        unique_name: Callable[[str], str]) -> None:
    """Two rounds of page views through an app's repartition, the purge interval
    passing between them: the repartition's low watermark has moved past the first
    round (records purged) and never past the group's committed offset (nothing
    unread purged), and every user's last count is exact."""
    partitions = 3
    source, output = new_topic("views", partitions=partitions), new_topic("counts")
    app = App("clicks")
    by_user = app.repartition("by-user")
    app.processor("rekey", ByUser, inputs=[source], outputs=[by_user])
    app.processor("count", lambda _context: Count(output), inputs=[by_user], outputs=[output])
    name = unique_name("purge")
    repartition = f"{name}-by-user-repartition"
    config = config_for(bootstrap, name, source, batch_size=100, batch_wait=0.1,
                        repartition_purge_interval=0.5)
    expected: Counter[str] = Counter()
    processor = TopicProcessor(config, app)
    try:
        for round_ in range(2):
            views = range(round_ * 600, (round_ + 1) * 600)
            kafka.produce(source, [(f"s{i}".encode(), f"u{i % 40}".encode()) for i in views])
            expected.update(f"u{i % 40}" for i in views)
            processor.run_loop(until_caught_up=True)
            if round_ == 0:
                first = kafka.committed(name, repartition, partitions)
                time.sleep(0.6)  # the purge interval passes
        committed = kafka.committed(name, repartition, partitions)
        with KafkaAdmin(config) as reader:
            marks = reader.watermarks((repartition, p) for p in range(partitions))
        low = {p: marks[repartition, p][0] for p in range(partitions)}
    finally:
        processor.close()
        with contextlib.suppress(Exception):
            topic_admin(config).delete_topics([repartition])
    assert all(low[p] <= committed[p] for p in range(partitions)), (low, committed)  # type: ignore[operator]
    assert all(low[p] >= first[p] > 0 for p in range(partitions)), (low, first)  # type: ignore[operator]
    last: dict[str, int] = {}
    for message in kafka.read_all(output):
        last[message.key().decode()] = int(message.value())
    assert last == dict(expected)
