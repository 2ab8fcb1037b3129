"""``kasper offsets show``, ``kasper offsets reset`` and ``kasper lag``: the group's
offsets and lag, read and moved through ``KafkaAdmin``; and ``Progress``, the display of
long work. Kafka's errors arrive mapped by the admin and become exit codes here.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any, TextIO

import structlog

from kasper_py.cli.base import (
    EXIT_BROKER,
    EXIT_CONFIG,
    EXIT_FAILED,
    EXIT_OK,
    EXIT_REFUSED,
    EXIT_USAGE,
    CliError,
)
from kasper_py.config import Config
from kasper_py.exceptions import AdminError, ConfigError, KasperError
from kasper_py.kafka.admin import GroupState, KafkaAdmin
from kasper_py.kafka.offsets import (
    GROUP_ACTIVE_ERRORS,
    IDLE_GROUP_STATES,
    PartitionProgress,
    running_loop,
    running_window,
)
from kasper_py.kafka.positions import (
    Position,
    parse_offset,
    parse_position,
    resolve_position,
    to_millis,
)
from kasper_py.kafka.topics import input_partitions
from kasper_py.loop.standby_placement import group_placement
from kasper_py.message import TopicPartitionKey

__all__ = ["Progress", "ResetTarget", "add_offsets_parsers", "admin_for", "alter_offsets",
           "clear_running_notes", "describe_target", "group_of", "lag", "loop_placement",
           "offsets_reset",
           "offsets_show", "probe", "read_progress", "refuse_if_active", "refuse_if_running",
           "reset_table", "reset_target", "reset_targets"]

_log = structlog.get_logger("kasper_py.cli")

ExplicitOffset = tuple[str, int, int]
"""One ``--to-offset``: topic, partition, offset."""
ResetTarget = str | int | list[ExplicitOffset]
"""``--to``: earliest, latest or epoch ms; or the ``--to-offset`` list."""


def add_offsets_parsers(commands: Any, add_config_flags: Callable[[Any], None]) -> None:
    """``kasper offsets show|reset`` and ``kasper lag``."""
    offsets = commands.add_parser("offsets", help="show or reset the group's offsets")
    actions = offsets.add_subparsers(dest="action", required=True, metavar="ACTION")
    add_config_flags(actions.add_parser("show", help="committed offsets and watermarks"))
    reset = actions.add_parser("reset", help="move the committed offsets (group must be idle)")
    where = reset.add_mutually_exclusive_group(required=True)
    where.add_argument("--to", type=reset_target, metavar="WHERE",
                       help="every input partition to earliest, latest, an ISO-8601 time "
                            "(UTC if no zone) or epoch ms")
    # Same dest as --to: the reset receives one target, a list when given as offsets.
    where.add_argument("--to-offset", dest="to", action="append", type=_offset_target,
                       metavar="TOPIC:PARTITION=OFFSET",
                       help="only this partition, to this offset (repeat for more); e.g. "
                            "past a record that fails every run: its offset + 1")
    reset.add_argument("--dry-run", action="store_true", help="show the plan, change nothing")
    reset.add_argument("--force", action="store_true",
                       help="reset although a kasper loop committed recently without saying "
                            "it stopped (one killed with -9, say): make sure it is gone")
    add_config_flags(reset)
    add_config_flags(commands.add_parser("lag", help="the group's lag per partition"))


def reset_target(text: str) -> str | int:
    """``--to``'s type: ``earliest``/``latest``, or a timestamp in epoch milliseconds."""
    try:
        position = parse_position(text, offsets=False)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return to_millis(position) if isinstance(position, datetime) else str(position)


def _offset_target(text: str) -> ExplicitOffset:
    """``TOPIC:PARTITION=OFFSET``; Kafka topic names cannot hold ``:`` or ``=``."""
    try:
        return parse_offset(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


# -- Kafka access ---------------------------------------------------------------------

def admin_for(config: Config, timeout: float, *, client_id: str | None = None,
              group: str | None = None, read_committed: bool = False) -> KafkaAdmin:
    """The CLI's admin (``ConfigError`` as exit 3): by default its own client id and
    offsets read as they stand (read_uncommitted: not waited on while a killed
    exactly-once loop's transaction is open); ``group`` defaults to the processor's."""
    try:
        return KafkaAdmin(config, timeout=timeout, client_id=client_id or f"{config.name}-cli",
                          read_committed=read_committed, group=group)
    except ConfigError as exc:
        raise CliError(EXIT_CONFIG, str(exc)) from None


def probe(config: Config, admin: KafkaAdmin, timeout: float) -> Any:
    """Cluster metadata, or ``CliError(EXIT_BROKER)`` when no broker answers."""
    try:
        return admin.metadata()
    except AdminError as exc:
        detail = admin.errors[0] if admin.errors else _cause(exc)
        raise CliError(EXIT_BROKER, f"cannot reach Kafka at {config.bootstrap_servers} "
                       f"within {timeout:g}s: {detail}") from None


def _cause(exc: KasperError) -> str:
    cause = exc.__cause__
    error = cause.args[0] if cause is not None and cause.args else exc
    return str(error.str() if hasattr(error, "str") else error)


def _read_offsets(config: Config, admin: KafkaAdmin, metadata: Any) -> list[PartitionProgress]:
    return read_progress(config, admin, input_partitions(config, metadata))


def read_progress(config: Config, admin: KafkaAdmin, keys: list[TopicPartitionKey]
                  ) -> list[PartitionProgress]:
    """Committed offset, commit note and watermarks of each of ``keys`` in the admin's
    group; ``CliError(EXIT_BROKER)`` when Kafka fails to answer."""
    progress = Progress("reading offsets", len(keys))
    try:
        return admin.progress(keys)
    except AdminError as exc:
        raise CliError(EXIT_BROKER, f"reading offsets of group {admin.group_id!r} failed: "
                       f"{_cause(exc)}") from None
    finally:
        progress.update(len(keys))
        progress.finish()


def group_of(config: Config, admin: KafkaAdmin) -> GroupState:
    """The group's state and members (``admin.group``); ``CliError`` (the broker's exit
    code) when it cannot be read."""
    try:
        return admin.group()
    except AdminError as exc:
        raise CliError(EXIT_BROKER, f"describing group {admin.group_id!r} failed: "
                       f"{_cause(exc)}") from None


# -- kasper offsets show / kasper lag ------------------------------------------------

def offsets_show(config: Config, timeout: float) -> int:
    """Print the group's state, committed offsets, watermarks, lag and owners."""
    with admin_for(config, timeout) as admin:
        metadata = probe(config, admin, timeout)
        group = group_of(config, admin)
        rows = _read_offsets(config, admin, metadata)
    print(f"group {config.group} ({group.state.lower()}, {len(group.members)} members)")
    owners = group.owners()
    table = [["TOPIC", "PARTITION", "COMMITTED", "LOW", "HIGH", "LAG", "MEMBER"]]
    table += [[r.topic, str(r.partition), "-" if r.committed is None else str(r.committed),
               str(r.low), str(r.high), str(r.lag(config.auto_offset_reset)),
               owners.get(r.key, "-")] for r in rows]
    print(_format_table(table))
    notes = [r.note for r in rows if r.note is not None]
    if notes:
        print(f"last commit by a kasper loop: {max(notes, key=lambda n: n.at).describe()}")
    return EXIT_OK


def lag(config: Config, timeout: float) -> int:
    """Print the group's lag per partition and in total, who runs each partition and,
    with standbys, who keeps each partition warm (``placement``)."""
    with admin_for(config, timeout) as admin:
        rows = _read_offsets(config, admin, probe(config, admin, timeout))
        group = group_of(config, admin)
    owners, warm = placement(config, group, rows)
    lags = [r.lag(config.auto_offset_reset) for r in rows]
    table = [["TOPIC", "PARTITION", "LAG", "MEMBER"]]
    table += [[r.topic, str(r.partition), str(lag), owners.get(r.key, "-")]
              for r, lag in zip(rows, lags, strict=True)]
    if warm is not None:
        table[0].append("STANDBYS")
        for row, r in zip(table[1:], rows, strict=True):
            row.append(",".join(warm.get(r.partition, ())) or "-")
    print(_format_table(table))
    print(f"total lag of group {config.group}: {sum(lags)} messages")
    return EXIT_OK


def placement(config: Config, group: GroupState, rows: list[PartitionProgress]
              ) -> tuple[dict[TopicPartitionKey, str], dict[int, tuple[str, ...]] | None]:
    """Who runs each input partition and who keeps each partition warm (``None``: no
    standbys anywhere): in group mode, the group's members and ``group_standbys``; with
    static partition sets, what the loops' commit notes on ``rows`` say now
    (``loop_placement``). A group with members is in group mode whatever ``config``
    says (``kasper run --assignment group`` given on the command line, not in the file
    ``kasper lag`` reads): static loops never join it, and its members' notes lag a
    rebalance."""
    if config.group_mode or group.members:
        return group.owners(), group_standbys(config, group)
    return loop_placement(config, rows)


def loop_placement(config: Config, rows: list[PartitionProgress]
                   ) -> tuple[dict[TopicPartitionKey, str], dict[int, tuple[str, ...]] | None]:
    """Static loops never join the group; their commit notes say where they stand. A
    partition is run by the loop whose recent ``running`` note is on it (none when
    released or stopped); a running loop keeps warm what its newest note says (after a
    promotion not the promoted partitions, after a release them again; each loop
    re-commits at least every ``HEARTBEAT_SECONDS``). ``None`` for the standbys when
    no loop keeps any."""
    window = running_window(config)
    live = sorted(((r.key, note) for r in rows if (note := r.note) is not None
                   and note.state == "running" and note.alive(window)),
                  key=lambda found: found[1].at)
    newest = {note.runner: note for _, note in live}
    warm: dict[int, tuple[str, ...]] = {}
    for runner, note in sorted(newest.items()):
        for partition in note.standbys:
            warm[partition] = (*warm.get(partition, ()), runner)
    return {key: note.runner for key, note in live}, warm or None


def group_standbys(config: Config, group: GroupState) -> dict[int, tuple[str, ...]] | None:
    """The members keeping each partition warm, as each member computes it at run time
    (``loop.standby_placement``, of the first input topic); ``None`` unless group mode
    with ``num_standby_replicas``."""
    if not (config.group_mode and config.num_standby_replicas):
        return None
    placed = group_placement(group, config.input_topics[0], config.num_standby_replicas)
    warm: dict[int, tuple[str, ...]] = {}
    for member, partitions in sorted(placed.items()):
        for partition in partitions:
            warm[partition] = (*warm.get(partition, ()), member)
    return warm


def _format_table(rows: list[list[str]]) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True))
                     .rstrip() for row in rows)


# -- kasper offsets reset -------------------------------------------------------------

def offsets_reset(config: Config, to: ResetTarget, dry_run: bool, timeout: float,
                  force: bool = False) -> int:
    """Move the group's committed offsets to ``to`` (refused while it is active)."""
    with admin_for(config, timeout) as admin:
        metadata = probe(config, admin, timeout)
        refuse_if_active(config, admin)
        current = _read_offsets(config, admin, metadata)
        if not force:
            refuse_if_running(config, current, dry_run=dry_run)
        targets = reset_targets(config, current, to, admin)
        print(reset_table(current, targets))
        if dry_run:
            print(f"dry run: group {config.group} unchanged")
            return EXIT_OK
        alter_offsets(config, admin, targets)
    print(f"group {config.group}: {len(targets)} partitions reset to {describe_target(to)}")
    return EXIT_OK


def reset_table(current: list[PartitionProgress], targets: dict[TopicPartitionKey, int]
                ) -> str:
    """The partitions a reset moves: committed offset and new offset of each."""
    table = [["TOPIC", "PARTITION", "COMMITTED", "NEW"]]
    table += [[r.topic, str(r.partition), "-" if r.committed is None else str(r.committed),
               str(targets[r.key])] for r in current if r.key in targets]
    return _format_table(table)


def describe_target(to: ResetTarget) -> str:
    """``--to``/``--to-offset`` in words: ``earliest``, a time with its ms, or offsets."""
    if isinstance(to, list):
        return ", ".join(f"{topic}:{partition}={offset}" for topic, partition, offset in to)
    if isinstance(to, str):
        return to
    moment = datetime.fromtimestamp(to / 1000, tz=UTC)
    return f"{moment.isoformat(timespec='milliseconds')} ({to} ms)"


def refuse_if_active(config: Config, admin: KafkaAdmin) -> GroupState:
    """The admin's group's state (``DEAD``: no such group) when it has no members;
    ``CliError(EXIT_REFUSED)`` naming them while it has."""
    group: GroupState = group_of(config, admin)
    if group.members or group.state not in IDLE_GROUP_STATES:
        listed = ", ".join(m.describe() for m in group.members) or "none"
        raise CliError(EXIT_REFUSED, f"group {admin.group_id!r} is active "
                       f"({group.state.lower()}, members: {listed}): stop its processors "
                       "first")
    return group


def refuse_if_running(config: Config, current: list[PartitionProgress], *,
                      dry_run: bool = False) -> None:
    """``CliError(EXIT_REFUSED)`` while a loop runs: one with a static assignment is no
    group member, but its commit notes show it, and its next commit would overwrite a
    reset. A ``dry_run`` changes nothing, so it is never refused: it warns on stderr."""
    note = running_loop(config, [r.note for r in current])
    if note is None:
        return
    running = f"a kasper loop is {note.describe()}"
    if dry_run:
        print(f"kasper: warning: {running}: a reset now would be refused (and undone by "
              "its next commit) unless it has stopped", file=sys.stderr, flush=True)
        return
    raise CliError(EXIT_REFUSED, f"group {config.group!r} is being processed: {running}, "
                   "and its next commit would undo the reset; stop it first (its last "
                   "commit then says it stopped), or pass --force if it is gone (a loop "
                   f"counts as running for {running_window(config):.0f} s after its last "
                   "commit)")


def clear_running_notes(config: Config, timeout: float) -> int:
    """After this process's loop was stopped at once (a second Ctrl-C: no last commit),
    its commit notes still say running and would refuse resets for ``running_window``
    seconds. Where a partition's last commit is this process's running note, commit the
    same offset, read back from the broker (so none moves), with a stopped note: safe,
    since nothing was committed after it and the loop no longer consumes. Returns how
    many partitions; 0 when Kafka does not answer or the group has members (group mode:
    the others' commits speak for it)."""
    try:
        with admin_for(config, timeout) as admin:
            rows = _read_offsets(config, admin, probe(config, admin, timeout))
            mine = {r.key: r.committed for r in rows if r.committed is not None
                    and r.note is not None and r.note.is_mine() and r.note.state == "running"}
            note = next((r.note for r in rows if r.key in mine), None)
            if note is None:
                return 0
            admin.commit(mine, replace(note, state="stopped", at=time.time()).encode())
    except (CliError, KasperError):
        return 0
    return len(mine)


def reset_targets(config: Config, current: list[PartitionProgress], to: ResetTarget,
                  admin: KafkaAdmin) -> dict[TopicPartitionKey, int]:
    """Where each partition moves: ``resolve_position`` over the current watermarks."""
    if isinstance(to, list):
        return _explicit_targets(config, current, to)
    watermarks = {r.key: (r.low, r.high) for r in current}
    keys = list(watermarks)
    if isinstance(to, str):
        edge: Position = "earliest" if to == "earliest" else "latest"
        return resolve_position(edge, keys, watermarks, lambda _millis: {})
    progress = Progress(f"finding offsets at {to} ms", len(current))
    try:
        found = resolve_position(datetime.fromtimestamp(to / 1000, tz=UTC), keys, watermarks,
                                 lambda millis: admin.offsets_at(millis, watermarks))
        progress.update(len(current))
        return found
    except AdminError as exc:
        raise CliError(EXIT_BROKER, f"offsets_for_times failed: {_cause(exc)}") from None
    finally:
        progress.finish()


def _explicit_targets(config: Config, current: list[PartitionProgress],
                      wanted: list[ExplicitOffset]) -> dict[TopicPartitionKey, int]:
    """The ``--to-offset`` targets, each checked against its partition's watermarks:
    Kafka answers an offset it no longer (or not yet) holds with "out of range", and
    the next run would silently start at ``auto_offset_reset`` instead."""
    rows = {r.key: r for r in current}
    targets: dict[TopicPartitionKey, int] = {}
    for topic, partition, offset in wanted:
        row = rows.get((topic, partition))
        if row is None:
            owned = ", ".join(f"{t}:{p}" for t, p in rows)
            raise CliError(EXIT_USAGE, f"--to-offset {topic}:{partition}: not an input "
                           f"partition of group {config.group!r} (its partitions: {owned})")
        if (topic, partition) in targets:
            raise CliError(EXIT_USAGE, f"--to-offset {topic}:{partition} is given twice")
        if not row.low <= offset <= row.high:
            raise CliError(EXIT_USAGE, f"--to-offset {topic}:{partition}={offset}: topic "
                           f"{topic!r} partition {partition} holds offsets {row.low}..{row.high}"
                           f" (low to high watermark; {row.high} is the end, after its last "
                           "record)")
        targets[topic, partition] = offset
    return targets


def alter_offsets(config: Config, admin: KafkaAdmin,
                  targets: dict[TopicPartitionKey, int]) -> None:
    """Commit ``targets`` for the group; ``CliError(EXIT_REFUSED)`` if it became active."""
    try:
        admin.commit(targets)
    except AdminError as exc:
        if exc.code in GROUP_ACTIVE_ERRORS:
            raise CliError(EXIT_REFUSED, f"group {config.group!r} became active: "
                           f"{exc}") from None
        raise CliError(EXIT_FAILED, f"resetting offsets failed: {exc}") from None


# -- progress display ------------------------------------------------------------------

class Progress:
    """Progress of long work: one line redrawn in place on a terminal; elsewhere a
    ``kasper.progress`` log line at most every ``log_every`` seconds and at the end."""

    def __init__(self, label: str, total: int, stream: TextIO | None = None,
                 log_every: float = 10.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.label, self.total, self.done = label, total, 0
        self._stream = stream or sys.stderr
        self._tty = bool(getattr(self._stream, "isatty", lambda: False)())
        self._clock, self._log_every = clock, log_every
        self._last_shown = clock()
        self._finished = False

    def advance(self, count: int = 1) -> None:
        """``count`` more units are done."""
        self.update(self.done + count)

    def update(self, done: int, total: int | None = None) -> None:
        """``done`` of ``total`` units are done; redraws when worth it."""
        self.done, self.total = done, self.total if total is None else total
        now = self._clock()
        interval = 0.1 if self._tty else self._log_every
        if now - self._last_shown >= interval or self.done >= self.total:
            self._last_shown = now
            self._show()

    def finish(self) -> None:
        """End the display (a newline on a terminal, a last log line elsewhere)."""
        if self._finished:
            return
        self._finished = True
        if self._tty:
            self._show()
            self._stream.write("\n")
            self._stream.flush()
        elif self.total >= 100:
            _log.info("kasper.progress", task=self.label, done=self.done, total=self.total)

    def _show(self) -> None:
        percent = 100 * self.done / self.total if self.total else 100.0
        if self._tty:
            self._stream.write(f"\r{self.label}: {self.done}/{self.total} ({percent:.0f}%)")
            self._stream.flush()
        elif 0 < self.done < self.total:
            _log.info("kasper.progress", task=self.label, done=self.done, total=self.total)
