"""PostgreSQL tables on a real PostgreSQL and Kafka, through ``kasper run``: the word
count of postgres_module.py SIGKILLed at every step boundary of a turn, and the server
going away mid-run. After each, the rows are exactly the input below the offsets the
database holds (no duplicate, no gap), the group's committed offsets never pass them,
and a run to the end leaves every row exact once."""
# ruff: noqa: PLR0917 - pytest passes fixtures positionally; tests take several

from __future__ import annotations

import json
import os
import signal
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
from conftest_stores import TcpProxy, free_port, produce_words, wait_for  # isort: skip  # noqa: E402

pytestmark = pytest.mark.integration

HERE = Path(__file__).parent
PARTITIONS = 2
WORDS = [f"w{i % 23}" for i in range(1200)]
STORE = "words"
"""postgres_module.STORE: the table `kasper query` reads."""
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
            appended = [v for (v,) in connection.execute(  # jsonb: psycopg decodes it
                f"SELECT value FROM {self.table}_appended WHERE prefix = %s ORDER BY seq",
                (self.name,))]
            counts: Counter[str] = Counter()
            for key, value in connection.execute(
                    f"SELECT key, value FROM {self.table} WHERE prefix = %s", (self.name,)):
                counts[bytes(key).decode()] += value
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


def test_kasper_query_reads_a_postgres_table_through_the_query_server(
        bootstrap, new_topic, kafka, unique_name, postgres_url, tmp_path) -> None:
    """``kasper run --query-port`` serves the PostgreSQL table: ``kasper query`` (a
    subprocess) reads one word's count in a partition and a prefix scan of the other,
    equal to the input's counts there (the words are spread over the partitions by
    position, not by key); a key never written is not found (exit 1, named); a SIGTERM
    ends the run cleanly."""
    topic = new_topic("pg-query", partitions=PARTITIONS)
    produce_words(kafka, topic, WORDS, PARTITIONS)
    run = WordLogRun(tmp_path, bootstrap, unique_name("pg-query"), topic, postgres_url)
    port = free_port()
    worker = run.start("--query-port", str(port))
    url = f"http://127.0.0.1:{port}"
    expected = [Counter(WORDS[partition::PARTITIONS]) for partition in range(PARTITIONS)]
    query = lambda *args: subprocess.run(  # noqa: E731
        [sys.executable, "-m", "kasper_py", "query", "--url", url, STORE, *args],
        check=False, capture_output=True, text=True, timeout=60,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    try:
        wait_for(lambda: sum(_offsets(run).values()) == len(WORDS), "every word counted",
                 timeout=90)
        answer = query("w7", "--partition", "0")
        assert (answer.returncode, answer.stdout) == (0, f"{expected[0]['w7']}\n"), answer
        answer = query("--prefix", "w1", "--partition", "1")
        assert answer.returncode == 0, answer.stderr
        assert dict(map(json.loads, answer.stdout.splitlines())) == {
            word: count for word, count in expected[1].items() if word.startswith("w1")}
        answer = query("nope", "--partition", "0")
        assert answer.returncode == 1 and "nope" in answer.stderr, answer
    finally:
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(60) == 0, run.log.read_text()[-3000:]


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
    assert [v for (v,) in rows] == ["first"]
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


def test_json_values_are_jsonb_and_a_bytea_table_made_before_keeps_working(
        postgres_url, unique_name) -> None:
    """With the json serde values are typed jsonb, readable field by field in SQL; a
    table made with bytea values (before jsonb) is written and read as before; another
    serde's values stay bytea."""
    spec, config = _table(postgres_url, unique_name)
    store = spec.open(StoreRuntime(config, 0))
    store.put("ada", {"visits": 3, "city": "Paris"})
    store.append({"word": "hello"})
    store.flush({("t", 0): 1})
    with psycopg.connect(postgres_url) as connection:
        assert connection.execute(f"SELECT value->>'city', pg_typeof(value)::text "
                                  f"FROM {spec.table}").fetchall() == [("Paris", "jsonb")]
        assert connection.execute(f"SELECT value->>'word' FROM {spec.table}_appended"
                                  ).fetchall() == [("hello",)]
        old = unique_name("pg_old").replace("-", "_")
        connection.execute(f"CREATE TABLE {old} (prefix text, partition int, key bytea, "
                           "value bytea NOT NULL, PRIMARY KEY (prefix, partition, key))")
        connection.execute(f"CREATE TABLE {old}_appended (prefix text, partition int, seq "
                           "bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, value bytea "
                           "NOT NULL)")
        connection.execute(f"INSERT INTO {old} VALUES (%s, 0, 'ada', %s)",
                           (config.name, b'{"visits":1}'))
    legacy = PostgresTable("api", url=postgres_url, table=old)
    store = legacy.open(StoreRuntime(config, 0))
    assert store.get_many(["ada"]) == {"ada": {"visits": 1}}
    store.put("bob", {"visits": 2})
    store.append({"word": "again"})
    store.flush({("t", 0): 1})
    assert legacy.open(StoreRuntime(config, 0)).get_many(["ada", "bob"]) == {
        "ada": {"visits": 1}, "bob": {"visits": 2}}
    assert store.query_get_many(["bob"]) == {"bob": {"visits": 2}}
    plain = PostgresTable("api", url=postgres_url, table=f"{old}_s", value_serde="str")
    text = plain.open(StoreRuntime(config, 0))
    text.put("k", "v")
    text.flush({("t", 0): 1})
    with psycopg.connect(postgres_url) as connection:
        assert connection.execute(f"SELECT value FROM {old} WHERE key = 'bob'").fetchall(
            ) == [(b'{"visits":2}',)]
        assert connection.execute(f"SELECT value FROM {old}_appended").fetchall() == [
            (b'{"word":"again"}',)]
        assert connection.execute(f"SELECT pg_typeof(value)::text, value FROM {old}_s"
                                  ).fetchall() == [("bytea", b"v")]
    for table in (spec, legacy, plain):
        table.close()
