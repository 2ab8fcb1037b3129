"""Stale lookups in group mode without a broker: a member publishes its query endpoint in
its client id, the group's description names the members keeping a partition warm, and
an instance without a copy sends a ``?stale=ok`` lookup to the first of them."""

from __future__ import annotations

import os
from collections.abc import Sequence

import pytest

from kasper_py import Config
from kasper_py._support.client_conf import endpoint_of_member
from kasper_py.cli.query import main as query_main
from kasper_py.exceptions import AdminError, KeyNotFoundError, NotHereError
from kasper_py.kafka.admin import GroupMember, GroupState
from kasper_py.loop.standby_placement import WarmEndpoints, group_placement, warm_members
from kasper_py.observability.http import Request, Response
from kasper_py.query import QueryClient, Tables
from kasper_py.query._locate import Locator
from kasper_py.query._web import QueryApp
from kasper_py.query.server import QueryServer, query_app
from kasper_py.stores.memory import MemoryTable
from tests.warm_copies import Warm


def config(**fields: object) -> Config:
    return Config(name="wc", bootstrap_servers="unused:0", input_topics=["orders"],
                  assignment="group", **fields)  # type: ignore[arg-type]


def client_id(**fields: object) -> str:
    return str(config(**fields).to_consumer_conf()["client.id"])


def test_a_member_with_standbys_and_a_query_port_publishes_its_endpoint() -> None:
    """``<name>-consumer-<pid>;query=<url>``, the URL as the query server announces it;
    nothing to publish without standbys, without a query port or with port 0 (the port
    is known only at bind), and a client id the user set is kept as it is."""
    pid = os.getpid()
    assert client_id(num_standby_replicas=1, query_port=9300) == \
        f"wc-consumer-{pid};query=http://127.0.0.1:9300"
    assert client_id(num_standby_replicas=1, query_port=9300, query_host="::1") == \
        f"wc-consumer-{pid};query=http://[::1]:9300"
    assert client_id(num_standby_replicas=1, query_port=0,
                     query_endpoint="https://orders-3.internal:443/") == \
        f"wc-consumer-{pid};query=https://orders-3.internal:443"
    for fields in ({"query_port": 9300}, {"num_standby_replicas": 1},
                   {"num_standby_replicas": 1, "query_port": 0}):
        assert client_id(**fields) == f"wc-consumer-{pid}"
    assert client_id(num_standby_replicas=1, query_port=9300,
                     consumer_overrides={"client.id": "mine"}) == "mine"


def test_the_endpoint_is_read_back_from_a_client_id() -> None:
    assert endpoint_of_member("wc-consumer-7;query=http://h:1") == "http://h:1"
    assert endpoint_of_member("wc-consumer-7") is None
    assert endpoint_of_member("wc-consumer-7;query=") is None
    assert GroupMember("wc-consumer-7;query=http://h:1", "/10.0.0.1", ()).query_endpoint \
        == "http://h:1"


def member(letter: str, *partitions: int) -> GroupMember:
    return GroupMember(f"wc-{letter};query=http://{letter}:1", f"/10.0.0.{ord(letter)}",
                       tuple(("orders", p) for p in partitions))


STATE = GroupState("STABLE", (member("a", 0), member("b", 1), member("c"),
                              GroupMember("wc-d", "/10.0.0.9", ())))


def test_warm_members_are_those_the_placement_gives_the_partition_in_rank_order() -> None:
    """Each partition's warm members are the ones ``group_placement`` gives it, in a
    fixed order; none for a partition no member owns (the group has not assigned it)."""
    placed = group_placement(STATE, "orders", 2)
    for partition in (0, 1):
        ranked = warm_members(STATE, "orders", partition, 2)
        assert {m.describe() for m in ranked} == {
            name for name, parts in placed.items() if partition in parts}
        assert len(ranked) == 2
        assert warm_members(STATE, "orders", partition, 1) == ranked[:1]
    assert warm_members(STATE, "orders", 5, 2) == []
    assert warm_members(STATE, "orders", 0, 0) == []


class Describe:
    """A group description answered from ``states`` in turn (an exception is raised)."""

    def __init__(self, *states: GroupState | Exception) -> None:
        self.states = list(states)
        self.calls = 0

    def __call__(self) -> GroupState:
        state = self.states[min(self.calls, len(self.states) - 1)]
        self.calls += 1
        if isinstance(state, Exception):
            raise state
        return state


def test_warm_endpoints_name_the_published_endpoints_and_describe_the_group_sparingly(
        ) -> None:
    """Every member keeps warm what it does not own (three replicas over four members);
    the one publishing no endpoint is left out. Within ``fresh`` seconds the description
    is read once; a group that cannot be described gives no endpoint."""
    describe = Describe(STATE)
    warm = WarmEndpoints(config(num_standby_replicas=3), describe, fresh=60)
    assert sorted(warm(0)) == ["http://b:1", "http://c:1"]
    assert sorted(warm(1)) == ["http://a:1", "http://c:1"]
    assert describe.calls == 1
    failing = WarmEndpoints(config(num_standby_replicas=1),
                            Describe(AdminError("no coordinator")), fresh=0)
    assert failing(0) == []


def tables(warm_elsewhere: Sequence[str], own: str | None = None) -> Tables:
    """Tables holding nothing of one partition, whose locator finds no owner."""
    locator = Locator(config(), own)
    locator.endpoint = lambda _partition, _count: None  # type: ignore[method-assign]
    return Tables(config(), [MemoryTable("counts", key_serde="str")], dict, locator,
                  lambda: 1, warm_elsewhere=lambda _partition: warm_elsewhere)


def get(app: QueryApp, target: str) -> Response:
    path, _, query = target.partition("?")
    params = dict(pair.split("=") for pair in query.split("&") if pair)
    answer = app(Request("GET", path, params, target=target))
    assert answer is not None
    return answer


def test_a_stale_lookup_without_a_copy_here_is_sent_to_a_member_keeping_it_warm() -> None:
    """With ``stale``: 307 to the first member keeping the partition warm, the flag kept;
    without it, to the owner as always (here none is known: 421). A member placed to keep
    the partition warm that has no copy yet sends to the owner, never to another
    standby, so a lookup is sent on once at most."""
    app = QueryApp(tables(["http://b:1", "http://c:1"]), {}, "http://a:1")
    answer = get(app, "/tables/counts/alice?stale=ok")
    assert answer.status == 307
    assert answer.headers["Location"] == "http://b:1/tables/counts/alice?stale=ok"
    assert get(app, "/tables/counts/alice").status == 421
    own = tables(["http://b:1", "http://c:1"], own="http://c:1")
    with pytest.raises(NotHereError) as raised:
        own.find("counts", "alice", stale=True)
    assert raised.value.endpoint is None
    with pytest.raises(NotHereError, match="kept warm by http://b:1") as raised:
        tables(["http://b:1"]).find("counts", "alice", stale=True)
    assert raised.value.endpoint == "http://b:1"


def test_kasper_query_stale_prints_the_standby_answer_and_its_lag(
        capsys: pytest.CaptureFixture[str]) -> None:
    """``kasper query --stale`` prints a standby's answer, its lag as a note on stderr;
    without the flag the owner is required, and none is known: exit 3."""
    cfg = config(query_port=0, key_serde="str")
    server = QueryServer(cfg)
    capsys.readouterr()  # the server's start-up log
    try:
        warm = Tables(cfg, [MemoryTable("counts", key_serde="str")], dict,
                      partition_count=lambda: 1, warm=lambda: {0: {"counts": Warm()}})
        server.mount(query_app(warm, {}, server.endpoint))
        assert query_main(["--url", server.endpoint, "--stale", "counts", "alice"],
                          env={}) == 0
        out, err = capsys.readouterr()
        assert out == "3\n"
        assert err == ("kasper query: note: answered by a standby copy 7 changelog offsets "
                       "behind\n")
        assert query_main(["--url", server.endpoint, "counts", "alice"], env={}) == 3
        assert "input partition 0" in capsys.readouterr().err
        assert query_main(["--url", server.endpoint, "--stale", "counts", "bob"],
                          env={}) == 1
        assert "7 changelog offsets behind its owner's" in capsys.readouterr().err
    finally:
        server.close()


def test_a_key_missing_from_a_standby_copy_comes_back_with_the_copy_lag() -> None:
    """A 404 from a standby's copy carries its lag (header and body), and the client's
    ``KeyNotFoundError`` says it: the key may not have reached the copy yet."""
    cfg = config(query_port=0, key_serde="str")
    server = QueryServer(cfg)
    try:
        warm = Tables(cfg, [MemoryTable("counts", key_serde="str")], dict,
                      partition_count=lambda: 1, warm=lambda: {0: {"counts": Warm()}})
        app = query_app(warm, {}, server.endpoint)
        server.mount(app)
        answer = get(app, "/tables/counts/bob?stale=ok")
        assert (answer.status, answer.headers["Kasper-Standby-Lag"]) == (404, "7")
        assert answer.body["standby_lag"] == 7
        with pytest.raises(KeyNotFoundError, match="7 changelog offsets behind") as missing:
            QueryClient(server.endpoint).find("counts", "bob", stale=True)
        assert missing.value.standby_lag == 7
    finally:
        server.close()
