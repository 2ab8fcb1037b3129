"""Exactly-once for the DSL's windowed stream-stream outer join on the real broker:
``kasper run`` of ``tests.dsl_shapes.window_join`` (orders and payments within 0.5 s,
both sides in a changelog-backed RocksDB window store) killed with SIGKILL at random
moments, restarted each time, then run to the end. A read_committed reader must see
every pair and every unmatched side exactly once, with Kafka Streams' timestamps."""

from __future__ import annotations

import json
import shutil
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
from test_dsl_exactly_once import kill_randomly  # isort: skip

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("internal_topics")]

PARTITIONS, ORDERS = 2, 4000
START = (int(time.time()) - 3600) * 1000
"""An hour ago: the stack's broker deletes records older than its 24 h retention, and a
restart then found its committed offsets below the topics' starts (the restart hang
this test once excused, fixed in ``offsets.start_offset``)."""
GRACE = 600_000
"""Longer than the input's span: whichever topic a batch reads first, no record is late
and no window closes before a record far ahead comes (batches are not aligned here)."""
Record = tuple[str, dict[str, Any], int]


def orders_and_payments() -> tuple[list[Record], list[Record]]:
    """Order ``o<i>`` at START + 100 i ms; its payment (none for i % 4 == 3) 600, 300, 0
    ms before or 300, 600 ms after it (i % 5): within 0.5 s for i % 5 in (1, 2, 3).
    Each topic in timestamp order, as producers write them."""
    orders = [(f"o{i}", {"amount": i}, START + 100 * i) for i in range(ORDERS)]
    payments = [(f"o{i}", {"amount": 1000 + i}, START + 100 * i + (i % 5 - 2) * 300)
                for i in range(ORDERS) if i % 4 != 3]
    return orders, sorted(payments, key=lambda p: p[2])


def expected_outputs(orders: list[Record], payments: list[Record]) -> Counter[str]:
    """Kafka Streams' outer join: a pair stamped with the later time, a side alone with
    its own (every window closed by the last records, which join nothing)."""
    paid = {key: (value, at) for key, value, at in payments}
    out: list[tuple[str, dict[str, Any], int]] = []
    for key, order, at in orders:
        payment, paid_at = paid.pop(key, (None, None))
        if payment is not None and paid_at is not None and abs(paid_at - at) <= 500:
            out.append((key, {"order": order["amount"], "paid": payment["amount"]},
                        max(at, paid_at)))
            continue
        out.append((key, {"order": order["amount"], "paid": None}, at))
        if payment is not None:
            out.append((key, {"order": None, "paid": payment["amount"]}, paid_at))
    return Counter(json.dumps(o, sort_keys=True) for o in out)


def test_sigkill_during_a_windowed_outer_join_loses_and_repeats_nothing(
        bootstrap: str, new_topic: Callable[..., str], unique_name: Callable[[str], str],
        kafka: Any, tmp_path: Path) -> None:
    """4,000 orders and 3,000 payments: ``kasper run`` killed with SIGKILL three times
    after some progress, then run to the end, gives every pair once (no window closed
    yet); then, the state folder lost, one record per partition far ahead closes every
    window, and the unmatched sides, restored from the store's changelog, come out
    once. Both inputs are committed to their ends."""
    orders_topic = new_topic("wj-orders", partitions=PARTITIONS)
    payments_topic = new_topic("wj-payments", partitions=PARTITIONS)
    output, name = unique_name("wj-out"), unique_name("wj-eos")
    orders, payments = orders_and_payments()
    for topic, records in ((orders_topic, orders), (payments_topic, payments)):
        kafka.produce(topic, [(json.dumps(k).encode(), json.dumps(v).encode(), at)
                              for k, v, at in records])
    app_dir = app_module(tmp_path, "tests.dsl_shapes",
                         f"window_join({orders_topic!r}, {payments_topic!r}, {output!r}, "
                         f"grace={GRACE / 1000})")
    env = run_env(bootstrap, tmp_path / "state", key_serde="json", value_serde="json",
                  processing_guarantee="exactly_once", batch_size="20", max_task_idle="none")
    command = [*kasper_command(), "run", "dsl_app:app", "--name", name, "--app-dir", app_dir,
               "--create-topics", "--output-topics", output]

    def committed() -> tuple[int, ...]:
        return tuple(sum(o or 0 for o in kafka.committed(name, topic, PARTITIONS).values())
                     for topic in (orders_topic, payments_topic))

    at_kill = kill_randomly(command, env, 3, committed)  # type: ignore[arg-type]
    run_to_the_end(command, env)
    assert committed() == (len(orders), len(payments))
    expected = expected_outputs(orders, payments)
    pairs = Counter({o: n for o, n in expected.items() if "null" not in o})
    assert sent(kafka, output) == pairs
    assert 0 < sum(at_kill[0]) < len(orders) + len(payments), at_kill  # a kill mid-run

    shutil.rmtree(tmp_path / "state")
    last = START + 100 * ORDERS + GRACE + 60_000  # closes every window, joins nothing
    for partition in range(PARTITIONS):
        kafka.produce(orders_topic, [(json.dumps(f"end-{partition}").encode(), b"{}", last)],
                      partition=partition)
    run_to_the_end(command, env)
    assert committed() == (len(orders) + PARTITIONS, len(payments))
    assert sent(kafka, output) == expected


def run_to_the_end(command: list[str], env: dict[str, str]) -> None:
    done = subprocess.run([*command, "--until-caught-up"], env=env, capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-3000:]


def sent(kafka: Any, output: str) -> Counter[str]:
    """What a read_committed reader sees: (key, value, timestamp) of each record."""
    return Counter(json.dumps((json.loads(m.key()), json.loads(m.value()), m.timestamp()[1]),
                              sort_keys=True) for m in kafka.read_all(output))
