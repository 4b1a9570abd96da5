"""``python -m eventop.localkube``: serve a local API server until SIGTERM/SIGINT.

Prints its URL on the first line of stdout (scripts read it), then logs one line per request
on stderr, as JSON lines or text (``--log-format``), like the router and the watcher.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from pathlib import Path

from eventop.cli import (
    PORT,
    ConfigError,
    Parser,
    integer,
    log_options,
    report,
)
from eventop.localkube.core import REPO_CRDS, LocalKube, RequestLog

PROG = "python -m eventop.localkube"
log = logging.getLogger("eventop.localkube")


class LoggedRequests(RequestLog):
    """Each request as a log line, and not kept: a long-running server must not grow."""

    def append(self, request: tuple[str, str, str, int]) -> None:
        method, path, query, status = request
        log.log(logging.WARNING if status >= 500 else logging.INFO, "%s %s%s %d",
                method, path, f"?{query}" if query else "", status,
                extra={"fields": {"method": method, "path": path, "query": query,
                                  "status": status}})


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog=PROG, description="A local stand-in for kube-apiserver over plain "
                    "HTTP, for the demo and tests. kubectl reaches it with a kubeconfig whose "
                    "cluster server is the printed URL.")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind [127.0.0.1]")
    parser.add_argument("--port", type=PORT, default=8001, help="0 picks a free port [8001]")
    parser.add_argument("--crds", default=None,
                        help="directory of CRD yaml files to install, relative to here or to "
                             "the repository [crds, if there is one]; --crds '' installs none")
    parser.add_argument("--history", type=integer(1), default=10000,
                        help="watch events kept for resuming watches [10000]")
    log_options(parser)
    return parser


def crd_dir(given: str | None) -> str | None:
    """The CRD folder to install: ``given`` (relative to here, else to the repository), none
    for ``''``; not given, ``crds`` if there is one here or in the repository."""
    if given == "":
        return None
    for folder in (Path(given or "crds"), REPO_CRDS.parent / (given or "crds")):
        if folder.is_dir():
            return str(folder.resolve())
    if given is None:
        return None
    raise ConfigError(f"--crds {given!r}: no such directory (give a folder of CRD yaml "
                      "files, or --crds '' for none)")


def main(argv: list[str] | None = None) -> int:
    from eventop.router.logs import configure

    args = build_parser().parse_args(argv)  # a mistake: one line, exit status 2
    try:
        crds = crd_dir(args.crds)
    except ConfigError as exc:
        return report(PROG, exc)
    configure(args.log_level, force=True, log_format=args.log_format)
    try:
        server = LocalKube(crds, host=args.host, port=args.port, history=args.history)
    except Exception as exc:  # a CRD file that is not YAML, or not a CRD
        said = " ".join(str(exc).split())
        return report(PROG, ConfigError(f"--crds {crds}: cannot install the CRDs: "
                                        f"{type(exc).__name__}: {said}"))
    server.requests = LoggedRequests()
    try:
        url = server.start()
    except OSError as exc:
        print(f"{PROG}: error: cannot start: {args.host}:{args.port}: {exc.strerror or exc} "
              "(choose another --port, or 0 for a free one)", file=sys.stderr)
        return 1
    # Logged before the URL is printed: a client waits for the URL, so its requests' lines
    # always come after this one.
    log.info("serving on %s (CRDs: %s)", url, crds or "none")
    print(url, flush=True)
    done = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: done.set())
    done.wait()
    server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
