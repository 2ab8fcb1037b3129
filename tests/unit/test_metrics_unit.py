"""PrometheusObserver: counters, lag gauges, health and the store API, driven with
hand-built TurnStats (no broker). Each test uses its own CollectorRegistry."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from kasper_py import Config
from kasper_py.exceptions import ProcessingError
from kasper_py.kafka.batching import Batch, OffsetRange
from kasper_py.observability.metrics import PrometheusObserver, observer_for
from kasper_py.observability.observe import NoopObserver, TurnStats
from kasper_py.stores.base import StoreRuntime
from kasper_py.stores.rocksdb import RocksDBTable
from tests.http_get import get


class FakeClock:
    """A settable clock in seconds since the epoch."""

    def __init__(self, now: float = 1_700_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def make_config(name: str = "orders", **fields: object) -> Config:
    """A valid Config; nothing connects to it in these tests."""
    return Config(name=name, bootstrap_servers="127.0.0.1:1", input_topics=["in"],
                  **fields)  # type: ignore[arg-type]


def make_stats(ranges: dict[tuple[str, int], OffsetRange], produced: int = 0,
               high: dict[tuple[str, int], int] | None = None) -> TurnStats:
    """TurnStats of one committed turn over ``ranges``."""
    batch = Batch(ranges=ranges)
    committed = {tp: r.last + 1 for tp, r in ranges.items()}
    durations = {"process": 0.01, "flush": 0.002, "produce": 0.02, "commit": 0.005}
    return TurnStats(batch, produced, durations, committed, high or dict(committed))


@pytest.fixture
def clock() -> FakeClock:
    """The observer's clock, moved by hand."""
    return FakeClock()


@pytest.fixture
def observer(clock: FakeClock) -> Iterator[PrometheusObserver]:
    """An observer of processor 'orders' with its own registry."""
    observer = PrometheusObserver(make_config(), clock=clock)
    yield observer
    observer.close()


def value(observer: PrometheusObserver, name: str, **labels: str) -> float | None:
    """One sample of the observer's registry."""
    return observer.registry.get_sample_value(name, labels)


def test_turn_counts_messages_turns_and_steps(observer: PrometheusObserver) -> None:
    """A turn adds its messages per partition, its output, one turn, one batch size and
    one observation per step."""
    stats = make_stats({("in", 0): OffsetRange(0, 9, 10), ("in", 1): OffsetRange(5, 7, 3)},
                       produced=4)
    observer.on_turn(stats)
    observer.on_turn(stats)
    labels = {"processor": "orders"}
    assert value(observer, "kasper_messages_consumed_total", **labels, topic="in",
                 partition="0") == 20
    assert value(observer, "kasper_messages_consumed_total", **labels, topic="in",
                 partition="1") == 6
    assert value(observer, "kasper_messages_produced_total", **labels) == 8
    assert value(observer, "kasper_turns_total", **labels) == 2
    assert value(observer, "kasper_batch_size_messages_sum", **labels) == 26
    for step in ("process", "flush", "produce", "commit"):
        assert value(observer, "kasper_step_duration_seconds_count", **labels, step=step) == 2


def test_batch_size_target_gauge_follows_the_turns(observer: PrometheusObserver) -> None:
    """The gauge shows the target of the last turn that reported one."""
    stats = make_stats({("in", 0): OffsetRange(0, 9, 10)})
    stats.batch_size_target = 400
    observer.on_turn(stats)
    assert value(observer, "kasper_batch_size_target", processor="orders") == 400
    stats.batch_size_target = 200
    observer.on_turn(stats)
    assert value(observer, "kasper_batch_size_target", processor="orders") == 200


def test_lag_in_messages_and_seconds(observer: PrometheusObserver, clock: FakeClock) -> None:
    """Lag is high watermark minus committed; lag seconds is now minus the last processed
    timestamp; the oldest unprocessed age is 0 once caught up."""
    written_ms = int((clock.now - 30) * 1000)
    behind = {("in", 0): OffsetRange(0, 9, 10, written_ms - 5000, written_ms)}
    observer.on_turn(make_stats(behind, high={("in", 0): 25}))
    clock.now += 10
    labels = {"processor": "orders", "topic": "in", "partition": "0"}
    assert value(observer, "kasper_consumer_lag_messages", **labels) == 15
    assert value(observer, "kasper_lag_seconds", **labels) == pytest.approx(40)
    assert value(observer, "kasper_oldest_unprocessed_age_seconds", **labels) == pytest.approx(40)
    assert value(observer, "kasper_last_processed_timestamp_seconds", **labels) == written_ms / 1000

    caught_up = {("in", 0): OffsetRange(10, 24, 15, written_ms, written_ms + 1000)}
    observer.on_turn(make_stats(caught_up, high={("in", 0): 25}))
    assert value(observer, "kasper_consumer_lag_messages", **labels) == 0
    assert value(observer, "kasper_oldest_unprocessed_age_seconds", **labels) == 0
    assert value(observer, "kasper_lag_seconds", **labels) == pytest.approx(39)


def test_observers_have_separate_registries() -> None:
    """Two observers (even of one processor name) never share a sample."""
    first = PrometheusObserver(make_config("same"))
    second = PrometheusObserver(make_config("same"))
    try:
        first.on_turn(make_stats({("in", 0): OffsetRange(0, 0, 1)}))
        assert first.registry is not second.registry
        assert value(first, "kasper_turns_total", processor="same") == 1
        assert value(second, "kasper_turns_total", processor="same") == 0
    finally:
        first.close()
        second.close()


def test_errors_counted_by_type_and_known_types_start_at_zero(
        observer: PrometheusObserver) -> None:
    """Every kasper error type is exported as 0 before it happens, then counted."""
    assert value(observer, "kasper_errors_total", processor="orders", type="CommitError") == 0
    observer.on_error(ProcessingError("boom", partition=3))
    observer.on_error(RuntimeError("bug"))
    assert value(observer, "kasper_errors_total", processor="orders",
                 type="ProcessingError") == 1
    assert value(observer, "kasper_errors_total", processor="orders", type="RuntimeError") == 1


def test_health_follows_the_loop(observer: PrometheusObserver, clock: FakeClock) -> None:
    """Live while turning within live_timeout; ready between on_start and on_stop."""
    assert observer.liveness().ok and not observer.readiness().ok
    observer.on_start([("in", 0)])
    assert observer.readiness().ok and observer.readiness().detail["assigned_partitions"] == 1
    clock.now += observer.live_timeout + 1
    assert not observer.liveness().ok
    observer.on_idle()
    assert observer.liveness().ok
    observer.on_stop()
    assert not observer.liveness().ok and not observer.readiness().ok


def test_live_timeout_is_a_few_batch_waits() -> None:
    """The default liveness window is 5 batch_waits, never under 30 s."""
    slow = PrometheusObserver(make_config(batch_wait=20.0))
    fast = PrometheusObserver(make_config(batch_wait=0.5))
    try:
        assert slow.live_timeout == 100.0
        assert fast.live_timeout == 30.0
    finally:
        slow.close()
        fast.close()


def test_an_error_makes_the_loop_not_live(observer: PrometheusObserver) -> None:
    """After on_error the liveness answer says why."""
    observer.on_start([("in", 0)])
    observer.on_error(ProcessingError("boom", partition=0))
    report = observer.liveness()
    assert not report.ok
    assert "ProcessingError: boom" in report.detail["error"]


def test_http_server_serves_metrics_and_health(observer: PrometheusObserver) -> None:
    """/metrics is Prometheus text; /health/ready turns 200 after on_start; others 404."""
    server = observer.serve(0, "127.0.0.1")
    base = f"http://127.0.0.1:{server.port}"
    status, body = get(f"{base}/metrics")
    assert status == 200
    assert 'kasper_turns_total{processor="orders"} 0.0' in body
    assert get(f"{base}/health/ready")[0] == 503
    observer.on_start([("in", 0)])
    status, body = get(f"{base}/health/ready")
    assert status == 200 and json.loads(body)["status"] == "ok"
    assert get(f"{base}/health/live")[0] == 200
    assert get(f"{base}/nothing")[0] == 404


def test_metrics_disabled_is_a_noop() -> None:
    """Without metrics_port there is nothing to serve: the no-op observer."""
    assert isinstance(observer_for(make_config()), NoopObserver)


def test_observer_for_serves_on_the_configured_port() -> None:
    """With metrics_port (0: any free port) the observer is serving."""
    observer = observer_for(make_config(metrics_port=0), host="127.0.0.1")
    assert isinstance(observer, PrometheusObserver) and observer.server is not None
    try:
        assert get(f"http://127.0.0.1:{observer.server.port}/metrics")[0] == 200
    finally:
        observer.close()


def test_stores_report_to_the_observer_they_were_handed(tmp_path: Path,
                                                        clock: FakeClock) -> None:
    """Two processors of one name in one process: each store reports its operations
    (latency, round trips) to its own processor's observer, not to both."""
    first, second = (PrometheusObserver(make_config(), clock=clock) for _ in range(2))
    stores = [RocksDBTable("totals", changelog=False).open(StoreRuntime(
        make_config(state_dir=str(tmp_path / str(i))), 0, None, observer.store_observer()))
        for i, observer in enumerate((first, second))]
    stores[0].get_many(["a", "b"])
    stores[0].put("a", 1)
    stores[0].flush({})
    labels = {"processor": "orders", "store": "totals"}
    assert value(first, "kasper_store_operation_seconds_count", op="get_many", **labels) == 1
    assert value(first, "kasper_store_round_trips_total", op="flush", **labels) == 1
    assert value(second, "kasper_store_operation_seconds_count", op="get_many",
                 **labels) is None
    for store in stores:
        store.close()


def test_restore_progress_sets_gauges_and_keeps_the_loop_live(
        observer: PrometheusObserver, clock: FakeClock) -> None:
    """A restore's progress sets ratio and remaining, and counts as the loop being alive."""
    clock.now += observer.live_timeout + 1
    observer.store_observer().on_restore_progress("totals", 2, 250, 1000)
    labels = {"processor": "orders", "store": "totals", "partition": "2"}
    assert value(observer, "kasper_restore_progress_ratio", **labels) == 0.25
    assert value(observer, "kasper_restore_remaining_messages", **labels) == 750
    assert observer.liveness().ok
    observer.on_restore_progress("totals", 2, 1000, 1000)
    assert value(observer, "kasper_restore_progress_ratio", **labels) == 1.0


def test_a_copy_no_longer_kept_warm_reports_no_standby_lag(
        observer: PrometheusObserver) -> None:
    """A warm copy's lag gauges go once it is promoted or placed elsewhere, so the
    dashboard shows no standby for a partition this process now owns."""
    stores = observer.store_observer()
    stores.on_standby_lag("totals", 2, 40, 3, 1.5)
    labels = {"processor": "orders", "store": "totals", "partition": "2"}
    assert value(observer, "kasper_standby_lag_records", **labels) == 3
    stores.on_standby_stopped("totals", 2)
    stores.on_standby_stopped("totals", 5)  # never kept warm: nothing to remove
    for name in ("standby_lag_records", "standby_lag_seconds", "standby_changelog_offset"):
        assert value(observer, f"kasper_{name}", **labels) is None


def test_missing_prometheus_client_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without prometheus-client, building an observer says which extra to install."""
    monkeypatch.setitem(sys.modules, "prometheus_client", None)
    with pytest.raises(ImportError, match=r"kasper-py\[prometheus\]"):
        PrometheusObserver(make_config())


def test_importing_metrics_does_not_import_prometheus() -> None:
    """kasper_py.observability.metrics (and the CLI) import prometheus_client only when
    metrics are on."""
    code = ("import sys, kasper_py.observability.metrics, kasper_py.cli; "
            "print('prometheus_client' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "False"


def test_transactions_counted_by_result_and_the_guarantee_shown(clock: FakeClock) -> None:
    """The processing guarantee is a labelled gauge; committed and aborted transactions
    start at 0, are counted by result, and a commit's seconds go to the histogram."""
    observer = PrometheusObserver(make_config(processing_guarantee="exactly_once"), clock=clock)
    try:
        labels = {"processor": "orders"}
        assert value(observer, "kasper_processing_guarantee",
                     guarantee="exactly_once", **labels) == 1
        assert value(observer, "kasper_transactions_total", result="aborted", **labels) == 0
        observer.on_transaction("committed", 0.004)
        observer.on_transaction("committed", 0.006)
        observer.on_transaction("aborted", 0.0)
        assert value(observer, "kasper_transactions_total", result="committed", **labels) == 2
        assert value(observer, "kasper_transactions_total", result="aborted", **labels) == 1
        assert value(observer, "kasper_transaction_commit_seconds_count", **labels) == 2
        assert value(observer, "kasper_transaction_commit_seconds_sum",
                     **labels) == pytest.approx(0.010)
    finally:
        observer.close()


def test_late_records_of_windows_appear_on_metrics(observer: PrometheusObserver) -> None:
    """A store starts at 0 late records once it reports; the records a window drops as
    late are counted on /metrics by processor and store."""
    from kasper_py.stores.memory import MemoryTable
    from kasper_py.testing import ProcessorDriver, make_message

    from test_windows_unit import Counts  # isort: skip - the windows tests' processor

    table = MemoryTable("windows")
    driver = ProcessorDriver(Counts, config=make_config(), stores=[table])
    driver.processor()
    table.partitions[0].observer = observer
    observer.on_store_op("windows", "get_many", 0.001, 0)
    url = f"http://127.0.0.1:{observer.serve(0, '127.0.0.1').port}/metrics"
    series = 'kasper_late_records_total{processor="orders",store="windows"}'
    assert f"{series} 0.0" in get(url)[1]
    driver.process([make_message("in", "v", "a", timestamp=t) for t in (50, 1, 2, 55, 3)])
    assert f"{series} 3.0" in get(url)[1]
