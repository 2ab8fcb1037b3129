"""Real servers in containers for integration tests: Kafka (KRaft), Redis, a schema
registry, Cassandra, PostgreSQL and OpenSearch, started through testcontainers
(``pip install 'kasper-py[containers]'``) on Docker or Podman.

    with KafkaContainer() as kafka:
        config = Config(name="wc", bootstrap_servers=kafka.bootstrap_servers, ...)

Every container runs with host networking on free ports (``free_ports``: below the
kernel's ephemeral range, above the stack's own), so the address
handed back is ``127.0.0.1:<port>`` whatever the engine. The image is the official
one (``apache/kafka:<the stack's Kafka version>``, ``redis:7.0``, ``cassandra``,
``postgres``, ``opensearchproject/opensearch``, each at the stack's version) when the
engine has it or can pull it, else the image ``python -m kasper_py.stack images`` built on this
machine; ``image=`` picks another. The engine is ``$DOCKER_HOST``, else the stack's
Podman (``kasper stack up podman``), else Docker's default socket. Leaving the
``with`` block, by an error or not, removes the container; one left by a killed test
run is removed by the next start (``OWNER_LABEL``). pytest fixtures over these
are in ``kasper_py.testing.container_fixtures``.
"""

from __future__ import annotations

import os
import re
import time
import urllib.error
import urllib.request
from types import TracebackType
from typing import TYPE_CHECKING, Any

from kasper_py import stack
from kasper_py._support.ports import LOOPBACK, free_ports
from kasper_py.exceptions import KasperError

if TYPE_CHECKING:
    from typing import Self

    from testcontainers.core.container import DockerContainer

INSTALL_HINT = (
    "a container engine: Docker, or Podman on Debian with `python -m kasper_py.stack up "
    "podman` (installs podman and runc, serves the Docker API), and `pip install "
    "'kasper-py[containers]'`")
"""What a machine needs for container tests; said by every ``ContainerEngineError``."""

OWNER_LABEL = "org.kasper-py.testing.owner-pid"
"""The label naming the process that started a container: one whose process is gone (a
test run killed with -9 removes nothing) is removed by the next start on the machine."""


class ContainerEngineError(KasperError):
    """No container engine answers, or the ``containers`` extra is not installed; the
    message names what to install."""


class ContainerStartError(KasperError):
    """A container started but its server did not answer in time; the message ends with
    the tail of the container's log (``log`` holds all of it). The container has been
    removed."""

    def __init__(self, message: str, log: str = "") -> None:
        super().__init__(message)
        self.log = log


_PORT_TAKEN = re.compile(r"address already in use|is in use by another process", re.I)
"""What a server's log says when its port was taken between ``free_ports``' probe and
its bind: another process's probe may draw the same port at the same moment."""




def docker_client() -> Any:
    """A docker-py client of the engine (see the module docstring), after ``/version``
    answered; ContainerEngineError naming what to install otherwise."""
    try:
        import docker  # noqa: PLC0415 - the optional containers extra
    except ImportError:
        raise ContainerEngineError(f"docker-py is not installed; needs {INSTALL_HINT}") \
            from None
    if not os.environ.get("DOCKER_HOST") and (local := stack.docker_host()) is not None:
        os.environ["DOCKER_HOST"] = local  # testcontainers' own client reads it too
    try:
        client = docker.from_env(timeout=30)
        client.version()
    except Exception as exc:  # docker-py raises DockerException, requests' and OS errors
        where = os.environ.get("DOCKER_HOST") or "Docker's default socket"
        raise ContainerEngineError(
            f"no container engine answers at {where} ({exc}); needs {INSTALL_HINT}") from None
    return client


def resolve_image(client: Any, official: str, local: str) -> str:
    """``official`` when the engine has it or pulls it, else ``local`` when the engine
    has it (built by ``python -m kasper_py.stack images``); else an error saying so."""
    import docker.errors  # noqa: PLC0415 - the optional containers extra

    for name, pull in ((official, False), (local, False), (official, True)):
        try:
            client.images.pull(name) if pull else client.images.get(name)
            return name
        except docker.errors.DockerException:
            continue
    raise ContainerEngineError(
        f"neither {official} (no registry answered) nor {local} is there: build the local "
        "images with `python -m kasper_py.stack images`")


def remove_orphans(client: Any) -> list[str]:
    """Remove the containers started here by processes that no longer run; their ids."""
    import docker.errors  # noqa: PLC0415 - the optional containers extra

    removed = []
    # sparse: the list's own answer, no inspection of each container, which fails for
    # one another process removes meanwhile (Podman answers 500 "no such container")
    for container in client.containers.list(all=True, sparse=True,
                                            filters={"label": OWNER_LABEL}):
        owner = (container.attrs.get("Labels") or {}).get(OWNER_LABEL, "")
        if owner.isdigit() and not _process_alive(int(owner)):
            try:
                container.remove(force=True)
            except docker.errors.APIError as exc:
                if "no such container" not in str(exc).lower():
                    raise
                continue  # another cleanup removed it first
            removed.append(str(container.id))
    return removed


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True


class ServerContainer:
    """One server in a container with host networking; a context manager."""

    official_image: str
    local_image: str
    ready_timeout = 120.0
    ports_needed = 1
    """``port`` and the ports after it that the server listens on."""
    start_attempts = 3
    """Starts on fresh ports when a port was taken before the server bound it."""

    def __init__(self, image: str | None = None) -> None:
        self.image = image
        self.port = free_ports(self.ports_needed)
        self._container: DockerContainer | None = None

    def command(self) -> list[str] | None:
        """The container's command line (None: the image's own)."""
        return None

    def environment(self) -> dict[str, str]:
        """The container's environment variables."""
        return {}

    def answers(self) -> bool:
        """True once the server answers a real request."""
        raise NotImplementedError

    def start(self) -> Self:
        """Start the container and return once the server answers; on failure the
        container is removed and ContainerStartError carries its log's tail. A server
        whose port another process took first is started again on fresh ports."""
        for _ in range(self.start_attempts - 1):
            try:
                return self._start_once()
            except ContainerStartError as error:
                if not _PORT_TAKEN.search(error.log):
                    raise
                self.port = free_ports(self.ports_needed)
        return self._start_once()

    def _start_once(self) -> Self:
        from testcontainers.core.config import testcontainers_config  # noqa: PLC0415
        from testcontainers.core.container import DockerContainer  # noqa: PLC0415

        client = docker_client()
        # Ryuk, testcontainers' reaper, is an image of its own that no registry may serve;
        # the `with` block (and the fixtures built on it) remove what they started.
        testcontainers_config.ryuk_disabled = True
        remove_orphans(client)
        image = self.image or resolve_image(client, self.official_image, self.local_image)
        container = DockerContainer(image, network_mode="host",
                                    labels={OWNER_LABEL: str(os.getpid())})
        for name, value in self.environment().items():
            container.with_env(name, value)
        if (command := self.command()) is not None:
            container.with_command(command)
        self._container = container
        try:
            container.start()
            self._wait_ready(container)
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_ready(self, container: DockerContainer) -> None:
        deadline = time.monotonic() + self.ready_timeout
        while not self.answers():
            container.reload()
            if container.status != "running" or time.monotonic() > deadline:
                stdout, stderr = container.get_logs()
                log = (stdout + stderr).decode(errors="replace")
                tail = "\n".join(log.splitlines()[-30:])
                raise ContainerStartError(
                    f"{container.image} ({container.status}) did not answer within "
                    f"{self.ready_timeout:.0f} s:\n{tail}", log)
            time.sleep(0.2)

    @property
    def container_id(self) -> str:
        """The engine's id of the running container."""
        if self._container is None:
            raise RuntimeError("the container is not started")
        return str(self._container.get_container_id())

    def stop(self) -> None:
        """Remove the container (forced) if it was started; idempotent."""
        container, self._container = self._container, None
        if container is not None:
            container.stop()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self.stop()


class KafkaContainer(ServerContainer):
    """Apache Kafka in KRaft mode, broker and controller in one node, configured the
    way the official ``apache/kafka`` image reads its ``KAFKA_*`` variables."""

    ports_needed = 2

    @property
    def controller_port(self) -> int:
        """The KRaft controller's listener, after the broker's."""
        return self.port + 1

    def __init__(self, image: str | None = None) -> None:
        super().__init__(image)
        self.official_image = f"apache/kafka:{stack.kafka_version()}"
        self.local_image = stack.image_name("kafka")

    @property
    def bootstrap_servers(self) -> str:
        """``127.0.0.1:<port>``, what ``Config.bootstrap_servers`` takes."""
        return f"{LOOPBACK}:{self.port}"

    def get_bootstrap_server(self) -> str:
        """The bootstrap address, under testcontainers' KafkaContainer's name."""
        return self.bootstrap_servers

    def environment(self) -> dict[str, str]:
        broker, controller = f"{LOOPBACK}:{self.port}", f"{LOOPBACK}:{self.controller_port}"
        return {
            "KAFKA_NODE_ID": "1",
            "KAFKA_PROCESS_ROLES": "broker,controller",
            "KAFKA_LISTENERS": f"PLAINTEXT://{broker},CONTROLLER://{controller}",
            "KAFKA_ADVERTISED_LISTENERS": f"PLAINTEXT://{broker}",
            "KAFKA_CONTROLLER_LISTENER_NAMES": "CONTROLLER",
            "KAFKA_LISTENER_SECURITY_PROTOCOL_MAP": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
            "KAFKA_CONTROLLER_QUORUM_VOTERS": f"1@{controller}",
            "KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR": "1",
            "KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR": "1",
            "KAFKA_TRANSACTION_STATE_LOG_MIN_ISR": "1",
            "KAFKA_SHARE_COORDINATOR_STATE_TOPIC_REPLICATION_FACTOR": "1",
            "KAFKA_SHARE_COORDINATOR_STATE_TOPIC_MIN_ISR": "1",
            "KAFKA_GROUP_INITIAL_REBALANCE_DELAY_MS": "0",
            "KAFKA_NUM_PARTITIONS": "1",
            "KAFKA_LOG_DIRS": "/tmp/kraft-combined-logs",
            "KAFKA_HEAP_OPTS": "-Xms256m -Xmx1g",
        }

    def answers(self) -> bool:
        return stack.kafka_answers(LOOPBACK, self.port)


class RedisContainer(ServerContainer):
    """Redis with an append-only file (fsync every second), as the stack runs it."""

    def __init__(self, image: str | None = None) -> None:
        super().__init__(image)
        self.official_image = "redis:7.0"
        self.local_image = stack.image_name("redis")

    @property
    def url(self) -> str:
        """``redis://127.0.0.1:<port>/0``, what ``RedisTable(url=...)`` takes."""
        return f"redis://{LOOPBACK}:{self.port}/0"

    def get_connection_url(self) -> str:
        """The URL, under the name testcontainers' Redis container uses."""
        return self.url

    def command(self) -> list[str]:
        return ["redis-server", "--bind", LOOPBACK, "--port", str(self.port), "--save", "",
                "--appendonly", "yes", "--appendfsync", "everysec", "--dir", "/tmp",
                "--protected-mode", "yes"]

    def answers(self) -> bool:
        return stack.redis_answers(LOOPBACK, self.port)


class SchemaRegistryContainer(ServerContainer):
    """A Confluent-compatible schema registry (Apicurio Registry, in-memory storage)."""

    def __init__(self, image: str | None = None) -> None:
        super().__init__(image)
        self.official_image = f"apicurio/apicurio-registry-mem:{stack.registry_version()}"
        self.local_image = stack.image_name("schema-registry")

    @property
    def url(self) -> str:
        """The Confluent-compatible API, what ``SchemaRegistryClient({"url": ...})`` and
        ``Config.schema_registry_url`` take."""
        return f"http://{LOOPBACK}:{self.port}/apis/ccompat/v7"

    def environment(self) -> dict[str, str]:
        return {"QUARKUS_HTTP_HOST": LOOPBACK, "QUARKUS_HTTP_PORT": str(self.port)}

    def answers(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/subjects", timeout=2) as reply:
                return int(reply.status) == 200 and reply.read().startswith(b"[")
        except (urllib.error.URLError, OSError):
            return False


class CassandraContainer(ServerContainer):
    """One Cassandra node, a cluster of its own (its seed is itself), as the stack runs
    it; the official image's ``cassandra -f`` with the ports as ``-D`` options."""

    ready_timeout = 240.0
    ports_needed = 2

    @property
    def storage_port(self) -> int:
        """The node's inter-node (storage) port, after the CQL port."""
        return self.port + 1

    def __init__(self, image: str | None = None) -> None:
        super().__init__(image)
        self.official_image = f"cassandra:{stack.cassandra_version()}"
        self.local_image = stack.image_name("cassandra")

    @property
    def contact(self) -> tuple[str, int]:
        """(host, port): ``CassandraTable(contact_points=[host], port=port)``."""
        return LOOPBACK, self.port

    def get_contact_point(self) -> str:
        """``127.0.0.1:<port>``, under testcontainers' CassandraContainer's name."""
        return f"{LOOPBACK}:{self.port}"

    def command(self) -> list[str]:
        return ["cassandra", "-f", f"-Dcassandra.native_transport_port={self.port}",
                f"-Dcassandra.storage_port={self.storage_port}"]

    def environment(self) -> dict[str, str]:
        # never gossips with another node on the machine (the stack's, on port 7000)
        return {"CASSANDRA_SEEDS": f"{LOOPBACK}:{self.storage_port}",
                "CASSANDRA_CLUSTER_NAME": f"kasper-container-{self.port}",
                "CASSANDRA_LISTEN_ADDRESS": LOOPBACK, "CASSANDRA_RPC_ADDRESS": LOOPBACK,
                "MAX_HEAP_SIZE": "1g", "HEAP_NEWSIZE": "128m"}

    def answers(self) -> bool:
        return stack.cql_answers(LOOPBACK, self.port)


class PostgresContainer(ServerContainer):
    """A PostgreSQL server, superuser ``postgres`` with trust authentication, as the
    stack runs it."""

    def __init__(self, image: str | None = None) -> None:
        super().__init__(image)
        self.official_image = f"postgres:{stack.postgres_version().split('.')[0]}"
        self.local_image = stack.image_name("postgres")

    @property
    def url(self) -> str:
        """``postgresql://postgres@127.0.0.1:<port>/postgres``, what ``PostgresTable(url=...)``
        takes."""
        return f"postgresql://postgres@{LOOPBACK}:{self.port}/postgres"

    def get_connection_url(self) -> str:
        """The URL, under the name testcontainers' Postgres container uses."""
        return self.url

    def command(self) -> list[str]:
        return ["postgres", "-p", str(self.port), "-c", f"listen_addresses={LOOPBACK}",
                "-c", "max_connections=100"]

    def environment(self) -> dict[str, str]:
        return {"POSTGRES_HOST_AUTH_METHOD": "trust"}

    def answers(self) -> bool:
        try:
            import psycopg  # noqa: PLC0415 - the optional postgres extra
        except ImportError:
            raise ContainerEngineError("PostgresContainer's readiness check needs psycopg: "
                                       "pip install 'kasper-py[postgres]'") from None
        try:
            with psycopg.connect(self.url, connect_timeout=2) as connection:
                return connection.execute("SELECT 1").fetchone() == (1,)
        except psycopg.Error:
            return False


class OpenSearchContainer(ServerContainer):
    """One OpenSearch node, security off, a 512 MB heap, as the stack runs it."""

    ports_needed = 2

    @property
    def transport_port(self) -> int:
        """The node's transport port, after the HTTP port."""
        return self.port + 1

    def __init__(self, image: str | None = None) -> None:
        super().__init__(image)
        self.official_image = f"opensearchproject/opensearch:{stack.opensearch_version()}"
        self.local_image = stack.image_name("opensearch")

    @property
    def url(self) -> str:
        """``http://127.0.0.1:<port>``, what ``OpenSearchTable(url=...)`` takes."""
        return f"http://{LOOPBACK}:{self.port}"

    def environment(self) -> dict[str, str]:
        port, transport = str(self.port), str(self.transport_port)
        return {"OPENSEARCH_HOST": LOOPBACK, "OPENSEARCH_HTTP_PORT": port,
                "OPENSEARCH_TRANSPORT_PORT": transport,
                # the official image takes settings as dotted variables
                "network.host": LOOPBACK, "http.port": port, "transport.port": transport,
                "discovery.type": "single-node", "DISABLE_SECURITY_PLUGIN": "true",
                "DISABLE_INSTALL_DEMO_CONFIG": "true",
                "OPENSEARCH_JAVA_OPTS": "-Xms512m -Xmx512m"}

    def answers(self) -> bool:
        return stack.opensearch_answers(self.url)
