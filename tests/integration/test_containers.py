"""kasper_py.testing.containers on the real container engine (the stack's Podman here):
Kafka and Redis up in containers, a processor run through them end to end, and no
container left behind, after a failing test included."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis
from confluent_kafka.admin import NewTopic

from kasper_py import Config, Message, MessageProcessor, ProcessorContext, Sender, TopicProcessor
from kasper_py.stack._images import IMAGES
from kasper_py.stores.redis import RedisTable
from kasper_py.testing.containers import (
    OWNER_LABEL,
    ContainerStartError,
    KafkaContainer,
    RedisContainer,
    SchemaRegistryContainer,
)
from tests.conftest import KafkaHelper
from tests.container_stack import exists, of_this_process, on_containers, outside_ephemeral_range
from tests.kafka_clients import AdminClient

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]


class CountWords(MessageProcessor):
    """Counts words in Redis and sends each word's new count to ``counts``."""

    def __init__(self, context: ProcessorContext) -> None:
        self.table = context.store("counts")

    def process(self, messages: list[Message], sender: Sender) -> None:
        words = [word for message in messages for word in message.value.split()]
        current = self.table.get_many(sorted(set(words)))
        for word in words:
            current[word] = int(current.get(word) or 0) + 1
        self.table.put_many(current)
        for word, count in sorted(current.items()):
            sender.send("counts-out", str(count), key=word)


def test_a_processor_runs_end_to_end_through_kafka_and_redis_containers(
        engine: Any, unique_name: Callable[[str], str]) -> None:
    """Input produced to the container broker is counted into the container Redis,
    outputs and committed offsets are exact; both containers are gone afterwards."""
    with KafkaContainer() as kafka, RedisContainer() as store:
        ids = [kafka.container_id, store.container_id]
        assert kafka.bootstrap_servers == f"127.0.0.1:{kafka.port}"
        assert outside_ephemeral_range(kafka.port)
        source = unique_name("lines")
        admin = AdminClient({"bootstrap.servers": kafka.bootstrap_servers})
        for topic in (source, "counts-out"):
            admin.create_topics([NewTopic(topic, num_partitions=1)])[topic].result(30)
        helper = KafkaHelper(kafka.bootstrap_servers)
        helper.produce(source, ["a b a", "c a", "b"])
        name = unique_name("wc")
        config = Config(name=name, bootstrap_servers=kafka.bootstrap_servers,
                        input_topics=[source], batch_size=2, batch_wait=0.2,
                        key_serde="str", value_serde="str")
        table = RedisTable("counts", url=store.url, prefix=name, value_serde="json")
        processor = TopicProcessor(config, CountWords, stores=[table])
        try:
            processor.run_loop(until_caught_up=True)
        finally:
            processor.close()
        latest = {m.key(): m.value() for m in helper.read_all("counts-out")}
        assert latest == {b"a": b"3", b"b": b"2", b"c": b"1"}
        assert helper.committed(name, source) == {0: 3}
        client = redis.Redis.from_url(store.url)
        keys = sorted(client.keys(f"{name}/counts/*"))
        assert dict(zip(keys, client.mget(keys), strict=True)) == {
            f"{name}/counts/0/{word}".encode(): count for word, count in
            (("a", b"3"), ("b", b"2"), ("c", b"1"))}
        assert all(exists(engine, container_id) for container_id in ids)
    assert not any(exists(engine, container_id) for container_id in ids)


def test_the_schema_registry_container_registers_and_serves_a_schema(engine: Any) -> None:
    """The Confluent-compatible API of the registry container: a registered schema gets
    an id, is listed under its subject and read back; the container is gone after."""
    schema = '{"type": "record", "name": "Word", "fields": [{"name": "w", "type": "string"}]}'
    with SchemaRegistryContainer() as registry:
        container_id = registry.container_id
        request = urllib.request.Request(
            f"{registry.url}/subjects/words-value/versions", method="POST",
            data=json.dumps({"schema": schema}).encode(),
            headers={"Content-Type": "application/vnd.schemaregistry.v1+json"})
        with urllib.request.urlopen(request, timeout=30) as reply:
            schema_id = json.loads(reply.read())["id"]
        with urllib.request.urlopen(f"{registry.url}/subjects", timeout=30) as reply:
            assert json.loads(reply.read()) == ["words-value"]
        with urllib.request.urlopen(f"{registry.url}/schemas/ids/{schema_id}",
                                    timeout=30) as reply:
            assert json.loads(json.loads(reply.read())["schema"]) == json.loads(schema)
    assert not exists(engine, container_id)


def test_an_error_in_the_with_block_removes_the_container(engine: Any) -> None:
    """The exception reaches the caller and the container does not outlive it."""
    with pytest.raises(ZeroDivisionError), RedisContainer() as store:
        container_id = store.container_id
        assert redis.Redis.from_url(store.url).ping()
        _ = 1 / 0
    assert not exists(engine, container_id)


def test_a_server_that_never_answers_is_removed_with_its_log(engine: Any) -> None:
    """A container whose server exits at start is a ContainerStartError quoting its log,
    and is removed."""
    broken = RedisContainer()
    broken.command = lambda: ["redis-server", "--no-such-option"]  # type: ignore[method-assign]
    with pytest.raises(ContainerStartError, match="no-such-option"):
        broken.start()
    assert of_this_process(engine, "no-such-option") == set()


def test_a_container_of_a_killed_test_run_is_removed_by_the_next_start(engine: Any) -> None:
    """A container whose owner process is gone (a run killed with -9 removes nothing) is
    removed when the next container starts; a live owner's is left alone."""
    image = RedisContainer().local_image
    gone_pid = _exited_pid()
    orphan = engine.containers.create(image, labels={OWNER_LABEL: str(gone_pid)})
    alive = engine.containers.create(image, labels={OWNER_LABEL: str(os.getpid())})
    try:
        with RedisContainer():
            assert not exists(engine, orphan.id)
            assert exists(engine, alive.id)
    finally:
        alive.remove(force=True)
        if exists(engine, orphan.id):
            orphan.remove(force=True)


def _exited_pid() -> int:
    """The pid of a child that has exited and been reaped."""
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid


def test_a_failing_pytest_test_leaves_no_container(engine: Any, tmp_path: Path) -> None:
    """A user's test that fails while holding the session's Redis fixture: pytest reports
    the failure and the fixture removes the container at the session's end."""
    (tmp_path / "conftest.py").write_text(
        'pytest_plugins = ["kasper_py.testing.container_fixtures"]\n')
    (tmp_path / "test_user.py").write_text(textwrap.dedent("""
        import redis

        def test_fails(redis_container):
            open("container-id", "w").write(redis_container.container_id)
            assert redis.Redis.from_url(redis_container.url).ping()
            assert False, "the user's assertion"
    """))
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_user.py"],
        check=False, cwd=tmp_path, capture_output=True, text=True, timeout=300,
        env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert result.returncode == 1, result.stdout + result.stderr
    assert "the user's assertion" in result.stdout
    container_id = (tmp_path / "container-id").read_text()
    assert not exists(engine, container_id)


def test_the_images_command_finds_the_built_images() -> None:
    """`python -m kasper_py.stack images` after a build: each image exists under its
    content tag, none is built again."""
    result = subprocess.run([sys.executable, "-m", "kasper_py.stack", "images"],
                            check=False, capture_output=True, text=True, timeout=1800,
                            cwd=ROOT)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert [line.split(":")[0] for line in lines] == [
        f"localhost/kasper-py/{name}" for name in (
            "debian", "kafka", "redis", "apicurio-registry", "cassandra", "postgres",
            "opensearch")]
    assert all(line.endswith(": exists") for line in lines), lines
    assert lines[1:] == [f"{image().name}: exists" for image in IMAGES.values()]
    subset = subprocess.run([sys.executable, "-m", "kasper_py.stack", "images", "postgres"],
                            check=False, capture_output=True, text=True, timeout=1800,
                            cwd=ROOT)
    assert subset.stdout.splitlines() == [lines[0], f"{IMAGES['postgres']().name}: exists"]


def test_with_kasper_stack_containers_the_suite_runs_on_containers(
        request: pytest.FixtureRequest, engine: Any) -> None:
    """`KASPER_STACK=containers` (make test's second step): the suite's broker is the
    session's Kafka container, and its Cassandra, PostgreSQL and OpenSearch (the fixtures
    the store tests take hand these out) the session's containers, running; workers find
    them through the environment."""
    if not on_containers():
        pytest.skip("the suite runs on the local stack (KASPER_STACK is not containers)")
    bootstrap = request.getfixturevalue("bootstrap")
    kafka = request.getfixturevalue("kafka_container")
    assert bootstrap == kafka.bootstrap_servers == os.environ["KASPER_BOOTSTRAP_SERVERS"]
    assert exists(engine, kafka.container_id)
    for server, variable in (("postgres", "POSTGRES_URL"), ("opensearch", "OPENSEARCH_URL")):
        container = request.getfixturevalue(f"{server}_container")
        assert request.getfixturevalue(f"container_{server}_url") == container.url
        assert os.environ[f"KASPER_{variable}"] == container.url
        assert exists(engine, container.container_id)
    cassandra = request.getfixturevalue("cassandra_container")
    assert request.getfixturevalue("container_cassandra_contact") == cassandra.contact
    assert os.environ["KASPER_CASSANDRA_PORT"] == str(cassandra.port)


def test_kasper_stack_up_podman_serves_the_docker_api() -> None:
    """`kasper stack up podman` (idempotent) leaves the engine running; `status` shows it
    at its unix socket, where the Docker API answers with Podman's version."""
    from kasper_py.stack._engine import api_version

    def kasper_stack(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "kasper_py", "stack", *args],
                              check=False, capture_output=True, text=True, timeout=600,
                              cwd=ROOT)

    up = kasper_stack("up", "podman")
    assert up.returncode == 0, up.stderr
    status = kasper_stack("status")
    (line,) = [line for line in status.stdout.splitlines() if line.startswith("podman ")]
    assert "running" in line
    socket = line.split()[-1].removeprefix("unix://")
    assert socket.endswith("/podman/podman.sock")
    assert '"Name":"Podman Engine"' in (api_version(Path(socket)) or "")
