"""The stack's OpenSearch: one node of OpenSearch 2.19 (Apache-2.0, the Elasticsearch 7
REST API) run on Java 17 from Maven Central's jars, security off, a small heap.

Maven serves the server and its HTTP/transport module (Netty 4) as plain jars, not the
distribution, so ``prepare`` lays out the home a node expects: the server's jars on the
classpath, the module's jars under ``modules/transport-netty4`` with the descriptor and
policy the distribution would ship, and ``config/``.
"""

from __future__ import annotations

import json
import shutil
import urllib.error
import urllib.request
from pathlib import Path

from kasper_py._support.ports import LOOPBACK
from kasper_py.stack._components import Component
from kasper_py.stack._install import template

_MODULE = "transport-netty4"
_MODULE_JARS = ("netty-", "transport-netty4-client-")

_DESCRIPTOR = """\
description=Netty 4 based HTTP and transport layer
version={version}
name=transport-netty4
classname=org.opensearch.transport.Netty4Plugin
java.version=11
opensearch.version={version}
extended.plugins=
has.native.controller=false
"""

# What the distribution's policy grants the module under the security manager:
# reflection into its buffers and the sockets it serves on.
_POLICY = """\
grant {
  permission java.lang.RuntimePermission "accessClassInPackage.sun.misc";
  permission java.lang.RuntimePermission "accessDeclaredMembers";
  permission java.lang.RuntimePermission "getClassLoader";
  permission java.lang.reflect.ReflectPermission "suppressAccessChecks";
  permission java.util.PropertyPermission "*", "read,write";
  permission java.net.SocketPermission "*", "accept,connect,listen,resolve";
};
"""

JVM_OPTIONS = ["-Xms512m", "-Xmx512m", "-XX:+UseSerialGC", "-Djava.security.manager=allow",
               "-Dfile.encoding=UTF-8",
               # No native library: the node skips mlock, seccomp and the refusal to run as
               # root (a container's only user), which a local dev node can do without.
               "-Djna.nosys=true", "-Djna.nounpack=true"]
"""The JVM options of a node, here and in its container image (before its paths)."""


class OpenSearch(Component):
    """OpenSearch 2.19, one node (``discovery.type: single-node``), HTTP on ``port`` and
    the transport on ``Settings.opensearch_transport_port``, both on 127.0.0.1."""

    name = "opensearch"
    ready_timeout = 120.0
    stop_grace = 30.0

    @property
    def port(self) -> int:
        return self.settings.opensearch_port

    @property
    def url(self) -> str:
        """The REST base URL clients take."""
        return f"http://{self.address}"

    def recipe(self) -> str:
        return template("opensearch-pom.xml")

    def prepare(self) -> str:
        java, jars = self.java_with_jars()
        home = self.directory / "home"
        lay_out_home(home, jars, server_version(jars))
        self.render("opensearch.yml", "home/config/opensearch.yml", host=LOOPBACK,
                    http_port=self.port, directory=self.directory,
                    transport_port=self.settings.opensearch_transport_port)
        self.render("opensearch-log4j2.properties", "home/config/log4j2.properties")
        return java

    def command(self, program: str) -> list[str]:
        home = self.directory / "home"
        return [program, *JVM_OPTIONS, f"-Dopensearch.path.home={home}",
                f"-Dopensearch.path.conf={home / 'config'}",
                "-Dopensearch.distribution.type=tar", "-Dopensearch.bundled_jdk=false",
                "-cp", str(home / "lib" / "*"), "org.opensearch.bootstrap.OpenSearch"]

    def is_ready(self) -> bool:
        return opensearch_answers(self.url)


def opensearch_answers(url: str) -> bool:
    """True once ``GET <url>/_cluster/health`` reports green or yellow."""
    try:
        with urllib.request.urlopen(f"{url}/_cluster/health", timeout=2) as reply:
            health = json.loads(reply.read())
    except (urllib.error.URLError, OSError, ValueError):
        return False
    return isinstance(health, dict) and health.get("status") in ("green", "yellow")


def server_version(jars: list[Path]) -> str:
    """The server's version, from its jar's name (``opensearch-2.19.6.jar``)."""
    server = next(jar for jar in jars if jar.name.startswith("opensearch-2"))
    return server.stem.removeprefix("opensearch-")


def lay_out_home(home: Path, jars: list[Path], version: str) -> None:
    """``home/lib`` (the server), ``home/modules/transport-netty4`` (the module, kept off
    the server's classpath: the node loads it in a class loader of its own)."""
    lib, module = home / "lib", home / "modules" / _MODULE
    for folder in (lib, module):
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
    (home / "plugins").mkdir(exist_ok=True)
    (home / "config").mkdir(exist_ok=True)
    for jar in jars:
        target = module if jar.name.startswith(_MODULE_JARS) else lib
        shutil.copy2(jar, target / jar.name)
    (module / "plugin-descriptor.properties").write_text(
        _DESCRIPTOR.format(version=version), encoding="utf-8")
    (module / "plugin-security.policy").write_text(_POLICY, encoding="utf-8")
