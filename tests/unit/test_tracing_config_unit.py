"""Tracing turned on from configuration (``Config.tracing``, ``otlp_endpoint``): the
layers that set it (TOML, ``KASPER_TRACING``, ``OTEL_TRACES_EXPORTER``, flags), the
service name, and a processor that builds its own provider exporting its spans when it
closes. The OTLP export into a real backend is tests/integration/test_tracing_otlp.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("opentelemetry.exporter.otlp.proto.http")

from opentelemetry.sdk.resources import SERVICE_NAME

from kasper_py import Config, TopicProcessor
from kasper_py.cli.base import CliError, load_config
from kasper_py.exceptions import ConfigError
from kasper_py.observability.otel_export import service_resource
from kasper_py.observability.tracing import NOOP_TRACING, tracing_for
from kasper_py.testing import InMemoryBroker
from tests.unit.test_turn_steps import Forward

BASE = {"KASPER_NAME": "traced", "KASPER_BOOTSTRAP_SERVERS": "127.0.0.1:9092",
        "KASPER_INPUT_TOPICS": "in"}


def test_tracing_is_off_by_default() -> None:
    """No setting anywhere: nothing traced, no endpoint."""
    config = load_config(None, BASE)
    assert (config.tracing, config.otlp_endpoint) == ("none", None)
    assert tracing_for(config, None) is NOOP_TRACING


@pytest.mark.parametrize(("toml", "env", "flags", "expected"), [
    ('tracing = "otlp"\n', {}, {}, "otlp"),
    ("", {"KASPER_TRACING": "console"}, {}, "console"),
    ("", {"OTEL_TRACES_EXPORTER": "otlp"}, {}, "otlp"),
    ("", {"OTEL_TRACES_EXPORTER": "otlp", "KASPER_TRACING": "none"}, {}, "none"),
    ('tracing = "none"\n', {"OTEL_TRACES_EXPORTER": "otlp"}, {}, "none"),
    ('tracing = "otlp"\n', {"KASPER_TRACING": "console"}, {"tracing": "none"}, "none"),
])
def test_layers_set_tracing(tmp_path: Path, toml: str, env: dict[str, str],
                            flags: dict[str, str], expected: str) -> None:
    """File, then environment (``KASPER_TRACING`` over ``OTEL_TRACES_EXPORTER``), then
    flags; the standard variable sits below everything of kasper's own."""
    path = tmp_path / "kasper.toml"
    path.write_text(toml)
    assert load_config(str(path), {**BASE, **env}, flags).tracing == expected


def test_endpoint_from_each_layer(tmp_path: Path) -> None:
    """``otlp_endpoint`` is an ordinary field: TOML, ``KASPER_OTLP_ENDPOINT``, flag."""
    path = tmp_path / "kasper.toml"
    path.write_text('otlp_endpoint = "http://a:4318"\n')
    assert load_config(str(path), BASE).otlp_endpoint == "http://a:4318"
    env = {**BASE, "KASPER_OTLP_ENDPOINT": "https://b:443/otlp"}
    assert load_config(str(path), env).otlp_endpoint == "https://b:443/otlp"
    assert load_config(str(path), env, {"otlp_endpoint": "http://c:1"}).otlp_endpoint \
        == "http://c:1"


@pytest.mark.parametrize(("env", "message"), [
    ({"KASPER_TRACING": "jaeger"}, "config field 'tracing': must be one of none, otlp, "
     "console, got 'jaeger' (from environment)"),
    ({"OTEL_TRACES_EXPORTER": "otlp,console"}, "config field 'tracing': must be one of "
     "none, otlp, console, got 'otlp,console' (from OTEL_TRACES_EXPORTER)"),
    ({"KASPER_OTLP_ENDPOINT": "localhost:4318"}, "config field 'otlp_endpoint': must be "
     "an http(s) URL, got 'localhost:4318' (from environment)"),
])
def test_bad_settings_name_the_field(env: dict[str, str], message: str) -> None:
    with pytest.raises(CliError) as raised:
        load_config(None, {**BASE, **env})
    assert (raised.value.code, str(raised.value)) == (3, message)


def test_config_refuses_a_bad_endpoint_in_code() -> None:
    with pytest.raises(ConfigError, match=r"^config field 'otlp_endpoint': must be an "
                       r"http\(s\) URL, got 'ftp://x'$"):
        Config(name="n", bootstrap_servers="b:1", input_topics=["in"], tracing="otlp",
               otlp_endpoint="ftp://x")


def test_service_name_is_the_processor_name_unless_set(monkeypatch: pytest.MonkeyPatch) -> None:
    config = Config(name="word-count", bootstrap_servers="b:1", input_topics=["in"])
    monkeypatch.delenv("OTEL_SERVICE_NAME", raising=False)
    monkeypatch.delenv("OTEL_RESOURCE_ATTRIBUTES", raising=False)
    assert service_resource(config).attributes[SERVICE_NAME] == "word-count"
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "service.name=from-attributes")
    assert service_resource(config).attributes[SERVICE_NAME] == "from-attributes"
    monkeypatch.setenv("OTEL_SERVICE_NAME", "from-variable")
    assert service_resource(config).attributes[SERVICE_NAME] == "from-variable"


def console_spans(printed: str) -> list[dict[str, Any]]:
    """The spans ``ConsoleSpanExporter`` printed (one indented JSON object each, from a
    line ``{`` to a line ``}``), the loop's log lines around them left out."""
    spans, lines = [], printed.splitlines()
    for start, line in enumerate(lines):
        if line == "{":
            end = lines.index("}", start)
            spans.append(json.loads("\n".join(lines[start:end + 1])))
    return spans


def test_console_tracing_exports_every_span_when_the_processor_closes(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """``tracing="console"``: the processor builds its own provider (in batches, on the
    SDK's thread) and shuts it down at ``close()``, which prints the turn and its four
    steps, under the processor's name."""
    monkeypatch.delenv("OTEL_SERVICE_NAME", raising=False)
    monkeypatch.delenv("OTEL_RESOURCE_ATTRIBUTES", raising=False)
    config = Config(name="console-traced", bootstrap_servers="in-memory",
                    input_topics=["in"], tracing="console")
    broker = InMemoryBroker()
    broker.create_topic("in")
    broker.create_topic("out")
    broker.produce("in", "a")
    processor = TopicProcessor(config, Forward, clients=broker.clients(config))
    processor.run_loop(until_caught_up=True)
    processor.close()
    spans = console_spans(capsys.readouterr().out)
    turn = next(span for span in spans if span["name"] == "kasper.turn")
    assert sorted((span["name"], span["parent_id"]) for span in spans
                  if span["name"] != "kasper.turn") == [
        (step, turn["context"]["span_id"]) for step in
        ("kasper.commit", "kasper.flush", "kasper.process", "kasper.produce")]
    assert {span["resource"]["attributes"]["service.name"] for span in spans} \
        == {"console-traced"}
    assert [len(m.headers) for m in broker.read("out")] == [1]
