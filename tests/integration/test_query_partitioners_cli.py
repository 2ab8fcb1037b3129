"""Key lookups with any producer, through the CLI: input written by a plain
confluent-kafka ``Producer`` (librdkafka's crc32 ``consistent_random``), counted by
``kasper run`` with the default settings, read with ``kasper query``: each key is found,
with a note naming ``query_partitioner``; a json-keyed table's errors reach the shell
as the server words them."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from kasper_py.query import QueryClient, partition_for
from tests.kafka_clients import Producer

sys.path.insert(0, str(Path(__file__).parent))
pytest.register_assert_rewrite("conftest_stores")
from conftest_stores import free_port, wait_for  # isort: skip  # noqa: E402
from test_cli import cli_env, kasper  # isort: skip  # noqa: E402
from test_queries_cli import running  # isort: skip  # noqa: E402, F401 - the fixture

pytestmark = pytest.mark.integration
pytest_plugins = ["conftest_stores"]

HERE = Path(__file__).parent
PARTITIONS = 4
KEYS = [f"user-{i}" for i in range(12)]
SETTING = ('set query_partitioner = "crc32" (TOML, KASPER_QUERY_PARTITIONER=crc32 or '
           'Config(query_partitioner=...))')


def _produce_plain(bootstrap: str, topic: str, keys: list[bytes]) -> None:
    """Key i written i % 3 + 1 times by confluent-kafka's default producer (crc32)."""
    producer = Producer({"bootstrap.servers": bootstrap})
    for i, key in enumerate(keys):
        for _ in range(i % 3 + 1):
            producer.produce(topic, b"x", key)
    assert producer.flush(30) == 0


def _config(tmp_path: Path, name: str, topic: str, port: int, key_serde: str) -> str:
    path = tmp_path / f"{name}.toml"
    path.write_text(f'name = "{name}"\ninput_topics = ["{topic}"]\nbatch_wait = 0.2\n'
                    f'key_serde = "{key_serde}"\nstate_dir = "{tmp_path / "state"}"\n'
                    f"query_port = {port}\n")
    return str(path)


def _served(client: QueryClient, count: int) -> bool:
    try:
        return len(list(client.scan("counts", page=100))) == count
    except Exception:  # not serving yet
        return False


def test_kasper_query_finds_keys_of_a_plain_producer(  # noqa: PLR0917
        bootstrap: str, new_topic: Callable[..., str], unique_name: Callable[[str], str],
        tmp_path: Path, delete_changelogs: None, running: Any) -> None:  # noqa: F811
    """Default settings (murmur2): every key a crc32 producer wrote is found by ``kasper
    query`` (exit 0, the count on stdout) with the note on stderr; an absent key exits 1
    naming the partitions looked in."""
    topic = new_topic("q-crc-in", partitions=PARTITIONS)
    _produce_plain(bootstrap, topic, [k.encode() for k in KEYS])
    port = free_port()
    env = cli_env(bootstrap)
    running("run", "queries_module:Count", "--stores", "queries_module:stores", "--app-dir",
            str(HERE), "--config", _config(tmp_path, unique_name("q-crc"), topic, port, "str"),
            env=env)
    url = f"http://127.0.0.1:{port}"
    wait_for(lambda: _served(QueryClient(url), len(KEYS)), "every count served", timeout=90)
    moved = 0
    for i, key in enumerate(KEYS):
        answer = kasper("query", "--url", url, "counts", key, env=env)
        assert (answer.returncode, answer.stdout) == (0, f"{i % 3 + 1}\n"), answer.stderr
        crc32, murmur2 = (partition_for(key.encode(), PARTITIONS, p)
                          for p in ("crc32", "murmur2"))
        if crc32 == murmur2:
            assert answer.stderr == ""
            continue
        moved += 1
        assert answer.stderr == (
            f"kasper query: note: key {key!r} was found in input partition {crc32}, where "
            "the crc32 partitioner (librdkafka's default consistent_random: a plain "
            f"confluent-kafka, Go or .NET producer) puts it, not in partition {murmur2} "
            f"(query_partitioner='murmur2'): {SETTING}\n")
    assert moved >= 6
    missing = kasper("query", "--url", url, "counts", "nobody", env=env)
    homes = [partition_for(b"nobody", PARTITIONS, p) for p in ("murmur2", "crc32")]
    assert (missing.returncode, missing.stdout) == (1, "")
    assert missing.stderr == (
        "kasper query: error: table 'counts' has no value for key 'nobody' (looked in "
        f"input partition {homes[0]} (murmur2) and {homes[1]} (crc32))\n")


def test_kasper_query_passes_on_a_json_key_hint(  # noqa: PLR0917
        bootstrap: str, new_topic: Callable[..., str], unique_name: Callable[[str], str],
        tmp_path: Path, delete_changelogs: None, running: Any) -> None:  # noqa: F811
    """A json-keyed table: a bare word is refused (exit 2) with the server's own hint,
    word for word; the JSON text of the key finds it."""
    topic = new_topic("q-json-in", partitions=PARTITIONS)
    _produce_plain(bootstrap, topic, [json.dumps(k).encode() for k in KEYS])
    port = free_port()
    env = cli_env(bootstrap)
    running("run", "queries_module:Count", "--stores", "queries_module:json_stores",
            "--app-dir", str(HERE), "--config",
            _config(tmp_path, unique_name("q-json"), topic, port, "json"), env=env)
    url = f"http://127.0.0.1:{port}"
    wait_for(lambda: _served(QueryClient(url), len(KEYS)), "every count served", timeout=90)
    bare = kasper("query", "--url", url, "counts", "user-4", env=env)
    assert (bare.returncode, bare.stdout) == (2, ""), bare.stderr
    assert bare.stderr.startswith(
        "kasper query: error: key b'user-4' of table 'counts' does not decode with its key "
        "serde 'json': ")
    assert bare.stderr.endswith(
        '; json keys are written as JSON text: a string in quotes ("user-4", %22...%22 in '
        "a URL), a number as digits\n")
    quoted = kasper("query", "--url", url, "counts", '"user-4"', env=env)
    assert (quoted.returncode, quoted.stdout) == (0, "2\n"), quoted.stderr
