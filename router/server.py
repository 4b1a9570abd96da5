"""Serve the router under gunicorn, configured in code rather than by a config file.

Why programmatic (``gunicorn.app.base.BaseApplication``): the image, ``make demo`` and the
tests all start the router the same way, with the defaults that matter here baked in:

* prometheus_client multiprocess mode: ``python -m eventop.router`` sets
  ``PROMETHEUS_MULTIPROC_DIR`` before anything imports prometheus_client (see
  :mod:`eventop.router.__main__`), and the master's ``child_exit`` hook calls ``mark_process_dead``
  for every worker that exits;
* ``gthread`` workers when ``threads > 1``: handlers block on Kubernetes API calls, so
  threads let one worker overlap several events without more memory per event;
* no gunicorn control socket (gunicorn >= 25 creates one in ``$HOME`` by default, which
  collides between routers on one machine and fails on a read-only root filesystem);
* worker heartbeat files in ``/dev/shm`` when it exists (gunicorn's advice for containers,
  where ``/tmp`` may be a slow or read-only disk);
* the app is created in each worker after the fork (no ``preload_app``), so handler
  modules, Kubernetes connections and metric files all belong to the worker; before
  gunicorn starts, :func:`check_app` builds it once in a throwaway child process, so a
  mistake (a handler module that does not import, a bad ``EVENTOP_*`` variable) is one line
  and exit status 2 instead of every worker's traceback and gunicorn's "Worker failed to boot";
* gunicorn's own messages use eventop's formatter (JSON lines or text, ``--log-format``).
"""

from __future__ import annotations

import errno
import gc
import logging
import os
import shutil
import signal
import socket
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from typing import Any

from gunicorn.app.base import BaseApplication
from gunicorn.glogging import Logger as GunicornLogger

from eventop.cli import ConfigError

log = logging.getLogger("eventop.router")


@dataclass
class ServerOptions:
    host: str
    port: int
    workers: int = 2
    threads: int = 4
    timeout: int = 60
    graceful_timeout: int = 25  # below Kubernetes' default termination grace period (30 s)
    keepalive: int = 5
    log_level: str = "info"
    log_format: str = "json"
    metrics_dir_owned: str | None = None  # a temp dir we created and remove on exit
    app: str | None = None  # "module:factory" for another WSGI app (the benchmark's baseline)

    def gunicorn_settings(self) -> dict[str, Any]:
        settings: dict[str, Any] = {
            "bind": [f"[{self.host}]:{self.port}" if ":" in self.host
                     else f"{self.host}:{self.port}"],
            "workers": self.workers,
            "threads": self.threads,
            "worker_class": "gthread" if self.threads > 1 else "sync",
            "timeout": self.timeout,
            "graceful_timeout": self.graceful_timeout,
            "keepalive": self.keepalive,
            "loglevel": self.log_level,
            "errorlog": "-",
            "accesslog": None,  # the router logs one JSON line per event instead
            "proc_name": "eventop-router",
            "control_socket_disable": True,
            "logger_class": _gunicorn_logger(self.log_format),
            "post_worker_init": _post_worker_init,
            "child_exit": _child_exit,
            "worker_exit": _worker_exit,
            "on_exit": self._on_exit,
        }
        if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK):
            settings["worker_tmp_dir"] = "/dev/shm"
        return settings

    def _on_exit(self, server: Any) -> None:
        if self.metrics_dir_owned:
            shutil.rmtree(self.metrics_dir_owned, ignore_errors=True)


def _post_worker_init(worker: Any) -> None:
    """Freeze the loaded heap for the GC; in the first worker, check the API once.

    ``gc.freeze()``: the app has just imported Flask, the Kubernetes client, the CloudEvents
    SDK and the handlers, tens of thousands of objects that live as long as the worker.
    Left in the collected generations, every full collection walks them again, and parsing
    each event's JSON allocates enough to trigger collections often: measured, that cost as
    much per request as the whole of a bare Flask request. Frozen, the collector skips them.

    The API check runs in a thread so a slow or black-holed API server never delays serving;
    it also primes the ``/readyz`` cache. The router keeps running either way: readiness,
    not a crash, is how Kubernetes learns that events cannot be handled yet.
    """
    gc.freeze()
    # Our lines never show thread names; not collecting them makes every log record (one per
    # event) cheaper. The process id stays: gunicorn's messages may be formatted with it.
    logging.logThreads = logging.logMultiprocessing = False
    if getattr(worker, "age", 0) != 1:
        return
    state = getattr(worker.wsgi, "extensions", {}).get("eventop")
    if not state:
        return

    def check() -> None:
        """Log the readiness reason now and on every change, until ready."""
        said = ""
        while True:
            ok, reason = state["readiness"].check()
            if ok:
                log.info("%s", reason, extra={"fields": {"ready": True}})
                return
            if reason != said:
                log.warning("Not ready: %s. The router keeps serving; /readyz answers 503 and "
                            "events needing the API get 503 (retried by the sender) until "
                            "then. Check EVENTOP_KUBE_URL, KUBECONFIG or the in-cluster "
                            "service account if the API is unreachable.", reason,
                            extra={"fields": {"ready": False}})
                said = reason
            time.sleep(5)

    threading.Thread(target=check, name="eventop-kube-check", daemon=True).start()


def _worker_exit(server: Any, worker: Any) -> None:
    """In a worker shutting down: stop its engine, which hands back the router's Lease when
    it held it (another worker or replica then leads at once, not after the lease expired)."""
    state = getattr(getattr(worker, "wsgi", None), "extensions", {}).get("eventop")
    if state and state.get("engine"):
        state["engine"].stop()


def _child_exit(server: Any, worker: Any) -> None:
    """Drop the exited worker's live gauges from the multiprocess metrics (counters stay)."""
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(worker.pid)


def _gunicorn_logger(log_format: str) -> type[GunicornLogger]:
    """gunicorn's logger with eventop's formatter on its error log (JSON lines or text), so
    a collector reads one format from the router's stderr."""
    from eventop.router.logs import formatter

    class Logger(GunicornLogger):  # type: ignore[misc]
        def setup(self, cfg: Any) -> None:
            super().setup(cfg)
            for handler in self.error_log.handlers:
                if getattr(handler, "_gunicorn", False):
                    handler.setFormatter(formatter(log_format))

    return Logger


def load_app(options: ServerOptions, *, start: bool = True) -> Any:
    """The WSGI app a worker serves: the router (logging set up), or ``options.app``;
    ``start=False`` builds it without starting its engine (:func:`check_app`)."""
    if options.app:
        import importlib

        module, _, attr = options.app.partition(":")
        return getattr(importlib.import_module(module), attr or "app")()
    from eventop.router import logs
    from eventop.router.app import create_app

    logs.configure(options.log_level, force=True, log_format=options.log_format)
    return create_app(start_engine=start)


def check_app(options: ServerOptions) -> None:
    """Build the app once in a forked child and discard it; raise :class:`ConfigError` with
    one line if that fails.

    Every worker would fail the same way (a handler module that does not import, an unknown
    built-in handler, a bad ``EVENTOP_MAX_BODY_BYTES``), each with its traceback, before
    gunicorn gives up with "Worker failed to boot". A child, not this process: the master
    must stay free of what handler modules do at import (threads, connections, metrics),
    which belong to each worker. Costs one import of the app at start, a fraction of a second,
    and, when the API server answers, one discovery request per built-in group/version the
    handlers declare (:func:`eventop.router.app.check_builtin_kinds`: a misspelt kind).
    """
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: build, report, and leave without running any cleanup
        status = 0
        try:
            os.close(read_end)
            quiet = os.open(os.devnull, os.O_WRONLY)
            os.dup2(quiet, 1)
            os.dup2(quiet, 2)
            app = load_app(options, start=False)
            if not options.app:
                _check_kinds(app)
        except BaseException as exc:
            os.write(write_end, describe_failure(exc).encode("utf-8", "replace"))
            status = 2
        os._exit(status)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as pipe:
        said = pipe.read().decode("utf-8", "replace")
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        raise ConfigError(f"building the router app killed its process with "
                          f"{signal.Signals(os.WTERMSIG(status)).name}")
    if said:
        raise ConfigError(said)


def _check_kinds(app: Any) -> None:
    """The built-in kinds the handlers declare, against the API server (if it answers)."""
    from eventop.kube.errors import Unavailable
    from eventop.router.app import check_builtin_kinds

    parts = app.extensions["eventop"]
    try:
        kube = parts["kube"].get()
    except Unavailable:  # not configured or not reachable: readiness says so
        return
    check_builtin_kinds(parts["registry"], kube)


def describe_failure(exc: BaseException) -> str:
    """One line: the error, and the line of the user's code that raised it, if any (a
    handler module's own mistake), so nobody has to read a traceback through importlib."""
    text = (str(exc) if isinstance(exc, ValueError)
            else f"the app does not load: {type(exc).__name__}: {exc}")
    if isinstance(exc, ModuleNotFoundError):
        text += " (is it installed, or is its folder on PYTHONPATH?)"
    where = None if isinstance(exc, SyntaxError) or isinstance(exc.__cause__, SyntaxError) \
        else _user_frame(exc)
    if where is not None:
        text += f" ({where.filename}, line {where.lineno})"
    return " ".join(text.split())


def _user_frame(exc: BaseException) -> traceback.FrameSummary | None:
    """The innermost frame in neither eventop, importlib, nor an installed library or the
    standard library, of the exception or of the one it was raised from (eventop's loader
    names the module and keeps the user's error as its cause)."""
    ours = tuple({os.path.dirname(m.__file__) + os.sep for name, m in list(sys.modules.items())
                  if name.split(".")[0] == "eventop" and getattr(m, "__file__", None)})
    installed = tuple({sys.prefix + os.sep, sys.base_prefix + os.sep})
    chain: BaseException | None = exc
    while chain is not None:
        for frame in reversed(traceback.extract_tb(chain.__traceback__)):
            path = os.path.abspath(frame.filename)
            if not (frame.filename.startswith("<") or path.startswith(ours)
                    or path.startswith(installed)):
                return frame
        chain = chain.__cause__ or chain.__context__
    return None


class RouterServer(BaseApplication):  # type: ignore[misc]
    """gunicorn running :func:`eventop.router.app.create_app` (or ``options.app``) in each
    worker."""

    def __init__(self, options: ServerOptions) -> None:
        self.options = options
        super().__init__(prog="python -m eventop.router")

    def load_config(self) -> None:
        for key, value in self.options.gunicorn_settings().items():
            self.cfg.set(key, value)

    def load(self) -> Any:
        return load_app(self.options)


class PortInUse(OSError):
    """The router's port is taken; not a configuration mistake (exit status 1)."""


def check_bind(host: str, port: int) -> None:
    """Bind once before gunicorn does: an address that is not this machine's, or a port in
    use, is one line instead of gunicorn's five attempts, two lines each."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise ConfigError(f"--host {host!r}: {exc.strerror}") from None
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as gunicorn binds
        try:
            probe.bind(address)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise PortInUse(f"port {port} on {host} is in use (another router?): choose "
                              "another --port or PORT") from None
            raise ConfigError(f"cannot listen on {host}:{port}: {exc.strerror}") from None


def serve(options: ServerOptions) -> None:
    """Check the address (:func:`check_bind`) and that the app builds (:func:`check_app`),
    then run gunicorn in this process until it is stopped (SIGTERM: graceful shutdown)."""
    check_bind(options.host, options.port)
    check_app(options)
    RouterServer(options).run()
