"""``python -m eventop.router``: serve the router under gunicorn.

Only the standard library is imported before ``PROMETHEUS_MULTIPROC_DIR`` is set, so that
every process (master and forked workers) has prometheus_client in multiprocess mode.
"""

from __future__ import annotations

import argparse
import glob
import os
import shutil
import sys
import tempfile

DESCRIPTION = """\
Receive CloudEvents over HTTP and dispatch them to eventop's handler functions, under gunicorn.

Routes: POST / (CloudEvents, binary or structured mode; POST /events is an alias),
GET /healthz (process alive), GET /readyz (200 only while the Kubernetes API answers),
GET /metrics (Prometheus text, summed over all workers).
"""

EPILOG = """\
environment:
  PORT                      port when --port is not given (default 8080)
  WEB_CONCURRENCY           workers when --workers is not given (default 2)
  EVENTOP_THREADS           threads per worker when --threads is not given (default 4)
  EVENTOP_KUBE_URL          plain-HTTP Kubernetes API (the local API server); otherwise
                            KUBECONFIG / ~/.kube/config, or the in-cluster service account
  EVENTOP_HANDLERS          extra handler modules to import, comma-separated
  EVENTOP_MAX_BODY_BYTES    request body limit in bytes (default 8388608 = 8 MiB)
  EVENTOP_LOG_LEVEL         log level of eventop's JSON logs (default INFO)
  PROMETHEUS_MULTIPROC_DIR  directory for per-worker metric files; its *.db files are
                            removed at start. When unset, a fresh temporary directory is
                            created and removed on exit.

The host defaults to 0.0.0.0 inside a container (KUBERNETES_SERVICE_HOST set, or
/.dockerenv exists) and to 127.0.0.1 elsewhere, so a laptop run is not exposed to the network.
SIGTERM shuts down gracefully: workers finish their current events within --graceful-timeout.
"""


# Below Kubernetes' default terminationGracePeriodSeconds (30): the kubelet's SIGKILL comes
# that long after its SIGTERM, so workers must be done (or stopped by gunicorn) before then.
GRACEFUL_TIMEOUT = 25


def in_container() -> bool:
    return bool(os.environ.get("KUBERNETES_SERVICE_HOST")) or os.path.exists("/.dockerenv")


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        return int(raw)
    except ValueError:
        raise SystemExit(f"python -m eventop.router: {name} must be an integer, "
                         f"not {raw!r}") from None


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m eventop.router", description=DESCRIPTION, epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--host", default=None,
                        help="address to bind (default: 0.0.0.0 in a container, else 127.0.0.1)")
    parser.add_argument("--port", type=int, default=None,
                        help="port to listen on (default: $PORT or 8080)")
    parser.add_argument("--workers", type=_positive, default=None,
                        help="gunicorn worker processes (default: $WEB_CONCURRENCY or 2)")
    parser.add_argument("--threads", type=_positive, default=None,
                        help="threads per worker; more than 1 selects gunicorn's gthread worker "
                             "(default: $EVENTOP_THREADS or 4)")
    parser.add_argument("--timeout", type=_positive, default=60,
                        help="seconds a worker may stay silent before gunicorn restarts it "
                             "(default: 60)")
    parser.add_argument("--graceful-timeout", type=_positive, default=GRACEFUL_TIMEOUT,
                        help="seconds workers get to finish their events on shutdown; keep it "
                             "below the pod's terminationGracePeriodSeconds, or the kubelet "
                             f"kills them first (default: {GRACEFUL_TIMEOUT})")
    parser.add_argument("--log-level", default=os.environ.get("EVENTOP_LOG_LEVEL", "info"),
                        choices=["debug", "info", "warning", "error", "critical"],
                        help="log level (default: $EVENTOP_LOG_LEVEL or info)")
    return parser


def prepare_metrics_dir() -> str | None:
    """Make ``PROMETHEUS_MULTIPROC_DIR`` point at an empty directory; return it if we made it.

    Stale files from a previous run would be added to this run's counters, so a given
    directory is emptied of metric files; without one, a fresh temporary directory is used.
    """
    given = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if given:
        os.makedirs(given, exist_ok=True)
        for stale in glob.glob(os.path.join(given, "*.db")):
            os.remove(stale)
        return None
    created = tempfile.mkdtemp(prefix="eventop-metrics-")
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = created
    return created


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    port = args.port if args.port is not None else _env_int("PORT", 8080)
    if not 0 <= port <= 65535:
        raise SystemExit(f"python -m eventop.router: port must be 0..65535, not {port}")
    owned = prepare_metrics_dir()  # before prometheus_client is imported anywhere
    master = os.getpid()

    try:
        from eventop.router.server import ServerOptions, serve

        serve(ServerOptions(
            host=args.host or ("0.0.0.0" if in_container() else "127.0.0.1"),
            port=port,
            workers=args.workers or max(1, _env_int("WEB_CONCURRENCY", 2)),
            threads=args.threads or max(1, _env_int("EVENTOP_THREADS", 4)),
            timeout=args.timeout,
            graceful_timeout=args.graceful_timeout,
            log_level=args.log_level,
            metrics_dir_owned=owned,
        ))
    finally:
        # Also when gunicorn exits early (port in use, bad handler module). Forked workers
        # unwind through here too when they exit: only the master may remove the directory.
        if owned and os.getpid() == master:
            shutil.rmtree(owned, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
