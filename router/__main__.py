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

from eventop.cli import (
    PORT,
    ConfigError,
    Parser,
    env_flag,
    http_url,
    integer,
    kubeconfig_files,
    log_options,
    report,
)
from eventop.router import auth

DESCRIPTION = """\
Receive CloudEvents over HTTP and dispatch them to eventop's handler functions, under gunicorn.

Routes: POST / (CloudEvents, binary or structured mode; POST /events is an alias),
GET /healthz (process alive), GET /readyz (200 only while the Kubernetes API answers),
GET /metrics (Prometheus text, summed over all workers).
"""

EPILOG = """\
python -m eventop.router rbac --help: print the ClusterRoles the loaded handlers need.

environment (besides the variables of the options above):
  EVENTOP_KUBE_URL          plain-HTTP Kubernetes API (the local API server); otherwise
  KUBECONFIG                the kubeconfig file (or ~/.kube/config), or the in-cluster
                            service account
  EVENTOP_HANDLERS          your handler modules, comma-separated: dotted module paths
                            (importable by the router) or paths of .py files
  EVENTOP_BUILTIN_HANDLERS  which shipped handlers to load, comma-separated (copy_rules,
                            databases, exchange_rates, mirrors); unset: all, "none":
                            only yours
  EVENTOP_MAX_BODY_BYTES    request body limit in bytes (default 8388608 = 8 MiB)
  EVENTOP_ROUTER_TOKEN      when set, an event must carry "Authorization: Bearer <token>"
                            or is answered 401 (probes and /metrics stay open); unset: off
  RATES_API_URL             the exchange-rate provider, a Frankfurter API (default
                            https://api.frankfurter.dev/v1)
  EVENTOP_CACHE_WAIT_SECONDS  how long an event waits for the router's cache to catch up
                            with its change before it is answered 503 (default 10)
  EVENTOP_ANSWER_WAIT_SECONDS  how long an event waits for the runs it asked for before it
                            is answered 503, the runs going on (default 45)
  EVENTOP_RUN_ON_WATCH      true (default with one worker): a change the router's own cache
                            sees starts its runs at once, the watcher's event finding them
                            under way or done; leader: only in the process holding the
                            Lease eventop-router (for several replicas or workers; needs
                            get, create and update on leases in its namespace: POD_NAMESPACE,
                            else the service account's); false (default with several
                            workers): only events start runs
  PROMETHEUS_MULTIPROC_DIR  directory for per-worker metric files; its *.db files are
                            removed at start. When unset, a fresh temporary directory is
                            created and removed on exit.

The host defaults to 0.0.0.0 inside a container (KUBERNETES_SERVICE_HOST set, or
/.dockerenv exists) and to 127.0.0.1 elsewhere, so a laptop run is not exposed to the network.
SIGTERM shuts down gracefully: workers finish their current events within --graceful-timeout.
A configuration mistake (an option, a variable, a handler module that does not import) is
reported on one line before anything starts, with exit status 2.
"""

PROG = "python -m eventop.router"

# Below Kubernetes' default terminationGracePeriodSeconds (30): the kubelet's SIGKILL comes
# that long after its SIGTERM, so workers must be done (or stopped by gunicorn) before then.
GRACEFUL_TIMEOUT = 25


def in_container() -> bool:
    return bool(os.environ.get("KUBERNETES_SERVICE_HOST")) or os.path.exists("/.dockerenv")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog=PROG, description=DESCRIPTION, epilog=EPILOG,
                    formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--host", default=None,
                        help="address to bind (default: 0.0.0.0 in a container, else 127.0.0.1)")
    env_flag(parser, "--port", "PORT", 8080, "port to listen on, 0 picks a free one", PORT)
    env_flag(parser, "--workers", "WEB_CONCURRENCY", 1,
             "gunicorn worker processes; each has its own cache and work queue, so one per pod "
             "(scale with replicas) merges the most work and writes each change once",
             integer(1))
    env_flag(parser, "--threads", "EVENTOP_THREADS", 32,
             "threads per worker (events handled at once: most of them wait for their runs); "
             "more than 1 selects gunicorn's gthread worker", integer(1))
    parser.add_argument("--timeout", type=integer(1), default=60,
                        help="seconds a worker may stay silent before gunicorn restarts it "
                             "(default: 60)")
    parser.add_argument("--graceful-timeout", type=integer(1), default=GRACEFUL_TIMEOUT,
                        help="seconds workers get to finish their events on shutdown; keep it "
                             "below the pod's terminationGracePeriodSeconds, or the kubelet "
                             f"kills them first (default: {GRACEFUL_TIMEOUT})")
    log_options(parser)
    return parser


def prepare_metrics_dir() -> str | None:
    """Make ``PROMETHEUS_MULTIPROC_DIR`` point at an empty directory; return it if we made it.

    Stale files from a previous run would be added to this run's counters, so a given
    directory is emptied of metric files; without one, a fresh temporary directory is used.
    """
    given = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if given:
        try:
            os.makedirs(given, exist_ok=True)
            for stale in glob.glob(os.path.join(given, "*.db")):
                os.remove(stale)
        except OSError as exc:
            raise ConfigError(f"PROMETHEUS_MULTIPROC_DIR={given!r} can not hold the workers' "
                              f"metric files: {exc.strerror or exc}; point it at a writable "
                              "directory, or unset it for a fresh one") from None
        return None
    created = tempfile.mkdtemp(prefix="eventop-metrics-")
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = created
    return created


def check_environment() -> None:
    """The variables the workers read later, checked now: a typo there would otherwise only
    show as a router that never turns ready."""
    for name in ("EVENTOP_KUBE_URL", "RATES_API_URL"):
        raw = os.environ.get(name, "").strip()
        if raw:
            try:
                http_url(raw)
            except argparse.ArgumentTypeError as exc:
                raise ConfigError(f"{name}: {exc}") from None
    if os.environ.get("KUBECONFIG") and not os.environ.get("EVENTOP_KUBE_URL", "").strip():
        kubeconfig_files(os.environ["KUBECONFIG"], "KUBECONFIG")
    try:
        auth.token_from_env()
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def check_kube_config() -> None:
    """A kubeconfig the workers could not load (no current context, a context that is not
    in it, a malformed file), said now in one line, as the watcher does: else the router
    would start and never turn ready. Reading it does no I/O; no configuration at all is
    not a mistake (the router starts unready and says why). Called once the metrics
    directory is settled: it imports the client."""
    if os.environ.get("EVENTOP_KUBE_URL", "").strip():
        return
    from eventop.kube.connection import configuration
    from eventop.kube.errors import Unavailable

    try:
        configuration()
    except Unavailable:
        return
    except Exception as exc:  # kubernetes' ConfigException, a malformed file's TypeError...
        raise ConfigError(f"cannot configure Kubernetes access from the kubeconfig: "
                          f"{type(exc).__name__}: {exc}") from None


def main(argv: list[str] | None = None) -> int:
    given = sys.argv[1:] if argv is None else argv
    if given[:1] == ["rbac"]:
        from eventop.router import rbac

        return rbac.main(given[1:])
    args = build_parser().parse_args(argv)  # a mistake: one line, exit status 2
    host = args.host or ("0.0.0.0" if in_container() else "127.0.0.1")
    try:
        check_environment()
    except ConfigError as exc:
        return report(PROG, exc)
    # gunicorn reads WEB_CONCURRENCY when it is imported, and fails on an empty value (which
    # means unset here). It is not needed: --workers is always passed.
    os.environ.pop("WEB_CONCURRENCY", None)
    # Before prometheus_client is imported anywhere. One worker keeps its counters in memory
    # (cheaper per event than a file per metric); several share them through files.
    if args.workers > 1:
        try:
            owned = prepare_metrics_dir()
        except ConfigError as exc:
            return report(PROG, exc)
        # Each worker has its own cache and watch: runs started from the watch would run
        # in every worker. Only events (each sent to one worker) start runs then, unless
        # the workers elect a leader (EVENTOP_RUN_ON_WATCH=leader, which needs a Lease).
        if not os.environ.get("EVENTOP_RUN_ON_WATCH", "").strip():
            os.environ["EVENTOP_RUN_ON_WATCH"] = "false"
    else:
        owned = None
        os.environ.pop("PROMETHEUS_MULTIPROC_DIR", None)
    master = os.getpid()

    try:
        check_kube_config()
        from eventop.router.server import PortInUse, ServerOptions, serve

        serve(ServerOptions(
            host=host,
            port=args.port,
            workers=args.workers,
            threads=args.threads,
            timeout=args.timeout,
            graceful_timeout=args.graceful_timeout,
            log_level=args.log_level,
            log_format=args.log_format,
            metrics_dir_owned=owned,
        ))
    except ConfigError as exc:
        return report(PROG, exc)
    except PortInUse as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 1
    finally:
        # Also when gunicorn exits early (port in use, bad handler module). Forked workers
        # unwind through here too when they exit: only the master may remove the directory.
        if owned and os.getpid() == master:
            shutil.rmtree(owned, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
