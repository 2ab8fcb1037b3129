"""Container images built on this machine, for where no image registry is reachable:
what each one holds, and its name. ``_image_build`` builds them.

One Debian root filesystem (``debootstrap --variant=minbase`` from the mirror apt is
configured with) is the base of every image; Kafka, Cassandra and OpenSearch add
Debian's Java and the jars the stack resolves from Maven Central, the schema registry
the Apicurio jar the stack builds, Redis and PostgreSQL Debian's packages at the
versions the stack runs.

An image's tag is the version it runs and a digest of what it is made from (its
Containerfile as filled in, the files put beside it, the poms pinning its jars):
``kafka:4.3.1-<12 hex>``. Editing any of them names a new image, so a stale one is
never reused, and whether an image is built is one ``podman image exists``.
"""

from __future__ import annotations

import hashlib
import re
import subprocess
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from string import Template

from kasper_py.stack._components import CASSANDRA_JVM_OPTIONS
from kasper_py.stack._errors import StackError
from kasper_py.stack._install import template
from kasper_py.stack._opensearch import JVM_OPTIONS as OPENSEARCH_JVM_OPTIONS

PREFIX = "localhost/kasper-py"


@dataclass(frozen=True)
class Image:
    """One locally built image: what it is made from, and its name, tagged by content."""

    repository: str
    version: str
    containerfile: str
    values: Mapping[str, str] = field(default_factory=dict)
    files: Mapping[str, str] = field(default_factory=dict)
    """Text files the build context holds beside the Containerfile, by path."""
    pinned_by: tuple[str, ...] = ()
    """The packaged templates (poms, sources) that pin what ``jars`` puts in the context."""
    jars: str = ""
    """The stack component whose jars the context holds ("" for none)."""

    def containerfile_text(self) -> str:
        """The Containerfile with its base and values filled in."""
        return Template(template(self.containerfile)).substitute(base=base_image(),
                                                                 **self.values)

    @property
    def digest(self) -> str:
        """12 hex digits of SHA-256 over everything the image is made from."""
        parts = [self.containerfile_text(), *(template(name) for name in self.pinned_by)]
        parts += [f"{path}\0{text}" for path, text in sorted(self.files.items())]
        digest = hashlib.sha256()
        for part in parts:
            digest.update(f"{len(part)}\0{part}".encode())
        return digest.hexdigest()[:12]

    @property
    def name(self) -> str:
        """``localhost/kasper-py/<repository>:<version>-<digest>``."""
        return f"{PREFIX}/{self.repository}:{self.version}-{self.digest}"


def debian_suite() -> str:
    """The codename of this machine's Debian release (``bookworm``)."""
    for line in Path("/etc/os-release").read_text().splitlines():
        if line.startswith("VERSION_CODENAME="):
            return str(line.split("=", 1)[1].strip('"'))
    raise StackError("not a Debian system: /etc/os-release names no VERSION_CODENAME")


def base_image() -> str:
    """The name of the shared Debian base image."""
    return f"{PREFIX}/debian:{debian_suite()}-minbase"


def kafka_version() -> str:
    """The Kafka version of the stack's pom (``kafka.version``)."""
    return _pom_version("kafka-pom.xml", "kafka.version")


def registry_version() -> str:
    """The Apicurio Registry version of the stack's registry pom."""
    return _pom_version("registry-pom.xml", "apicurio.version")


def cassandra_version() -> str:
    """The Cassandra version of the stack's pom."""
    return _pom_version("cassandra-pom.xml", "cassandra.version")


def opensearch_version() -> str:
    """The OpenSearch version of the stack's pom."""
    return _pom_version("opensearch-pom.xml", "opensearch.version")


def _pom_version(pom: str, tag: str) -> str:
    found = re.search(rf"<{re.escape(tag)}>([^<]+)</{re.escape(tag)}>", template(pom))
    if found is None:
        raise StackError(f"{pom} names no {tag}")
    return found.group(1)


def debian_package_version(package: str) -> str:
    """The Debian version of ``package`` the stack runs: installed here, else apt's
    candidate."""
    installed = subprocess.run(["dpkg-query", "-W", "-f=${Version}", package],
                               capture_output=True, text=True, check=False)
    if installed.returncode == 0 and installed.stdout.strip():
        return installed.stdout.strip()
    policy = subprocess.run(["apt-cache", "policy", package], capture_output=True,
                            text=True, check=False)
    found = re.search(r"Candidate:\s*(\S+)", policy.stdout)
    if found is None or found.group(1) == "(none)":
        raise StackError(f"apt knows no {package} package: run apt-get update")
    return found.group(1)


def _upstream(debian_version: str) -> str:
    """``5:7.0.15-1~deb12u4`` -> ``7.0.15``; ``15+248+deb12u1`` -> ``15``."""
    return re.split(r"[-+]", debian_version.split(":", 1)[-1], maxsplit=1)[0]


def kafka() -> Image:
    """Kafka in KRaft mode, configured by ``KAFKA_*`` variables as ``apache/kafka``."""
    return Image("kafka", kafka_version(), "kafka-Containerfile",
                 {"version": kafka_version()},
                 {"log4j2.properties": template("kafka-log4j2.properties"),
                  "kafka-image.sh": template("kafka-image.sh")},
                 ("kafka-pom.xml",), jars="kafka")


def redis() -> Image:
    """Debian's redis-server, the version the stack runs."""
    package = debian_package_version("redis-server")
    return Image("redis", _upstream(package), "redis-Containerfile",
                 {"version": _upstream(package), "pin": f"={package}"})


def registry() -> Image:
    """The Apicurio registry jar the stack builds, in-memory storage."""
    return Image("apicurio-registry", registry_version(), "registry-Containerfile",
                 {"version": registry_version()},
                 pinned_by=("registry-pom.xml", "registry-beans.java",
                            "registry-application.properties"), jars="schema-registry")


def cassandra() -> Image:
    """One Cassandra node, the stack's jars, JVM options and configuration."""
    config = Template(template("cassandra.yaml")).substitute(
        host="127.0.0.1", directory="/var/lib/cassandra", native_port=9042,
        storage_port=7000)
    return Image("cassandra", cassandra_version(), "cassandra-Containerfile",
                 {"version": cassandra_version()},
                 {"cassandra.yaml": config, "logback.xml": template("cassandra-logback.xml"),
                  "jvm.options": "\n".join(CASSANDRA_JVM_OPTIONS) + "\n",
                  "cassandra": template("cassandra-image.sh")},
                 ("cassandra-pom.xml",), jars="cassandra")


def _postgres_server() -> tuple[str, str]:
    """(``postgresql-<major>``, its Debian version): the server package the stack runs."""
    server = f"postgresql-{_upstream(debian_package_version('postgresql'))}"
    return server, debian_package_version(server)


def postgres_version() -> str:
    """The PostgreSQL version the stack runs (``15.18``)."""
    return _upstream(_postgres_server()[1])


def postgres() -> Image:
    """Debian's PostgreSQL server, the major and version the stack runs."""
    server, package = _postgres_server()
    return Image("postgres", _upstream(package), "postgres-Containerfile",
                 {"version": _upstream(package), "package": f"{server}={package}"},
                 {"postgres-image.sh": template("postgres-image.sh")})


def opensearch() -> Image:
    """One OpenSearch node from the stack's Maven Central jars, security off."""
    config = Template(template("opensearch.yml")).substitute(
        host="${OPENSEARCH_HOST}", http_port="${OPENSEARCH_HTTP_PORT}",
        transport_port="${OPENSEARCH_TRANSPORT_PORT}", directory="/var/lib/opensearch")
    return Image("opensearch", opensearch_version(), "opensearch-Containerfile",
                 {"version": opensearch_version()},
                 {"home/config/opensearch.yml": config,
                  "home/config/log4j2.properties": template("opensearch-log4j2.properties"),
                  "jvm.options": "\n".join(OPENSEARCH_JVM_OPTIONS) + "\n",
                  "opensearch-image.sh": template("opensearch-image.sh")},
                 ("opensearch-pom.xml",), jars="opensearch")


IMAGES: dict[str, Callable[[], Image]] = {
    "kafka": kafka, "redis": redis, "schema-registry": registry, "cassandra": cassandra,
    "postgres": postgres, "opensearch": opensearch}
"""Every image ``python -m kasper_py.stack images`` builds, by the stack component it runs."""



def image_name(component: str) -> str:
    """The name of the local image that runs the stack ``component`` (a key of
    ``IMAGES``: ``kafka``, ``redis``, ``schema-registry``, ...), tagged by its content."""
    return IMAGES[component]().name
