"""The OpenSearch store and stack component without a server: index names, refused
keys, what happens when the node cannot be reached (bounded retries, then
StoreUnavailableError), and the node's command line and home layout."""

from __future__ import annotations

from pathlib import Path

import pytest

from kasper_py import Config, StoreError, StoreUnavailableError
from kasper_py._support.ports import free_ports as closed_port
from kasper_py.stack._opensearch import OpenSearch, lay_out_home
from kasper_py.stack._settings import Settings
from kasper_py.stores.base import StoreRuntime
from kasper_py.stores.opensearch import OpenSearchTable

CONFIG = Config(name="Word_Count", bootstrap_servers="unused:0", input_topics=["lines"])



def test_index_names_are_lowercase_per_processor_and_table() -> None:
    """``<prefix>-<table>`` lowercased, characters OpenSearch refuses made ``_``; an
    explicit index is checked when declared."""
    assert OpenSearchTable("Counts").index_name(CONFIG) == "word_count-counts"
    assert OpenSearchTable("counts", prefix="app:v2").index_name(CONFIG) == "app_v2-counts"
    assert OpenSearchTable("counts", index="my-index").index_name(CONFIG) == "my-index"
    with pytest.raises(ValueError, match="index must be lowercase"):
        OpenSearchTable("counts", index="Bad/Index")
    with pytest.raises(ValueError, match="no '/'"):
        OpenSearchTable("a/b")


def test_an_unreachable_node_fails_the_open_after_bounded_retries() -> None:
    """Connection refused: ``retries`` tries more, each counted, then StoreUnavailableError
    naming the node, the request and the table."""
    url = f"http://127.0.0.1:{closed_port()}"
    table = OpenSearchTable("counts", url=url, retries=2, backoff=0.01, timeout=1)
    with pytest.raises(StoreUnavailableError) as info:
        table.open(StoreRuntime(CONFIG, 0))
    assert f"opensearch {url} unreachable: PUT index for table 'counts' partition 0 " \
           "failed 3 times" in str(info.value)
    table.close()


def test_owned_state_names_the_index() -> None:
    """``kasper app reset`` says where the table lives, which it cannot remove."""
    owned = OpenSearchTable("counts", url="http://127.0.0.1:9200").owned_state(CONFIG)
    assert owned.external == ("OpenSearch table 'counts': index word_count-counts at "
                              "http://127.0.0.1:9200")


def test_keys_must_be_utf8_text() -> None:
    """A key whose serde bytes are not UTF-8 cannot be a document id: StoreError."""
    from kasper_py.stores.opensearch import _key_text

    assert _key_text("café".encode()) == "café"
    with pytest.raises(StoreError, match="must be UTF-8 text"):
        _key_text(b"\xff\xfe", error=StoreError)


def test_the_node_runs_on_its_ports_from_a_home_of_its_own(tmp_path: Path,
                                                           monkeypatch) -> None:
    """HTTP and transport ports from the environment, security manager allowed, the
    Netty module's jars off the server's classpath, beside its descriptor."""
    monkeypatch.setenv("KASPER_OPENSEARCH_PORT", "41234")
    monkeypatch.setenv("KASPER_OPENSEARCH_TRANSPORT_PORT", "41235")
    settings = Settings.load(tmp_path)
    node = OpenSearch(settings)
    assert (node.port, settings.opensearch_transport_port) == (41234, 41235)
    assert node.url == "http://127.0.0.1:41234"
    command = node.command("java")
    assert command[-1] == "org.opensearch.bootstrap.OpenSearch"
    assert f"-Dopensearch.path.home={node.directory / 'home'}" in command
    jars = []
    for name in ("opensearch-2.19.6.jar", "netty-common-4.1.jar",
                 "transport-netty4-client-2.19.6.jar", "lucene-core-9.12.3.jar"):
        (tmp_path / name).write_bytes(b"")
        jars.append(tmp_path / name)
    home = tmp_path / "home"
    lay_out_home(home, jars, "2.19.6")
    assert sorted(p.name for p in (home / "lib").iterdir()) == [
        "lucene-core-9.12.3.jar", "opensearch-2.19.6.jar"]
    module = home / "modules" / "transport-netty4"
    assert sorted(p.name for p in module.iterdir()) == [
        "netty-common-4.1.jar", "plugin-descriptor.properties", "plugin-security.policy",
        "transport-netty4-client-2.19.6.jar"]
    assert "opensearch.version=2.19.6" in (module / "plugin-descriptor.properties").read_text()
