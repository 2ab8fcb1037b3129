"""Output topics with no broker: a send never creates one (the turn asks the cluster
about each new topic once), and declared output topics (``Config.output_topics``) as
Python, TOML, the environment and flags give them, checked and created at start."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException

from kasper_py import (
    JSON,
    STRING,
    Config,
    ConfigError,
    Message,
    MessageProcessor,
    OutputTopic,
    ProcessorContext,
    Sender,
    TopicError,
    TopicProcessor,
)
from kasper_py.cli import CliError, load_config
from kasper_py.kafka import admin as admin_module
from kasper_py.kafka.admin import ensure_output_topics
from kasper_py.kafka.topics import output_specs
from kasper_py.output_topic import value_serdes
from kasper_py.testing import InMemoryBroker


def make(**fields: Any) -> Config:
    return Config(name="p", bootstrap_servers="h:1", input_topics=["in"], **fields)


def metadata(**partitions: int) -> Any:
    """Cluster metadata as list_topics() gives it: topic -> partition count."""
    return SimpleNamespace(topics={
        topic: SimpleNamespace(error=None, partitions=dict.fromkeys(range(count)))
        for topic, count in partitions.items()})


# -- a send to a topic that does not exist -------------------------------------------------

class Router(MessageProcessor):
    """Sends each value to the topic named by its key (decoded as str)."""

    def __init__(self, context: ProcessorContext) -> None:
        pass

    def process(self, messages: list[Message], sender: Sender) -> None:
        for m in messages:
            sender.send(m.key, m.value)


def test_the_cluster_is_asked_about_each_output_topic_once() -> None:
    """The first turn sending to a topic asks whether it exists; later turns ask only
    about topics no turn of this process sent to before (no metadata request per turn)."""
    config = Config(name="router", bootstrap_servers="in-memory", input_topics=["in"],
                    key_serde="str", batch_size=1)
    broker = InMemoryBroker()
    for topic in ("in", "a", "b"):
        broker.create_topic(topic)
    for key in ("a", "a", "b", "a", "b"):
        broker.produce("in", b"v", key=key)
    clients = broker.clients(config)
    asked: list[set[str]] = []
    ask = clients.producer.missing_topics

    def counting(topics: Any) -> dict[str, str]:
        asked.append(set(topics))
        return ask(topics)

    clients.producer.missing_topics = counting  # type: ignore[method-assign]
    with TopicProcessor(config, Router, clients=clients) as processor:
        processor.run_loop(until_caught_up=True)
    assert asked == [{"a"}, {"b"}]
    assert [len(broker.read(t)) for t in ("a", "b")] == [3, 2]
    assert broker.committed("router") == {("in", 0): 5}


def test_a_missing_dead_letter_topic_fails_the_turn_naming_it() -> None:
    """Dead letters go through the same check: an undecodable message bound for a
    dead-letter topic that does not exist fails the turn, uncommitted, naming the
    topic and the processor."""
    config = Config(name="dl", bootstrap_servers="in-memory", input_topics=["in"],
                    value_serde="json", on_decode_error="dead_letter",
                    dead_letter_topic="in-dead-letters")
    broker = InMemoryBroker()
    broker.create_topic("in")
    broker.produce("in", b"{not json")
    with pytest.raises(TopicError, match=r"processor 'dl' sent messages to "
                                         r"'in-dead-letters' \(does not exist\)"):
        TopicProcessor(config, Router, clients=broker.clients(config)).run_loop()
    assert broker.committed("dl") == {}


def test_the_producer_never_asks_a_broker_to_create_a_topic() -> None:
    """Whatever the broker's auto.create.topics.enable, the loop's producer (and its
    metadata requests) never create a topic; a user may still opt in explicitly."""
    assert make().to_producer_conf()["allow.auto.create.topics"] is False
    opted_in = make(producer_overrides={"allow.auto.create.topics": True})
    assert opted_in.to_producer_conf()["allow.auto.create.topics"] is True


# -- declaring output topics -----------------------------------------------------------------

def test_declared_topics_in_every_form_become_output_topics() -> None:
    """An OutputTopic, a table of its fields (TOML) and "name[:partitions]" (environment,
    flags) are all taken; topic settings become the strings Kafka takes."""
    config = make(output_topics=[
        OutputTopic("a", 3),
        {"name": "b", "partitions": 6, "replication_factor": 2,
         "config": {"retention.ms": 60000, "compression.type": "zstd", "preallocate": True}},
        "c:4", "d"])
    assert config.output_topics == (
        OutputTopic("a", 3),
        OutputTopic("b", 6, 2, {"retention.ms": "60000", "compression.type": "zstd",
                                "preallocate": "true"}),
        OutputTopic("c", 4), OutputTopic("d"))


@pytest.mark.parametrize(("declared", "problem"), [
    (["a:x"], "'a:x' is not NAME, NAME:PARTITIONS, NAME@VALUE_SERDE or "
              "NAME:PARTITIONS@VALUE_SERDE"),
    (["a@"], "'a@' is not NAME, NAME:PARTITIONS"),
    (["a:x@json"], "'a:x@json' is not NAME, NAME:PARTITIONS"),
    (["a@yaml"], "unknown serde 'yaml'"),
    (["a:0"], "'a': partitions must be an int >= 1"),
    ([{"name": "a", "partitions": 2, "retention": "1d"}], "takes name, partitions"),
    ([{"partitions": 2}], "takes name, partitions"),
    (["bad topic"], "'bad topic' is not a topic name"),
    (["a", "b:2", "a:3"], "declares 'a' twice"),
    ([{"name": "a", "value_serde": "yaml"}], "unknown serde 'yaml'"),
    ([{"name": "a", "value_serde": 3}], "'a': value_serde must be a serde name or a Serde"),
    ([{"name": "a", "value_serde": "avro"}], "registry"),
    ("a", "must be a list"),
    ([3], "got 3"),
])
def test_a_bad_declaration_names_the_field(declared: Any, problem: str) -> None:
    """A declaration that cannot be an output topic is a ConfigError of
    ``output_topics`` saying what is wrong with which topic."""
    with pytest.raises(ConfigError, match="'output_topics'") as failed:
        make(output_topics=declared)
    assert problem in str(failed.value)


def test_declared_topics_load_from_toml_environment_and_flags(tmp_path: Path) -> None:
    """TOML declares topics as an array of tables (settings included) or as strings;
    KASPER_OUTPUT_TOPICS and --output-topics as comma-separated
    NAME[:PARTITIONS][@VALUE_SERDE], winning over the file as every field does."""
    path = tmp_path / "kasper.toml"
    path.write_text('name = "p"\nbootstrap_servers = "h:1"\ninput_topics = ["in"]\n'
                    '[[output_topics]]\nname = "enriched"\npartitions = 8\n'
                    '[output_topics.config]\n"retention.ms" = 86400000\n'
                    '[[output_topics]]\nname = "alerts"\n')
    assert load_config(str(path), {}).output_topics == (
        OutputTopic("enriched", 8, config={"retention.ms": "86400000"}), OutputTopic("alerts"))
    env = {"KASPER_OUTPUT_TOPICS": "enriched:4, alerts"}
    assert load_config(str(path), env).output_topics == (OutputTopic("enriched", 4),
                                                         OutputTopic("alerts"))
    flags = {"output_topics": ["x:2"]}
    assert load_config(str(path), env, flags).output_topics == (OutputTopic("x", 2),)
    env = {"KASPER_OUTPUT_TOPICS": "enriched:4@json, alerts@str"}
    assert load_config(str(path), env).output_topics == (
        OutputTopic("enriched", 4, value_serde=JSON), OutputTopic("alerts", value_serde=STRING))
    flags = {"output_topics": ["x@json"]}
    assert load_config(str(path), env, flags).output_topics == (
        OutputTopic("x", value_serde=JSON),)
    path.write_text('name = "p"\nbootstrap_servers = "h:1"\ninput_topics = ["in"]\n'
                    'output_topics = ["enriched:0"]\n')
    with pytest.raises(CliError, match=f"partitions must be .* \\(from {path}\\)"):
        load_config(str(path), {})


def test_a_declared_topic_has_its_own_value_serde_from_python_or_toml(tmp_path: Path) -> None:
    """``value_serde`` is resolved as ``Config.value_serde`` is (a name or a Serde);
    topics without one use Config's."""
    config = make(output_topics=[{"name": "a", "value_serde": "json"}, OutputTopic("b")])
    assert config.output_topics == (OutputTopic("a", value_serde=JSON), OutputTopic("b"))
    assert value_serdes(config.output_topics) == {"a": JSON}
    path = tmp_path / "kasper.toml"
    path.write_text('name = "p"\nbootstrap_servers = "h:1"\ninput_topics = ["in"]\n'
                    '[[output_topics]]\nname = "totals"\nvalue_serde = "json"\n')
    assert load_config(str(path), {}).output_topics == (OutputTopic("totals", value_serde=JSON),)


# -- checked and created at start ------------------------------------------------------------

def test_absent_declared_topics_are_listed_with_their_partition_count() -> None:
    """An absent declared topic is to be created with its partitions, or the input
    topics' count when it declares none; a present one is checked against its declared
    count, and taken with any count when it declares none."""
    config = make(output_topics=["a:3", "b", "c:2", "d"])
    specs = output_specs(config, metadata(**{"in": 6, "c": 2, "d": 1}))
    assert [(s.name, s.partitions, s.rule) for s in specs] == [
        ("a", 3, "exact"), ("b", 6, "any"), ("c", 2, "exact"), ("d", 1, "any")]


class FakeAdmin:
    """Stands in for AdminClient: records create_topics, answers with ``errors``; its
    metadata is ``topics`` (topic -> partition count) and the topics it created."""

    def __init__(self, errors: dict[str, int] | None = None, **topics: int) -> None:
        self.created: list[Any] = []
        self.errors = errors or {}
        self.topics = topics

    def list_topics(self, topic: str | None = None, timeout: float = 0) -> Any:
        return metadata(**self.topics)

    def poll(self, timeout: float) -> int:
        return 0

    def create_topics(self, topics: list[Any], request_timeout: float) -> dict[str, Future[None]]:
        futures = {}
        for topic in topics:
            self.created.append(topic)
            future: Future[None] = Future()
            code = self.errors.get(topic.topic)
            if code is None:
                future.set_result(None)
            else:
                future.set_exception(KafkaException(KafkaError(code)))
            if code in (None, KafkaError.TOPIC_ALREADY_EXISTS):
                self.topics[topic.topic] = topic.num_partitions
            futures[topic.topic] = future
        return futures


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Callable[..., FakeAdmin]:
    """Makes the process's shared AdminClient a ``FakeAdmin`` built with the arguments."""
    def install(errors: dict[str, int] | None = None, **topics: int) -> FakeAdmin:
        admin = FakeAdmin(errors, **topics)
        monkeypatch.setattr(admin_module, "shared_client", lambda _config: (admin, []))
        return admin
    return install


def test_an_existing_topic_with_another_partition_count_refuses_to_start(
        fake: Callable[..., FakeAdmin]) -> None:
    """A declared topic that exists with another partition count than declared is a
    TopicError naming the topic, the declared and the actual count; nothing is created."""
    admin = fake(**{"in": 3, "out": 2})
    with pytest.raises(TopicError, match="output topic 'out' is declared with 3 partitions "
                                         "but has 2 on h:1"):
        ensure_output_topics(make(output_topics=["out:3", "new"]))
    assert admin.created == []


def test_absent_declared_topics_are_created_as_declared(fake: Callable[..., FakeAdmin]) -> None:
    """With ``create``, each absent declared topic is created with its partitions,
    replication factor (the broker's default when not declared) and settings; one another
    process created meanwhile is fine; present ones are not created again."""
    config = make(output_topics=[
        OutputTopic("a", 3, 2, {"cleanup.policy": "compact"}), "b", "present:4", "raced"])
    admin = fake({"raced": KafkaError.TOPIC_ALREADY_EXISTS}, **{"in": 5, "present": 4})
    created = ensure_output_topics(config)
    assert created == ["a", "b", "raced"]
    assert [(t.topic, t.num_partitions, t.replication_factor, t.config)
            for t in admin.created] == [("a", 3, 2, {"cleanup.policy": "compact"}),
                                        ("b", 5, -1, {}), ("raced", 5, -1, {})]


def test_absent_declared_topics_without_create_or_refused_fail_naming_them(
        fake: Callable[..., FakeAdmin]) -> None:
    """Without ``create`` an absent declared topic refuses to start (nothing created);
    a creation the cluster refuses names the topic and the reason."""
    config = make(output_topics=["a", "b"])
    admin = fake(**{"in": 1})
    with pytest.raises(TopicError, match="declared output topics 'a', 'b' do not exist on "
                                         "h:1: create them, or start with --create-topics"):
        ensure_output_topics(config, create=False)
    assert admin.created == []
    fake({"b": KafkaError.TOPIC_AUTHORIZATION_FAILED}, **{"in": 1})
    with pytest.raises(TopicError, match=r"cannot create topic 'b': .*uthorization"):
        ensure_output_topics(config)
