"""The harness of the application guarantee tests: the page-view app of
rekey_app_module.py run as ``kasper run rekey_app_module:app`` in its own OS process (so a
test can SIGKILL it), its input, and what the tests read back (outputs, ends of
topics, the RocksDB counts)."""

from __future__ import annotations

import contextlib
import os
import random
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from confluent_kafka import TopicPartition

from kasper_py import Config
from kasper_py.stores.rocksdb import RocksDBTable
from tests.kafka_clients import AdminClient, Consumer

from conftest_stores import read_counts, wait_for  # isort: skip - a sibling module

HERE = Path(__file__).parent
APP = "rekey_app_module:app"
T = TypeVar("T")


def produce_views(kafka: Any, topic: str, count: int, *, users: int = 40,
                  sessions: int = 300, start: int = 0) -> Counter[str]:
    """Page views ``start`` .. ``start + count - 1``: view i is keyed by session
    ``s<i % sessions>``, its value ``"u<i % users>,p<i>"`` (a session's views are of a
    few users, on several partitions once re-keyed); returns each user's views."""
    views = [(f"s{i % sessions}", f"u{i % users}", f"p{i}")
             for i in range(start, start + count)]
    kafka.produce(topic, [(s.encode(), f"{u},{p}".encode()) for s, u, p in views])
    return Counter(u for _, u, _ in views)


def write_config(path: Path, **fields: Any) -> Path:
    """A TOML config file of ``fields`` (strings, numbers)."""
    lines = [f"{name} = {value!r}" if not isinstance(value, str) else f'{name} = "{value}"'
             for name, value in fields.items()]
    path.write_text("\n".join(lines) + "\n")
    return path


class AppWorker:
    """One ``kasper run`` of the page-view app, its output in its own log file."""

    def __init__(self, config: Path, log: Path, source: str, output: str, *options: str,
                 pause: float = 0.0) -> None:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path),
               "PAGEVIEWS_SOURCE": source, "PAGEVIEWS_OUTPUT": output,
               "PAGEVIEWS_PAUSE": str(pause)}
        self.log = log
        with log.open("wb") as out:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "kasper_py", "run", APP, "--app-dir", str(HERE),
                 "--config", str(config), "--log-format", "console", *options],
                env=env, stdout=out, stderr=subprocess.STDOUT)

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def started(self) -> bool:
        """The loop took its partitions (static) or joined its group."""
        return "kasper.started" in self.text()

    def wait_started(self, timeout: float = 90.0) -> None:
        wait_for(lambda: self.started() or self.process.poll() is not None,
                 f"{self.log.name} to start", timeout)
        assert self.process.poll() is None, self.text()[-3000:]

    def kill(self) -> None:
        self.process.kill()
        self.process.wait(30)

    def finish(self, timeout: float = 120.0) -> int:
        """Wait for it to exit on its own; its exit code."""
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"{self.log.name} did not finish: "
                                 f"{self.text()[-3000:]}") from None


def kill_at_random(start: Callable[[int], AppWorker], kills: int, progress: Callable[[], T],
                   *, within: tuple[float, float] = (0.3, 1.5),
                   seed: int | None = None) -> list[T]:
    """Start a worker ``kills`` times (``start(run)``), SIGKILL each at a random moment
    ``within`` seconds after it started; ``progress()`` after each kill."""
    rng = random.Random(seed)
    at_kill = []
    for run in range(kills):
        worker = start(run)
        worker.wait_started()
        time.sleep(rng.uniform(*within))
        assert worker.process.poll() is None, worker.text()[-3000:]
        worker.kill()
        at_kill.append(progress())
    return at_kill


def ends(bootstrap: str, topic: str, partitions: int) -> dict[int, int]:
    """Each partition's high watermark."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "kasper-tests-ends"})
    try:
        return {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1]
                for p in range(partitions)}
    finally:
        consumer.close()


def committed_totals(kafka: Any, group: str, topics: list[str], partitions: int
                     ) -> Callable[[], list[int]]:
    """The group's committed offsets summed per topic of ``topics``."""
    return lambda: [sum(o or 0 for o in kafka.committed(group, t, partitions).values())
                    for t in topics]


def updates(kafka: Any, topic: str) -> Counter[tuple[str, int]]:
    """How often each (user, count) update is in ``topic``, read_committed."""
    return Counter((m.key().decode(), int(m.value())) for m in kafka.read_all(topic))


def store_counts(bootstrap: str, name: str, source: str, state_dir: Path, *,
                 partitions: int, users: list[str], guarantee: str) -> Counter[str]:
    """The ``counts`` table of app ``name`` as a restarted loop would open it."""
    config = Config(name=name, bootstrap_servers=bootstrap, input_topics=[source],
                    state_dir=str(state_dir), processing_guarantee=guarantee)
    return read_counts(RocksDBTable("counts"), config, partitions, users)


@contextlib.contextmanager
def internal_topics_deleted(bootstrap: str, name: str) -> Iterator[None]:
    """Delete app ``name``'s repartition and changelog topics afterwards."""
    try:
        yield
    finally:
        admin = AdminClient({"bootstrap.servers": bootstrap})
        topics = [t for t in admin.list_topics(timeout=30).topics
                  if t.startswith(f"{name}-") and t.endswith(("-repartition", "-changelog"))]
        for future in (admin.delete_topics(topics).values() if topics else ()):
            with contextlib.suppress(Exception):  # cleanup is best-effort
                future.result(30)
