"""Getting the servers onto the machine: jars from Maven Central, binaries from apt.

Jars are resolved with the user's own ``mvn`` (and so their ``~/.m2`` cache, mirrors
and proxies) from the poms shipped beside this module, into the per-user cache
(``Settings.lib_dir``) that every clone shares. Debian packages are installed
only when their binary is missing, and never left running as system services.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import subprocess
from collections.abc import Iterator, Sequence
from importlib import resources
from pathlib import Path

from kasper_py.stack._errors import StackError

# Written after a successful copy; holds the hash of the pom (and options) it came from,
# so a version bump in the pom re-resolves and an unchanged one costs nothing.
_STAMP = ".resolved"

# Debian's service policy hook: exit code 101 means "do not start services", which
# stops the package's own redis or prometheus from being started on the default port.
_POLICY_RC = Path("/usr/sbin/policy-rc.d")
_POLICY_RC_DENY = "#!/bin/sh\n# written by kasper_py.stack during apt-get install\nexit 101\n"


def template(name: str) -> str:
    """The text of a file shipped as package data beside this module."""
    return resources.files("kasper_py.stack").joinpath(name).read_text(encoding="utf-8")


def require_binary(binary: str, hint: str) -> str:
    """Absolute path of ``binary`` on PATH, or a StackError carrying ``hint``."""
    path = shutil.which(binary)
    if path is None:
        raise StackError(f"{binary} not found on PATH: {hint}")
    return path


def resolve_jars(pom_text: str, lib_dir: Path, extra_args: Sequence[str] = ()) -> list[Path]:
    """Copy the runtime dependencies of ``pom_text`` into ``lib_dir`` (once) and list them."""
    with building(lib_dir):
        if not is_resolved(pom_text, lib_dir, extra_args):
            _copy_dependencies(pom_text, lib_dir, extra_args)
            mark_resolved(pom_text, lib_dir, extra_args)
    return sorted(lib_dir.glob("*.jar"))


@contextlib.contextmanager
def building(lib_dir: Path) -> Iterator[None]:
    """Hold ``<lib_dir>.lock``: the cache is shared by every clone and process of a user,
    and two first ``up``s must not fill one folder at once (the second waits, then finds
    it complete)."""
    lib_dir.parent.mkdir(parents=True, exist_ok=True)
    with open(lib_dir.with_name(f"{lib_dir.name}.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def is_resolved(pom_text: str, lib_dir: Path, extra_args: Sequence[str] = ()) -> bool:
    """True when ``lib_dir`` holds a complete copy made from this very pom and options."""
    stamp = lib_dir / _STAMP
    return stamp.is_file() and stamp.read_text().strip() == _fingerprint(pom_text, extra_args)


def mark_resolved(pom_text: str, lib_dir: Path, extra_args: Sequence[str] = ()) -> None:
    """Record that ``lib_dir`` now holds a complete copy made from this pom and options."""
    (lib_dir / _STAMP).write_text(_fingerprint(pom_text, extra_args) + "\n")


def _fingerprint(pom_text: str, extra_args: Sequence[str]) -> str:
    return hashlib.sha256("\n".join([pom_text, *extra_args]).encode()).hexdigest()


def _copy_dependencies(pom_text: str, lib_dir: Path, extra_args: Sequence[str]) -> None:
    mvn = require_binary("mvn", "install Maven 3.8+ (e.g. apt-get install maven)")
    if lib_dir.exists():
        shutil.rmtree(lib_dir)  # a stale or half-copied set must not mix with the new one
    lib_dir.mkdir(parents=True)
    pom = lib_dir.parent / f"{lib_dir.name}-pom.xml"
    pom.write_text(pom_text, encoding="utf-8")
    command = [mvn, "-q", "-B", "-Dstyle.color=never", "-f", str(pom),
               "dependency:copy-dependencies",
               "-DincludeScope=runtime", f"-DoutputDirectory={lib_dir}", *extra_args]
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        shutil.rmtree(lib_dir, ignore_errors=True)
        output = "\n".join((result.stdout + result.stderr).splitlines()[-30:])
        raise StackError(f"Maven could not resolve {pom}:\n{output}")


def apt_install(package: str, binary: str) -> str:
    """Path of ``binary``, installing Debian's ``package`` first when it is missing."""
    existing = shutil.which(binary)
    if existing is not None:
        return existing
    manual = f"install it with: sudo apt-get install --no-install-recommends {package}"
    if shutil.which("apt-get") is None or os.geteuid() != 0:
        raise StackError(f"{binary} not found on PATH; {manual}")
    print(f"{package}: installing with apt-get ...", flush=True)
    with _services_not_started():
        _run_apt(["apt-get", "update"], manual)
        _run_apt(["apt-get", "install", "-y", "--no-install-recommends", package], manual)
    _disable_systemd_unit(package)
    return require_binary(binary, manual)


def _run_apt(command: list[str], manual: str) -> None:
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    result = subprocess.run(command, capture_output=True, text=True, check=False, env=env)
    if result.returncode != 0:
        output = "\n".join((result.stdout + result.stderr).splitlines()[-30:])
        raise StackError(f"{' '.join(command)} failed; {manual}\n{output}")


@contextlib.contextmanager
def _services_not_started() -> Iterator[None]:
    """A deny-all policy-rc.d for the duration of an install, unless one exists already."""
    created = not _POLICY_RC.exists()
    if created:
        _POLICY_RC.write_text(_POLICY_RC_DENY)
        _POLICY_RC.chmod(0o755)
    try:
        yield
    finally:
        if created:
            _POLICY_RC.unlink(missing_ok=True)


def _disable_systemd_unit(unit: str) -> None:
    """Under systemd, keep the package's own service off now and at boot: we run our own."""
    if Path("/run/systemd/system").is_dir() and shutil.which("systemctl"):
        subprocess.run(["systemctl", "disable", "--now", unit],
                       capture_output=True, check=False)
