"""Which process of an app leads, for its leader-only tasks (``Task(on_leader=True)``).

Each process runs a ``LeaderElector``: a consumer of its own, on a daemon thread, in
the group ``<Config.group>.leader``, subscribed to the one-partition topic
``<Config.name>-leader`` (created at start). The member holding partition 0 leads;
nothing is ever produced to that topic, the group's assignment is the election. The
lead moves when its holder leaves the group (at once on a graceful close) or dies
(after the session timeout, ``SESSION_TIMEOUT_MS``).

The assignor is ``cooperative-sticky``: a partition changes owner only after its old
owner gave it up (the revocation is handled before the new owner is assigned), and a
process joining or restarting leaves the lead where it is. The caveat every Kafka
group shares: a process paused past the session timeout (a stopped VM, a long GC
pause) is replaced while it does not know it yet, so until it polls again (within
``POLL_SECONDS`` of waking) both may run a leader-only task once.

A process with no leader-only task, or on the in-memory broker or the testing driver,
elects nothing: ``AlwaysLeader`` (a lone process always leads).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from typing import Any, Protocol

import structlog
from confluent_kafka import Consumer, TopicPartition

from kasper_py.config import Config
from kasper_py.kafka.admin import topic_admin
from kasper_py.kafka.client_log import with_client_log
from kasper_py.kafka.topics import leader_group, leader_spec, leader_topic
from kasper_py.observability.observe import LoopObserver
from kasper_py.time import Task

__all__ = ["POLL_SECONDS", "SESSION_TIMEOUT_MS", "AlwaysLeader", "Election",
           "LeaderElector", "election_for", "leader_group", "leader_topic"]

_log = structlog.get_logger("kasper_py")
POLL_SECONDS = 0.1
"""How often the elector serves its consumer (rebalance callbacks run inside a poll)."""
SESSION_TIMEOUT_MS = 6000
"""A dead leader's lead moves after this (the broker's default minimum): short, since
the elector's consumer never waits on a turn."""
_HEARTBEAT_MS = 1000


class Election(Protocol):
    """Says whether this process leads now; started with the loop, closed with it."""

    def start(self) -> None:
        """Join the election (needs Kafka)."""

    def leading(self) -> bool:
        """True while this process leads; cheap, from any thread."""

    def close(self) -> None:
        """Leave the election: the lead, if held, moves at once."""


class AlwaysLeader:
    """No election: the process is alone, or runs no leader-only task."""

    def start(self) -> None:
        pass

    def leading(self) -> bool:
        return True

    def close(self) -> None:
        pass


def election_for(config: Config, tasks: Sequence[Task], observer: LoopObserver, *,
                 kafka: bool) -> Election:
    """A ``LeaderElector`` when some task runs ``on_leader`` and the loop runs on
    Kafka (``kafka``: real clients), else ``AlwaysLeader``."""
    if kafka and any(task.on_leader for task in tasks):
        return LeaderElector(config, observer)
    return AlwaysLeader()


class LeaderElector:
    """This process's member of the leader group (see the module docstring)."""

    def __init__(self, config: Config, observer: LoopObserver) -> None:
        self.config = config
        self.topic = leader_topic(config.name)
        self.group = leader_group(config)
        self._observer = observer
        self._leading = False
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    def consumer_conf(self) -> dict[str, Any]:
        """The loop's consumer settings (connection, security, overrides) with the
        election's own group, protocol, assignor and session timeout."""
        conf: dict[str, Any] = {
            **self.config.to_consumer_conf(),
            "group.id": self.group, "client.id": f"{self.config.name}-leader-{os.getpid()}",
            "group.protocol": "classic", "partition.assignment.strategy": "cooperative-sticky",
            "session.timeout.ms": SESSION_TIMEOUT_MS, "heartbeat.interval.ms": _HEARTBEAT_MS,
            "enable.auto.commit": False, "auto.offset.reset": "latest"}
        for key in ("group.remote.assignor", "group.instance.id"):
            conf.pop(key, None)  # a static member would keep the lead past its death
        return conf

    def start(self) -> None:
        """Create the election's topic if absent, join the group on a daemon thread.
        Raises ``TopicError`` when the topic cannot be created."""
        if self._thread is not None:
            return
        topic_admin(self.config).ensure([leader_spec(self.topic)])
        consumer = Consumer(with_client_log(self.consumer_conf(), self.config.name, "consumer"))
        consumer.subscribe([self.topic], on_assign=self._assigned, on_revoke=self._revoked,
                           on_lost=self._lost)
        self._observer.on_leader(False)
        _log.info("kasper.leader_electing", processor=self.config.name, group=self.group,
                  topic=self.topic, pid=os.getpid())
        self._thread = threading.Thread(target=self._serve, args=(consumer,), daemon=True,
                                        name=f"kasper-leader-{self.config.name}")
        self._thread.start()

    def leading(self) -> bool:
        """True while this process holds the lead."""
        return self._leading

    def close(self, timeout: float = 30.0) -> None:
        """Leave the group (the lead moves at once) and stop the thread."""
        self._stopping.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)

    def _serve(self, consumer: Consumer) -> None:
        """Poll until closed; the consumer is used on this thread only."""
        try:
            while not self._stopping.is_set():
                consumer.poll(POLL_SECONDS)  # the topic stays empty: this serves callbacks
        except Exception as exc:  # a fatal client error: step down, others lead
            _log.error("kasper.leader_failed", processor=self.config.name,
                       error=f"{type(exc).__name__}: {exc}")
        finally:
            self._lose("closed")
            try:
                consumer.close()  # leaves the group
            except Exception as exc:
                _log.warning("kasper.leader_close_failed", processor=self.config.name,
                             error=f"{type(exc).__name__}: {exc}")

    # -- rebalance callbacks, on the elector's thread ------------------------------------

    def _assigned(self, _consumer: Consumer, partitions: list[TopicPartition]) -> None:
        if any(tp.partition == 0 for tp in partitions) and not self._leading:
            self._leading = True
            _log.info("kasper.leader_elected", processor=self.config.name, group=self.group,
                      pid=os.getpid())
            self._observer.on_leader(True)

    def _revoked(self, _consumer: Consumer, partitions: list[TopicPartition]) -> None:
        if any(tp.partition == 0 for tp in partitions):
            self._lose("revoked")

    def _lost(self, _consumer: Consumer, partitions: list[TopicPartition]) -> None:
        if any(tp.partition == 0 for tp in partitions):
            self._lose("lost")

    def _lose(self, why: str) -> None:
        if self._leading:
            self._leading = False
            _log.info("kasper.leader_lost", processor=self.config.name, group=self.group,
                      pid=os.getpid(), why=why)
            self._observer.on_leader(False)
