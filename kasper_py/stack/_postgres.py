"""The stack's PostgreSQL: Debian's ``postgresql`` package, its cluster made with
``initdb`` in the stack folder (trust authentication, 127.0.0.1 only, no Unix socket)
and run as a plain ``postgres`` process on ``KASPER_POSTGRES_PORT``, never as the
package's systemd service or its ``pg_ctlcluster`` cluster on port 5432.

PostgreSQL refuses to run as root: under root the cluster belongs to the ``postgres``
user the package creates, and the server is started with ``setpriv`` as that user.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
from pathlib import Path

from kasper_py._support.ports import LOOPBACK
from kasper_py.stack._components import Component
from kasper_py.stack._errors import StackError
from kasper_py.stack._install import apt_install

DATABASE = "postgres"
"""The database the stack's clients use (``initdb`` creates it)."""
USER = "postgres"
"""The superuser ``initdb`` creates, and the system user the server runs as under root."""
_DEBIAN_BIN = Path("/usr/lib/postgresql")


class Postgres(Component):
    """PostgreSQL from Debian's packages, one cluster in ``<stack>/postgres/data``."""

    name = "postgres"
    ready_timeout = 30.0
    stop_grace = 10.0  # SIGTERM: "smart" shutdown; clients gone, it exits at once

    @property
    def data_dir(self) -> Path:
        """The cluster ``initdb`` made (``PGDATA``)."""
        return self.directory / "data"

    @property
    def port(self) -> int:
        return self.settings.postgres_port

    @property
    def url(self) -> str:
        """``postgresql://postgres@127.0.0.1:<port>/postgres`` (trust: no password)."""
        return f"postgresql://{USER}@{self.address}/{DATABASE}"

    def prepare(self) -> str:
        bin_dir = _server_bin_dir()
        self.directory.mkdir(parents=True, exist_ok=True)
        if not (self.data_dir / "PG_VERSION").is_file():
            self._initdb(bin_dir)
        return str(bin_dir / "postgres")

    def _initdb(self, bin_dir: Path) -> None:
        shutil.rmtree(self.data_dir, ignore_errors=True)  # a half-made cluster from a failure
        self.data_dir.mkdir(mode=0o700)
        _give_to_server_user(self.directory)
        _give_to_server_user(self.data_dir)
        command = [str(bin_dir / "initdb"), "-D", str(self.data_dir), "-U", USER,
                   "--auth=trust", "--encoding=UTF8", "--locale=C.UTF-8"]
        result = subprocess.run([*_as_server_user(), *command], capture_output=True,
                                text=True, check=False, cwd=self.directory)
        if result.returncode != 0:
            shutil.rmtree(self.data_dir, ignore_errors=True)
            raise StackError(f"postgres initdb failed:\n{result.stdout}{result.stderr}")

    def command(self, program: str) -> list[str]:
        return [*_as_server_user(), program, "-D", str(self.data_dir), "-p", str(self.port),
                "-c", f"listen_addresses={LOOPBACK}", "-c", "unix_socket_directories=",
                "-c", "max_connections=200"]

    def is_ready(self) -> bool:
        """True once ``pg_isready`` says the server accepts connections."""
        probe = _server_bin_dir() / "pg_isready"
        result = subprocess.run([str(probe), "-q", "-h", LOOPBACK, "-p", str(self.port)],
                                capture_output=True, check=False)
        return result.returncode == 0


def _server_bin_dir() -> Path:
    """The newest ``/usr/lib/postgresql/<major>/bin`` (Debian keeps the server off PATH),
    installing Debian's ``postgresql`` first when there is none."""
    found = _newest_bin_dir()
    if found is None:
        apt_install("postgresql", "pg_ctlcluster")
        _keep_debian_clusters_down()
        found = _newest_bin_dir()
    if found is None:
        raise StackError("postgres not found under /usr/lib/postgresql/*/bin; install it "
                         "with: sudo apt-get install --no-install-recommends postgresql")
    return found


def _newest_bin_dir() -> Path | None:
    majors = [d for d in _DEBIAN_BIN.glob("*/bin") if (d / "postgres").is_file()]
    return max(majors, key=lambda d: int(d.parent.name), default=None) if majors else None


def _keep_debian_clusters_down() -> None:
    """The package's postinst makes a cluster on port 5432 that starts with the machine;
    ours is the stack's, so theirs is made ``manual`` (never started by itself)."""
    for start_conf in Path("/etc/postgresql").glob("*/*/start.conf"):
        start_conf.write_text("manual\n")


def _as_server_user() -> list[str]:
    """The prefix that runs a command as ``postgres`` under root; nothing otherwise."""
    if os.geteuid() != 0:
        return []
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        raise StackError("postgres cannot run as root and setpriv (util-linux) is missing")
    return [setpriv, f"--reuid={USER}", f"--regid={USER}", "--init-groups", "--"]


def _give_to_server_user(path: Path) -> None:
    if os.geteuid() == 0:
        entry = pwd.getpwnam(USER)
        os.chown(path, entry.pw_uid, entry.pw_gid)
