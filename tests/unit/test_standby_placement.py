"""The group members' standby placement: rendezvous hashing over non-owners."""

from __future__ import annotations

from pathlib import Path

import pytest
import structlog.testing

from kasper_py import Config, cli
from kasper_py.app.plan import describe
from kasper_py.cli.app import render, standby_listing
from kasper_py.cli.offsets import group_standbys
from kasper_py.dsl import Builder
from kasper_py.exceptions import AdminError
from kasper_py.kafka.admin import GroupMember, GroupState
from kasper_py.loop.standby_placement import (
    MemberPlacement,
    group_placement,
    standby_placement,
    warm_owner_probability,
)

MEMBERS = ["m-a", "m-b", "m-c"]
OWNERS = {0: "m-a", 1: "m-b", 2: "m-c", 3: "m-a", 4: "m-b", 5: "m-c"}


def test_each_partition_warm_in_replicas_non_owners() -> None:
    placed = standby_placement("orders", OWNERS, MEMBERS, 1)
    for partition, owner in OWNERS.items():
        holders = [m for m, parts in placed.items() if partition in parts]
        assert len(holders) == 1
        assert holders != [owner]


def test_replicas_at_least_members_minus_one_warms_every_partition_everywhere() -> None:
    placed = standby_placement("orders", OWNERS, MEMBERS, 5)
    for member in MEMBERS:
        assert placed[member] == tuple(p for p, o in sorted(OWNERS.items()) if o != member)


def test_placement_is_the_same_whatever_order_members_are_learned_in() -> None:
    one = standby_placement("orders", OWNERS, MEMBERS, 1)
    other = standby_placement("orders", dict(reversed(list(OWNERS.items()))),
                              list(reversed(MEMBERS)), 1)
    assert one == other


def test_a_member_leaving_moves_only_the_copies_it_held() -> None:
    owners = dict.fromkeys(range(64), "m-a")
    before = standby_placement("orders", owners, ["m-a", "m-b", "m-c", "m-d"], 1)
    after = standby_placement("orders", owners, ["m-a", "m-b", "m-c"], 1)
    for member in ("m-b", "m-c"):
        assert set(before[member]) <= set(after[member])
    assert set(after["m-b"]) | set(after["m-c"]) == set(range(64))


def test_no_replicas_places_nothing() -> None:
    assert standby_placement("orders", OWNERS, MEMBERS, 0) == dict.fromkeys(MEMBERS, ())


def test_warm_owner_probability() -> None:
    assert warm_owner_probability(3, 1) == 0.5
    assert warm_owner_probability(3, 2) == 1.0
    assert warm_owner_probability(5, 9) == 1.0
    assert warm_owner_probability(1, 1) == 0.0


def test_group_placement_follows_the_described_group() -> None:
    state = GroupState("STABLE", (
        GroupMember("w0", "/10.0.0.1", (("orders", 0), ("other", 1))),
        GroupMember("w1", "/10.0.0.2", (("orders", 1),)),
    ))
    assert group_placement(state, "orders", 1) == {"w0@10.0.0.1": (1,),
                                                    "w1@10.0.0.2": (0,)}


def member_config() -> Config:
    return Config(name="wc", bootstrap_servers="unused:0", input_topics=["orders", "other"],
                  assignment="group", num_standby_replicas=1,
                  consumer_overrides={"client.id": "w1"})


def test_a_member_keeps_warm_what_the_placement_gives_it() -> None:
    """Found by its client id, the member keeps the first input topic's placement."""
    state = GroupState("STABLE", (
        GroupMember("w0", "/10.0.0.1", (("orders", 0), ("other", 0))),
        GroupMember("w1", "/10.0.0.2", (("orders", 1), ("other", 1))),
    ))
    assert MemberPlacement(member_config(), lambda: state)() == (0,)


def test_a_member_not_found_once_keeps_what_it_keeps_and_says_why() -> None:
    """Not in the group yet, its client id on two members, or the group not described:
    ``None`` (nothing changes), each reason logged once."""
    alone = GroupState("STABLE", (GroupMember("w0", "/10.0.0.1", ()),))
    twice = GroupState("STABLE", (GroupMember("w1", "/10.0.0.1", ()),
                                  GroupMember("w1", "/10.0.0.2", ())))
    states = iter([alone, alone, twice])

    def describe() -> GroupState:
        state = next(states, None)
        if state is None:
            raise AdminError("describing group 'wc' failed")
        return state

    placement = MemberPlacement(member_config(), describe)
    with structlog.testing.capture_logs() as logs:
        assert [placement() for _ in range(4)] == [None] * 4
    assert [(e["event"], e["reason"]) for e in logs] == [
        ("kasper.standby_not_placed", "not in the group yet"),
        ("kasper.standby_not_placed",
         "client.id shared by several members: set one per process"),
        ("kasper.standby_not_placed", "group not described")]


def test_kasper_lag_lists_the_members_keeping_each_partition_warm() -> None:
    """``kasper lag``'s STANDBYS column: each partition's warm members, by the same
    rule the members follow; nothing to list outside group mode or without replicas."""
    state = GroupState("STABLE", (
        GroupMember("w0", "/10.0.0.1", (("orders", 0),)),
        GroupMember("w1", "/10.0.0.2", (("orders", 1),)),
        GroupMember("w2", "/10.0.0.3", ()),
    ))
    group = Config(name="wc", bootstrap_servers="unused:0", input_topics=["orders"],
                   assignment="group", num_standby_replicas=2)
    assert group_standbys(group, state) == {0: ("w1@10.0.0.2", "w2@10.0.0.3"),
                                            1: ("w0@10.0.0.1", "w2@10.0.0.3")}
    static = Config(name="wc", bootstrap_servers="unused:0", input_topics=["orders"],
                    num_standby_replicas=1)
    assert group_standbys(static, state) is None


def test_describe_lists_the_members_keeping_each_partition_warm() -> None:
    """`kasper app describe --members` in group mode: each partition of the first input
    topic with the members whose placement keeps it warm, as `kasper lag` shows them."""
    state = GroupState("STABLE", (
        GroupMember("w0", "/10.0.0.1", (("orders", 0),)),
        GroupMember("w1", "/10.0.0.2", (("orders", 1),)),
    ))
    listing = standby_listing(member_config(), group_standbys(member_config(), state))
    assert listing == {"topic": "orders", "partitions": {"0": ["w1@10.0.0.2"],
                                                          "1": ["w0@10.0.0.1"]}}
    builder = Builder("wc", stores="memory")
    builder.stream("orders").group_by_key().count("counts")
    text = render({**describe(builder.build(), member_config()), "standbys": listing})
    assert ("  standbys (members keeping each partition warm):\n"
            "    partition 0: w1@10.0.0.2\n    partition 1: w0@10.0.0.1") in text


def test_cli_describe_lists_the_partitions_a_static_process_keeps_warm(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """With a static set and standby partitions, `kasper app describe` (no connection)
    names the partitions this process keeps warm; without standbys it says nothing."""
    (tmp_path / "warm_module.py").write_text(
        "from kasper_py.dsl import Builder\n"
        "builder = Builder('warm', stores='memory')\n"
        "builder.stream('orders').group_by_key().count('counts')\n"
        "app = builder.build()\n")
    monkeypatch.setenv("KASPER_BOOTSTRAP_SERVERS", "127.0.0.1:1")
    base = ["app", "describe", "warm_module:app", "--app-dir", str(tmp_path)]
    assert cli.main(base) == 0
    assert "standbys" not in capsys.readouterr().out
    monkeypatch.setenv("KASPER_INPUT_PARTITIONS", "0")
    monkeypatch.setenv("KASPER_STANDBY_PARTITIONS", "1,2")
    assert cli.main(base) == 0
    assert "  standbys: this process keeps partitions 1,2 warm" in capsys.readouterr().out
