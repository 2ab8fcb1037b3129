"""The container engine: Podman from Debian's packages, configured for machines where
containers run with host networking, runc and cgroupfs, and serving the Docker API on
a unix socket (``podman system service``) for docker-py and testcontainers.

The engine's quirks live in one ``containers.conf`` written here and handed to every
podman process through ``CONTAINERS_CONF``; nothing is set by hand. Images are built
by ``_images`` and ``_image_build``; this module only installs, configures, runs and
probes the engine.
"""

from __future__ import annotations

import http.client
import os
import resource
import socket
import subprocess
from collections.abc import Sequence
from pathlib import Path

from kasper_py.stack._components import Component
from kasper_py.stack._errors import StackError
from kasper_py.stack._install import apt_install
from kasper_py.stack._settings import Settings

ENGINE_PACKAGES = (("podman", "podman"), ("runc", "runc"))
"""(Debian package, binary): the engine, and the OCI runtime it is told to use (crun,
podman's default, refuses some cgroup v1 layouts)."""

# rlimits a container may not raise: podman's default (nofile 1048576) is above what
# root in this kind of VM may set, and runc's init runs under hard limits lower than a
# shell's (nproc 32768 where a shell has 96365), so containers get these ceilings, or
# this process's soft limit when lower. Enough for a broker's threads and sockets.
_RLIMITS = (("nofile", resource.RLIMIT_NOFILE, 20000), ("nproc", resource.RLIMIT_NPROC, 8192))


class Podman(Component):
    """``podman system service`` answering the Docker API on ``<stack>/podman/podman.sock``."""

    name = "podman"
    ready_timeout = 30.0
    stop_grace = 10.0

    def __init__(self, settings: Settings) -> None:
        super().__init__(settings)
        self.socket_path = self.directory / "podman.sock"
        self.conf_file = self.directory / "containers.conf"

    @property
    def port(self) -> int:
        """No TCP port: the API is on a unix socket (``docker_host``)."""
        return 0

    @property
    def address(self) -> str:
        return self.docker_host

    @property
    def docker_host(self) -> str:
        """What ``DOCKER_HOST`` is set to for docker-py and testcontainers."""
        return f"unix://{self.socket_path}"

    def prepare(self) -> str:
        podman = install_engine()
        self.directory.mkdir(parents=True, exist_ok=True)
        self.write_conf()
        self.socket_path.unlink(missing_ok=True)  # left by a killed service
        return podman

    def write_conf(self) -> Path:
        """Write this engine's ``containers.conf``; returns its path."""
        self.directory.mkdir(parents=True, exist_ok=True)
        self.conf_file.write_text(engine_conf(), encoding="utf-8")
        return self.conf_file

    def environment(self) -> dict[str, str]:
        return {"CONTAINERS_CONF": str(self.conf_file)}

    def command(self, program: str) -> list[str]:
        return [program, "system", "service", "--time=0", self.docker_host]

    def is_ready(self) -> bool:
        return api_version(self.socket_path) is not None

    def run(self, arguments: Sequence[str], *, stdin: bytes | None = None,
            check: bool = True) -> subprocess.CompletedProcess[bytes]:
        """Run the ``podman`` command line with this engine's configuration."""
        podman = install_engine()
        self.write_conf()
        env = {**os.environ, **self.environment()}
        result = subprocess.run([podman, *arguments], input=stdin, capture_output=True,
                                env=env, check=False)
        if check and result.returncode != 0:
            output = (result.stdout + result.stderr).decode(errors="replace")
            tail = "\n".join(output.splitlines()[-30:])
            raise StackError(f"podman {' '.join(arguments[:2])} failed:\n{tail}")
        return result


def install_engine() -> str:
    """Path of ``podman``, installing podman and runc from Debian's packages if missing."""
    binaries = [apt_install(package, binary) for package, binary in ENGINE_PACKAGES]
    return binaries[0]


def engine_conf() -> str:
    """The ``containers.conf`` of this machine: runc, cgroupfs, host networking, no
    registry searched for short names, rlimits at the current soft limits."""
    ulimits = ", ".join(f'"{ulimit}"' for ulimit in current_ulimits())
    return (
        "# written by kasper_py.stack (podman component); see kasper_py/stack/_engine.py\n"
        "[containers]\n"
        f"default_ulimits = [{ulimits}]\n"
        'netns = "host"\n'
        "[engine]\n"
        'runtime = "runc"\n'
        'cgroup_manager = "cgroupfs"\n'
        'events_logger = "file"\n'
    )


def current_ulimits() -> list[str]:
    """``name=N:N`` of the rlimits every container gets (``_RLIMITS``): given on each
    ``podman build`` too, since a build's ``--ulimit`` replaces the configured list."""
    ulimits = []
    for name, limit, ceiling in _RLIMITS:
        soft, _hard = resource.getrlimit(limit)
        value = ceiling if soft == resource.RLIM_INFINITY else min(soft, ceiling)
        ulimits.append(f"{name}={value}:{value}")
    return ulimits


class _UnixConnection(http.client.HTTPConnection):
    """HTTP over a unix socket, as the Docker API is served."""

    def __init__(self, path: Path) -> None:
        super().__init__("localhost", timeout=2)
        self._path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(2)
        sock.connect(str(self._path))
        self.sock = sock


def api_version(socket_path: Path) -> str | None:
    """The body of the engine's ``GET /version`` (Docker API), None if it does not answer."""
    if not socket_path.exists():
        return None
    connection = _UnixConnection(socket_path)
    try:
        connection.request("GET", "/version")
        reply = connection.getresponse()
        body = reply.read().decode(errors="replace")
        return body if reply.status == 200 else None
    except OSError:
        return None
    finally:
        connection.close()
