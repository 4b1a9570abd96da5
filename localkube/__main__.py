"""``python -m eventop.localkube``: serve a local API server until SIGTERM/SIGINT."""

from __future__ import annotations

import argparse
import signal
import sys
import threading

from eventop.localkube.core import LocalKube


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m eventop.localkube",
                                     description="A local stand-in for kube-apiserver.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8001, help="0 picks a free port")
    parser.add_argument("--crds", default="crds", help="directory of CRD yaml files")
    parser.add_argument("--history", type=int, default=10000,
                        help="watch events kept for resuming watches")
    args = parser.parse_args(argv)
    try:
        server = LocalKube(args.crds, host=args.host, port=args.port, history=args.history)
        url = server.start()
    except (OSError, FileNotFoundError) as exc:
        print(f"localkube: cannot start: {exc}", file=sys.stderr)
        return 1
    print(url, flush=True)
    done = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: done.set())
    done.wait()
    server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
