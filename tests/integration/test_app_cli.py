"""`kasper run module:app` and `kasper app describe|reset` as a user runs them, against
the stack's Kafka, with the two-stage app of app_module.py (parse, repartition by user,
count per user in RocksDB). Fresh topics and app name per test; the topics the app
creates (its repartition and changelog) are deleted after it."""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka.admin import NewTopic
from test_cli import cli_env, kasper, kasper_command, wait_for

from tests.kafka_clients import AdminClient

pytestmark = pytest.mark.integration

HERE = Path(__file__).parent
N = 60
USERS = 5
PARTITIONS = 3


@pytest.fixture
def app_topics(bootstrap: str, unique_name: Callable[[str], str]) -> Iterator[AdminClient]:
    """An admin client; the internal topics this test's apps created are deleted after."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    yield admin
    run = unique_name("")  # "-<run id>", the suffix of every name made in this test
    topics = [t for t in admin.list_topics(timeout=30).topics
              if run in t and t.endswith(("-repartition", "-changelog"))]
    for future in (admin.delete_topics(topics).values() if topics else ()):
        with contextlib.suppress(Exception):  # cleanup is best-effort
            future.result(30)


class AppRun:
    """One app's topics, config file and environment, and its commands."""

    def __init__(self, bootstrap: str, new_topic: Callable[..., str], kafka: Any,
                 name: str, tmp_path: Path, **env: str) -> None:
        self.source = new_topic("app-views", partitions=PARTITIONS)
        self.sink = new_topic("app-counts", partitions=PARTITIONS)
        self.name, self.kafka = name, kafka
        self.repartition = f"{name}-by-user-repartition"
        self.state = tmp_path / "state"
        self.config = tmp_path / "kasper.toml"
        self.config.write_text(f'name = "{name}"\nbatch_wait = 0.5\nbatch_size = 25\n'
                               f'state_dir = "{self.state}"\n')
        self.env = cli_env(bootstrap, APP_SOURCE_TOPIC=self.source,
                           APP_OUTPUT_TOPIC=self.sink, **env)

    def args(self, *command: str) -> list[str]:
        """``command`` on app_module:app with this run's config."""
        return [*command, "app_module:app", "--app-dir", str(HERE), "--config",
                str(self.config)]

    def __call__(self, *command: str) -> subprocess.CompletedProcess[str]:
        return kasper(*self.args(*command), env=self.env)

    def produce_views(self) -> None:
        """N page views ``u<i % USERS>,p<i>`` keyed by session ``s<i % 7>``."""
        self.kafka.produce(self.source, [(f"s{i % 7}".encode(), f"u{i % USERS},p{i}".encode())
                                         for i in range(N)])

    def committed(self, topic: str) -> dict[int, int | None]:
        """The app's committed offsets of ``topic``."""
        return self.kafka.committed(self.name, topic, partitions=PARTITIONS)

    def counts_by_user(self) -> dict[str, list[int]]:
        """Every count sent per user, in the order the output holds them."""
        found: dict[str, list[int]] = defaultdict(list)
        for message in sorted(self.kafka.read_all(self.sink),
                              key=lambda m: (m.partition(), m.offset())):
            found[message.key().decode()].append(int(message.value()))
        return dict(found)


@pytest.fixture
def new_app(new_topic: Callable[..., str], kafka: Any, unique_name: Callable[[str], str],
            tmp_path: Path, app_topics: AdminClient) -> Callable[..., AppRun]:
    """Makes a fresh app run (topics, name, config; ``env``: app_module's settings),
    its input not yet produced."""
    return lambda **env: AppRun(kafka.bootstrap, new_topic, kafka, unique_name("clicks"),
                                tmp_path, **env)


@pytest.fixture
def app_run(new_app: Callable[..., AppRun]) -> AppRun:
    """A fresh app run of the app as declared."""
    return new_app()


def expected_counts(times: int = 1) -> dict[str, list[int]]:
    """Each user's counts 1..n, ``times`` over: what ``times`` full runs send."""
    per_user = Counter(f"u{i % USERS}" for i in range(N))
    return {user: list(range(1, n + 1)) * times for user, n in per_user.items()}


def partition_counts(admin: AdminClient, topic: str) -> int:
    """How many partitions ``topic`` has (0: it does not exist)."""
    meta = admin.list_topics(timeout=30).topics.get(topic)
    return 0 if meta is None or meta.error is not None else len(meta.partitions)


def test_run_app_creates_its_repartition_and_commits_both_stages(
        app_run: AppRun, app_topics: AdminClient) -> None:
    """`kasper run module:app --until-caught-up` creates the repartition topic with the
    source's partition count, sends every user's counts exactly (1..n, in order), and
    commits every offset of the source and of the repartition topic."""
    app_run.produce_views()
    result = app_run("run", "--until-caught-up")
    assert result.returncode == 0, result.stderr
    assert partition_counts(app_topics, app_run.repartition) == PARTITIONS
    assert app_run.counts_by_user() == expected_counts()
    assert sum(o or 0 for o in app_run.committed(app_run.source).values()) == N
    assert sum(o or 0 for o in app_run.committed(app_run.repartition).values()) == N


def test_describe_prints_the_topology_as_text_and_json(app_run: AppRun) -> None:
    """`kasper app describe` names the processors in turn order, their inputs, outputs
    and store, and the repartition topic named after Config.name; `--json` the same."""
    text = app_run("app", "describe")
    assert text.returncode == 0, text.stderr
    assert text.stdout.splitlines() == [
        f"app clicks (Config.name {app_run.name})",
        f"  sources: {app_run.source}",
        "  1. processor parse",
        f"       inputs:  topic:{app_run.source}",
        f"       outputs: repartition:by-user ({app_run.repartition})",
        "  2. processor count",
        f"       inputs:  repartition:by-user ({app_run.repartition})",
        f"       outputs: topic:{app_run.sink}",
        "       stores:  counts (RocksDBTable)",
        f"  internal topics: {app_run.repartition}"]
    as_json = app_run("app", "describe", "--json")
    assert as_json.returncode == 0, as_json.stderr
    topology = json.loads(as_json.stdout)
    assert (topology["app"], topology["name"]) == ("clicks", app_run.name)
    assert topology["sources"] == [app_run.source]
    assert [p["name"] for p in topology["processors"]] == ["parse", "count"]
    assert topology["processors"][1]["stores"] == [{"name": "counts", "kind": "RocksDBTable"}]
    assert topology["internal_topics"] == [app_run.repartition]


def test_describe_lists_a_dsl_apps_operators_per_stage(bootstrap: str) -> None:
    """`kasper app describe` of a streams-DSL app (dsl_app_module.py) prints each stage
    as a processor with its operators in order: generated names counting up across the
    builder, the user's names where given, what each reads, sends to or stores, and
    the operators it hands its records to."""
    result = kasper("app", "describe", "dsl_app_module:app", "--app-dir", str(HERE),
                    env=cli_env(bootstrap))
    assert result.returncode == 0, result.stderr
    by_word = "repartition:by-word (dsl-describe-by-word-repartition)"
    assert result.stdout.splitlines() == [
        "app dsl-describe (Config.name dsl-describe)",
        "  sources: describe-lines",
        "  1. processor stage-0",
        "       inputs:  topic:describe-lines",
        f"       outputs: {by_word}",
        "       operators:",
        "         KSTREAM-SOURCE-0000000000 source [topic:describe-lines] --> non-empty",
        "         non-empty filter --> KSTREAM-FLATMAPVALUES-0000000001",
        "         KSTREAM-FLATMAPVALUES-0000000001 flat_map_values"
        " --> KSTREAM-KEY-SELECT-0000000002",
        "         KSTREAM-KEY-SELECT-0000000002 select_key --> KSTREAM-COMBINE-0000000003",
        f"         KSTREAM-COMBINE-0000000003 combine [{by_word}]",
        "  2. processor stage-1",
        f"       inputs:  {by_word}",
        "       outputs: topic:describe-counts",
        "       stores:  counts (MemoryTable)",
        "       operators:",
        f"         KSTREAM-SOURCE-0000000004 source [{by_word}]"
        " --> KSTREAM-AGGREGATE-0000000005",
        "         KSTREAM-AGGREGATE-0000000005 count [store:counts]"
        " --> KTABLE-TOSTREAM-0000000006",
        "         KTABLE-TOSTREAM-0000000006 to_stream --> counts-out",
        "         counts-out to [topic:describe-counts]",
        "  internal topics: dsl-describe-by-word-repartition"]


def test_describe_lists_the_kept_times_store_of_a_dsl_app_stamping_latest(
        bootstrap: str) -> None:
    """`kasper app describe` of the same app built with ``timestamps="latest"`` lists
    the count's kept times beside its values, and nothing else changes."""
    result = kasper("app", "describe", "dsl_app_module:timed_app", "--app-dir", str(HERE),
                    env=cli_env(bootstrap))
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "app dsl-describe-timed (Config.name dsl-describe-timed)"
    assert [line for line in lines if "stores:" in line] == [
        "       stores:  counts (MemoryTable), counts-timestamps (MemoryTable)"]
    assert lines[-1] == "  internal topics: dsl-describe-timed-by-word-repartition"


def test_reset_dry_run_then_execute_then_reprocess(app_run: AppRun,
                                                   app_topics: AdminClient) -> None:
    """`kasper app reset` prints what it would delete and changes nothing; with
    `--execute` the repartition and changelog topics, the group's offsets and the
    RocksDB folder are gone, and the next run reprocesses the source from its beginning,
    sending the same counts again."""
    app_run.produce_views()
    assert app_run("run", "--until-caught-up").returncode == 0
    changelog = f"{app_run.name}-counts-changelog"
    folder = app_run.state / app_run.name / "counts"
    before = app_run.committed(app_run.source)
    plan = [
        f"reset of app clicks (Config.name {app_run.name}, group {app_run.name}):",
        f"  delete topic {app_run.repartition} ({PARTITIONS} partitions)",
        f"  delete topic {changelog} ({PARTITIONS} partitions)",
        f"  delete group {app_run.name} (committed offsets of {2 * PARTITIONS} partitions: "
        f"{app_run.source}, {app_run.repartition})",
        f"  delete local state {folder}",
        f"  sources {app_run.source}: nothing committed, the next start reads them from "
        "auto_offset_reset (earliest)"]
    dry = app_run("app", "reset")
    assert dry.returncode == 0, dry.stderr
    assert dry.stdout.splitlines() == [
        *plan, "dry run: nothing changed; run again with --execute to reset"]
    assert partition_counts(app_topics, app_run.repartition) == PARTITIONS
    assert app_run.committed(app_run.source) == before
    assert folder.is_dir()

    done = app_run("app", "reset", "--execute")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [*plan, "app clicks reset: deleted 2 topics, 1 group, "
                                        "1 local state folder"]
    assert partition_counts(app_topics, app_run.repartition) == 0
    assert partition_counts(app_topics, changelog) == 0
    assert set(app_run.committed(app_run.source).values()) == {None}
    assert not folder.exists()

    again = app_run("run", "--until-caught-up")
    assert again.returncode == 0, again.stderr
    assert app_run.counts_by_user() == expected_counts(times=2)
    assert app_run.committed(app_run.source) == before


def test_reset_refused_while_the_app_runs(app_run: AppRun, app_topics: AdminClient,
                                          tmp_path: Path) -> None:
    """`kasper app reset --execute` while `kasper run` runs the app (a static
    assignment: no group member, but its commit notes say it runs) exits 5 with one
    line, and deletes nothing."""
    app_run.produce_views()
    with (tmp_path / "run.log").open("w") as log:
        loop = subprocess.Popen([*kasper_command(), *app_run.args("run")], stderr=log,
                                env=app_run.env)
    try:
        wait_for(lambda: sum(o or 0 for o in app_run.committed(app_run.repartition).values())
                 == N, "both stages to be committed")
        committed = app_run.committed(app_run.source)
        refused = app_run("app", "reset", "--execute")
        assert refused.returncode == 5, refused.stderr
        assert refused.stderr.startswith(f"kasper: error: group {app_run.name!r} is being "
                                         "processed: a kasper loop is running")
        assert len(refused.stderr.splitlines()) == 1
        assert partition_counts(app_topics, app_run.repartition) == PARTITIONS
        assert app_run.committed(app_run.source) == committed
        loop.send_signal(signal.SIGTERM)
        assert loop.wait(timeout=60) == 0
    finally:
        if loop.poll() is None:
            loop.kill()
    assert app_run.counts_by_user() == expected_counts()


def test_a_repartition_declared_with_its_own_count_runs_with_it(
        new_app: Callable[..., AppRun], app_topics: AdminClient) -> None:
    """A repartition declared with 2 partitions over 3-partition sources is created with
    2 (its stage reads it alone), every user's counts are exact, and every partition of
    both topics is committed."""
    run = new_app(APP_REPARTITION_PARTITIONS="2")
    run.produce_views()
    result = run("run", "--until-caught-up")
    assert result.returncode == 0, result.stderr
    assert partition_counts(app_topics, run.repartition) == 2
    assert run.counts_by_user() == expected_counts()
    assert None not in run.committed(run.source).values()
    assert sum(o or 0 for o in run.committed(run.repartition).values()) == N


def test_existing_repartition_with_another_count_refuses_to_start(
        app_run: AppRun, app_topics: AdminClient, bootstrap: str) -> None:
    """An existing repartition topic with 2 partitions under 3-partition sources refuses
    to start (exit 3) naming both counts, and points at `kasper app reset`."""
    app_topics.create_topics([NewTopic(app_run.repartition, 2, 1)])[
        app_run.repartition].result(30)
    app_run.produce_views()
    result = app_run("run", "--until-caught-up")
    assert result.returncode == 3, result.stderr
    assert result.stderr == (
        f"kasper: error: internal topic {app_run.repartition!r} has 2 partitions on "
        f"{bootstrap}, but the app runs it with {PARTITIONS}: reset the app (`kasper app "
        "reset`), or declare that count\n")
    assert set(app_run.committed(app_run.source).values()) == {None}
