"""``kasper app``: an application's topology (``describe``): its processors in turn
order, what each reads, sends to and stores (a DSL stage's operators too, by name),
the topics it owns and its channels; and ``reset``, which deletes what the app owns
so its next start reprocesses its sources. Group and offset work goes through
``kasper offsets``' functions and ``KafkaAdmin``."""

from __future__ import annotations

import argparse
import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from kasper_py.app import App, RunTarget, describe
from kasper_py.app.reset import ResetScope, reset_scope
from kasper_py.cli.base import (
    EXIT_CONFIG,
    EXIT_FAILED,
    EXIT_OK,
    EXIT_REFUSED,
    CliError,
    add_target_arguments,
    load_attr,
)
from kasper_py.cli.base import add_config_flags as add_name_flags
from kasper_py.cli.offsets import (
    ResetTarget,
    admin_for,
    alter_offsets,
    describe_target,
    group_of,
    group_standbys,
    loop_placement,
    probe,
    read_progress,
    refuse_if_active,
    refuse_if_running,
    reset_table,
    reset_target,
    reset_targets,
)
from kasper_py.config import Config
from kasper_py.exceptions import AdminError
from kasper_py.kafka.admin import KafkaAdmin
from kasper_py.kafka.offsets import GROUP_ACTIVE_ERRORS, PartitionProgress
from kasper_py.kafka.topics import input_partitions, leader_group, topic_problem
from kasper_py.message import TopicPartitionKey

__all__ = ["add_app_parsers", "app_command", "app_reset", "load_app", "render"]

_MEMBERS_TIMEOUT = 10.0
"""``kasper app describe --members``: how long to wait for Kafka."""


def add_app_parsers(commands: Any, add_config_flags: Callable[[argparse.ArgumentParser], None]
                    ) -> None:
    """``kasper app describe|reset``."""
    app = commands.add_parser("app", help="describe or reset an application "
                              "(see `kasper app -h`)")
    actions = app.add_subparsers(dest="action", required=True, metavar="ACTION")
    show = actions.add_parser("describe", help="print an app's processors, inputs, outputs, "
                              "internal topics, channels, stores and tasks")
    add_target_arguments(show, stores=False)  # an App declares its stores
    show.add_argument("--json", action="store_true", help="print it as JSON")
    show.add_argument("--members", action="store_true",
                      help="also read Kafka: in group mode, name the member holding each "
                           "partition of each internal topic; with static sets, the loop "
                           "running and those keeping warm each source partition now (from "
                           "their commit notes, so after a promotion or release too)")
    show.set_defaults(offline=True)  # reads the code and the config, never Kafka
    add_name_flags(show, ("name",))
    reset = actions.add_parser(
        "reset", help="delete an app's internal topics, group offsets and local state, so "
        "its next start reprocesses its sources (a dry run unless --execute)")
    add_target_arguments(reset)
    reset.set_defaults(accepts_app=True)
    reset.add_argument("--execute", action="store_true",
                       help="do it (without: print what it would delete, change nothing)")
    reset.add_argument("--to", type=reset_target, metavar="WHERE",
                       help="also commit the source topics' offsets at earliest, latest, an "
                            "ISO-8601 time (UTC if no zone) or epoch ms (without: none "
                            "committed, the next start reads from auto_offset_reset)")
    reset.add_argument("--force", action="store_true",
                       help="reset although a kasper loop committed recently without saying "
                            "it stopped (one killed with -9, say): make sure it is gone")
    add_config_flags(reset)


def app_command(config: Config, args: argparse.Namespace) -> int:
    """Run ``kasper app ACTION``."""
    if args.action == "reset":
        return app_reset(config, args)
    app = load_app(args)
    owners = warm = runners = None
    if args.members and config.group_mode:
        with admin_for(config, _MEMBERS_TIMEOUT) as admin:
            group = group_of(config, admin)
        owners, warm = group.owners(), group_standbys(config, group)
    elif args.members:
        runners, warm = _loops_now(config)
    topology = describe(app, config, owners)
    standbys = standby_listing(config, warm, runners)
    if standbys is not None:
        topology["standbys"] = standbys
    if args.json:
        print(json.dumps(topology, indent=2))
    else:
        print(render(topology))
    return EXIT_OK


def load_app(args: argparse.Namespace) -> App:
    """The ``App`` the command's target names; ``CliError(EXIT_CONFIG)`` for another."""
    found = load_attr(args.target, args.app_dir, "target")
    app = RunTarget.of(found).app
    if app is None:
        raise CliError(EXIT_CONFIG, f"target {args.target!r} is not an App "
                       f"(kasper_py.app.App), but a {type(found).__name__}")
    return app


def render(topology: dict[str, Any]) -> str:
    """``describe``'s data as the text ``kasper app describe`` prints."""
    lines = [f"app {topology['app']} (Config.name {topology['name']})",
             f"  sources: {', '.join(topology['sources'])}"]
    for index, node in enumerate(topology["processors"], 1):
        lines.append(f"  {index}. processor {node['name']}")
        lines.append(f"       inputs:  {', '.join(node['inputs'])}")
        if node["outputs"]:
            lines.append(f"       outputs: {', '.join(node['outputs'])}")
        if node["stores"]:
            stores = ", ".join(f"{s['name']} ({s['kind']})" for s in node["stores"])
            lines.append(f"       stores:  {stores}")
        if node.get("operators"):
            lines.append("       operators:")
            lines += [_operator_line(op) for op in node["operators"]]
    if topology["internal_topics"]:
        lines.append(f"  internal topics: {', '.join(topology['internal_topics'])}")
    for topic, found in topology.get("partitions", {}).items():
        if found["count"] is None and found["runs"] == "all":
            continue  # the sources' count, all run here: nothing to tell
        count = "the sources' count" if found["count"] is None else found["count"]
        runs = found["runs"] if isinstance(found["runs"], str) else (
            ",".join(map(str, found["runs"])) or "none")
        lines.append(f"  {topic}: {count} partitions; this process runs: {runs}")
        lines += [f"    partition {p}: {who}" for p, who in found.get("members", {}).items()]
    lines += _standby_lines(topology.get("standbys"))
    if topology["channels"]:
        lines.append(f"  channels: {', '.join(topology['channels'])}")
    for task in topology["tasks"]:
        lines.append(f"  task {task['name']}{' (on leader)' if task['on_leader'] else ''}")
    return "\n".join(lines)


def _loops_now(config: Config) -> tuple[dict[int, str], dict[int, tuple[str, ...]] | None]:
    """Static sets, ``--members``: the loop running each partition of the first input
    topic (every partition, not only the config's) and those keeping each warm, as their
    commit notes say now (``loop_placement``: a promotion or a release shows at once)."""
    with admin_for(config, _MEMBERS_TIMEOUT) as admin:
        topic = config.input_topics[0]
        partitions = probe(config, admin, _MEMBERS_TIMEOUT).topics[topic].partitions
        rows = read_progress(config, admin, [(topic, p) for p in sorted(partitions)])
    owners, warm = loop_placement(config, rows)
    return {r.partition: owners.get(r.key, "-") for r in rows}, warm or {}


def standby_listing(config: Config, warm: dict[int, tuple[str, ...]] | None,
                    runners: dict[int, str] | None = None) -> dict[str, Any] | None:
    """Where the app's tables are kept warm (docs/stores.md, standby replicas): read with
    ``--members``, the members (group mode, as each member places its copies) or loops
    (static sets, with ``runners``: the loop running each partition, from the commit
    notes) keeping each partition of the first input topic warm (``warm``); without, the
    partitions the config says this process keeps warm. ``None`` without standbys."""
    if runners is not None and warm is not None:
        numbers = sorted({*runners, *warm})
        return {"topic": config.input_topics[0],
                "partitions": {str(p): list(warm.get(p, ())) for p in numbers},
                "runners": {str(p): runners.get(p, "-") for p in numbers}}
    if warm is not None:
        return {"topic": config.input_topics[0],
                "partitions": {str(p): list(who) for p, who in sorted(warm.items())}}
    if config.standby_partitions:
        return {"topic": config.input_topics[0], "this_process": list(config.standby_partitions)}
    return None


def _standby_lines(standbys: dict[str, Any] | None) -> list[str]:
    if standbys is None:
        return []
    if "this_process" in standbys:
        kept = ",".join(map(str, standbys["this_process"]))
        return [f"  standbys: this process keeps partitions {kept} warm"]
    if "runners" in standbys:
        return [f"  {standbys['topic']} (loops running and keeping each partition warm, "
                "from their commit notes):",
                *(f"    partition {p}: run by {standbys['runners'][p]}; warm in "
                  f"{', '.join(who) or '-'}" for p, who in standbys["partitions"].items())]
    return ["  standbys (members keeping each partition warm):",
            *(f"    partition {p}: {', '.join(who) or '-'}"
              for p, who in standbys["partitions"].items())]


def _operator_line(operator: dict[str, Any]) -> str:
    """``NAME kind [links] --> children``: one operator of a processor."""
    links = f" [{', '.join(operator['links'])}]" if operator["links"] else ""
    to = f" --> {', '.join(operator['to'])}" if operator["to"] else ""
    return f"         {operator['name']} {operator['kind']}{links}{to}"


# -- kasper app reset ---------------------------------------------------------------

@dataclass(frozen=True)
class _Found:
    """What of an app's ``ResetScope`` exists now: its topics (with their partition
    counts), its groups (with their committed partitions), its local folders; and the
    sources' progress, which ``--to`` moves."""

    topics: dict[str, int]
    groups: dict[str, list[PartitionProgress]]
    paths: list[Path]
    sources: list[PartitionProgress]


def app_reset(config: Config, args: argparse.Namespace) -> int:
    """``kasper app reset``: print what resetting the app deletes (its internal topics,
    its groups' offsets, its local state); with ``--execute``, delete it. Refused
    (exit 5) while a loop runs the app, as ``kasper offsets reset`` is."""
    app = load_app(args)
    scope = reset_scope(app, config)
    # Every partition of the sources, whatever this process's input_partitions say.
    config = replace(config, input_topics=scope.sources, input_partitions=None)
    timeout = args.connect_timeout
    with admin_for(config, timeout) as admin, \
            admin_for(config, timeout, group=leader_group(config)) as leader:
        metadata = probe(config, admin, timeout)
        found = _find(config, scope, metadata, (admin, leader), args.force,
                      dry_run=not args.execute)
        targets = {} if args.to is None else reset_targets(config, found.sources, args.to,
                                                           admin)
        print(_plan_text(app, config, scope, found, to=args.to, targets=targets))
        if not args.execute:
            print("dry run: nothing changed; run again with --execute to reset")
            return EXIT_OK
        _execute(config, found, (admin, leader), targets)
    print(f"app {app.name} reset: {_summary(found, targets)}")
    return EXIT_OK


def _find(config: Config, scope: ResetScope, metadata: Any,
          admins: tuple[KafkaAdmin, KafkaAdmin], force: bool, *, dry_run: bool) -> _Found:
    """What exists of ``scope``, after refusing (exit 5) while a loop runs the app: a
    member in either group, or (unless ``force``) a recent commit note of a loop."""
    topics = {name: len(metadata.topics[name].partitions) for name in scope.topics
              if topic_problem(metadata.topics.get(name)) is None}
    sources = input_partitions(config, metadata)
    keys = [*sources, *((t, p) for t, n in topics.items() for p in range(n))]
    groups: dict[str, list[PartitionProgress]] = {}
    rows: dict[str, list[PartitionProgress]] = {}
    for admin in admins:
        state = refuse_if_active(config, admin)
        rows[admin.group_id] = read_progress(config, admin, keys)
        if state.state != "DEAD":
            groups[admin.group_id] = [r for r in rows[admin.group_id] if r.committed is not None]
    if not force:
        refuse_if_running(config, [r for group in rows.values() for r in group],
                          dry_run=dry_run)
    return _Found(topics, groups, [p for p in scope.paths if p.exists()],
                  rows[config.group][:len(sources)])


def _plan_text(app: App, config: Config, scope: ResetScope, found: _Found, *,
               to: ResetTarget | None, targets: dict[TopicPartitionKey, int]) -> str:
    """What the reset deletes and moves, one line each, then the warnings."""
    lines = [f"reset of app {app.name} (Config.name {config.name}, group {config.group}):"]
    lines += [f"  delete topic {name} ({count} partitions)"
              for name, count in found.topics.items()]
    for group, rows in found.groups.items():
        lines.append(f"  delete group {group} (committed offsets of {len(rows)} "
                     f"partitions{_topics_of(rows)})")
    lines += [f"  delete local state {path}" for path in found.paths]
    if not (found.topics or found.groups or found.paths):
        lines.append("  nothing to delete: no internal topic, group or local state exists")
    sources = ", ".join(scope.sources)
    if to is None:
        lines.append(f"  sources {sources}: nothing committed, the next start reads them "
                     f"from auto_offset_reset ({config.auto_offset_reset})")
    else:
        lines.append(f"  sources {sources}: committed at {describe_target(to)}")
        lines += ["    " + line for line in reset_table(found.sources, targets).splitlines()]
    lines += [f"warning: {external}: kept, kasper cannot reset an external store; clear it "
              "yourself, or the reprocessed input is applied on top of what it holds"
              for external in scope.external]
    return "\n".join(lines)


def _topics_of(rows: list[PartitionProgress]) -> str:
    topics = list(dict.fromkeys(r.topic for r in rows))
    return f": {', '.join(topics)}" if topics else ""


def _execute(config: Config, found: _Found, admins: tuple[KafkaAdmin, KafkaAdmin],
             targets: dict[TopicPartitionKey, int]) -> None:
    """Delete the groups first (the broker refuses while one has members: nothing else
    is touched then), the topics, commit ``targets``, then delete the local folders."""
    for admin in admins:
        if admin.group_id in found.groups:
            _delete_group(admin)
    try:
        admins[0].delete_topics(found.topics)
    except AdminError as exc:
        raise CliError(EXIT_FAILED, f"deleting the app's topics failed: {exc}") from None
    if targets:
        alter_offsets(config, admins[0], targets)
    for path in found.paths:
        shutil.rmtree(path)


def _delete_group(admin: KafkaAdmin) -> None:
    try:
        admin.delete_group()
    except AdminError as exc:
        if exc.code in GROUP_ACTIVE_ERRORS:
            raise CliError(EXIT_REFUSED, f"group {admin.group_id!r} became active: "
                           f"{exc}") from None
        raise CliError(EXIT_FAILED, f"deleting group {admin.group_id!r} failed: "
                       f"{exc}") from None


def _summary(found: _Found, targets: dict[TopicPartitionKey, int]) -> str:
    done = [_count(len(found.topics), "topic"), _count(len(found.groups), "group"),
            _count(len(found.paths), "local state folder")]
    committed = f"; {_count(len(targets), 'source partition')} committed" if targets else ""
    return f"deleted {', '.join(done)}{committed}"


def _count(number: int, thing: str) -> str:
    return f"{number} {thing}{'' if number == 1 else 's'}"
