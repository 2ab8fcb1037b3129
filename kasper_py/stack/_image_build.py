"""Building the images ``_images`` describes: ``python -m kasper_py.stack images``.

The Debian base is imported once from a ``debootstrap`` root filesystem; every other
image is a ``podman build`` of its Containerfile, the files ``_images`` names and the
jars the stack resolves, in a temporary context. An image whose name (content tag)
exists is never built again.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from kasper_py.stack._components import Cassandra, Component, Kafka
from kasper_py.stack._engine import Podman, current_ulimits
from kasper_py.stack._errors import StackError
from kasper_py.stack._images import IMAGES, Image, base_image, debian_suite
from kasper_py.stack._install import apt_install, resolve_jars
from kasper_py.stack._opensearch import OpenSearch, lay_out_home, server_version
from kasper_py.stack._registry import SchemaRegistry
from kasper_py.stack._settings import Settings

_POLICY_RC_DENY = "#!/bin/sh\n# no service starts during an image build\nexit 101\n"
Report = Callable[[str], None]


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


def build_images(settings: Settings, report: Report, names: Sequence[str] = ()) -> list[str]:
    """Build the base and the images of ``names`` (stack components: ``kafka``,
    ``postgres``...; all of ``IMAGES`` when empty) that do not exist yet; list their
    names."""
    unknown = sorted(set(names) - set(IMAGES))
    if unknown:
        raise StackError(f"no image for {', '.join(unknown)}; images: {', '.join(IMAGES)}")
    engine = Podman(settings)
    built = [_ensure_base(engine, report)]
    for name in names or IMAGES:
        built.append(_ensure(engine, settings, IMAGES[name](), report))
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


def _ensure(engine: Podman, settings: Settings, image: Image, report: Report) -> str:
    name = image.name
    if image_exists(engine, name):
        report(f"{name}: exists")
        return name
    began = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="kasper-image-") as folder:
        context = Path(folder)
        if image.jars:
            _JARS[image.jars](settings, context)
        for path, text in image.files.items():
            (context / path).parent.mkdir(parents=True, exist_ok=True)
            (context / path).write_text(text, encoding="utf-8")
        (context / "Containerfile").write_text(image.containerfile_text(), encoding="utf-8")
        ulimits = [f"--ulimit={ulimit}" for ulimit in current_ulimits()]
        engine.run(["build", "--network", "host", *ulimits, "--tag", name,
                    "--file", str(context / "Containerfile"), str(context)])
    report(f"{name}: built in {time.monotonic() - began:.1f} s")
    return name


def _component_jars(component: Component, context: Path) -> None:
    """The jars of ``component``'s pom (resolved once, as ``kasper stack up`` does) in
    ``libs/``."""
    libs = context / "libs"
    libs.mkdir()
    for jar in resolve_jars(component.recipe(), component.lib_dir):
        _link_or_copy(jar, libs / jar.name)


def _registry_jar(settings: Settings, context: Path) -> None:
    """The stack's schema registry jar (built once, as ``kasper stack up schema-registry``
    does)."""
    registry = SchemaRegistry(settings)
    registry.prepare()
    _link_or_copy(registry.lib_dir / "schema-registry.jar", context / "schema-registry.jar")


def _opensearch_home(settings: Settings, context: Path) -> None:
    """The node's home as the stack lays it out (``home/lib``, ``home/modules``)."""
    node = OpenSearch(settings)
    jars = resolve_jars(node.recipe(), node.lib_dir)
    lay_out_home(context / "home", jars, server_version(jars))


_JARS: dict[str, Callable[[Settings, Path], None]] = {
    "kafka": lambda settings, context: _component_jars(Kafka(settings), context),
    "cassandra": lambda settings, context: _component_jars(Cassandra(settings), context),
    "schema-registry": _registry_jar,
    "opensearch": _opensearch_home,
}


def _link_or_copy(source: Path, target: Path) -> None:
    try:
        os.link(source, target)
    except OSError:  # another filesystem
        shutil.copy2(source, target)
