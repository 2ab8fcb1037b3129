"""PostgreSQL tables on a real PostgreSQL and Kafka, through ``kasper run``: the word
count of postgres_module.py SIGKILLed at every step boundary of a turn, and the server
going away mid-run. After each, the rows are exactly the input below the offsets the
database holds (no duplicate, no gap), the group's committed offsets never pass them,
and a run to the end leaves every row exact once."""
# ruff: noqa: PLR0917 - pytest passes fixtures positionally; tests take several

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest

from kasper_py import Config, StoreError, stack
from kasper_py.steps import BOUNDARIES
from kasper_py.stores.base import StoreRuntime
from kasper_py.stores.postgres import PostgresTable
from kasper_py.stores.query import Scan
from tests.container_stack import on_containers
from tests.on_demand import on_demand

pytest.register_assert_rewrite("conftest_stores")
from conftest_stores import TcpProxy, produce_words, wait_for  # isort: skip  # noqa: E402

pytestmark = pytest.mark.integration

HERE = Path(__file__).parent
PARTITIONS = 2
WORDS = [f"w{i % 23}" for i in range(1200)]
"""600 messages a partition: at batches of 50, a run reaches every boundary thrice."""


@pytest.fixture(scope="session")
def postgres_url(request: pytest.FixtureRequest) -> str:
    """URL of the stack's PostgreSQL, started when it is not running (or
    ``$KASPER_POSTGRES_URL``); fails when it does not answer. With
    ``KASPER_STACK=containers`` a server in a container."""
    if on_containers():
        return str(request.getfixturevalue("container_postgres_url"))
    url = stack.postgres_url()
    on_demand("postgres", url, lambda: psycopg.connect(url, connect_timeout=5).close(),
              external="KASPER_POSTGRES_URL" in os.environ)
    return url


class WordLogRun:
    """``kasper run`` of postgres_module.py over one topic, writing into one table."""

    def __init__(self, tmp_path: Path, bootstrap: str, name: str, topic: str,
                 url: str, guarantee: str = "at_least_once") -> None:
        self.name, self.topic, self.url, self.table = name, topic, url, name.replace("-", "_")
        self.config = tmp_path / "kasper.toml"
        self.config.write_text(
            f'name = "{name}"\nbootstrap_servers = "{bootstrap}"\n'
            f'input_topics = ["{topic}"]\nbatch_size = 50\nbatch_wait = 0.05\n'
            f'value_serde = "str"\nprocessing_guarantee = "{guarantee}"\n')
        self.log = tmp_path / "run.log"

    def start(self, *options: str, url: str | None = None,
              **env: str) -> subprocess.Popen[bytes]:
        environment = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path),
                       "PG_URL": url or self.url, "PG_TABLE": self.table, **env}
        with self.log.open("ab") as out:
            return subprocess.Popen(
                [sys.executable, "-m", "kasper_py", "run", "postgres_module:WordLog",
                 "--stores", "postgres_module:stores", "--app-dir", str(HERE),
                 "--config", str(self.config), "--log-format", "console", *options],
                env=environment, stdout=out, stderr=subprocess.STDOUT)

    def run(self, *options: str, **env: str) -> int:
        return self.start(*options, **env).wait(120)

    def rows(self) -> tuple[dict[int, int], list[tuple[int, int, str]], Counter[str]]:
        """(next offset per partition, appended (partition, offset, word), counts)."""
        with psycopg.connect(self.url) as connection:
            offsets = dict(connection.execute(
                f"SELECT partition, next_offset FROM {self.table}_offsets WHERE prefix = %s",
                (self.name,)).fetchall())
            appended = [json.loads(bytes(v)) for (v,) in connection.execute(
                f"SELECT value FROM {self.table}_appended WHERE prefix = %s ORDER BY seq",
                (self.name,))]
            counts: Counter[str] = Counter()
            for key, value in connection.execute(
                    f"SELECT key, value FROM {self.table} WHERE prefix = %s", (self.name,)):
                counts[bytes(key).decode()] += json.loads(bytes(value))
        return offsets, [(r["partition"], r["offset"], r["word"]) for r in appended], counts


def check_consistent(run: WordLogRun, committed: Callable[[], dict[int, int]], *,
                     behind: bool = False) -> dict[int, int]:
    """The database holds exactly the input below its offsets, appended once each and
    counted once each, and the group's committed offsets are not past them (unless
    ``behind``: under exactly-once the transaction commits before the SQL one); returns
    the database's offsets."""
    offsets, appended, counts = run.rows()
    expected = [(p, o, WORDS[p + PARTITIONS * o]) for p in range(PARTITIONS)
                for o in range(offsets.get(p, 0))]
    assert sorted(appended) == expected
    assert counts == Counter(word for _, _, word in expected)
    for partition, offset in committed().items():
        assert behind or offset <= offsets.get(partition, 0), (partition, committed(), offsets)
    return offsets


@pytest.mark.parametrize("guarantee", ["at_least_once", "exactly_once"])
def test_kill_at_every_step_boundary_keeps_rows_exact(bootstrap, new_topic, kafka,
                                                      unique_name, postgres_url, tmp_path,
                                                      guarantee) -> None:
    """``kasper run`` SIGKILLed at each step boundary in turn (before and after process,
    after the acks, after the SQL transaction, after the commit), each run resuming
    where the last one's database stood: after every kill the rows match the offsets in
    the database exactly, and a last run leaves every message appended once, every word
    counted exactly, the database's and the group's offsets at the end. At-least-once,
    a kill after the SQL commit leaves the database ahead of the group (the replay is
    skipped); exactly-once, the Kafka transaction commits first, so some kill leaves the
    database behind it (the next run starts from the database's offsets)."""
    exactly_once = guarantee == "exactly_once"
    topic = new_topic("pg-words", partitions=PARTITIONS)
    produce_words(kafka, topic, WORDS, PARTITIONS)
    run = WordLogRun(tmp_path, bootstrap, unique_name("pg-kill"), topic, postgres_url,
                     guarantee)
    committed = lambda: {p: o or 0 for p, o in kafka.committed(  # noqa: E731
        run.name, topic, PARTITIONS).items()}
    database_minus_group = {}
    for step in BOUNDARIES:
        assert run.run(PG_KILL_AT=step) == -9, run.log.read_text()[-3000:]
        offsets = check_consistent(run, committed, behind=exactly_once)
        assert sum(offsets.values()) < len(WORDS), f"{step}: the run was not killed mid-way"
        database_minus_group[step] = sum(offsets.values()) - sum(committed().values())
    if exactly_once:
        assert min(database_minus_group.values()) < 0, database_minus_group
    else:
        assert database_minus_group["after_flush"] > 0, database_minus_group
    assert run.run("--until-caught-up") == 0, run.log.read_text()[-3000:]
    end = {p: len(WORDS) // PARTITIONS for p in range(PARTITIONS)}
    assert check_consistent(run, committed) == end
    assert committed() == end


def test_server_gone_mid_run_fails_the_turn_then_the_run_recovers(
        bootstrap, new_topic, kafka, unique_name, postgres_url, tmp_path) -> None:
    """The server goes away (a proxy in front of it closes) while ``kasper run`` writes:
    the turn fails after its retries, the process exits non-zero naming the server, the
    group's offsets are not past the database's; once the server is back, a run to the
    end leaves every row exact once."""
    host, port = postgres_url.split("@")[1].split("/")[0].split(":")
    proxy = TcpProxy((host, int(port)))
    proxy.start()
    try:
        topic = new_topic("pg-outage", partitions=PARTITIONS)
        produce_words(kafka, topic, WORDS, PARTITIONS)
        run = WordLogRun(tmp_path, bootstrap, unique_name("pg-outage"), topic, postgres_url)
        committed = lambda: {p: o or 0 for p, o in kafka.committed(  # noqa: E731
            run.name, topic, PARTITIONS).items()}
        proxied = postgres_url.replace(f":{port}/", f":{proxy.port}/")
        worker = run.start(url=proxied, PG_RETRIES="2", PG_PAUSE="0.05")
        wait_for(lambda: sum(_offsets(run).values()) > 0, "the first transaction")
        proxy.stop()
        assert worker.wait(60) == 1, run.log.read_text()[-3000:]
        assert "StoreUnavailableError" in run.log.read_text()
        assert f"127.0.0.1:{proxy.port}" in run.log.read_text()
        assert sum(check_consistent(run, committed).values()) < len(WORDS)
        proxy.start()
        assert run.start("--until-caught-up", url=proxied).wait(120) == 0
        end = {p: len(WORDS) // PARTITIONS for p in range(PARTITIONS)}
        assert check_consistent(run, committed) == end
        assert committed() == end
    finally:
        proxy.stop()


def _offsets(run: WordLogRun) -> dict[int, Any]:
    try:
        return run.rows()[0]
    except psycopg.errors.UndefinedTable:
        return {}


def _table(postgres_url: str, unique_name: Callable[[str], str]) -> tuple[Any, Config]:
    name = unique_name("pg-api").replace("-", "_")
    config = Config(name=name, bootstrap_servers="127.0.0.1:1", input_topics=["t"])
    return PostgresTable("api", url=postgres_url, table=name), config


def test_a_failed_turn_writes_nothing_and_a_replay_is_not_applied_twice(
        postgres_url, unique_name) -> None:
    """Discarded upserts and appended rows never reach the server; a rollback keeps the
    rows appended before its savepoint; a batch whose offsets the database holds is not
    written again by a store opened afterwards (a replay after a crash)."""
    spec, config = _table(postgres_url, unique_name)
    store = spec.open(StoreRuntime(config, 0))
    store.put("kept", 1)
    store.append("first")
    point = store.savepoint()
    store.append("undone")
    store.put("undone", 2)
    store.rollback(point)
    store.flush({("t", 0): 5})
    store.put_many({"new": 2, "kept": 3})
    store.append_many(["discarded"])
    store.discard_pending()
    store.flush({("t", 0): 5})
    replayed = spec.open(StoreRuntime(config, 0))
    assert replayed.applied_offsets() == {("t", 0): 5}
    replayed.put("kept", 99)
    replayed.append("again")
    replayed.flush({("t", 0): 5})
    assert replayed.get_many(["kept", "new", "undone"]) == {"kept": 1}
    with psycopg.connect(postgres_url) as connection:
        rows = connection.execute(f"SELECT value FROM {spec.table}_appended "
                                  "ORDER BY seq").fetchall()
    assert [json.loads(bytes(v)) for (v,) in rows] == ["first"]
    spec.close()


def test_a_second_writer_of_a_partition_is_fenced(postgres_url, unique_name) -> None:
    """Two stores of one partition: once one has moved the offsets, the other's write
    fails with a StoreError naming the fence, and nothing of it is written."""
    spec, config = _table(postgres_url, unique_name)
    first, second = spec.open(StoreRuntime(config, 1)), spec.open(StoreRuntime(config, 1))
    first.put("a", 1)
    first.flush({("t", 1): 10})
    second.put("a", 2)
    second.append("lost")
    with pytest.raises(StoreError, match=r"partition 1 fenced: offset of t is 10, expected None"):
        second.flush({("t", 1): 20})
    assert spec.open(StoreRuntime(config, 1)).get_many(["a"]) == {"a": 1}
    spec.close()


def test_queries_read_committed_rows_in_key_order(postgres_url, unique_name) -> None:
    """``query_get_many`` reads what turns committed (not the pending writes); scans
    are ordered by key, take ranges and page with a cursor."""
    spec, config = _table(postgres_url, unique_name)
    store = spec.open(StoreRuntime(config, 0))
    store.put_many({f"k{i}": i for i in range(5)})
    store.flush({("t", 0): 1})
    store.put("k9", 9)
    assert store.query_get_many(["k1", "k9"]) == {"k1": 1}
    first = store.query_scan(Scan(prefix=b"k", limit=2))
    assert (first.items, first.ordered) == ([("k0", 0), ("k1", 1)], True)
    rest = store.query_scan(Scan(prefix=b"k", limit=5, cursor=first.cursor))
    assert (rest.items, rest.cursor) == ([("k2", 2), ("k3", 3), ("k4", 4)], None)
    ranged = store.query_scan(Scan(start=b"k1", end=b"k3", limit=10))
    assert ranged.items == [("k1", 1), ("k2", 2)]
    spec.close()
