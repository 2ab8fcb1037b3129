"""The registry settings and serdes without a registry: validation, secrets masked,
TOML, subjects per strategy, topic binding, the shared client, and what is refused
before any request."""

from __future__ import annotations

import json
import time

import pytest

from kasper_py import BYTES, JSON, Config, SerdeError
from kasper_py._support.secrets import scrub
from kasper_py.cli.base import load_config
from kasper_py.exceptions import ConfigError, RegistryUnavailableError
from kasper_py.registry import AvroSerde, JsonSchemaSerde, RegistryConfig, shared_client
from kasper_py.serdes import bound_to

URL = "http://127.0.0.1:1/apis/ccompat/v7"
ORDER = json.dumps({"type": "record", "name": "Order", "namespace": "shop",
                    "fields": [{"name": "id", "type": "string"}]})


@pytest.mark.parametrize(("settings", "text"), [
    ({"url": "registry:8081"}, "url must be an http(s) URL"),
    ({"url": URL, "basic_auth": "no-colon"}, "basic_auth must be 'user:password'"),
    ({"url": URL, "subject_strategy": "by-topic"}, "subject_strategy must be one of"),
    ({"url": URL, "auto_register": "yes"}, "auto_register must be true or false"),
    ({"url": URL, "use_latest_version": True}, "use_latest_version needs auto_register"),
    ({"url": URL, "value_schema": "  "}, "value_schema must be a schema"),
    ({"url": URL, "schema": ORDER}, "a table of url, basic_auth"),
    ({"url": URL, "timeout": 0}, "timeout must be a number of seconds above 0, got 0"),
    ({"url": URL, "timeout": "5s"}, "timeout must be a number of seconds"),
])
def test_invalid_settings_name_the_registry(settings, text) -> None:
    """Each bad registry setting is a ConfigError on the ``registry`` field."""
    with pytest.raises(ConfigError) as info:
        RegistryConfig.of(settings)
    assert info.value.field == "registry"
    assert text in str(info.value)


def test_basic_auth_is_masked() -> None:
    """The credentials show in no repr (the registry's or the Config's) and are
    scrubbed from any text."""
    registry = RegistryConfig(URL, basic_auth="svc-user:s3cret-pass-word")
    config = Config(name="p", bootstrap_servers="b:9092", input_topics=["t"],
                    registry=registry)
    assert "s3cret" not in repr(registry) and "s3cret" not in repr(config)
    assert "basic_auth='***'" in repr(registry)
    assert "s3cret" not in scrub("auth svc-user:s3cret-pass-word failed")


def test_toml_table_builds_the_serdes(tmp_path) -> None:
    """A [registry] table and value_serde = "avro" give an AvroSerde with that schema;
    the key stays bytes."""
    path = tmp_path / "kasper.toml"
    path.write_text(f'name = "p"\nbootstrap_servers = "b:9092"\ninput_topics = ["t"]\n'
                    f'value_serde = "avro"\n[registry]\nurl = "{URL}"\n'
                    f"value_schema = '{ORDER}'\nauto_register = false\n")
    config = load_config(str(path), {})
    assert isinstance(config.registry, RegistryConfig)
    assert config.registry.auto_register is False
    assert isinstance(config.value_serde, AvroSerde)
    assert config.value_serde.schema == ORDER and config.key_serde is BYTES


def test_a_url_alone_is_a_registry() -> None:
    """``registry="http://..."`` (KASPER_REGISTRY) is a registry with the defaults."""
    config = Config(name="p", bootstrap_servers="b:9092", input_topics=["t"],
                    key_serde="json_schema", registry=URL)
    assert config.registry == RegistryConfig(URL)
    assert isinstance(config.key_serde, JsonSchemaSerde) and config.key_serde.field == "key"


@pytest.mark.parametrize(("strategy", "subject"), [
    ("topic", "orders-value"), ("record", "shop.Order"), ("topic_record", "orders-shop.Order")])
def test_subject_per_strategy(strategy, subject) -> None:
    """The subject named in errors follows the strategy."""
    serde = AvroSerde(RegistryConfig(URL, subject_strategy=strategy), ORDER)
    assert serde.for_topic("orders").subject == subject


def test_for_topic_is_cached_and_plain_serdes_are_their_own() -> None:
    """One bound serde per topic; a serde without for_topic is used as it is."""
    serde = AvroSerde(RegistryConfig(URL), ORDER)
    bound = serde.for_topic("a")
    assert bound is serde.for_topic("a") is bound.for_topic("a")
    assert bound.topic == "a" and serde.for_topic("b").topic == "b" and serde.topic is None
    assert bound_to(JSON, "a") is JSON and bound_to(serde, "a") is bound


def test_refused_before_any_request() -> None:
    """An unbound serde, and a record not in the wire format, are SerdeErrors without
    asking the registry (nothing listens on its port)."""
    serde = AvroSerde(RegistryConfig(URL), ORDER)
    with pytest.raises(SerdeError, match="bound to no topic"):
        serde.encode({"id": "x"})
    with pytest.raises(SerdeError, match="subject 'orders-value': not the schema registry's "
                                         "wire format \\(magic byte 7b"):
        serde.for_topic("orders").decode(b'{"id": "x"}')
    assert serde.decode(None) is None and serde.encode(None) is None


def test_one_client_per_registry() -> None:
    """Serdes of one registry share a client; other credentials get their own."""
    one, same = RegistryConfig(URL), RegistryConfig(URL, subject_strategy="record")
    other = RegistryConfig(URL, basic_auth="u:p")
    assert shared_client(one) is shared_client(same)
    assert shared_client(one) is not shared_client(other)


def test_a_registry_that_does_not_answer_is_not_the_records_fault() -> None:
    """No registry on the port: RegistryUnavailableError (the turn fails), not a
    SerdeError (which on_decode_error would set the record aside for)."""
    serde = AvroSerde(RegistryConfig(URL), '"long"').for_topic("t")
    with pytest.raises(RegistryUnavailableError, match="schema id 5: the schema registry at "
                                                       f"{URL} did not answer"):
        serde.decode(b"\x00\x00\x00\x00\x05\x02")


def test_every_registry_request_has_a_share_of_the_timeout() -> None:
    """confluent-kafka's client waits forever by default: each of the two attempts per
    URL gets an equal share of ``timeout``, and the one retry waits at most 0.1 s."""
    conf = RegistryConfig(URL, timeout=6).client_conf()
    assert conf["timeout"] == 3 and conf["max.retries"] == 1
    assert conf["retries.max.wait.ms"] == 100
    two_urls = RegistryConfig(f"{URL},http://127.0.0.1:2/apis", timeout=6).client_conf()
    assert two_urls["timeout"] == 1.5
    assert shared_client(RegistryConfig(URL, timeout=6)) is not shared_client(
        RegistryConfig(URL))


@pytest.mark.timeout(60)
def test_a_registry_that_hangs_fails_within_its_timeout(
        hung_server: tuple[str, int]) -> None:
    """A registry that takes the request and never answers: RegistryUnavailableError
    naming the registry and the wait, after about ``timeout`` (not forever)."""
    hung_registry = "http://{}:{}/apis/ccompat/v7".format(*hung_server)
    serde = AvroSerde(RegistryConfig(hung_registry, timeout=1), '"long"').for_topic("t")
    started = time.monotonic()
    with pytest.raises(RegistryUnavailableError) as info:
        serde.decode(b"\x00\x00\x00\x00\x07\x02")
    assert time.monotonic() - started < 30  # about 1 s; generous for a loaded machine
    assert f"schema id 7: the schema registry at {hung_registry} did not answer within " \
           "1s (registry.timeout)" in str(info.value)
