"""The stack's tracing backend: Jaeger v2 (``github.com/jaegertracing/jaeger/cmd/jaeger``),
built once with the user's own ``go`` from the Go module proxy at a pinned version, and
run with a config of its own: OTLP in over gRPC and HTTP, traces kept in memory, the
query API on ``KASPER_JAEGER_PORT`` (the UI is a placeholder: its assets are built
with npm for Jaeger's releases, not found in the Go module).

Jaeger's ``go.mod`` has a ``replace`` directive, which ``go install pkg@version`` refuses,
so ``prepare`` downloads the module (``go mod download``) and builds inside it. Go's own
caches (``GOMODCACHE``, ``GOCACHE``) live outside the stack, so the build of a second
stack (another clone, or after ``rm -rf .kasper-stack``) downloads and compiles nothing
again: it only links.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import urllib.error
import urllib.request
from pathlib import Path

from kasper_py._support.ports import LOOPBACK
from kasper_py.stack._components import Component
from kasper_py.stack._errors import StackError
from kasper_py.stack._install import building, is_resolved, mark_resolved, require_binary
from kasper_py.stack._process import port_open

JAEGER_MODULE = "github.com/jaegertracing/jaeger"
JAEGER_VERSION = "v1.76.0"
"""The module version whose ``cmd/jaeger`` is Jaeger v2 (the v1 tags carry both)."""

_BINARY = "jaeger"
_GO_HINT = "install Go 1.24.6 or later (https://go.dev/dl/)"  # its go.mod's minimum


class Jaeger(Component):
    """Jaeger v2 all-in-one, in memory, built from the Go module proxy."""

    name = "jaeger"
    ready_timeout = 30.0
    stop_grace = 10.0

    @property
    def port(self) -> int:
        """The query API (``/api/v3/traces``, ``/api/services``)."""
        return self.settings.jaeger_port

    @property
    def otlp_endpoint(self) -> str:
        """The OTLP/HTTP base URL (``Config.otlp_endpoint``; spans go to ``/v1/traces``)."""
        return f"http://{LOOPBACK}:{self.settings.jaeger_otlp_http_port}"

    def recipe(self) -> str:
        return f"{JAEGER_MODULE}/cmd/jaeger@{JAEGER_VERSION}"

    def prepare(self) -> str:
        self.directory.mkdir(parents=True, exist_ok=True)
        binary = self.lib_dir / _BINARY
        with building(self.lib_dir):  # one build per user, whichever stack asks first
            if not is_resolved(self.recipe(), self.lib_dir) or not binary.is_file():
                _build(binary)
                mark_resolved(self.recipe(), self.lib_dir)
        settings = self.settings
        self.render("jaeger.yaml", "jaeger.yaml", host=LOOPBACK, query_port=self.port,
                    query_grpc_port=settings.jaeger_grpc_port,
                    otlp_grpc_port=settings.jaeger_otlp_grpc_port,
                    otlp_http_port=settings.jaeger_otlp_http_port)
        return str(binary)

    def command(self, program: str) -> list[str]:
        return [program, "--config", str(self.directory / "jaeger.yaml")]

    def is_ready(self) -> bool:
        """True once the OTLP/HTTP receiver listens and ``GET /api/services`` answers
        with JSON (the storage is up)."""
        if not port_open(LOOPBACK, self.settings.jaeger_otlp_http_port):
            return False
        try:
            with urllib.request.urlopen(f"http://{self.address}/api/services",
                                        timeout=2) as reply:
                json.loads(reply.read())
        except (urllib.error.URLError, OSError, ValueError):
            return False
        return True


def _build(binary: Path) -> None:
    """``go build`` the pinned ``cmd/jaeger`` into ``binary`` (minutes the first time)."""
    go = require_binary("go", _GO_HINT)
    print(f"jaeger: building {JAEGER_MODULE}/cmd/jaeger@{JAEGER_VERSION} with Go "
          "(once; minutes the first time) ...", flush=True)
    source = _go(go, ["mod", "download", "-json", f"{JAEGER_MODULE}@{JAEGER_VERSION}"],
                 cwd=binary.parent.parent)
    module_dir = json.loads(source)["Dir"]
    shutil.rmtree(binary.parent, ignore_errors=True)
    binary.parent.mkdir(parents=True)
    partial = binary.with_suffix(".partial")
    _go(go, ["build", "-trimpath", "-o", str(partial), "./cmd/jaeger"], cwd=Path(module_dir))
    partial.replace(binary)


def _go(go: str, arguments: list[str], cwd: Path) -> str:
    """Run ``go`` with ``arguments`` in ``cwd``; its stdout."""
    cwd.mkdir(parents=True, exist_ok=True)
    result = subprocess.run([go, *arguments], cwd=cwd, capture_output=True, text=True,
                            check=False)
    if result.returncode != 0:
        output = "\n".join((result.stdout + result.stderr).splitlines()[-30:])
        raise StackError(f"go {' '.join(arguments)} failed:\n{output}")
    return result.stdout
