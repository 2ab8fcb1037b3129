"""``kasper query``: read a running processor's tables from a shell, through
``QueryClient`` (so redirects to the instance holding a key are followed). Prints JSON:
one value, or one ``[key, value]`` line per pair of a scan. The key is sent as typed
and decoded by the server, so its errors and hints reach the shell verbatim; a hint
given with a value (the key found where another partitioner puts it) goes to stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from kasper_py.cli.base import (
    ENV_PREFIX,
    EXIT_FAILED,
    EXIT_OK,
    EXIT_REFUSED,
    EXIT_USAGE,
    print_error,
)
from kasper_py.exceptions import NotFoundError, QueryError, UnauthorizedError
from kasper_py.query.client import QueryClient

__all__ = ["main"]

_PROG = "kasper query"
_TOKEN_ENV = f"{ENV_PREFIX}QUERY_TOKEN"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=_PROG, description="Read a running processor's tables (its query server, "
        "Config.query_port, serves them). With KEY: its value (a windowed table: its "
        "windows). Without: every pair, page by page.",
        epilog=f"The bearer token (Config.query_token) comes from {_TOKEN_ENV} or "
               "--token-file, never from the command line, where other users could read "
               "it. Exit codes: 0 found, 1 not found, 2 usage or bad query, 3 no instance "
               "answered, 5 refused (no token, or the wrong one).")
    parser.add_argument("--url", action="append", required=True, metavar="URL",
                        help="an instance's query endpoint, e.g. http://127.0.0.1:9200 "
                             "(repeat: the first that answers is asked)")
    parser.add_argument("--token-file", metavar="FILE",
                        help=f"a file holding the bearer token (default: ${_TOKEN_ENV})")
    parser.add_argument("--cafile", metavar="PEM",
                        help="HTTPS: the CA (or self-signed) certificate the servers' "
                             "certificates are checked against (default: the system's)")
    parser.add_argument("table", nargs="?", help="the table; none lists the tables")
    parser.add_argument("key", nargs="?", help="the key, as the processor sees it (with "
                        "a json key serde: JSON text, e.g. 42 or '\"alice\"')")
    parser.add_argument("--key-serde", choices=("bytes", "str", "json"),
                        help="ignored (kept for old scripts): the key is sent as typed "
                             "and the server decodes it with the table's key serde")
    parser.add_argument("--prefix", help="a scan: keys starting with these bytes (UTF-8)")
    parser.add_argument("--start", help="a scan: keys from these bytes (inclusive)")
    parser.add_argument("--end", help="a scan: keys up to these bytes (exclusive)")
    parser.add_argument("--stale", action="store_true",
                        help="a key: accept an answer from a standby's warm copy (its lag "
                        "in changelog offsets goes to stderr) when the owner is not here")
    parser.add_argument("--partition", type=int, help="a scan: this partition only")
    parser.add_argument("--limit", type=int, help="a scan: at most this many pairs")
    parser.add_argument("--from", dest="time_from", type=int, default=0, metavar="MS",
                        help="a windowed table: windows ending after this time (epoch ms)")
    parser.add_argument("--to", dest="time_to", type=int, default=2 ** 63 - 1, metavar="MS",
                        help="a windowed table: windows starting before this time")
    return parser


def main(argv: Sequence[str], env: Mapping[str, str] = os.environ) -> int:
    """Run ``kasper query``; returns the exit code."""
    args = _parser().parse_args(argv)
    if args.limit is not None and args.limit < 1:
        print_error(_PROG, f"--limit must be at least 1, got {args.limit}")
        return EXIT_USAGE
    try:
        token = _token(args.token_file, env)
        client = QueryClient(args.url, token=token, ca_file=args.cafile)
        for line in _answer(client, args):
            print(json.dumps(line, default=repr))
    except (ValueError, OSError) as exc:  # a bad --url, token file or CA file
        print_error(_PROG, str(exc))
        return EXIT_USAGE
    except QueryError as exc:
        print_error(_PROG, str(exc))
        return _exit_code(exc)
    return EXIT_OK


def _answer(client: QueryClient, args: argparse.Namespace) -> Any:
    """The lines to print, as JSON values; a lookup's hint goes to stderr."""
    if args.table is None:
        return client.tables()
    if args.key is None:
        return _scan(client, args)
    described = _describe(client, args.table)  # one /tables request: kind and key serde
    # The key goes as typed: its text is the key serde's bytes (JSON text for a json
    # key), decoded by the server, whose error names what is wrong with it.
    key = args.key.encode("utf-8")
    if described.get("kind") == "windowed":
        return client.windows(args.table, key, args.time_from, args.time_to,
                              key_serde="bytes")
    found = client.find(args.table, key, key_serde="bytes", stale=args.stale)
    if found.hint:
        print(f"{_PROG}: note: {found.hint}", file=sys.stderr, flush=True)
    if found.standby_lag is not None:
        print(f"{_PROG}: note: answered by a standby copy {found.standby_lag} changelog "
              "offsets behind", file=sys.stderr, flush=True)
    return [found.value]


def _scan(client: QueryClient, args: argparse.Namespace) -> list[list[Any]]:
    pairs = client.scan(args.table, prefix=args.prefix, start=args.start, end=args.end,
                        page=min(args.limit or 100, 1000), partition=args.partition)
    lines: list[list[Any]] = []
    for key, value in pairs:
        lines.append([key, value])
        if args.limit is not None and len(lines) >= args.limit:
            break
    return lines


def _describe(client: QueryClient, table: str) -> dict[str, Any]:
    for described in client.tables():
        if described.get("name") == table:
            return described
    return {}


def _token(path: str | None, env: Mapping[str, str]) -> str | None:
    """The bearer token: the first line of ``--token-file``, else the environment's."""
    if path is None:
        return env.get(_TOKEN_ENV) or None
    try:
        with open(path, encoding="utf-8") as file:
            token = file.readline().strip()
    except OSError as exc:
        raise ValueError(f"--token-file {path!r}: {exc.strerror or exc}") from None
    if not token:
        raise ValueError(f"--token-file {path!r} holds no token")
    return token


def _exit_code(exc: QueryError) -> int:
    if isinstance(exc, UnauthorizedError):
        return EXIT_REFUSED
    if isinstance(exc, NotFoundError):
        return EXIT_FAILED
    return EXIT_USAGE if exc.status == 400 else 3


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
