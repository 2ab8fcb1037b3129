"""The streams DSL's graph as ``describe`` shows it: every operator a node named as
Kafka Streams names it (``KSTREAM-MAPVALUES-0000000003``) or by the user's ``name=``,
names unique per builder, stages merged by joins with every node in the one stage
left, and ``kasper app describe --json`` listing them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from kasper_py import ConfigError, cli
from kasper_py.app import App, describe
from kasper_py.dsl import Builder


def operators(app: App) -> dict[str, list[tuple[str, str, list[str], list[str]]]]:
    """Per processor, its operators as (name, kind, links, to)."""
    return {p["name"]: [(o["name"], o["kind"], o["links"], o["to"]) for o in p["operators"]]
            for p in describe(app)["processors"]}


def test_generated_names_follow_kafka_streams_and_count_across_the_builder() -> None:
    """Each node's name is its kind's prefix and the builder's count of generated names
    so far, ten digits; a stateless run keeps a node per operator."""
    builder = Builder("names", stores="memory")
    (builder.stream("in").filter(lambda _k, v: v is not None).map_values(str)
        .select_key(lambda _k, v: v).peek(print).to("out"))
    assert operators(builder.build()) == {"stage-0": [
        ("KSTREAM-SOURCE-0000000000", "source", ["topic:in"], ["KSTREAM-FILTER-0000000001"]),
        ("KSTREAM-FILTER-0000000001", "filter", [], ["KSTREAM-MAPVALUES-0000000002"]),
        ("KSTREAM-MAPVALUES-0000000002", "map_values", [], ["KSTREAM-KEY-SELECT-0000000003"]),
        ("KSTREAM-KEY-SELECT-0000000003", "select_key", [], ["KSTREAM-PEEK-0000000004"]),
        ("KSTREAM-PEEK-0000000004", "peek", [], ["KSTREAM-SINK-0000000005"]),
        ("KSTREAM-SINK-0000000005", "to", ["topic:out"], [])]}


def test_user_names_replace_generated_ones_which_skip_them() -> None:
    """``name=`` names a node without using up an index; a branch named ``split`` has
    children ``split-0`` and ``split-1``; a generated name a user took already is
    passed over for the next index."""
    builder = Builder("names", stores="memory")
    source = builder.stream("in", name="KSTREAM-MAPVALUES-0000000000")
    small, large = source.branch(lambda _k, v: v < 10, lambda _k, v: True, name="split")
    small.map_values(abs).to("small", name="small-out")
    large.to("large")
    assert operators(builder.build())["stage-0"] == [
        ("KSTREAM-MAPVALUES-0000000000", "source", ["topic:in"], ["split"]),
        ("split", "branch", [], ["split-0", "split-1"]),
        ("split-0", "branch_child", [], ["KSTREAM-MAPVALUES-0000000001"]),
        ("split-1", "branch_child", [], ["KSTREAM-SINK-0000000002"]),
        ("KSTREAM-MAPVALUES-0000000001", "map_values", [], ["small-out"]),
        ("small-out", "to", ["topic:small"], []),
        ("KSTREAM-SINK-0000000002", "to", ["topic:large"], [])]


def test_a_name_given_twice_is_an_error_naming_it() -> None:
    """A user's operator name taken already in the builder (by a user or a generated
    name) is a ``ConfigError`` naming it and the builder; so is an empty name."""
    builder = Builder("names", stores="memory")
    stream = builder.stream("in", name="read")
    with pytest.raises(ConfigError, match=r"operator name 'read' is taken in builder "
                                          r"'names': operator names are unique per builder"):
        stream.map_values(str, name="read")
    stream.filter(bool)
    with pytest.raises(ConfigError, match="'KSTREAM-FILTER-0000000000' is taken"):
        stream.peek(print, name="KSTREAM-FILTER-0000000000")
    with pytest.raises(ConfigError, match="an operator name must not be empty"):
        stream.peek(print, name="")


def test_a_join_merges_stages_and_keeps_every_node_in_the_stage_left() -> None:
    """A stream-table join of two sources makes one processor, named after the table's
    stage, holding both sources' nodes in declaration order; the stream's stage number
    is not used again."""
    builder = Builder("joined", stores="memory", cache=False)
    users = builder.table("users", name="users")
    builder.stream("clicks").join(users, lambda click, user: [click, user], name="enrich"
                                  ).to("out")
    builder.stream("more").to("out")
    app = builder.build()
    assert [p["name"] for p in describe(app)["processors"]] == ["stage-0", "stage-2"]
    assert operators(app)["stage-0"] == [
        ("users", "table", ["topic:users", "store:users"], []),  # enrich looks it up
        ("KSTREAM-SOURCE-0000000000", "source", ["topic:clicks"], ["enrich"]),
        ("enrich", "join", [], ["KSTREAM-SINK-0000000001"]),
        ("KSTREAM-SINK-0000000001", "to", ["topic:out"], [])]


def test_a_foreign_key_join_is_wired_across_its_two_repartitions() -> None:
    """The foreign-key join's nodes: the subscription sent from the left table's stage,
    answered in the right table's, the response read back into the result, stored as
    the join's name, which names the result's node."""
    builder = Builder("fk", stores="memory")
    orders, users = builder.table("orders"), builder.table("users")
    orders.join_foreign(users, lambda order: order["user"], lambda o, u: [o, u],
                        name="orders-users").to_stream().to("out")
    by_stage = operators(builder.build())
    subscription = "repartition:orders-users-subscription (fk-orders-users-subscription-" \
                   "repartition)"
    response = "repartition:orders-users-response (fk-orders-users-response-repartition)"
    assert by_stage["stage-0"] == [
        ("KTABLE-SOURCE-0000000000", "table", ["topic:orders", "store:orders"],
         ["KTABLE-FK-JOIN-SUBSCRIPTION-REGISTRATION-0000000002"]),
        ("KTABLE-FK-JOIN-SUBSCRIPTION-REGISTRATION-0000000002", "fk_subscribe",
         [subscription, "store:orders-users-state"], ["orders-users"]),
        ("orders-users", "fk_result", ["store:orders-users"],
         ["KTABLE-TOSTREAM-0000000006"]),
        ("KSTREAM-SOURCE-0000000005", "source", [response], ["orders-users"]),
        ("KTABLE-TOSTREAM-0000000006", "to_stream", [], ["KSTREAM-SINK-0000000007"]),
        ("KSTREAM-SINK-0000000007", "to", ["topic:out"], [])]
    assert by_stage["stage-1"] == [
        ("KTABLE-SOURCE-0000000001", "table", ["topic:users", "store:users"],
         ["KTABLE-FK-JOIN-SUBSCRIPTION-PROCESSOR-0000000003"]),
        ("KTABLE-FK-JOIN-SUBSCRIPTION-PROCESSOR-0000000003", "fk_answer",
         [response, "store:orders-users-subscribers"], []),
        ("KSTREAM-SOURCE-0000000004", "source", [subscription],
         ["KTABLE-FK-JOIN-SUBSCRIPTION-PROCESSOR-0000000003"])]


def test_cli_describe_json_lists_the_operators(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    """`kasper app describe module:app --json` gives each DSL stage's operators."""
    (tmp_path / "wc_module.py").write_text(
        "from kasper_py.dsl import Builder\n"
        "builder = Builder('wc', stores='memory')\n"
        "builder.stream('lines').flat_map_values(str.split, name='split')"
        ".group_by(lambda _k, w: w).count('counts').to_stream().to('counts-out')\n"
        "app = builder.build()\n")
    monkeypatch.setenv("KASPER_BOOTSTRAP_SERVERS", "127.0.0.1:1")
    assert cli.main(["app", "describe", "wc_module:app", "--app-dir", str(tmp_path),
                     "--json"]) == 0
    found: dict[str, Any] = json.loads(capsys.readouterr().out)
    assert [[o["name"] for o in p["operators"]] for p in found["processors"]] == [
        ["KSTREAM-SOURCE-0000000000", "split", "KSTREAM-KEY-SELECT-0000000001",
         "KSTREAM-COMBINE-0000000002"],
        ["KSTREAM-SOURCE-0000000003", "KSTREAM-AGGREGATE-0000000004",
         "KTABLE-TOSTREAM-0000000005", "KSTREAM-SINK-0000000006"]]
    assert found["processors"][1]["operators"][1] == {
        "name": "KSTREAM-AGGREGATE-0000000004", "kind": "count", "links": ["store:counts"],
        "to": ["KTABLE-TOSTREAM-0000000005"]}
