"""Container images built on this machine, for where no image registry is reachable.

One Debian root filesystem (``debootstrap --variant=minbase`` from the mirror apt is
configured with) is imported once as the base of every image; Kafka adds Debian's
Java and the jars the stack resolves from Maven Central, Redis adds Debian's package,
the schema registry Debian's Java and the Apicurio jar the stack builds.
Each image is tagged with the version the stack runs, and an image that exists is
never built again.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from string import Template

from kasper_py.stack._components import Kafka
from kasper_py.stack._engine import Podman, current_ulimits
from kasper_py.stack._errors import StackError
from kasper_py.stack._install import apt_install, resolve_jars, template
from kasper_py.stack._registry import SchemaRegistry
from kasper_py.stack._settings import Settings

PREFIX = "localhost/kasper-py"
_POLICY_RC_DENY = "#!/bin/sh\n# no service starts during an image build\nexit 101\n"
Report = Callable[[str], None]


@dataclass(frozen=True)
class Image:
    """One locally built image: its name and what it is made from."""

    name: str
    containerfile: str
    values: dict[str, str]


def debian_suite() -> str:
    """The codename of this machine's Debian release (``bookworm``)."""
    for line in Path("/etc/os-release").read_text().splitlines():
        if line.startswith("VERSION_CODENAME="):
            return str(line.split("=", 1)[1].strip('"'))
    raise StackError("not a Debian system: /etc/os-release names no VERSION_CODENAME")


def debian_mirror(archive: str = "debian") -> str:
    """The first URL of Debian's ``archive`` (``debian``, ``debian-security``) that apt
    is configured with, in deb822 or one-line sources; Debian's own when none is."""
    sources = [Path("/etc/apt/sources.list"), *sorted(Path("/etc/apt/sources.list.d").glob("*"))]
    for source in sources:
        if not source.is_file() or source.suffix not in ("", ".list", ".sources"):
            continue
        for url in re.findall(r"(?:URIs:|^deb)\s+(?:\[[^]]*\]\s+)?(\S+)", source.read_text(),
                              flags=re.MULTILINE):
            if url.rstrip("/").endswith(f"/{archive}"):
                return str(url)
    return f"http://deb.debian.org/{archive}"


def debian_sources(suite: str) -> str:
    """The image's ``sources.list``: the release, its updates and its security fixes, as
    a Debian host has them, so a package pinned to the host's version is found."""
    main, security = debian_mirror(), debian_mirror("debian-security")
    return (f"deb {main} {suite} main\ndeb {main} {suite}-updates main\n"
            f"deb {security} {suite}-security main\n")


def base_image() -> str:
    """The name of the shared Debian base image."""
    return f"{PREFIX}/debian:{debian_suite()}-minbase"


def kafka_image() -> str:
    """The local Kafka image, tagged with the stack's Kafka version."""
    return f"{PREFIX}/kafka:{kafka_version()}"


def redis_image() -> str:
    """The local Redis image, tagged with the version of Debian's redis-server it holds."""
    return f"{PREFIX}/redis:{_upstream(redis_package_version())}"


def registry_image() -> str:
    """The local schema registry image, tagged with the stack's Apicurio version."""
    return f"{PREFIX}/apicurio-registry:{registry_version()}"


def registry_version() -> str:
    """The Apicurio Registry version of the stack's registry pom."""
    return _pom_version("registry-pom.xml", "apicurio.version")


def kafka_version() -> str:
    """The Kafka version of the stack's pom (``kafka.version``)."""
    return _pom_version("kafka-pom.xml", "kafka.version")


def _pom_version(pom: str, tag: str) -> str:
    found = re.search(rf"<{re.escape(tag)}>([^<]+)</{re.escape(tag)}>", template(pom))
    if found is None:
        raise StackError(f"{pom} names no {tag}")
    return found.group(1)


def redis_package_version() -> str:
    """The Debian version of redis-server the stack runs: installed here, else apt's
    candidate."""
    installed = subprocess.run(["dpkg-query", "-W", "-f=${Version}", "redis-server"],
                               capture_output=True, text=True, check=False)
    if installed.returncode == 0 and installed.stdout.strip():
        return installed.stdout.strip()
    policy = subprocess.run(["apt-cache", "policy", "redis-server"], capture_output=True,
                            text=True, check=False)
    found = re.search(r"Candidate:\s*(\S+)", policy.stdout)
    if found is None or found.group(1) == "(none)":
        raise StackError("apt knows no redis-server package: run apt-get update")
    return found.group(1)


def _upstream(debian_version: str) -> str:
    """``5:7.0.15-1~deb12u4`` -> ``7.0.15``."""
    return debian_version.split(":", 1)[-1].split("-", 1)[0]


def build_images(settings: Settings, report: Report) -> list[str]:
    """Build the base, Kafka, Redis and schema registry images that do not exist yet;
    list their names."""
    engine = Podman(settings)
    built = [_ensure_base(engine, report)]
    kafka = Image(kafka_image(), "kafka-Containerfile", {"version": kafka_version()})
    built.append(_ensure(engine, kafka, report, lambda folder: _kafka_context(settings, folder)))
    package = redis_package_version()
    redis = Image(redis_image(), "redis-Containerfile",
                  {"version": _upstream(package), "pin": f"={package}"})
    built.append(_ensure(engine, redis, report, lambda folder: None))
    registry = Image(registry_image(), "registry-Containerfile",
                     {"version": registry_version()})
    built.append(_ensure(engine, registry, report,
                         lambda folder: _registry_context(settings, folder)))
    return built


def image_exists(engine: Podman, name: str) -> bool:
    """True when the engine holds an image called ``name``."""
    return engine.run(["image", "exists", name], check=False).returncode == 0


def _ensure_base(engine: Podman, report: Report) -> str:
    name = base_image()
    if image_exists(engine, name):
        report(f"{name}: exists")
        return name
    debootstrap = apt_install("debootstrap", "debootstrap")
    began = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="kasper-rootfs-") as rootfs:
        command = [debootstrap, "--variant=minbase", debian_suite(), rootfs, debian_mirror()]
        result = subprocess.run(command, capture_output=True, text=True, check=False)
        if result.returncode != 0:
            tail = "\n".join((result.stdout + result.stderr).splitlines()[-20:])
            raise StackError(f"debootstrap failed:\n{tail}")
        _image_defaults(Path(rootfs))
        archive = subprocess.run(["tar", "-C", rootfs, "-c", "."], capture_output=True,
                                 check=True).stdout
    engine.run(["import", "--change", 'CMD ["/bin/bash"]', "-", name], stdin=archive)
    report(f"{name}: built in {time.monotonic() - began:.1f} s")
    return name


def _image_defaults(rootfs: Path) -> None:
    """What a container image wants and debootstrap does not do: no service started
    by a package's install, no recommends, no apt caches left in a layer."""
    (rootfs / "etc/apt/sources.list").write_text(debian_sources(debian_suite()))
    policy = rootfs / "usr/sbin/policy-rc.d"
    policy.write_text(_POLICY_RC_DENY)
    policy.chmod(0o755)
    (rootfs / "etc/apt/apt.conf.d/90kasper-image").write_text(
        'APT::Install-Recommends "false";\nAPT::Install-Suggests "false";\n'
        'Binary::apt::APT::Keep-Downloaded-Packages "false";\n')
    shutil.rmtree(rootfs / "var/cache/apt/archives", ignore_errors=True)
    (rootfs / "var/cache/apt/archives/partial").mkdir(parents=True, exist_ok=True)


def _ensure(engine: Podman, image: Image, report: Report,
            fill_context: Callable[[Path], None]) -> str:
    if image_exists(engine, image.name):
        report(f"{image.name}: exists")
        return image.name
    began = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="kasper-image-") as folder:
        context = Path(folder)
        fill_context(context)
        text = Template(template(image.containerfile)).substitute(
            base=base_image(), **image.values)
        (context / "Containerfile").write_text(text, encoding="utf-8")
        ulimits = [f"--ulimit={ulimit}" for ulimit in current_ulimits()]
        engine.run(["build", "--network", "host", *ulimits, "--tag", image.name,
                    "--file", str(context / "Containerfile"), str(context)])
    report(f"{image.name}: built in {time.monotonic() - began:.1f} s")
    return image.name


def _kafka_context(settings: Settings, context: Path) -> None:
    """The stack's Kafka jars (resolved once, as ``kasper stack up kafka`` does), its
    log4j2 configuration and the image's entry point."""
    kafka = Kafka(settings)
    libs = context / "libs"
    libs.mkdir()
    for jar in resolve_jars(kafka.recipe(), kafka.lib_dir):
        _link_or_copy(jar, libs / jar.name)
    (context / "log4j2.properties").write_text(template("kafka-log4j2.properties"))
    (context / "kafka-image.sh").write_text(template("kafka-image.sh"))


def _registry_context(settings: Settings, context: Path) -> None:
    """The stack's schema registry jar (built once, as ``kasper stack up schema-registry``
    does)."""
    registry = SchemaRegistry(settings)
    registry.prepare()
    _link_or_copy(registry.lib_dir / "schema-registry.jar", context / "schema-registry.jar")


def _link_or_copy(source: Path, target: Path) -> None:
    try:
        os.link(source, target)
    except OSError:  # another filesystem
        shutil.copy2(source, target)
