"""What `kasper app reset` covers for an app, from its declarations alone: its
repartition, leader and changelog topics, its two groups, its RocksDB folders, and the
external stores it names in a warning (``reset_scope``, ``StoreSpec.owned_state``)."""

from __future__ import annotations

from pathlib import Path

from kasper_py import Config, Message, MessageProcessor, Sender
from kasper_py.app import App
from kasper_py.app.reset import reset_scope
from kasper_py.stores.base import OwnedState
from kasper_py.stores.cassandra import CassandraTable
from kasper_py.stores.memory import MemoryTable
from kasper_py.stores.redis import RedisTable
from kasper_py.stores.rocksdb import RocksDBTable


class Nothing(MessageProcessor):
    """Processes nothing: only the declarations matter here."""

    def process(self, messages: list[Message], sender: Sender) -> None:
        """Nothing."""


def clicks() -> App:
    """Two processors joined by a repartition, with one store of every kind."""
    app = App("clicks")
    by_user = app.repartition("by-user")
    app.processor("parse", Nothing, inputs=["views"], outputs=[by_user],
                  stores=[MemoryTable("seen"), RocksDBTable("local", changelog=False)])
    app.processor("count", Nothing, inputs=[by_user], stores=[
        RocksDBTable("counts"), RocksDBTable("users", global_table=True,
                                             changelog_topic="users-changelog"),
        RedisTable("totals", url="redis://:secret@cache:6380/2"),
        CassandraTable("history", keyspace="ks", prefix="hist")])
    return app


def test_scope_lists_what_the_app_owns_named_after_config_name() -> None:
    """Topics and groups are named after Config.name and the group, not the app's name;
    a global table's changelog belongs to its writer, so it is not the app's to delete,
    but its local copy and a changelog-less table's folder are."""
    config = Config(name="clicks-prod", bootstrap_servers="k:9092", input_topics=["views"],
                    group_id="clicks-group", state_dir="/var/kasper")
    scope = reset_scope(clicks(), config)
    assert scope.sources == ("views",)
    assert scope.topics == ("clicks-prod-by-user-repartition", "clicks-prod-leader",
                            "clicks-prod-counts-changelog")
    assert scope.groups == ("clicks-group", "clicks-group.leader")
    state = Path("/var/kasper/clicks-prod")
    assert scope.paths == (state / "local", state / "counts", state / "users")


def test_external_stores_are_named_without_credentials() -> None:
    """Redis and Cassandra tables are warned about with where their state lives (keys or
    rows under the processor's prefix), never the password in the URL."""
    config = Config(name="clicks-prod", bootstrap_servers="k:9092", input_topics=["views"])
    assert reset_scope(clicks(), config).external == (
        "Redis table 'totals': keys clicks-prod/totals/* at redis://cache:6380/2",
        "Cassandra table 'history': rows of prefix 'hist' in ks.history at "
        "cassandra 127.0.0.1:9042")


def test_a_memory_store_owns_nothing() -> None:
    """State in the process is gone with it: nothing to reset."""
    config = Config(name="p", bootstrap_servers="k:9092", input_topics=["t"])
    assert MemoryTable("seen").owned_state(config) == OwnedState()
