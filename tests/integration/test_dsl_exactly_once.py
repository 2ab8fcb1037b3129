"""Exactly-once for a streams-DSL pipeline with a repartition, on the real broker:
``kasper run`` of the word count (examples/streams_word_count.py: ``group_by`` sends
each batch's words, combined per word, through a repartition topic to the counting
stage, which sends each word's count once per batch) killed with SIGKILL at random
moments, restarted each time, then run to the end."""

from __future__ import annotations

import itertools
import random
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from test_cli import kasper_command  # isort: skip
from test_dsl_examples import app_module, internal_topics, run_env  # isort: skip  # noqa: F401 - a fixture

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("internal_topics")]

VOCABULARY = [f"w{i}" for i in range(41)]


def sample_lines(count: int, seed: int = 3) -> list[str]:
    """``count`` lines of one to six words of the vocabulary."""
    rng = random.Random(seed)
    return [" ".join(rng.choices(VOCABULARY, k=rng.randint(1, 6))) for _ in range(count)]


def test_sigkill_during_a_repartitioned_count_loses_and_repeats_nothing(
        bootstrap: str, new_topic: Callable[..., str], unique_name: Callable[[str], str],
        kafka: Any, tmp_path: Path) -> None:
    """20,000 lines (about 70,000 words, combined per word and batch before the
    repartition), ``kasper run`` killed with SIGKILL five times at random moments
    (each after some progress, before the end of either stage), then run to the end:
    the input is committed to its end, and a read_committed reader sees, per word,
    rising counts (each once: a batch's replay after a kill is never seen twice), the
    last one the word's true count."""
    partitions, total, kills = 2, 20_000, 5
    lines, output = new_topic("eos-lines", partitions=partitions), unique_name("eos-counts")
    name = unique_name("dsl-eos")
    text = sample_lines(total)
    for partition in range(partitions):
        kafka.produce(lines, [line.encode() for line in text[partition::partitions]],
                      partition=partition)
    app_dir = app_module(tmp_path, "streams_word_count",
                         f"word_count({lines!r}, {output!r}, name={name!r})")
    env = run_env(bootstrap, tmp_path / "state", key_serde="str", value_serde="str",
                  processing_guarantee="exactly_once", batch_size="100")
    command = [*kasper_command(), "run", "dsl_app:app", "--app-dir", app_dir,
               "--create-topics", "--output-topics", output]

    repartition = f"{name}-counts-store-by-key-repartition"

    def committed() -> tuple[int, int]:
        """The group's committed totals: lines, and records of the repartition."""
        return (sum(o or 0 for o in kafka.committed(name, lines, partitions).values()),
                sum(o or 0 for o in kafka.committed(name, repartition, partitions).values()))

    at_kill = kill_randomly(command, env, kills, committed)
    progress = [sum(pair) for pair in at_kill]
    done = subprocess.run([*command, "--until-caught-up"], env=env, capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    final = sum(committed())
    # each run moved on before its kill, until everything was processed (the combined
    # repartition is small: on a fast machine the last kills come after the end)
    assert all(later > earlier or earlier == final
               for earlier, later in itertools.pairwise(progress)), at_kill
    assert 0 < progress[0] < final, at_kill  # the first kill landed mid-run

    assert kafka.committed(name, lines, partitions) == {
        p: len(text[p::partitions]) for p in range(partitions)}
    expected = Counter(word for line in text for word in line.split())
    sent: dict[str, list[int]] = {}
    for message in kafka.read_all(output):
        sent.setdefault(message.key().decode(), []).append(int(message.value()))
    assert {word: counts[-1] for word, counts in sent.items()} == dict(expected)
    assert [counts for counts in sent.values() if counts != sorted(set(counts))] == []


def kill_randomly(command: list[str], env: dict[str, str], kills: int,
                  committed: Callable[[], tuple[int, int]]) -> list[tuple[int, int]]:
    """Start ``command`` ``kills`` times; once it has committed something, SIGKILL it
    within a random second; what ``committed()`` reads after each kill."""
    rng = random.Random()
    at_kill = []
    for _ in range(kills):
        before = committed()
        process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL,
                                   stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 30
        while committed() == before and time.monotonic() < deadline and process.poll() is None:
            time.sleep(0.1)
        time.sleep(rng.uniform(0, 1))
        process.kill()
        process.wait(30)
        at_kill.append(committed())
    return at_kill
