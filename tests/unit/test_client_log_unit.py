"""The clients' log lines: librdkafka's levels mapped to the library's, repeats held back
on a hand-moved clock, secrets masked, every line counted. No broker: lines are handed
to ``ClientLog.log`` the way confluent-kafka calls it."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
from structlog.testing import capture_logs

from kasper_py import Config
from kasper_py.kafka.client_log import ClientLog, RepeatLimiter, with_client_log
from kasper_py.observability.logging import MASK
from kasper_py.observability.metrics import PrometheusObserver

REFUSED = ("[thrd:127.0.0.1:1/bootstrap]: 127.0.0.1:1/bootstrap: Connect to ipv4#127.0.0.1:1 "
           "failed: Connection refused (after {ms}ms in state CONNECT)")


class FakeClock:
    """Monotonic seconds, moved by hand."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def client_line(client: ClientLog, level: int, text: str, facility: str = "FAIL") -> None:
    """One librdkafka line, in confluent-kafka's call shape."""
    client.log(level, "%s [%s] %s", facility, "orders-consumer#consumer-1", text)


@pytest.fixture
def clock() -> FakeClock:
    """The limiter's clock."""
    return FakeClock()


@pytest.fixture
def client(clock: FakeClock) -> ClientLog:
    """A consumer's logger of processor 'orders', holding repeats back for 30 s."""
    return ClientLog("orders", "consumer", RepeatLimiter(30.0, clock))


@pytest.mark.parametrize(("rdkafka", "logged"), [
    (logging.CRITICAL, "error"), (logging.ERROR, "warning"), (logging.WARNING, "warning"),
    (logging.INFO, "info"), (logging.DEBUG, "debug"),
])
def test_levels_map_to_the_library_levels(client: ClientLog, rdkafka: int, logged: str) -> None:
    """A refused connection (librdkafka's 'error', which it retries) is a warning; only a
    critical line is an error; the client's own level stays in ``rdkafka_level``."""
    with capture_logs() as logs:
        client_line(client, rdkafka, REFUSED.format(ms=0))
    [event] = logs
    assert event["log_level"] == logged
    assert event["rdkafka_level"] == logging.getLevelName(rdkafka).lower()
    assert event["event"] == "kasper.client_log"
    assert event["processor"] == "orders" and event["client"] == "consumer"
    assert event["client_name"] == "orders-consumer#consumer-1"
    assert event["facility"] == "FAIL" and event["message"] == REFUSED.format(ms=0)
    assert event["suppressed"] == 0


def test_repeats_are_held_back_then_counted(client: ClientLog, clock: FakeClock) -> None:
    """The same (facility, message) is logged once per interval, whatever its timings;
    the next line it logs says how many were held back."""
    with capture_logs() as logs:
        for ms in range(5):
            client_line(client, logging.ERROR, REFUSED.format(ms=ms))
            clock.now += 1.0
        clock.now += 25.0
        client_line(client, logging.ERROR, REFUSED.format(ms=9))
        client_line(client, logging.ERROR, REFUSED.format(ms=0))
    assert [event["suppressed"] for event in logs] == [0, 4]


def test_other_lines_are_not_held_back(client: ClientLog) -> None:
    """Another facility, or another broker's message, is logged at once."""
    with capture_logs() as logs:
        client_line(client, logging.ERROR, REFUSED.format(ms=0))
        client_line(client, logging.ERROR, REFUSED.format(ms=0), facility="ERROR")
        client_line(client, logging.ERROR, REFUSED.format(ms=0).replace(":1", ":2"))
    assert len(logs) == 3


def test_limiter_forgets_old_keys_when_lines_keep_changing(clock: FakeClock) -> None:
    """Endlessly different lines do not grow the limiter without bound."""
    limiter = RepeatLimiter(1.0, clock)
    for n in range(5000):
        assert limiter.admit(n) == 0
        clock.now += 0.01
    assert len(limiter._seen) <= 1024


def test_secrets_in_a_line_are_masked(client: ClientLog) -> None:
    """A line quoting a secret setting never carries its value."""
    with capture_logs() as logs:
        client_line(client, logging.WARNING, "Configuration property sasl.password=hunter2 "
                    "is ignored", facility="CONFWARN")
    [event] = logs
    assert "hunter2" not in event["message"] and MASK in event["message"]


@pytest.fixture
def observer() -> Iterator[PrometheusObserver]:
    """Metrics of processor 'orders', in their own registry."""
    observer = PrometheusObserver(Config(name="orders", bootstrap_servers="127.0.0.1:1",
                                         input_topics=["in"]))
    yield observer
    observer.close()


def test_every_line_is_counted(client: ClientLog, observer: PrometheusObserver) -> None:
    """``kasper_client_log_messages_total`` counts held-back repeats too, by logged level."""
    labels = {"processor": "orders", "client": "consumer", "level": "warning"}
    name = "kasper_client_log_messages_total"
    assert observer.registry.get_sample_value(name, labels) == 0
    with capture_logs():
        for _ in range(3):
            client_line(client, logging.ERROR, REFUSED.format(ms=0))
    assert observer.registry.get_sample_value(name, labels) == 3


def test_with_client_log_adds_a_logger_to_a_copy() -> None:
    """The settings given are left as they were; the copy has a ``logger``."""
    conf = {"bootstrap.servers": "127.0.0.1:1"}
    built = with_client_log(conf, "orders", "admin")
    assert conf == {"bootstrap.servers": "127.0.0.1:1"}
    logger = built["logger"]
    assert isinstance(logger, ClientLog) and logger.client == "admin"
