"""The stack's schema registry: Apicurio Registry 2.4 with its Confluent-compatible API
(``/apis/ccompat/v7``), built once into a runnable jar from Maven Central and run on
Java 17, its schemas kept in an H2 database file under the component's folder.

Maven Central serves Apicurio's application jar but not a runnable one, so ``prepare``
runs ``mvn package`` on ``registry-pom.xml`` (a Quarkus build of that jar) once per pom
and user: the jar is kept in the per-user cache (``Settings.lib_dir``).
"""

from __future__ import annotations

import shutil
import subprocess
import urllib.error
import urllib.request
from pathlib import Path

from kasper_py._support.ports import LOOPBACK
from kasper_py.stack._components import JAVA_HINT, Component
from kasper_py.stack._errors import StackError
from kasper_py.stack._install import (
    building,
    is_resolved,
    mark_resolved,
    require_binary,
    template,
)

CCOMPAT_PATH = "/apis/ccompat/v7"
"""Where Apicurio serves the Confluent Schema Registry API."""

_JAR = "schema-registry.jar"
_BEANS = "src/main/java/io/kasperpy/stack/ConfigPropertyListProducer.java"


class SchemaRegistry(Component):
    """A Confluent-compatible schema registry (Apicurio Registry, jar built with Maven)."""

    name = "schema-registry"
    ready_timeout = 60.0
    stop_grace = 15.0

    @property
    def port(self) -> int:
        return self.settings.schema_registry_port

    @property
    def url(self) -> str:
        """The base URL Confluent clients take (``SchemaRegistryClient({"url": ...})``)."""
        return f"http://{self.address}{CCOMPAT_PATH}"

    def recipe(self) -> str:
        return "\n".join(_build_sources().values())

    def prepare(self) -> str:
        java = require_binary("java", JAVA_HINT)
        self.directory.mkdir(parents=True, exist_ok=True)
        with building(self.lib_dir):
            if not is_resolved(self.recipe(), self.lib_dir):
                _build_jar(_build_sources(), self.lib_dir)
                mark_resolved(self.recipe(), self.lib_dir)
        return java

    def command(self, program: str) -> list[str]:
        database = self.directory / "data" / "registry"
        return [program, "-Xms64m", "-Xmx256m", "-XX:+UseSerialGC",
                f"-Dquarkus.http.host={LOOPBACK}", f"-Dquarkus.http.port={self.port}",
                # schemas survive a restart, as the records that name their ids do
                f"-Dquarkus.datasource.jdbc.url=jdbc:h2:file:{database}",
                "-Dregistry.sql.init=true", "-Dquarkus.log.console.color=false",
                "-jar", str(self.lib_dir / _JAR)]

    def is_ready(self) -> bool:
        """True once ``GET /subjects`` answers with a JSON list."""
        try:
            with urllib.request.urlopen(f"{self.url}/subjects", timeout=2) as reply:
                return int(reply.status) == 200 and reply.read().startswith(b"[")
        except (urllib.error.URLError, OSError):
            return False


def _build_sources() -> dict[str, str]:
    """The Maven project that builds the jar: its files by relative path."""
    return {"pom.xml": template("registry-pom.xml"),
            _BEANS: template("registry-beans.java"),
            "src/main/resources/application.properties":
                template("registry-application.properties")}


def _build_jar(sources: dict[str, str], lib_dir: Path) -> None:
    """``mvn package`` the project in ``<lib_dir>-build`` and keep only the jar."""
    mvn = require_binary("mvn", "install Maven 3.8+ (e.g. apt-get install maven)")
    build_dir = lib_dir.parent / f"{lib_dir.name}-build"
    shutil.rmtree(build_dir, ignore_errors=True)
    for relative, text in sources.items():
        path = build_dir / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    print("schema-registry: building the jar with Maven (once) ...", flush=True)
    result = subprocess.run([mvn, "-q", "-B", "-Dstyle.color=never", "-DskipTests",
                             "-f", str(build_dir / "pom.xml"), "package"],
                            capture_output=True, text=True, check=False)
    if result.returncode != 0:
        output = "\n".join((result.stdout + result.stderr).splitlines()[-30:])
        raise StackError(f"Maven could not build the schema registry in {build_dir}:\n{output}")
    shutil.rmtree(lib_dir, ignore_errors=True)
    lib_dir.mkdir(parents=True)
    runner = next((build_dir / "target").glob("*-runner.jar"))
    runner.replace(lib_dir / _JAR)
    shutil.rmtree(build_dir, ignore_errors=True)
