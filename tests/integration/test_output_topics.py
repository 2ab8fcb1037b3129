"""Output topics through `kasper run` against the stack's Kafka: a send to a topic that
does not exist (a typo) stops the run at once, uncommitted, and creates nothing, even on
a broker that creates topics on demand; declared output topics are created with
`--create-topics`, and a declared partition count that disagrees refuses to start."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka.admin import ConfigResource
from test_cli import cli_env, kasper, run_args, write_config

from tests.kafka_clients import AdminClient

pytestmark = pytest.mark.integration

N = 10
NO_DELIVERY_WAIT = 600.0
"""delivery_timeout of the runs, past the CLI helper's 90 s timeout: a run that noticed a
missing topic only by waiting out its deliveries would time out the test."""


@pytest.fixture
def absent_topic(bootstrap: str, unique_name: Callable[[str], str]
                 ) -> Iterator[Callable[[str], str]]:
    """Names of topics that do not exist; whichever exists after the test (created by
    the run under test) is deleted."""
    names: list[str] = []

    def name(prefix: str) -> str:
        names.append(unique_name(prefix))
        return names[-1]

    yield name
    admin = AdminClient({"bootstrap.servers": bootstrap})
    existing = [n for n in names if n in admin.list_topics(timeout=30).topics]
    for future in (admin.delete_topics(existing).values() if existing else ()):
        with contextlib.suppress(Exception):  # cleanup of a test topic is best-effort
            future.result(30)


def topics(bootstrap: str) -> dict[str, Any]:
    """Every topic's metadata, listed in a way that never creates one."""
    return dict(AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=30).topics)


def error_line(stderr: str) -> str:
    [line] = [line for line in stderr.splitlines() if line.startswith("kasper:")]
    return line


def test_a_send_to_a_misspelt_topic_stops_the_run_uncommitted(  # noqa: PLR0917 - fixtures
        bootstrap: str, new_topic: Callable[..., str], absent_topic: Callable[[str], str],
        kafka: Any, unique_name: Callable[[str], str], tmp_path: Path) -> None:
    """A processor sending to a topic that does not exist fails its first turn: `kasper
    run` exits 1 with one line naming the topic and the processor, before any delivery
    timeout; the input offsets stay uncommitted and the topic is not created."""
    source, typo = new_topic("typo-in"), absent_topic("ordres")
    kafka.produce(source, [f"m{i}".encode() for i in range(N)])
    name = unique_name("cli-typo")
    config = write_config(tmp_path, name, source, delivery_timeout=NO_DELIVERY_WAIT)
    result = kasper(*run_args(config, "--until-caught-up"), env=cli_env(bootstrap, typo))
    assert result.returncode == 1, result.stderr
    line = error_line(result.stderr)
    assert f"processor {name!r}" in line and f"{typo!r} (does not exist)" in line
    assert kafka.committed(name, source) == {0: None}
    assert typo not in topics(bootstrap)


def test_create_topics_creates_the_declared_output_topics(  # noqa: PLR0917 - fixtures
        bootstrap: str, new_topic: Callable[..., str], absent_topic: Callable[[str], str],
        kafka: Any, unique_name: Callable[[str], str], tmp_path: Path) -> None:
    """A declared output topic that does not exist refuses to start without
    `--create-topics` (nothing processed or created); with it, the topic is created with
    the declared partitions and settings, and the run delivers every output to it."""
    source, sink = new_topic("decl-in", partitions=2), absent_topic("decl-out")
    kafka.produce(source, [(f"k{i}".encode(), f"m{i}".encode()) for i in range(N)])
    name = unique_name("cli-declared")
    config = Path(write_config(tmp_path, name, source))
    config.write_text(config.read_text() + f'[[output_topics]]\nname = "{sink}"\npartitions = 3\n'
                      '[output_topics.config]\n"retention.ms" = 3600000\n')
    refused = kasper(*run_args(str(config), "--until-caught-up"), env=cli_env(bootstrap, sink))
    assert refused.returncode == 3, refused.stderr
    assert f"declared output topics {sink!r} do not exist" in error_line(refused.stderr)
    assert sink not in topics(bootstrap)

    result = kasper(*run_args(str(config), "--create-topics", "--until-caught-up"),
                    env=cli_env(bootstrap, sink))
    assert result.returncode == 0, result.stderr
    assert len(topics(bootstrap)[sink].partitions) == 3
    admin = AdminClient({"bootstrap.servers": bootstrap})
    resource = ConfigResource("topic", sink)
    assert admin.describe_configs([resource])[resource].result(30)["retention.ms"].value == \
        "3600000"
    assert sorted(m.value() for m in kafka.read_all(sink)) == sorted(
        f"M{i}".encode() for i in range(N))
    assert sum(o or 0 for o in kafka.committed(name, source, partitions=2).values()) == N


def test_a_declared_partition_count_that_disagrees_refuses_to_start(
        bootstrap: str, new_topic: Callable[..., str], kafka: Any,
        unique_name: Callable[[str], str], tmp_path: Path) -> None:
    """A declared output topic that exists with another partition count than declared
    refuses to start, with or without `--create-topics`: exit 3, one line naming the
    topic, the declared and the actual count; nothing is processed."""
    source, sink = new_topic("count-in"), new_topic("count-out", partitions=2)
    kafka.produce(source, [f"m{i}".encode() for i in range(N)])
    name = unique_name("cli-count")
    config = write_config(tmp_path, name, source)
    for extra in ((), ("--create-topics",)):
        result = kasper(*run_args(config, "--output-topics", f"{sink}:3", "--until-caught-up",
                                  *extra), env=cli_env(bootstrap, sink))
        assert result.returncode == 3, result.stderr
        assert (f"output topic {sink!r} is declared with 3 partitions but has 2"
                in error_line(result.stderr))
    assert kafka.committed(name, source) == {0: None}
    assert kafka.read_all(sink) == []
