"""Masking of client settings: an allow-list of harmless librdkafka keys, every
sensitive property of librdkafka's table masked, masked values scrubbed from text."""

from __future__ import annotations

import io
import json

import pytest
import structlog
from hypothesis import example, given, settings
from hypothesis import strategies as st

from kasper_py._support.secrets import (
    _SECRET_ASSIGNMENT,
    HARMLESS_PROPERTIES,
    MASK,
    SENSITIVE_PROPERTIES,
    is_harmless,
    masked_fields,
    masked_settings,
    scrub,
)
from kasper_py.config import Config
from kasper_py.observability.logging import configure_logging

# librdkafka 2.x flags these _RK_SENSITIVE in src/rdkafka_conf.c (its configuration
# dump redacts them); the test pins the list so a removal is a conscious change.
LIBRDKAFKA_SENSITIVE = (
    "ssl.key.location", "ssl.key.password", "ssl.key.pem", "ssl_key", "ssl.ca.pem",
    "ssl.keystore.password", "sasl.username", "sasl.password", "sasl.oauthbearer.config",
    "sasl.oauthbearer.client.secret", "sasl.oauthbearer.assertion.private.key.file",
    "sasl.oauthbearer.assertion.private.key.passphrase",
    "sasl.oauthbearer.assertion.private.key.pem",
)


def test_every_librdkafka_sensitive_property_is_listed_and_masked() -> None:
    """Each sensitive property is in the library's list, off the allow-list, and its
    value is masked in the Config repr (from any of the three override tables)."""
    for key in LIBRDKAFKA_SENSITIVE:
        assert key in SENSITIVE_PROPERTIES
        assert not is_harmless(key)
    assert not set(SENSITIVE_PROPERTIES) & HARMLESS_PROPERTIES
    settings = {key: f"value-of-{key}-xyzzy" for key in SENSITIVE_PROPERTIES}
    for field in ("client_overrides", "consumer_overrides", "producer_overrides"):
        text = repr(Config(name="p", bootstrap_servers="b:9092", input_topics=["t"],
                           **{field: settings}))
        for key, value in settings.items():
            assert value not in text, key
            assert f"'{key}': '{MASK}'" in text


def test_harmless_settings_stay_readable() -> None:
    """Timeouts, sizes and protocol choices are shown as they are."""
    shown = masked_settings({"security.protocol": "SASL_SSL", "sasl.mechanism": "PLAIN",
                             "session.timeout.ms": 45000, "fetch.max.bytes": 1 << 20})
    assert shown == {"security.protocol": "SASL_SSL", "sasl.mechanism": "PLAIN",
                     "session.timeout.ms": 45000, "fetch.max.bytes": 1 << 20}


def test_masked_values_are_scrubbed_from_any_text() -> None:
    """Once a Config holds a value, that value is hidden wherever it appears in text the
    library prints: an error string quoting it, a librdkafka line, a traceback."""
    secret = "principal=app extension_apikey=Zq81-unique"
    Config(name="p", bootstrap_servers="b:9092", input_topics=["t"],
           client_overrides={"sasl.oauthbearer.config": secret})
    assert scrub(f'Invalid value "{secret}" for property') == f'Invalid value "{MASK}" for property'
    assert "Zq81-unique" not in scrub(f"x {secret} y")


def test_scrub_keeps_short_values_out_of_text_masking() -> None:
    """Short values ("true", "1") are masked in settings but not blanked out of text."""
    Config(name="p", bootstrap_servers="b:9092", input_topics=["t"],
           client_overrides={"some.flag": "true"})
    assert scrub("enabled: true") == "enabled: true"


@pytest.mark.parametrize("renderer", ["json", "console"])
def test_log_lines_never_carry_a_masked_value(renderer: str) -> None:
    """Exception text rendered after the masking processor is scrubbed as well."""
    secret = "kinit -k -t /etc/app.keytab Hidden-Principal-77"
    Config(name="p", bootstrap_servers="b:9092", input_topics=["t"],
           client_overrides={"sasl.kerberos.kinit.cmd": secret})
    stream = io.StringIO()
    configure_logging(json=renderer == "json", stream=stream)
    log = structlog.get_logger("t")
    try:
        raise RuntimeError(f"command failed: {secret}")
    except RuntimeError:
        log.exception("failed", detail=secret)
    output = stream.getvalue()
    assert "Hidden-Principal-77" not in output
    assert "command failed" in output
    if renderer == "json":
        assert json.loads(output.splitlines()[0])["detail"] == MASK


@given(st.lists(st.sampled_from(["password", "PassWord", "pa\u017f\u017fword", "token", "jaas",
                                 "secret", "sasl.", "=", ":", " = ", '"', "'", "x", " ",
                                 "12:00", ",", "\u00e9", "\u212a"]), max_size=12).map("".join))
@example("pa\u017f\u017fword=x")  # the long s folds to s, as IGNORECASE matches it
@example("PassWord : 'y', token=z")
@example("at 12:00 the secret")
@settings(max_examples=400, deadline=None)
def test_text_fields_are_masked_as_the_key_value_pattern_says(text: str) -> None:
    """A log field's text goes through the ``key=value`` pattern only when it could
    match (a separator and a key word, case-folded): the result is the pattern's."""
    by_pattern = _SECRET_ASSIGNMENT.sub(lambda m: f"{m['key']}{m['sep']}{MASK}", text)

    assert masked_fields({"event": text}) == {"event": scrub(by_pattern) if text else text}


def test_counts_and_timings_pass_as_they_are_and_secret_names_are_masked() -> None:
    fields = {"partition": 3, "commit_ms": 1.25, "caught_up": True, "note": None,
              "sasl.password": 7, "api_token": 1.5}

    assert masked_fields(fields) == {"partition": 3, "commit_ms": 1.25, "caught_up": True,
                                     "note": None, "sasl.password": MASK, "api_token": MASK}
