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
  modules, Kubernetes connections and metric files all belong to the worker.
"""

from __future__ import annotations

import gc
import logging
import os
import shutil
import threading
import time
from dataclasses import dataclass
from typing import Any

from gunicorn.app.base import BaseApplication

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
            "post_worker_init": _post_worker_init,
            "child_exit": _child_exit,
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
    # Our JSON lines never show thread or process names; not collecting them makes every
    # log record (one per event) cheaper.
    logging.logThreads = logging.logProcesses = logging.logMultiprocessing = False
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


def _child_exit(server: Any, worker: Any) -> None:
    """Drop the exited worker's live gauges from the multiprocess metrics (counters stay)."""
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(worker.pid)


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
        if self.options.app:
            import importlib

            module, _, attr = self.options.app.partition(":")
            return getattr(importlib.import_module(module), attr or "app")()
        from eventop.router import logs
        from eventop.router.app import create_app

        logs.configure(self.options.log_level, force=True)
        return create_app()


def serve(options: ServerOptions) -> None:
    """Run gunicorn in this process until it is stopped (SIGTERM: graceful shutdown)."""
    RouterServer(options).run()
