"""Kafka Streams' examples rewritten in the streams DSL (examples/streams_word_count.py,
examples/streams_page_views.py), run as users run them: ``kasper run module:app
--until-caught-up`` against the stack's Kafka, RocksDB stores restored from their
changelogs between runs, the word counts read back over HTTP."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from kasper_py.query import QueryClient
from tests.kafka_clients import AdminClient

sys.path.insert(0, str(Path(__file__).parent))
pytest.register_assert_rewrite("conftest_stores")
from conftest_stores import free_port, wait_for  # isort: skip  # noqa: E402
from test_cli import kasper_command  # isort: skip  # noqa: E402

pytestmark = pytest.mark.integration

EXAMPLES = Path(__file__).parents[2] / "examples"
QUICKSTART = ["all streams lead to kafka", "hello kafka streams", "join kafka summit"]
KS_UPDATES = [("all", 1), ("streams", 1), ("lead", 1), ("to", 1), ("kafka", 1),
              ("hello", 1), ("kafka", 2), ("streams", 2),
              ("join", 1), ("kafka", 3), ("summit", 1)]
"""The quickstart's output with record caching disabled (``cache=False``): one update
per word read."""


@pytest.fixture
def internal_topics(bootstrap: str, unique_name: Callable[[str], str]) -> Iterator[None]:
    """Deletes the changelogs and repartitions the test's apps created."""
    yield
    run = unique_name("")
    admin = AdminClient({"bootstrap.servers": bootstrap})
    topics = [t for t in admin.list_topics(timeout=30).topics
              if run in t and t.endswith(("-changelog", "-repartition"))]
    for future in (admin.delete_topics(topics).values() if topics else ()):
        with contextlib.suppress(Exception):  # cleanup is best-effort
            future.result(30)


def app_module(folder: Path, module: str, call: str) -> str:
    """A module in ``folder`` whose ``app`` is ``call`` on the example ``module``, the
    way a user names their own topics; returns ``--app-dir``."""
    (folder / "dsl_app.py").write_text(f"import {module}\n\napp = {module}.{call}\n")
    return str(folder)


def run_env(bootstrap: str, state_dir: Path, **fields: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KASPER_")}
    env["PYTHONPATH"] = os.pathsep.join([str(EXAMPLES), *sys.path])
    env.update(KASPER_BOOTSTRAP_SERVERS=bootstrap, KASPER_STATE_DIR=str(state_dir),
               KASPER_BATCH_WAIT="0.2", **{f"KASPER_{k.upper()}": v for k, v in fields.items()})
    return env


def kasper_run(app_dir: str, env: dict[str, str], *flags: str) -> None:
    """``kasper run dsl_app:app --until-caught-up``; it must exit 0."""
    done = subprocess.run([*kasper_command(), "run", "dsl_app:app", "--app-dir", app_dir,
                           "--until-caught-up", *flags], env=env, capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-3000:]


def test_word_count_gives_the_kafka_streams_quickstart_counts(  # noqa: PLR0917 - fixtures
        bootstrap: str, new_topic: Callable[..., str], unique_name: Callable[[str], str],
        kafka: Any, tmp_path: Path, internal_topics: None) -> None:
    """Without the cache, the quickstart's lines give Kafka Streams' updates in its
    order (kafka 1, 2, 3); the third line is counted by a run whose state folder was
    lost, so its counts come from the changelog; the counts-store table answers every
    word over HTTP."""
    lines, output = new_topic("wc-lines"), unique_name("wc-out")
    name = unique_name("wc")
    app_dir = app_module(tmp_path, "streams_word_count",
                         f"word_count({lines!r}, {output!r}, name={name!r}, cache=False)")
    env = run_env(bootstrap, tmp_path / "state", key_serde="str", value_serde="str")
    create = ("--create-topics", "--output-topics", output)
    kafka.produce(lines, [line.encode() for line in QUICKSTART[:2]])
    kasper_run(app_dir, env, *create)
    shutil.rmtree(tmp_path / "state")
    kafka.produce(lines, [QUICKSTART[2].encode()])
    kasper_run(app_dir, env, *create)

    sent = [(m.key().decode(), int(m.value())) for m in kafka.read_all(output)]
    assert sent == KS_UPDATES
    assert kafka.committed(name, lines) == {0: 3}
    expected = dict(Counter(w for line in QUICKSTART for w in line.split()))
    assert served_counts(app_dir, env, list(expected)) == expected


def test_word_count_with_the_cache_sends_each_words_latest_count(  # noqa: PLR0917
        bootstrap: str, new_topic: Callable[..., str], unique_name: Callable[[str], str],
        kafka: Any, tmp_path: Path, internal_topics: None) -> None:
    """With the cache (the default), each word's count is sent at most once per batch:
    a subsequence of Kafka Streams' record-at-a-time updates, rising, ending at the
    true count; the repartition holds at most one record per word and batch."""
    lines, output = new_topic("wcc-lines"), unique_name("wcc-out")
    name = unique_name("wcc")
    app_dir = app_module(tmp_path, "streams_word_count",
                         f"word_count({lines!r}, {output!r}, name={name!r})")
    env = run_env(bootstrap, tmp_path / "state", key_serde="str", value_serde="str")
    kafka.produce(lines, [line.encode() for line in QUICKSTART])
    kasper_run(app_dir, env, "--create-topics", "--output-topics", output)

    sent: dict[str, list[int]] = {}
    for message in kafka.read_all(output):
        sent.setdefault(message.key().decode(), []).append(int(message.value()))
    expected = Counter(w for line in QUICKSTART for w in line.split())
    assert {word: counts[-1] for word, counts in sent.items()} == dict(expected)
    assert all(counts == sorted(set(counts)) for counts in sent.values())
    assert sum(map(len, sent.values())) <= len(KS_UPDATES)
    assert len(kafka.read_all(f"{name}-counts-store-by-key-repartition")) <= len(KS_UPDATES)


def served_counts(app_dir: str, env: dict[str, str], words: list[str]) -> dict[str, int]:
    """The app started again with ``--query-port`` (nothing left to read): each word's
    count in the table ``counts-store``, over HTTP; then SIGTERM, exit 0."""
    port = free_port()
    process = subprocess.Popen([*kasper_command(), "run", "dsl_app:app", "--app-dir", app_dir,
                                "--query-port", str(port)], env=env, text=True,
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        client = QueryClient(f"http://127.0.0.1:{port}")
        wait_for(lambda: _answers(client, words[0]), "the query server", timeout=60)
        counts = {word: client.get("counts-store", word) for word in words}
        assert dict(client.scan("counts-store")) == counts
    finally:
        process.send_signal(signal.SIGTERM)
        _, err = process.communicate(timeout=60)
    assert process.returncode == 0, err[-3000:]
    return counts


def _answers(client: QueryClient, word: str) -> bool:
    try:
        return client.get("counts-store", word) is not None
    except Exception:  # not serving yet, or the partition still opening
        return False


# -- page views --------------------------------------------------------------------------

BASE = (int(time.time()) - 3600) // 5 * 5 * 1000
"""An hour ago (ms), a multiple of the 5 s advance. Not a fixed date: the broker's
time-based retention counts from the records' timestamps (docs/time-and-windows.md,
"Output timestamps"), so the stack's broker (24 h, checked every minute) deletes views
and profiles stamped years ago from the test's topics, the repartition and the output,
at whichever check falls while the test runs."""
SIZE, ADVANCE = 10_000, 5_000
REGIONS = {f"u{i}": ["europe", "asia", "america"][i % 3] for i in range(8)}
"""Users u0..u7 have profiles; u8 and u9 have none (region UNKNOWN)."""


def sample_views(count: int) -> list[tuple[str, str, int]]:
    """(user, page, timestamp ms): ten users, a view every 150 ms, in time order."""
    return [(f"u{i % 10}", f"/page/{i % 7}", BASE + 150 * i) for i in range(count)]


def expected_windows(views: list[tuple[str, str, int]]) -> Counter[tuple[str, int]]:
    """Views per (region, window start): every 10 s window starting at a multiple of
    5 s that holds the view's timestamp, by brute force."""
    counts: Counter[tuple[str, int]] = Counter()
    for user, _page, at in views:
        region = REGIONS.get(user, "UNKNOWN")
        for start in range(at - at % ADVANCE - SIZE, at + 1, ADVANCE):
            if start <= at < start + SIZE:
                counts[(region, start)] += 1
    return counts


def test_page_views_count_exactly_per_region_window(  # noqa: PLR0917 - fixtures
        bootstrap: str, new_topic: Callable[..., str], unique_name: Callable[[str], str],
        kafka: Any, tmp_path: Path, internal_topics: None) -> None:
    """Profiles first (one run), then the state folder lost and 400 views over 60 s:
    each view is joined with its user's region from the restored table, and each
    (region, 10 s window advancing 5 s) ends at its true count, through rising updates
    (one per batch that changed the window), stamped with the window's last
    millisecond; users without a profile count under UNKNOWN."""
    views_topic, profiles = new_topic("pv-views", partitions=2), new_topic("pv-users", 2)
    output, name = unique_name("pv-out"), unique_name("pv")
    app_dir = app_module(tmp_path, "streams_page_views", (
        f"page_views({views_topic!r}, {profiles!r}, {output!r}, name={name!r}, "
        "size=10, advance=5, grace=120)"))  # grace: the views of two partitions interleave
    env = run_env(bootstrap, tmp_path / "state", key_serde="str", value_serde="json")
    create = ("--create-topics", "--output-topics", output)
    kafka.produce(profiles, [(u.encode(), json.dumps({"region": r}).encode(), BASE - 1000)
                             for u, r in REGIONS.items()])
    kasper_run(app_dir, env, *create)
    shutil.rmtree(tmp_path / "state")
    views = sample_views(400)
    kafka.produce(views_topic, [(u.encode(), json.dumps({"user": u, "page": p}).encode(), at)
                                for u, p, at in views])
    kasper_run(app_dir, env, *create)

    updates: dict[tuple[str, int], list[int]] = {}
    for message in kafka.read_all(output):
        key, value = json.loads(message.key()), json.loads(message.value())
        assert value["region"] == key["region"]
        assert message.timestamp()[1] == key["windowStart"] + SIZE - 1
        updates.setdefault((key["region"], key["windowStart"]), []).append(value["count"])
    expected = expected_windows(views)
    assert {window: counts[-1] for window, counts in updates.items()} == dict(expected)
    assert [c for c in updates.values() if c != sorted(set(c))] == []  # rising, no repeats
    assert {region for region, _ in expected} == {"europe", "asia", "america", "UNKNOWN"}
