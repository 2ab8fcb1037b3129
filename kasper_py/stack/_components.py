"""The servers of the local stack (Kafka, Redis, Cassandra, and a Spark standalone
master with two workers): how each is installed, configured, run and probed. The
schema registry and Prometheus have modules of their own.

Each component only describes itself (files, command line, readiness probe); starting,
stopping and timing them is the job of ``_lifecycle``.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import socket
import subprocess
import sys
import urllib.error
import urllib.request
import uuid
from abc import ABC, abstractmethod
from pathlib import Path
from string import Template
from typing import Any, ClassVar

from kasper_py._support.ports import LOOPBACK
from kasper_py.stack._errors import StackError
from kasper_py.stack._install import apt_install, require_binary, resolve_jars, template
from kasper_py.stack._process import port_open
from kasper_py.stack._settings import Settings
from kasper_py.stack._spark import spark_home

JAVA_HINT = "install Java 17 (e.g. apt-get install openjdk-17-jre-headless)"


class Component(ABC):
    """One server of the stack, living in ``<stack_dir>/<name>/``."""

    name: ClassVar[str]
    ready_timeout: ClassVar[float]  # seconds from launch until the probe must answer
    stop_grace: ClassVar[float] = 30.0  # seconds between SIGTERM and SIGKILL

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.directory = settings.component_dir(self.name)
        self.lib_dir = settings.lib_dir(self.name, self.recipe())
        self.pid_file = self.directory / f"{self.name}.pid"
        self.log_file = self.directory / f"{self.name}.log"

    @property
    @abstractmethod
    def port(self) -> int:
        """The TCP port clients connect to (on 127.0.0.1)."""

    @property
    def address(self) -> str:
        """Where clients connect, e.g. ``127.0.0.1:19092``."""
        return f"{LOOPBACK}:{self.port}"

    @property
    def port_variable(self) -> str:
        """The environment variable that moves ``port``."""
        return f"KASPER_{self.name.upper()}_PORT"

    def environment(self) -> dict[str, str]:
        """Variables added to the server process's environment (none by default)."""
        return {}

    def recipe(self) -> str:
        """What this component's jars are made from (its pom), which names their folder
        in the cache; empty for a component without jars of its own."""
        return ""

    def reconfigure(self, pid: int) -> bool:
        """Bring the running server ``pid`` up to this version's configuration where it
        can reload without a restart; True when it had to. Most cannot: False."""
        del pid
        return False

    @abstractmethod
    def prepare(self) -> str:
        """Install what is missing, write the configuration; return the program to run.

        Idempotent: a second call finds everything in place and only rewrites config.
        """

    @abstractmethod
    def command(self, program: str) -> list[str]:
        """The command line of the server process (run in ``self.directory``)."""

    @abstractmethod
    def is_ready(self) -> bool:
        """True once the server answers a real request."""

    def java_with_jars(self) -> tuple[str, list[Path]]:
        """A JVM server's first steps: the ``java`` to run and the jars ``recipe()``
        resolves into ``lib_dir`` (once), this component's folder made."""
        java = require_binary("java", JAVA_HINT)
        jars = resolve_jars(self.recipe(), self.lib_dir)
        self.directory.mkdir(parents=True, exist_ok=True)
        return java, jars

    def render(self, template_name: str, target_name: str, **values: object) -> Path:
        """Fill ``$names`` of a packaged template and write it into this component's dir."""
        target = self.directory / target_name
        target.write_text(Template(template(template_name)).substitute(values), encoding="utf-8")
        return target


def _java_classpath(lib_dir: Path) -> str:
    # The JVM expands a trailing `*` to every jar of the folder; the command line stays short.
    return str(lib_dir / "*")


class Kafka(Component):
    """Apache Kafka in KRaft mode, broker and controller in one JVM (jars from Maven)."""

    name = "kafka"
    ready_timeout = 90.0

    def __init__(self, settings: Settings) -> None:
        super().__init__(settings)
        self.data_dir = self.directory / "data"
        self.properties = self.directory / "server.properties"
        self.log4j = self.directory / "log4j2.properties"

    @property
    def port(self) -> int:
        return self.settings.kafka_port

    def recipe(self) -> str:
        return template("kafka-pom.xml")

    def prepare(self) -> str:
        java, _ = self.java_with_jars()
        self.render(
            "kafka-server.properties", self.properties.name, host=LOOPBACK,
            port=self.settings.kafka_port, controller_port=self.settings.kafka_controller_port,
            data_dir=self.data_dir,
        )
        self.render("kafka-log4j2.properties", self.log4j.name)
        if not (self.data_dir / "meta.properties").is_file():
            self._format_storage(java)
        return java

    def _format_storage(self, java: str) -> None:
        """Format the log dir once, as a standalone (single voter) dynamic quorum."""
        # Kafka's Uuid text form: 16 random bytes, URL-safe base64 without padding.
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        command = [*self._java_prefix(java, "-Xmx256m"), "kafka.tools.StorageTool", "format",
                   # "=" form: a cluster id may start with "-", which would read as an option
                   f"--cluster-id={cluster_id}", "--config", str(self.properties), "--standalone"]
        result = subprocess.run(command, capture_output=True, text=True, check=False)
        if result.returncode != 0:
            shutil.rmtree(self.data_dir, ignore_errors=True)  # let the next `up` retry cleanly
            raise StackError(f"kafka storage format failed:\n{result.stdout}{result.stderr}")

    def _java_prefix(self, java: str, *jvm_options: str) -> list[str]:
        return [java, *jvm_options, "-Djava.awt.headless=true",
                f"-Dlog4j2.configurationFile={self.log4j}",
                "-cp", _java_classpath(self.lib_dir)]

    def command(self, program: str) -> list[str]:
        heap = ("-Xms256m", "-Xmx1g", "-XX:+UseG1GC", "-XX:MaxGCPauseMillis=20")
        return [*self._java_prefix(program, *heap), "kafka.Kafka", str(self.properties)]

    def is_ready(self) -> bool:
        return kafka_answers(LOOPBACK, self.settings.kafka_port)


def kafka_answers(host: str, port: int) -> bool:
    """True when the broker at ``host:port`` answers a metadata request listing a broker."""
    if not port_open(host, port):
        return False  # no client yet: librdkafka would log every refused connection
    # Imported here, like every client library, so the stack module loads without them.
    from confluent_kafka import KafkaException  # noqa: PLC0415
    from confluent_kafka.admin import AdminClient  # noqa: PLC0415

    admin = AdminClient({"bootstrap.servers": f"{host}:{port}", "log_level": 0})
    try:
        metadata = admin.list_topics(timeout=2)
    except KafkaException:
        return False
    return bool(metadata.brokers)


class Redis(Component):
    """Debian's redis-server. Store state must survive a restart of it, or at-least-once
    counts silently become undercounts: an append-only file under ``data/`` by default
    (``Settings.redis_persistence``), never RDB snapshots (they lose minutes)."""

    name = "redis"
    ready_timeout = 20.0
    stop_grace = 10.0

    def __init__(self, settings: Settings) -> None:
        super().__init__(settings)
        self.data_dir = self.directory / "data"

    @property
    def port(self) -> int:
        return self.settings.redis_port

    def prepare(self) -> str:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        return apt_install("redis-server", "redis-server")

    def command(self, program: str) -> list[str]:
        return [program, "--bind", LOOPBACK, "--port", str(self.settings.redis_port),
                "--save", "", *_redis_persistence(self.settings.redis_persistence),
                "--daemonize", "no", "--dir", str(self.data_dir), "--protected-mode", "yes"]

    def is_ready(self) -> bool:
        return redis_answers(LOOPBACK, self.settings.redis_port)


def redis_answers(host: str, port: int) -> bool:
    """True when the Redis at ``host:port`` answers PING."""
    # A raw RESP PING: the probe must not need the optional `redis` package.
    try:
        with socket.create_connection((host, port), timeout=1) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(64).startswith(b"+PONG")
    except OSError:
        return False


def _redis_persistence(mode: str) -> list[str]:
    """redis-server options of a ``REDIS_PERSISTENCE`` mode. ``everysec`` writes the
    file before replying and fsyncs it once a second: a killed server loses nothing the
    kernel already holds, a host crash up to about a second (docs/stores.md)."""
    if mode == "none":
        return ["--appendonly", "no"]
    fsync = "always" if mode == "aof-always" else "everysec"
    return ["--appendonly", "yes", "--appendfsync", fsync]


class Cassandra(Component):
    """Apache Cassandra 5.0 on Java 17 (jars from Maven), one node."""

    name = "cassandra"
    ready_timeout = 180.0
    stop_grace = 60.0

    @property
    def port(self) -> int:
        return self.settings.cassandra_port

    def recipe(self) -> str:
        return template("cassandra-pom.xml")

    def prepare(self) -> str:
        java, _ = self.java_with_jars()
        self.render(
            "cassandra.yaml", "cassandra.yaml", host=LOOPBACK, directory=self.directory,
            native_port=self.settings.cassandra_port,
            storage_port=self.settings.cassandra_storage_port,
        )
        self.render("cassandra-logback.xml", "logback.xml")
        (self.directory / "triggers").mkdir(exist_ok=True)  # scanned at start; warns if absent
        return java

    def command(self, program: str) -> list[str]:
        return [
            program, *CASSANDRA_JVM_OPTIONS,
            f"-Dcassandra.config={(self.directory / 'cassandra.yaml').as_uri()}",
            f"-Dlogback.configurationFile={self.directory / 'logback.xml'}",
            f"-Dcassandra.logdir={self.directory}",
            f"-Dcassandra.storagedir={self.directory}",
            f"-Dcassandra.triggers_dir={self.directory / 'triggers'}",
            "-cp", _java_classpath(self.lib_dir), "org.apache.cassandra.service.CassandraDaemon",
        ]

    def is_ready(self) -> bool:
        if not port_open(LOOPBACK, self.settings.cassandra_port):
            return False
        return cql_answers(LOOPBACK, self.settings.cassandra_port)


def cql_answers(host: str, port: int) -> bool:
    """True when ``SELECT release_version FROM system.local`` returns a row."""
    try:
        from cassandra.cluster import Cluster  # noqa: PLC0415 - optional extra
    except ImportError:
        raise StackError(
            "the Cassandra readiness check needs cassandra-driver: "
            "pip install 'kasper-py[cassandra]'"
        ) from None
    cluster = Cluster([host], port=port, connect_timeout=5, protocol_version=5)
    try:
        session = cluster.connect()
        row = session.execute("SELECT release_version FROM system.local", timeout=5).one()
        return row is not None
    except Exception:  # the driver raises a dozen types while the node is still starting
        return False
    finally:
        cluster.shutdown()


_CASSANDRA_HEAP = ["-Xms512m", "-Xmx1g", "-Xss256k", "-XX:+UseG1GC",
                   "-XX:+ParallelRefProcEnabled", "-XX:MaxTenuringThreshold=1",
                   "-XX:MaxGCPauseMillis=300",
                   # Cassandra's own advice: a node that ran out of memory may corrupt data.
                   "-XX:+ExitOnOutOfMemoryError"]

# The module-system escapes of Cassandra 5.0's conf/jvm17-server.options ("JPMS" and
# "Netty" sections): without them the daemon fails on reflective access at start-up.
_CASSANDRA_JDK17_OPTIONS = [
    "-Djdk.attach.allowAttachSelf=true",
    *(f"--add-exports={target}=ALL-UNNAMED" for target in (
        "java.base/jdk.internal.misc", "java.management.rmi/com.sun.jmx.remote.internal.rmi",
        "java.rmi/sun.rmi.registry", "java.rmi/sun.rmi.server", "java.sql/java.sql",
        "java.base/java.lang.ref", "jdk.unsupported/sun.misc",
        "jdk.compiler/com.sun.tools.javac.file", "jdk.attach/sun.tools.attach",
    )),
    *(f"--add-opens={target}=ALL-UNNAMED" for target in (
        "java.base/java.lang.module", "java.base/jdk.internal.loader",
        "java.base/jdk.internal.ref", "java.base/jdk.internal.reflect",
        "java.base/jdk.internal.math", "java.base/jdk.internal.module",
        "java.base/jdk.internal.util.jar", "jdk.management/com.sun.management.internal",
        "java.base/sun.nio.ch", "java.base/java.io", "java.base/java.lang.reflect",
        "jdk.compiler/com.sun.tools.javac", "java.base/java.lang", "java.base/java.util",
    )),
    "-Dio.netty.tryReflectionSetAccessible=true",
    "-Dio.netty.allocator.useCacheForAllThreads=true",
    "-Dio.netty.allocator.maxOrder=11",
]

# A lone node has no peers to wait for: skip the gossip settling and ring delays that
# exist for multi-node clusters, and create the default superuser without delay.
_CASSANDRA_FAST_START = [
    "-Dcassandra-foreground=yes",
    "-Dcassandra.skip_wait_for_gossip_to_settle=0",
    "-Dcassandra.ring_delay_ms=0",
    "-Dcassandra.superuser_setup_delay_ms=0",
]

CASSANDRA_JVM_OPTIONS = [*_CASSANDRA_HEAP, *_CASSANDRA_JDK17_OPTIONS, *_CASSANDRA_FAST_START]
"""The JVM options a Cassandra node runs with, here and in its container image."""


class SparkMaster(Component):
    """The Spark standalone master of the pyspark wheel (``spark-class ...Master``)."""

    name = "spark-master"
    ready_timeout = 60.0
    stop_grace = 15.0

    @property
    def port(self) -> int:
        return self.settings.spark_master_port

    @property
    def address(self) -> str:
        """The master URL drivers pass as ``--master``."""
        return f"spark://{LOOPBACK}:{self.port}"

    @property
    def port_variable(self) -> str:
        return "KASPER_SPARK_MASTER_PORT"

    def prepare(self) -> str:
        return _prepare_spark(self)

    def environment(self) -> dict[str, str]:
        return _spark_environment(self)

    def command(self, program: str) -> list[str]:
        return [program, "org.apache.spark.deploy.master.Master", "--host", LOOPBACK,
                "--port", str(self.port), "--webui-port", str(self.settings.spark_master_ui_port)]

    def is_ready(self) -> bool:
        state = spark_master_state(self.settings)
        return state is not None and state.get("status") == "ALIVE"


class SparkWorker(Component):
    """A Spark standalone worker of the pyspark wheel, offering
    ``Settings.spark_worker_cores`` and ``_memory`` to executors. Executors run Python
    tasks with the driver's ``PYSPARK_PYTHON`` (this venv's interpreter by default)."""

    number: ClassVar[int]  # 1, 2: which of the stack's workers, and so which ports
    ready_timeout = 60.0
    stop_grace = 15.0

    @property
    def port(self) -> int:
        return self.settings.spark_worker_port + self.number - 1

    @property
    def port_variable(self) -> str:
        return "KASPER_SPARK_WORKER_PORT"

    def prepare(self) -> str:
        if spark_master_state(self.settings) is None:
            raise StackError(f"{self.name} needs a running spark-master at "
                             f"{SparkMaster(self.settings).address}: "
                             "start both with `kasper stack up spark`")
        (self.directory / "work").mkdir(parents=True, exist_ok=True)
        return _prepare_spark(self)

    def environment(self) -> dict[str, str]:
        return _spark_environment(self)

    def command(self, program: str) -> list[str]:
        settings = self.settings
        return [program, "org.apache.spark.deploy.worker.Worker", "--host", LOOPBACK,
                "--port", str(self.port),
                "--webui-port", str(settings.spark_worker_ui_port + self.number - 1),
                "--cores", str(settings.spark_worker_cores),
                "--memory", settings.spark_worker_memory,
                "--work-dir", str(self.directory / "work"),
                SparkMaster(settings).address]

    def is_ready(self) -> bool:
        """True once the master lists this worker (host and port) as ALIVE."""
        state = spark_master_state(self.settings)
        return state is not None and any(
            worker.get("host") == LOOPBACK and worker.get("port") == self.port
            and worker.get("state") == "ALIVE" for worker in state.get("workers", ()))


class SparkWorker1(SparkWorker):
    name = "spark-worker-1"
    number = 1


class SparkWorker2(SparkWorker):
    name = "spark-worker-2"
    number = 2


def spark_master_state(settings: Settings) -> dict[str, Any] | None:
    """The master web UI's ``/json/`` (status, workers, applications), None if it does
    not answer."""
    url = f"http://{LOOPBACK}:{settings.spark_master_ui_port}/json/"
    try:
        with urllib.request.urlopen(url, timeout=2) as reply:
            state = json.loads(reply.read())
    except (urllib.error.URLError, OSError, ValueError):
        return None
    return state if isinstance(state, dict) else None


def _prepare_spark(component: Component) -> str:
    """The wheel's ``bin/spark-class``, which finds Java and adds Spark's JDK 17 options."""
    require_binary("java", JAVA_HINT)
    component.directory.mkdir(parents=True, exist_ok=True)
    return str(spark_home()[0] / "bin" / "spark-class")


def _spark_environment(component: Component) -> dict[str, str]:
    return {
        "SPARK_HOME": str(spark_home()[0]),
        # An empty conf dir of its own: no spark-env.sh or defaults from anywhere else.
        "SPARK_CONF_DIR": str(component.directory),
        # The heap of the master or worker daemon itself; executors get their own JVMs.
        "SPARK_DAEMON_MEMORY": "256m",
        # Every Spark process bound to loopback, executors included (they inherit it).
        "SPARK_LOCAL_IP": LOOPBACK,
        "PYSPARK_PYTHON": os.environ.get("PYSPARK_PYTHON") or sys.executable,
    }
