"""``kasper standby promote``: tell a running ``kasper run`` process that keeps
partitions warm (``--standby-partitions``) to take them over as their owner, in place,
through its admin endpoint (``--admin-port``, loopback only); ``kasper standby release``:
the way back, once their owner returns. Prints the answer as JSON: the partitions owned
or released, the records restored, the transactional ids fenced, the offsets committed.
"""

from __future__ import annotations

import argparse
import json
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from typing import Any

from kasper_py.cli.base import EXIT_FAILED, EXIT_OK, EXIT_REFUSED, EXIT_USAGE, print_error
from kasper_py.loop.promotion import PROMOTE_PATH, RELEASE_PATH

__all__ = ["main"]

_PROG = "kasper standby"
_EXIT_UNREACHABLE = 3
_EXIT_CODES = ("Exit codes: 0 done, 1 it failed (the process stops, uncommitted), 2 usage, "
               "3 no process answered, 5 refused (unknown partitions, partitions it already "
               "owns or, to release, does not own or are its last, group mode): nothing "
               "changed.")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=_PROG, description="Operate a running process's standby replicas.",
        epilog=_EXIT_CODES)
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    promote = actions.add_parser(
        "promote", help="take partitions over in the running process (its warm copies "
        "promoted: only the changelogs' tails are read)",
        description="Take PARTITIONS over as their owner in the running process at "
        "ENDPOINT, between two of its turns. Exactly-once: the previous owner's "
        "transactional id is fenced first (its open transaction aborted). At-least-once: "
        "stop the previous owner first, nothing can fence it. A partition the process "
        "does not keep warm is adopted too, its tables restored in full.",
        epilog=_EXIT_CODES)
    _common(promote, "take over")
    promote.add_argument("--previous", metavar="SET",
                         help="exactly-once: the previous owner's partition set (its "
                              "--input-partitions, e.g. 0-3), fenced besides the sets of "
                              "PARTITIONS alone and of their last commit notes")
    release = actions.add_parser(
        "release", help="stop running partitions in the running process (the way back "
        "after a promotion, once their owner returns)",
        description="Stop running PARTITIONS in the process at ENDPOINT, between two of "
        "its turns: its last turn committed, their offsets re-committed with a "
        "'released' note (so their owner, restarted on them, is not refused), their "
        "stores closed, and kept warm again where it keeps standbys of them. Start "
        "their owner once this returns.", epilog=_EXIT_CODES)
    _common(release, "release")
    return parser


def _common(action: argparse.ArgumentParser, verb: str) -> None:
    """The arguments of every action: where, which partitions, how long to wait."""
    action.add_argument("--endpoint", required=True, metavar="URL",
                        help="the process's admin endpoint, e.g. http://127.0.0.1:9300 "
                             "(its --admin-port)")
    action.add_argument("--partitions", required=True, metavar="P[,P...]",
                        help=f"the partitions to {verb}")
    action.add_argument("--timeout", type=float, default=600.0, metavar="SECONDS",
                        help="how long to wait for the loop to do it (default: 600)")


def main(argv: Sequence[str]) -> int:
    """Run ``kasper standby``; returns the exit code."""
    args = _parser().parse_args(argv)
    params = {"partitions": args.partitions, "timeout": f"{args.timeout:g}"}
    if getattr(args, "previous", None):
        params["previous"] = args.previous
    path = PROMOTE_PATH if args.action == "promote" else RELEASE_PATH
    url = f"{args.endpoint.rstrip('/')}{path}?{urllib.parse.urlencode(params)}"
    try:
        status, answer = _post(url, args.timeout + 10)
    except ValueError as exc:  # not an http(s) URL
        print_error(_PROG, f"--endpoint {args.endpoint!r}: {exc}")
        return EXIT_USAGE
    except OSError as exc:
        print_error(_PROG, f"no process answered at {args.endpoint}: {exc}")
        return _EXIT_UNREACHABLE
    if status == 200:
        print(json.dumps(answer))
        return EXIT_OK
    print_error(_PROG, str(answer.get("message", answer)))
    if status == 400:
        return EXIT_USAGE
    return EXIT_REFUSED if status in (404, 405, 409, 503) else EXIT_FAILED


def _post(url: str, timeout: float) -> tuple[int, dict[str, Any]]:
    """POST ``url``: its status and JSON answer."""
    request = urllib.request.Request(url, data=b"", method="POST")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        try:
            return exc.code, json.loads(exc.read())
        except ValueError:
            return exc.code, {"message": f"HTTP {exc.code} {exc.reason}"}


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
