"""The query server without a broker: a loop on the in-memory broker serving its table
on its own server, loopback by default, behind a bearer token and TLS; every error of
kasper_py's HTTP servers in one JSON shape, the standard library's own pages included;
methods other than GET refused with 405 and ``Allow``."""

from __future__ import annotations

import json
import socket
import ssl
import subprocess
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import generate_latest

from kasper_py import Config, Message, MessageProcessor, Sender, TopicProcessor
from kasper_py._support.secrets import scrub
from kasper_py.cli.query import main as query_main
from kasper_py.exceptions import ConfigError, QueryUnavailableError, UnauthorizedError
from kasper_py.observability.metrics import PrometheusObserver
from kasper_py.query import QueryClient
from kasper_py.stores.memory import MemoryTable
from kasper_py.testing import InMemoryBroker, ProcessorDriver, make_message

TOKEN = "s3cret-token-of-the-processor"


class Count(MessageProcessor):
    """No ``__init__``: the base keeps the context, the stores come from it."""

    def process(self, messages: list[Message], sender: Sender) -> None:
        counts = self.context.store("counts")
        totals = counts.get_many({m.key for m in messages})
        for m in messages:
            totals[m.key] = totals.get(m.key, 0) + 1
        counts.put_many(totals)


def _serving(broker: InMemoryBroker, **fields: Any) -> tuple[TopicProcessor, PrometheusObserver]:
    config = Config(name="q", bootstrap_servers="memory", input_topics=["in"],
                    key_serde="str", query_port=0, **fields)
    observer = PrometheusObserver(config)
    processor = TopicProcessor(config, Count, stores=[MemoryTable("counts")],
                               clients=broker.clients(config), observer=observer)
    processor.run_loop(until_caught_up=True)
    return processor, observer


@pytest.fixture
def broker() -> InMemoryBroker:
    broker = InMemoryBroker()
    broker.create_topic("in")
    for key in ("a", "b", "a"):
        broker.produce("in", b"v", key=key)
    return broker


@pytest.fixture
def guarded(broker: InMemoryBroker) -> Iterator[tuple[TopicProcessor, PrometheusObserver]]:
    processor, observer = _serving(broker, query_token=TOKEN)
    yield processor, observer
    processor.close()
    observer.close()


def _call(url: str, method: str = "GET", headers: dict[str, str] | None = None,
          context: ssl.SSLContext | None = None) -> tuple[int, dict[str, Any], Any]:
    request = urllib.request.Request(url, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=10, context=context) as reply:
            return reply.status, json.loads(reply.read()), reply.headers
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read()), exc.headers


def _raw(port: int, request: bytes) -> tuple[int, str, dict[str, Any]]:
    """Status line's code, Content-Type and JSON body of a raw request."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(request)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines[1:])
    return int(lines[0].split()[1]), headers["Content-Type"], json.loads(body)


def test_a_processor_without_init_runs_and_keeps_its_context() -> None:
    """A MessageProcessor defining process() alone starts (the class is its factory) and
    reads its stores from self.context."""
    driver = ProcessorDriver(Count, stores=[MemoryTable("counts")], key_serde="str")
    driver.process([make_message("in", b"v", key="a"), make_message("in", b"v", key="a")])
    assert driver.store("counts").get("a") == 2
    with pytest.raises(AttributeError, match="context"):
        _ = Count().context  # built by hand without one: says what is missing


def test_queries_bind_loopback_apart_from_the_metrics(broker: InMemoryBroker) -> None:
    """By default the query server binds 127.0.0.1 and announces that address; without
    query_port nothing serves the tables, metrics_port alone included."""
    processor, observer = _serving(broker)
    try:
        assert processor.endpoint == f"http://127.0.0.1:{processor._servers.queries.port}"  # type: ignore[union-attr]
        assert processor._servers.queries.host == "127.0.0.1"  # type: ignore[union-attr]
        assert QueryClient(processor.endpoint or "").get("counts", "a") == 2
    finally:
        processor.close()
        observer.close()
    config = Config(name="q", bootstrap_servers="memory", input_topics=["in"], metrics_port=0)
    observer = PrometheusObserver(config)
    metrics = observer.serve(0, "127.0.0.1")
    processor = TopicProcessor(config, Count, stores=[MemoryTable("counts")],
                               clients=broker.clients(config), observer=observer)
    try:
        assert processor.endpoint is None
        status, body, _ = _call(f"http://127.0.0.1:{metrics.port}/tables")
        assert (status, body["error"], body["status"]) == (404, "NotFound", 404)
        assert "try /metrics, /health/live, /health/ready" in body["message"]
    finally:
        processor.close()
        observer.close()


def test_a_token_is_required_and_rejections_are_counted(guarded: Any) -> None:
    """No token or a wrong one: 401, JSON, WWW-Authenticate, counted by reason; the
    right one reads the table (through the client, and through kasper query)."""
    processor, observer = guarded
    url = f"{processor.endpoint}/tables/counts/a"
    status, body, headers = _call(url)
    assert (status, body["error"], body["status"]) == (401, "Unauthorized", 401)
    assert "Authorization: Bearer" in body["message"]
    assert headers["WWW-Authenticate"] == 'Bearer realm="kasper"'
    assert _call(url, headers={"Authorization": "Bearer nope-nope-nope"})[0] == 401
    assert _call(url, headers={"Authorization": f"Basic {TOKEN}"})[0] == 401
    status, body, _ = _call(url, headers={"Authorization": f"Bearer {TOKEN}"})
    assert (status, body["value"]) == (200, 2)
    metrics = generate_latest(observer.registry).decode()
    assert 'kasper_query_requests_rejected_total{processor="q",reason="missing"} 2.0' in metrics
    assert 'kasper_query_requests_rejected_total{processor="q",reason="wrong"} 1.0' in metrics
    assert QueryClient(processor.endpoint, token=TOKEN).get("counts", "b") == 1
    with pytest.raises(UnauthorizedError, match="bearer token is not this endpoint's"):
        QueryClient(processor.endpoint, token="another-token-entirely").get("counts", "b")


def test_kasper_query_takes_the_token_from_env_or_file(guarded: Any, tmp_path: Path,
                                                      capsys: Any) -> None:
    """kasper query: refused (exit 5) without the token; answers with it from
    KASPER_QUERY_TOKEN or --token-file."""
    processor, _ = guarded
    url = processor.endpoint
    assert query_main(["--url", url, "counts", "a"], env={}) == 5
    assert "Authorization: Bearer" in capsys.readouterr().err
    assert query_main(["--url", url, "counts", "a"], env={"KASPER_QUERY_TOKEN": TOKEN}) == 0
    assert capsys.readouterr().out == "2\n"
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    assert query_main(["--url", url, "--token-file", str(token_file), "counts", "b"],
                      env={}) == 0
    assert capsys.readouterr().out == "1\n"


def test_other_methods_answer_405_with_allow(guarded: Any) -> None:
    """POST/PUT/DELETE on /tables: 405, Allow: GET, JSON (after the token check, so a
    stranger learns nothing)."""
    processor, _ = guarded
    auth = {"Authorization": f"Bearer {TOKEN}"}
    for method in ("POST", "PUT", "DELETE", "PATCH"):
        status, body, headers = _call(f"{processor.endpoint}/tables/counts/a", method, auth)
        assert (status, body["error"], headers["Allow"]) == (405, "MethodNotAllowed", "GET")
        assert f"{method} is not allowed" in body["message"]
        assert _call(f"{processor.endpoint}/tables", method)[0] == 401


def test_standard_library_errors_are_json(broker: InMemoryBroker) -> None:
    """A request line too long (414) and an unknown method (501) answer in the one JSON
    shape, not the standard library's HTML."""
    processor, observer = _serving(broker)
    port = processor._servers.queries.port  # type: ignore[union-attr]
    try:
        status, kind, body = _raw(port, b"GET /" + b"x" * 70_000 + b" HTTP/1.1\r\n\r\n")
        assert (status, kind, body["status"], body["error"]) == (
            414, "application/json", 414, "RequestUriTooLong")
        status, kind, body = _raw(port, b"BREW /tables HTTP/1.1\r\nHost: x\r\n\r\n")
        assert (status, kind, body["error"]) == (501, "application/json", "NotImplemented")
        assert "BREW" in body["message"]
    finally:
        processor.close()
        observer.close()


def test_metrics_server_errors_are_json_and_refuse_post() -> None:
    """The metrics server: unknown path 404 and POST 405, both JSON."""
    observer = PrometheusObserver(Config(name="m", bootstrap_servers="x:1", input_topics=["i"]))
    base = f"http://127.0.0.1:{observer.serve(0, '127.0.0.1').port}"
    try:
        status, body, _ = _call(f"{base}/nothing")
        assert (status, body["error"]) == (404, "NotFound")
        status, body, headers = _call(f"{base}/metrics", "POST")
        assert (status, headers["Allow"]) == (405, "GET")
    finally:
        observer.close()


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    """A self-signed certificate for 127.0.0.1, made with openssl."""
    folder = tmp_path_factory.mktemp("tls")
    cert, key = str(folder / "cert.pem"), str(folder / "key.pem")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout",
                    key, "-out", cert, "-days", "2", "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1"], check=True,
                   capture_output=True)
    return cert, key


def test_tls_serves_https_to_clients_that_trust_it(broker: InMemoryBroker,
                                                   certificate: tuple[str, str]) -> None:
    """With a certificate the endpoint is https://; a client given the CA reads the
    table with the token; one that does not trust it fails; plain HTTP gets nothing."""
    cert, key = certificate
    processor, observer = _serving(broker, query_token=TOKEN, query_tls_cert=cert,
                                   query_tls_key=key)
    try:
        endpoint = processor.endpoint or ""
        assert endpoint.startswith("https://127.0.0.1:")
        assert QueryClient(endpoint, token=TOKEN, ca_file=cert).get("counts", "a") == 2
        with pytest.raises(QueryUnavailableError, match="CERTIFICATE_VERIFY_FAILED"):
            QueryClient(endpoint, token=TOKEN).get("counts", "a", key_serde="str")
        with pytest.raises(QueryUnavailableError):
            QueryClient(endpoint.replace("https", "http"), token=TOKEN).get(
                "counts", "a", key_serde="str")
    finally:
        processor.close()
        observer.close()


def test_config_of_the_query_server_is_checked() -> None:
    """Bad fields fail at construction naming the field; the token is masked in repr and
    scrubbed from any text the library writes."""
    base: dict[str, Any] = {"name": "q", "bootstrap_servers": "x:1", "input_topics": ["i"]}
    with pytest.raises(ConfigError, match=r"query_token.*at least 16"):
        Config(**base, query_token="short")
    with pytest.raises(ConfigError, match=r"query_tls_key.*is needed too"):
        Config(**base, query_tls_cert="cert.pem")
    with pytest.raises(ConfigError, match=r"query_port.*metrics port too"):
        Config(**base, query_port=9100, metrics_port=9100)
    with pytest.raises(ConfigError, match=r"query_port.*port 0\.\.65535"):
        Config(**base, query_port=70000)
    config = Config(**base, query_token=TOKEN)
    assert TOKEN not in repr(config) and "query_token='***'" in repr(config)
    assert scrub(f"a log line holding {TOKEN}") == "a log line holding ***"
    assert config.query_host == "127.0.0.1"
    with pytest.raises(ConfigError, match=r"query_tls_cert.*file not found"):
        TopicProcessor(Config(**base, query_port=0, query_tls_cert="/no/cert.pem",
                              query_tls_key="/no/key.pem"), Count,
                       clients=InMemoryBroker().clients(Config(**base)))


def test_query_partitioner_defaults_to_what_kasper_py_writes_with() -> None:
    """The default query partitioner is the one kasper_py's own producer uses."""
    config = Config(name="q", bootstrap_servers="x:1", input_topics=["i"])
    assert config.to_producer_conf()["partitioner"] == "murmur2_random"
    assert config.query_partitioner == "murmur2"
