"""The tests' own confluent-kafka clients (``tests/kafka_clients.py``) log through the
library's client log, never to the run's stderr, and every test module builds its
clients from there."""

from __future__ import annotations

import ast
import gc
from pathlib import Path

import confluent_kafka
import pytest

from tests import kafka_clients

TESTS = Path(__file__).parents[1]
_CLIENTS = {"Producer", "Consumer", "AdminClient"}


def _unreachable(client: type) -> None:
    """A client of ``client``'s kind asks a closed port for metadata, then is destroyed."""
    built = client({"bootstrap.servers": "127.0.0.1:1", "group.id": "g",
                    "reconnect.backoff.max.ms": 100})
    with pytest.raises(confluent_kafka.KafkaException):
        built.list_topics(timeout=0.5)
    del built
    gc.collect()


def test_librdkafka_lines_of_the_tests_clients_stay_off_stderr(
        capfd: pytest.CaptureFixture[str]) -> None:
    """A raw client that cannot connect prints ``%3|...|FAIL|...`` to stderr; the tests'
    clients of each kind print nothing there."""
    _unreachable(confluent_kafka.Producer)
    assert "|FAIL|" in capfd.readouterr().err
    for client in (kafka_clients.Producer, kafka_clients.Consumer, kafka_clients.AdminClient):
        _unreachable(client)
        assert "%" not in capfd.readouterr().err, client


def test_no_test_module_builds_a_raw_client() -> None:
    """Every ``from confluent_kafka[.admin] import`` of a client class in tests/ is
    ``tests.kafka_clients``'s instead (a subprocess's script, a string, is its own)."""
    raw = []
    for path in sorted(TESTS.rglob("*.py")):
        if path.name == "kafka_clients.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.ImportFrom) and node.module in (
                    "confluent_kafka", "confluent_kafka.admin")
                    and _CLIENTS & {alias.name for alias in node.names}):
                raw.append(f"{path.relative_to(TESTS)}:{node.lineno}")
    assert raw == []
