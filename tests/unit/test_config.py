"""Config: validation names the field, conversion to librdkafka settings, secret masking."""

from __future__ import annotations

import pytest

from kasper_py import Config, ConfigError
from kasper_py.serdes import JSON


def make(**overrides: object) -> Config:
    values: dict[str, object] = {
        "name": "reach", "bootstrap_servers": "127.0.0.1:9092", "input_topics": ["tweets"]}
    values.update(overrides)
    return Config(**values)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("field", "value", "text"),
    [
        ("name", "", "name"),
        ("name", "has space", "name"),
        ("bootstrap_servers", " ", "bootstrap_servers"),
        ("input_topics", [], "input_topics"),
        ("input_topics", "tweets", "input_topics"),
        ("input_topics", ["a", "a"], "twice"),
        ("input_partitions", [0, -1], "invalid partition -1"),
        ("input_partitions", [1, 1], "twice"),
        ("batch_size", 0, "batch_size"),
        ("batch_size", 2_000_000, "batch_size"),
        ("batch_size", True, "batch_size"),
        ("batch_wait", 0, "batch_wait"),
        ("batch_wait", "1", "batch_wait"),
        ("auto_offset_reset", "middle", "auto_offset_reset"),
        ("value_serde", "yaml", "unknown serde 'yaml'"),
        ("value_serde", "avro", "'avro' needs a schema registry"),
        ("metrics_port", 70000, "metrics_port"),
        ("delivery_timeout", -1, "delivery_timeout"),
    ],
)
def test_invalid_value_names_the_field(field: str, value: object, text: str) -> None:
    """Each bad value raises ConfigError whose field and message name what is wrong."""
    with pytest.raises(ConfigError) as info:
        make(**{field: value})
    assert info.value.field == field
    assert field in str(info.value)
    assert text in str(info.value)


def test_config_is_frozen_and_normalised() -> None:
    """Lists become tuples, partitions are sorted, serde names resolve, fields are read-only."""
    config = make(input_topics=["a", "b"], input_partitions=[3, 1], value_serde="json")
    assert config.input_topics == ("a", "b")
    assert config.input_partitions == (1, 3)
    assert config.value_serde is JSON
    with pytest.raises(AttributeError):
        config.batch_size = 5  # type: ignore[misc]


def test_consumer_conf_commits_manually_and_passes_overrides() -> None:
    """The consumer never auto-commits; user librdkafka keys pass through."""
    config = make(client_overrides={"security.protocol": "PLAINTEXT"},
                  consumer_overrides={"fetch.min.bytes": 1024}, auto_offset_reset="latest")
    conf = config.to_consumer_conf()
    assert conf["group.id"] == "reach"
    assert conf["enable.auto.commit"] is False
    assert conf["enable.auto.offset.store"] is False
    assert conf["auto.offset.reset"] == "latest"
    assert conf["security.protocol"] == "PLAINTEXT"
    assert conf["fetch.min.bytes"] == 1024


def test_a_process_that_takes_partitions_over_fetches_at_most_100_ms_apart() -> None:
    """With an admin endpoint (promotions) or standby replicas, the consumer's idle
    fetch waits 100 ms, so a partition taken over joins a fetch soon; otherwise
    librdkafka's default stays, and an override wins either way."""
    assert "fetch.wait.max.ms" not in make().to_consumer_conf()
    for fields in ({"admin_port": 9300},
                   {"assignment": "group", "num_standby_replicas": 1}):
        assert make(**fields).to_consumer_conf()["fetch.wait.max.ms"] == 100
    tuned = make(admin_port=9300, consumer_overrides={"fetch.wait.max.ms": 20})
    assert tuned.to_consumer_conf()["fetch.wait.max.ms"] == 20


def test_group_id_overrides_name() -> None:
    """An explicit group_id is the consumer group; by default it is the name."""
    assert make().group == "reach"
    assert make(group_id="other").to_consumer_conf()["group.id"] == "other"


def test_producer_conf_is_idempotent_acks_all() -> None:
    """The producer waits for all in-sync replicas and is idempotent."""
    conf = make(producer_overrides={"linger.ms": 20}).to_producer_conf()
    assert conf["acks"] == "all"
    assert conf["enable.idempotence"] is True
    assert conf["linger.ms"] == 20
    assert conf["partitioner"] == "murmur2_random"


def test_admin_conf_takes_the_connection_and_client_overrides_only() -> None:
    """The admin client (CLI, reprocess driver, changelog creation) gets the servers and
    client_overrides, never the consumer's or producer's own settings."""
    conf = make(client_overrides={"security.protocol": "SSL"},
                consumer_overrides={"fetch.min.bytes": 1024},
                producer_overrides={"linger.ms": 20}).to_admin_conf()
    assert conf == {"bootstrap.servers": "127.0.0.1:9092", "client.id": "reach-admin",
                    "security.protocol": "SSL"}


def test_one_precedence_for_every_client() -> None:
    """Defaults < client_overrides < the client's own overrides < keys a field decides,
    for consumer, producer and admin alike."""
    config = make(client_overrides={"client.id": "shared", "socket.timeout.ms": 1},
                  consumer_overrides={"socket.timeout.ms": 2, "isolation.level": "x"},
                  producer_overrides={"client.id": "mine", "linger.ms": 0},
                  delivery_timeout=3.0)
    consumer, producer, admin = (config.to_consumer_conf(), config.to_producer_conf(),
                                 config.to_admin_conf())
    assert (consumer["client.id"], producer["client.id"], admin["client.id"]) == (
        "shared", "mine", "shared")
    assert (consumer["socket.timeout.ms"], producer["socket.timeout.ms"]) == (2, 1)
    assert consumer["isolation.level"] == "x" and producer["linger.ms"] == 0
    assert producer["message.timeout.ms"] == 3000
    assert {c["bootstrap.servers"] for c in (consumer, producer, admin)} == {"127.0.0.1:9092"}


@pytest.mark.parametrize(("field", "key", "owner"), [
    ("client_overrides", "bootstrap.servers", "bootstrap_servers"),
    ("consumer_overrides", "metadata.broker.list", "bootstrap_servers"),
    ("client_overrides", "group.id", "group_id"),
    ("consumer_overrides", "auto.offset.reset", "auto_offset_reset"),
    ("producer_overrides", "message.timeout.ms", "delivery_timeout"),
    ("client_overrides", "delivery.timeout.ms", "delivery_timeout"),
])
def test_overrides_cannot_set_what_a_field_decides(field: str, key: str, owner: str) -> None:
    """A key a field decides would lose to the field: refused, naming the field to set."""
    with pytest.raises(ConfigError, match=f"{key} comes from the '{owner}' field") as info:
        make(**{field: {key: "x"}})
    assert info.value.field == field


@pytest.mark.parametrize(
    ("field", "overrides", "text"),
    [
        ("consumer_overrides", {"enable.auto.commit": True}, "enable.auto.commit"),
        ("consumer_overrides", {"group.id": "x"}, "group_id"),
        ("producer_overrides", {"acks": "1"}, "acks"),
        ("producer_overrides", {"enable.idempotence": False}, "enable.idempotence"),
    ],
)
def test_overrides_cannot_weaken_the_guarantee(field: str, overrides: dict[str, object],
                                                text: str) -> None:
    """Overrides that would break at-least-once are refused, naming the key."""
    with pytest.raises(ConfigError) as info:
        make(**{field: overrides})
    assert text in str(info.value)


def test_repr_masks_secrets() -> None:
    """SASL credentials and SSL key material never appear in the repr; known-harmless
    settings (timeouts, the security protocol) still do."""
    config = make(client_overrides={"sasl.password": "hunter2", "ssl.key.pem": "PRIVATE",
                                    "sasl.username": "bob", "security.protocol": "SASL_SSL",
                                    "socket.timeout.ms": 12345})
    text = repr(config)
    assert "hunter2" not in text
    assert "PRIVATE" not in text
    assert "'bob'" not in text
    assert "'sasl.password': '***'" in text
    assert "'security.protocol': 'SASL_SSL'" in text and "12345" in text


def test_repr_masks_every_setting_not_known_harmless() -> None:
    """The rule is an allow-list: a setting nobody listed as secret is masked too."""
    config = make(consumer_overrides={"some.future.credential": "opaque-value-1"},
                  producer_overrides={"sasl.kerberos.kinit.cmd": "kinit -p me -k secretpw"})
    text = repr(config)
    assert "opaque-value-1" not in text and "secretpw" not in text
    assert "'some.future.credential': '***'" in text


def test_exactly_once_makes_a_transactional_producer_named_for_the_partition_set() -> None:
    """exactly_once: the producer's transactional.id is <name>@<partition set> (a second
    process on the same partitions gets the same id and fences the first), its
    transaction timeout is the delivery timeout, and AddPartitions retries after 10 ms."""
    conf = make(processing_guarantee="exactly_once", input_partitions=[7, 0, 1, 2, 3],
                delivery_timeout=30.0).to_producer_conf()
    assert conf["transactional.id"] == "reach@0-3,7"
    assert conf["transaction.timeout.ms"] == conf["message.timeout.ms"] == 30_000
    assert conf["retry.backoff.ms"] == 10
    assert make(processing_guarantee="exactly_once").transactional_id == "reach@all"
    assert "transactional.id" not in make().to_producer_conf()


def test_processing_guarantee_is_checked_and_read_committed_kept() -> None:
    """An unknown guarantee names the field; exactly_once refuses read_uncommitted input
    and a hand-set transactional.id."""
    with pytest.raises(ConfigError, match=r"processing_guarantee.*exactly_once"):
        make(processing_guarantee="exactly-once")
    with pytest.raises(ConfigError, match=r"isolation\.level must stay read_committed"):
        make(processing_guarantee="exactly_once",
             consumer_overrides={"isolation.level": "read_uncommitted"})
    with pytest.raises(ConfigError, match=r"transactional\.id comes from"):
        make(producer_overrides={"transactional.id": "mine"})


def test_group_mode_joins_with_the_incremental_protocol_and_co_partitions() -> None:
    """assignment='group': KIP-848's consumer protocol with the range assignor (partition
    p of every input topic to one member); the classic fallback is cooperative-sticky for
    one topic and range for several; the poll budget covers a turn's longest ack wait;
    each process gets its own transactional id; input_partitions must stay None."""
    conf = make(assignment="group", delivery_timeout=200.0).to_consumer_conf()
    assert (conf["group.protocol"], conf["group.remote.assignor"]) == ("consumer", "range")
    assert "partition.assignment.strategy" not in conf
    assert conf["max.poll.interval.ms"] == 600_000
    classic = {"group.protocol": "classic"}
    one = make(assignment="group", consumer_overrides=classic).to_consumer_conf()
    two = make(assignment="group", input_topics=["a", "b"],
               consumer_overrides=classic).to_consumer_conf()
    assert one["partition.assignment.strategy"] == "cooperative-sticky"
    assert two["partition.assignment.strategy"] == "range"
    assert "group.remote.assignor" not in one
    assert make(assignment="group").partition_set.startswith("group-")
    with pytest.raises(ConfigError, match=r"input_partitions.*group assigns"):
        make(assignment="group", input_partitions=[0])
    with pytest.raises(ConfigError, match="assignment"):
        make(assignment="elastic")


def test_exactly_once_in_group_mode_bounds_the_transaction_timeout() -> None:
    """In group mode a killed member's open transaction is waited out by the next owner
    of its partitions, so the transaction (and delivery) timeout is at most 10 s."""
    conf = make(assignment="group", processing_guarantee="exactly_once").to_producer_conf()
    assert conf["transaction.timeout.ms"] == conf["message.timeout.ms"] == 10_000
    static = make(processing_guarantee="exactly_once").to_producer_conf()
    assert static["transaction.timeout.ms"] == 120_000
