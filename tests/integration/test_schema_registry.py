"""Schema Registry serdes against the stack's real registry (Apicurio's Confluent API)
and broker: what confluent-kafka's own serializers write, kasper_py reads, and the
reverse, for Avro, Protobuf and JSON Schema; an Avro schema evolution across a restart;
auto-registration off; records the registry cannot decode, through ``on_decode_error``;
`kasper run` behind a proxy that makes the registry hang (at start, and mid-run with a
SIGTERM while the request is outstanding)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.schema_registry.json_schema import JSONDeserializer, JSONSerializer
from confluent_kafka.schema_registry.protobuf import ProtobufDeserializer, ProtobufSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from registry_messages import Order

from kasper_py import Config, Message, MessageProcessor, SerdeError, TopicProcessor
from kasper_py.registry import AvroSerde, RegistryConfig
from kasper_py.sender import Sender
from kasper_py.stack import schema_registry_url
from tests.on_demand import on_demand

pytest.register_assert_rewrite("conftest_stores")
from conftest_stores import TcpProxy  # isort: skip  # noqa: E402 - after register_assert_rewrite
from test_cli import (  # isort: skip  # noqa: E402
    HERE, cli_env, json_lines, kasper, kasper_command, wait_for, write_config)

pytestmark = pytest.mark.integration

ORDER_V1 = json.dumps({"type": "record", "name": "Order", "namespace": "kasper.tests",
                       "fields": [{"name": "id", "type": "string"},
                                  {"name": "amount", "type": "long"}]})
ORDER_V2 = json.dumps({"type": "record", "name": "Order", "namespace": "kasper.tests",
                       "fields": [{"name": "id", "type": "string"},
                                  {"name": "amount", "type": "long"},
                                  {"name": "currency", "type": "string", "default": "EUR"}]})
ORDER_JSON = json.dumps({"type": "object", "title": "Order",
                         "properties": {"id": {"type": "string"},
                                        "amount": {"type": "integer"}},
                         "required": ["id", "amount"]})


@pytest.fixture(scope="module")
def registry_url() -> str:
    """The registry's Confluent API, the stack's started when it is not running; fails
    (not skips) when it does not answer."""
    url = schema_registry_url()
    on_demand("schema-registry", url, SchemaRegistryClient({"url": url}).get_subjects,
              external="KASPER_SCHEMA_REGISTRY_URL" in os.environ)
    return url


class Forward(MessageProcessor):
    """Sends every value on to ``output`` as it was decoded, keeping what it saw."""

    def __init__(self, output: str, seen: list[Any]) -> None:
        self.output, self.seen = output, seen

    def process(self, messages: list[Message], sender: Sender) -> None:
        for message in messages:
            self.seen.append(message.value)
            sender.send(self.output, message.value)


def run_forward(config: Config, output: str) -> list[Any]:
    """Run the loop until caught up; the values ``process()`` saw."""
    seen: list[Any] = []
    with TopicProcessor(config, lambda _c: Forward(output, seen)) as processor:
        processor.run_loop(until_caught_up=True)
    return seen


def config_for(bootstrap: str, name: str, source: str, value_serde: str,
               registry: dict[str, Any], **kwargs: Any) -> Config:
    return Config(name=name, bootstrap_servers=bootstrap, input_topics=[source],
                  value_serde=value_serde, registry=registry, batch_size=100,
                  batch_wait=0.3, **kwargs)


def confluent_values(kafka: Any, topic: str, deserialize: Callable[..., Any]) -> list[Any]:
    """``topic``'s values, decoded by a confluent-kafka deserializer."""
    context = SerializationContext(topic, MessageField.VALUE)
    return [deserialize(record.value(), context) for record in kafka.read_all(topic)]


def produce_with(kafka: Any, topic: str, serialize: Callable[..., bytes],
                 values: list[Any]) -> None:
    context = SerializationContext(topic, MessageField.VALUE)
    kafka.produce(topic, [serialize(value, context) for value in values], partition=0)


def test_avro_both_ways(bootstrap, kafka, new_topic, unique_name, registry_url) -> None:
    """confluent's AvroSerializer writes, kasper_py reads dicts and writes them on in
    Avro, confluent's AvroDeserializer reads them back."""
    client = SchemaRegistryClient({"url": registry_url})
    source, output = new_topic("avro-in"), new_topic("avro-out")
    orders = [{"id": f"o-{n}", "amount": n * 10} for n in range(5)]
    produce_with(kafka, source, AvroSerializer(client, ORDER_V1), orders)
    registry = {"url": registry_url, "value_schema": ORDER_V1}
    seen = run_forward(config_for(bootstrap, unique_name("avro"), source, "avro", registry),
                       output)
    assert seen == orders
    assert confluent_values(kafka, output, AvroDeserializer(client)) == orders
    assert f"{output}-value" in client.get_subjects()


def test_protobuf_both_ways(bootstrap, kafka, new_topic, unique_name, registry_url) -> None:
    """confluent's ProtobufSerializer writes, kasper_py reads message objects and writes
    them on, confluent's ProtobufDeserializer reads them back."""
    client = SchemaRegistryClient({"url": registry_url})
    source, output = new_topic("proto-in"), new_topic("proto-out")
    orders = [Order(id=f"o-{n}", amount=n) for n in range(4)]
    produce_with(kafka, source, ProtobufSerializer(Order, client), orders)
    registry = {"url": registry_url, "value_schema": "registry_messages:Order"}
    seen = run_forward(config_for(bootstrap, unique_name("proto"), source, "protobuf",
                                  registry), output)
    assert seen == orders
    assert confluent_values(kafka, output, ProtobufDeserializer(Order)) == orders


def test_json_schema_both_ways(bootstrap, kafka, new_topic, unique_name,
                               registry_url) -> None:
    """confluent's JSONSerializer writes, kasper_py reads and writes on, validated by
    the schema; confluent's JSONDeserializer reads them back."""
    client = SchemaRegistryClient({"url": registry_url})
    source, output = new_topic("json-in"), new_topic("json-out")
    orders = [{"id": f"o-{n}", "amount": n} for n in range(4)]
    produce_with(kafka, source, JSONSerializer(ORDER_JSON, client), orders)
    registry = {"url": registry_url, "value_schema": ORDER_JSON}
    seen = run_forward(config_for(bootstrap, unique_name("json"), source, "json_schema",
                                  registry), output)
    assert seen == orders
    deserializer = JSONDeserializer(None, schema_registry_client=client)
    assert confluent_values(kafka, output, deserializer) == orders


def test_avro_evolution_across_restart(bootstrap, kafka, new_topic, unique_name, *,
                                       registry_url, tmp_path) -> None:
    """A field added with a default: after a restart with the new schema (from a file),
    old records read with the default and new ones with their value."""
    client = SchemaRegistryClient({"url": registry_url})
    source, output = new_topic("evo-in"), new_topic("evo-out")
    name = unique_name("evo")
    produce_with(kafka, source, AvroSerializer(client, ORDER_V1), [{"id": "a", "amount": 1}])
    first = config_for(bootstrap, name, source, "avro",
                       {"url": registry_url, "value_schema": ORDER_V1})
    assert run_forward(first, output) == [{"id": "a", "amount": 1}]
    # while it is down: one more old record, then one of the new schema
    produce_with(kafka, source, AvroSerializer(client, ORDER_V1), [{"id": "b", "amount": 2}])
    new = {"id": "c", "amount": 3, "currency": "USD"}
    produce_with(kafka, source, AvroSerializer(client, ORDER_V2), [new])
    schema_file = tmp_path / "order-v2.avsc"
    schema_file.write_text(ORDER_V2)
    second = config_for(bootstrap, name, source, "avro",
                        {"url": registry_url, "value_schema": str(schema_file)})
    assert run_forward(second, output) == [{"id": "b", "amount": 2, "currency": "EUR"}, new]
    written = confluent_values(kafka, output, AvroDeserializer(client, ORDER_V2))
    assert written == [{"id": "a", "amount": 1, "currency": "EUR"},
                       {"id": "b", "amount": 2, "currency": "EUR"}, new]


def test_auto_register_off_names_the_subject(new_topic, registry_url) -> None:
    """With auto_register off, a schema not under its subject is a SerdeError naming
    the subject; nothing is registered."""
    topic = new_topic("unregistered")
    registry = RegistryConfig(registry_url, auto_register=False)
    serde = AvroSerde(registry, ORDER_V1).for_topic(topic)
    with pytest.raises(SerdeError, match=f"avro serde cannot encode \\(subject "
                                         f"'{topic}-value'\\)"):
        serde.encode({"id": "x", "amount": 1})
    assert f"{topic}-value" not in SchemaRegistryClient({"url": registry_url}).get_subjects()


def produce_undecodable(kafka: Any, client: Any, topic: str) -> None:
    """A good record (offset 0), one with a bad magic byte (1), one naming a schema id
    the registry does not hold (2), then a good one (3)."""
    serialize = AvroSerializer(client, ORDER_V1)
    context = SerializationContext(topic, MessageField.VALUE)
    good = [serialize({"id": n, "amount": 0}, context) for n in ("g1", "g2")]
    unknown_id = b"\x00" + (987654321).to_bytes(4, "big") + b"\x02a\x00"
    kafka.produce(topic, [good[0], b"\x07plain bytes", unknown_id, good[1]], partition=0)


def test_undecodable_fail_names_record_and_schema(bootstrap, kafka, new_topic, unique_name,
                                                  registry_url) -> None:
    """on_decode_error=fail: the SerdeError names topic, partition, offset and subject."""
    client = SchemaRegistryClient({"url": registry_url})
    source, output = new_topic("bad-in"), new_topic("bad-out")
    produce_undecodable(kafka, client, source)
    config = config_for(bootstrap, unique_name("bad"), source, "avro",
                        {"url": registry_url, "value_schema": ORDER_V1})
    with pytest.raises(SerdeError) as info:
        run_forward(config, output)
    assert f"cannot decode {source}[0] offset 1: avro serde: subject '{source}-value'" in str(
        info.value)
    assert "magic byte 07" in str(info.value)


@pytest.mark.parametrize("policy", ["skip", "dead_letter"])
def test_undecodable_set_aside(bootstrap, kafka, new_topic, unique_name, *, registry_url,
                               policy) -> None:
    """skip / dead_letter: the bad magic byte and the unknown schema id are set aside
    (the dead letters name subject and schema id), the good records go through."""
    client = SchemaRegistryClient({"url": registry_url})
    source, output = new_topic("aside-in"), new_topic("aside-out")
    produce_undecodable(kafka, client, source)
    extra: dict[str, Any] = {"on_decode_error": policy}
    if policy == "dead_letter":
        extra["dead_letter_topic"] = new_topic("aside-dlq")
    config = config_for(bootstrap, unique_name("aside"), source, "avro",
                        {"url": registry_url, "value_schema": ORDER_V1}, **extra)
    assert [v["id"] for v in run_forward(config, output)] == ["g1", "g2"]
    if policy == "dead_letter":
        letters = kafka.read_all(extra["dead_letter_topic"])
        errors = [dict(letter.headers())["kasper.error"].decode() for letter in letters]
        offsets = [dict(letter.headers())["kasper.source.offset"] for letter in letters]
        assert offsets == [b"1", b"2"]
        assert "magic byte 07" in errors[0]
        assert f"subject '{source}-value', schema id 987654321" in errors[1]


def test_store_values_in_avro(bootstrap, kafka, new_topic, unique_name, registry_url) -> None:
    """A store's values through a registry serde bound to a subject of its own: Redis
    holds them in the wire format, readable by confluent's deserializer."""
    import redis
    from stores_worker import WordCount  # a sibling script, not a package

    from kasper_py.stack import redis_url
    from kasper_py.stores.redis import RedisTable

    source, name = new_topic("store-in"), unique_name("avro-store")
    kafka.produce(source, [b"a b a", b"c a"], partition=0)
    registry = RegistryConfig(registry_url)
    counts = RedisTable("counts", url=redis_url(), prefix=name,
                        value_serde=AvroSerde(registry, '"long"').for_topic(name))
    config = Config(name=name, bootstrap_servers=bootstrap, input_topics=[source],
                    value_serde="str", batch_size=10, batch_wait=0.2)
    with TopicProcessor(config, WordCount, stores=[counts]) as processor:
        processor.run_loop(until_caught_up=True)
    client = redis.Redis.from_url(redis_url())
    keys = sorted(client.scan_iter(f"{name}/*"))
    deserialize = AvroDeserializer(SchemaRegistryClient({"url": registry_url}))
    context = SerializationContext(name, MessageField.VALUE)
    stored = {key.decode().rsplit("/", 1)[-1]: deserialize(client.get(key), context)
              for key in keys}
    assert stored == {"a": 3, "b": 1, "c": 1}
    client.delete(*keys)


@pytest.fixture
def registry_proxy(registry_url: str) -> Iterator[tuple[TcpProxy, str]]:
    """A proxy in front of the stack's registry (``hang()`` makes it a hung registry
    without touching the shared one) and the registry URL through it."""
    parts = urlsplit(registry_url)
    proxy = TcpProxy((parts.hostname or "127.0.0.1", parts.port or 80))
    proxy.start()
    yield proxy, parts._replace(netloc=f"127.0.0.1:{proxy.port}").geturl()
    proxy.stop()


def registry_run_args(tmp_path: Path, name: str, source: str, url: str) -> list[str]:
    """`kasper run` of registry_messages:Discard over Avro values, the registry at ``url``
    with a 2 s timeout."""
    config = write_config(tmp_path, name, source, value_serde="avro")
    with open(config, "a", encoding="utf-8") as file:
        file.write(f'[registry]\nurl = "{url}"\ntimeout = 2\n')
    return ["run", "registry_messages:Discard", "--app-dir", str(HERE), "--config", config]


def produce_orders(kafka: Any, registry_url: str, topic: str, schema: str, count: int) -> None:
    client = SchemaRegistryClient({"url": registry_url})
    produce_with(kafka, topic, AvroSerializer(client, schema),
                 [{"id": f"o-{n}", "amount": n} for n in range(count)])


def stopped_with(stderr: str) -> str:
    """The error type of the run's ``kasper.stopped`` log line."""
    [stopped] = [e for e in json_lines(stderr) if e["event"] == "kasper.stopped"]
    return str(stopped["error_type"])


def test_kasper_run_against_a_hung_registry_fails_uncommitted(
        bootstrap, kafka, new_topic, unique_name, *, registry_url, registry_proxy,
        tmp_path) -> None:
    """A process started while the registry accepts connections and never answers fails
    its first turn with RegistryUnavailableError after about registry.timeout (exit 1,
    the wait named), not hanging; nothing is committed."""
    proxy, proxied = registry_proxy
    source, name = new_topic("hung-in"), unique_name("hung")
    produce_orders(kafka, registry_url, source, ORDER_V1, 3)
    proxy.hang()
    started = time.monotonic()
    result = kasper(*registry_run_args(tmp_path, name, source, proxied), "--until-caught-up",
                    env=cli_env(bootstrap))
    assert time.monotonic() - started < 60  # about 2 s of registry wait, plus the start
    assert result.returncode == 1, result.stderr
    assert stopped_with(result.stderr) == "RegistryUnavailableError"
    assert f"the schema registry at {proxied} did not answer within 2s (registry.timeout)" \
        in result.stderr
    assert proxy.held > 0
    assert kafka.committed(name, source) == {0: None}


def test_sigterm_while_the_registry_hangs_mid_run(
        bootstrap, kafka, new_topic, unique_name, *, registry_url, registry_proxy,
        tmp_path) -> None:
    """The registry hangs mid-run (a new schema id to look up): one SIGTERM sent while the
    lookup is outstanding ends the process within about registry.timeout, exit 1 naming
    RegistryUnavailableError, and the committed offset stays where the last good turn
    left it."""
    proxy, proxied = registry_proxy
    source, name = new_topic("hung-mid"), unique_name("hung-mid")
    produce_orders(kafka, registry_url, source, ORDER_V1, 5)
    log_path = tmp_path / "stderr.log"
    with log_path.open("w") as log:
        process = subprocess.Popen(
            [*kasper_command(), *registry_run_args(tmp_path, name, source, proxied)],
            stderr=log, env=cli_env(bootstrap))
    try:
        wait_for(lambda: kafka.committed(name, source)[0] == 5, "the first orders committed")
        proxy.hang()
        produce_orders(kafka, registry_url, source, ORDER_V2, 3)  # a schema id not cached
        wait_for(lambda: proxy.held > 0, "the loop's request to the registry")
        process.send_signal(signal.SIGTERM)
        signalled = time.monotonic()
        assert process.wait(timeout=60) == 1
        assert time.monotonic() - signalled < 30  # about 2 s; generous for a loaded machine
    finally:
        if process.poll() is None:
            process.kill()
    stderr = log_path.read_text()
    assert stopped_with(stderr) == "RegistryUnavailableError"
    assert "did not answer within 2s (registry.timeout)" in stderr
    assert "Traceback" not in stderr
    assert kafka.committed(name, source) == {0: 5}
