"""eventop running your handlers for a test: the router (and, if asked, the watcher) as real
processes against a test's API server.

Without the watcher, the test is the event source: :meth:`Pipeline.post` sends the CloudEvent
the watcher would send for a change, :meth:`Pipeline.replay` makes a recording's changes
happen and posts their events in order, shuffled or duplicated. With the watcher, the test
only changes the cluster (:attr:`Pipeline.cluster`) and the watcher posts what it sees, as
in production.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import requests
from cloudevents.core.v1.event import CloudEvent

from eventop.events import simple_event, to_cloudevent, to_http
from eventop.testing.cluster import Cluster
from eventop.testing.processes import RouterProcess, WatcherProcess
from eventop.testing.recordings import replay

Obj = dict[str, Any]
TOKEN = "EVENTOP_ROUTER_TOKEN"  # the router then wants it on every event (router/auth.py)


class Pipeline:
    """The router (and optionally the watcher) for ``cluster``, running ``handlers``.

    ``handlers`` is ``EVENTOP_HANDLERS`` (module paths or ``.py`` files, comma-separated);
    ``builtin`` is ``EVENTOP_BUILTIN_HANDLERS`` (default ``none``: only yours run); both
    processes get them, so the watcher watches every kind those handlers listen to;
    ``resources`` is the watcher's ``EVENTOP_RESOURCES``, to watch something else;
    ``env`` is added to both processes' environment; ``cwd`` is where they run, first on
    their ``PYTHONPATH`` (default: the current directory).
    """

    def __init__(self, cluster: Cluster, handlers: str = "", *, builtin: str = "none",
                 watcher: bool = False, resources: str | None = None,
                 env: dict[str, str] | None = None, cwd: str | Path | None = None,
                 workers: int = 1, log_dir: str | None = None) -> None:
        self.cluster = cluster
        self._own_dir = log_dir is None  # removed on close: nothing left behind in /tmp
        self.log_dir = log_dir or tempfile.mkdtemp(prefix="eventop-test-")
        self.source = cluster.url
        common = {**cluster.env, "EVENTOP_LOG_FORMAT": "json", **(env or {})}
        token = common.get(TOKEN) or os.environ.get(TOKEN, "")
        self._auth = {"Authorization": f"Bearer {token.strip()}"} if token.strip() else {}
        common.update({"EVENTOP_HANDLERS": handlers, "EVENTOP_BUILTIN_HANDLERS": builtin})
        self.router = RouterProcess(common, workers=workers, log_dir=self.log_dir, cwd=cwd)
        self.watcher: WatcherProcess | None = None
        if watcher:
            watch_env = {"EVENTOP_RESYNC_SECONDS": "0", **common}  # no resync unless asked
            if resources:
                watch_env["EVENTOP_RESOURCES"] = resources
            try:
                self.watcher = WatcherProcess(
                    self.router.url, watch_env, self.log_dir, cwd=cwd,
                    wait_watching=str(watch_env.get("EVENTOP_LOG_LEVEL") or os.environ.get(
                        "EVENTOP_LOG_LEVEL") or "INFO").upper() in ("DEBUG", "INFO"))
            except BaseException:  # (its error says what the watcher's log ended with)
                self.router.stop(keep_log=True)
                self._discard_own_logs()
                raise

    @property
    def url(self) -> str:
        """Where the router listens."""
        return self.router.url

    def post(self, change: str, obj: Obj) -> int:
        """Post the CloudEvent the watcher sends for this change of ``obj``; the router's
        HTTP status (200 handled, 202 no handler wanted it, 5xx a handler failed)."""
        return self.send(to_cloudevent(change, obj, self.source))

    def post_event(self, type_: str, data: Any = None) -> int:
        """Post any other event (a refresh, a ping), as ``python -m eventop.watcher emit``."""
        return self.send(simple_event(type_, "/tests", data, f"test-{time.monotonic_ns()}"))

    def send(self, event: CloudEvent) -> int:
        headers, body = to_http(event)
        return requests.post(self.router.url, data=body, headers={**headers, **self._auth},
                             timeout=60).status_code

    def replay(self, paths: str | Path | Iterable[str | Path], order: str = "in_order",
               seed: int = 0, after_each: Callable[[str, Obj], None] | None = None
               ) -> list[int]:
        """A recording's changes made on the cluster and their events posted to the router
        (``in_order``, ``shuffled`` or ``duplicated``: :mod:`eventop.testing.recordings`);
        returns the router's answers."""
        return replay(self.cluster, paths, self.post, order=order, seed=seed,
                      after_each=after_each)

    def log(self) -> str:
        """What the router wrote so far (JSON lines)."""
        return self.router.log()

    def log_lines(self) -> list[Obj]:
        """The router's log lines as objects (gunicorn's included)."""
        return [json.loads(line) for line in self.router.log().splitlines()
                if line.startswith("{")]

    def events_logged(self) -> list[Obj]:
        """The router's per-event lines: ``message`` says what each handler returned,
        ``results`` has it per handler."""
        return [line for line in self.log_lines() if "outcome" in line and "status" in line]

    def close(self) -> None:
        """Stop the watcher, then the router. Their logs stay in a ``log_dir`` given (the
        kit's fixtures give pytest's ``tmp_path``); a directory of its own is removed."""
        try:
            if self.watcher is not None:
                self.watcher.stop(keep_log=True)
        finally:
            self.router.stop(keep_log=True)
            self._discard_own_logs()

    def _discard_own_logs(self) -> None:
        """Remove the log directory this pipeline made itself (not one it was given)."""
        if self._own_dir:
            shutil.rmtree(self.log_dir, ignore_errors=True)

    def __enter__(self) -> Pipeline:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
