"""eventop's own processes (the router under gunicorn, the watcher) as subprocesses on loopback.

A handler's tests, ``make demo`` and eventop's own tests all start them here, so each runs
exactly what a user runs: ``python -m eventop.router`` and ``python -m eventop.watcher run``.
Each child's output goes to a log file the test (or the demo) can read; its working
directory (the caller's by default) comes first on ``PYTHONPATH``, so ``EVENTOP_HANDLERS``
can name a module of the project under test.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import requests


def free_port() -> int:
    """A TCP port free on loopback right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_http(url: str, timeout: float = 30.0, proc: subprocess.Popen | None = None) -> None:
    """Wait until ``url`` answers anything over HTTP (or the process died)."""
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode} before {url} answered")
        try:
            requests.get(url, timeout=1)
            return
        except requests.RequestException as exc:
            last = exc
            time.sleep(0.1)
    raise TimeoutError(f"{url} did not answer within {timeout}s: {last}")


def metric_samples(url: str, name: str, timeout: float = 10.0
                   ) -> list[tuple[dict[str, str], float]]:
    """Every sample of metric ``name`` (``eventop_kube_requests_total``, say: the API
    requests a router made) on a process's ``/metrics`` page ``url``, with its labels, read
    by prometheus_client's own parser of the text format."""
    from prometheus_client.parser import text_string_to_metric_families

    text = requests.get(url, timeout=timeout).text
    return [(dict(sample.labels), sample.value)
            for family in text_string_to_metric_families(text)
            for sample in family.samples if sample.name == name]


class Process:
    """A ``python -m <module> ...`` child whose output goes to a log file.

    ``env`` is added to this process' environment; ``cwd`` (default: the current directory)
    is where it runs, first on its ``PYTHONPATH``.
    """

    def __init__(self, name: str, args: list[str], env: dict[str, str],
                 log_dir: str | None = None, cwd: str | Path | None = None) -> None:
        self.name = name
        self.cwd = Path(cwd or os.getcwd())
        path = os.pathsep.join(p for p in (str(self.cwd), os.environ.get("PYTHONPATH")) if p)
        full_env = {**os.environ, "PYTHONPATH": path, **env}
        full_env.pop("PROMETHEUS_MULTIPROC_DIR", None)
        fd, log = tempfile.mkstemp(prefix=f"eventop-{name}-", suffix=".log", dir=log_dir)
        os.close(fd)
        self.log_path = Path(log)
        self._log = self.log_path.open("wb")
        self.proc = subprocess.Popen([sys.executable, "-m", *args], cwd=self.cwd, env=full_env,
                                     stdout=self._log, stderr=subprocess.STDOUT)

    def _started(self, ready: Callable[[], None]) -> None:
        """Wait for ``ready()``; if it fails (the process exited at start, or never got
        ready), stop the process, keep its log and raise what its last line says."""
        try:
            ready()
        except BaseException as exc:  # also Ctrl-C: never leave the process running
            self.stop(keep_log=True)
            if not isinstance(exc, Exception):
                raise
            said = self.log().strip().splitlines()
            raise RuntimeError(f"{exc}; its log ({self.log_path}) ends: "
                               f"{said[-1] if said else '(empty)'}") from exc

    def log(self) -> str:
        """Everything the process wrote so far (also after :meth:`stop` with ``keep_log``)."""
        if not self._log.closed:
            self._log.flush()
        return self.log_path.read_text(errors="replace")

    @property
    def returncode(self) -> int | None:
        """The exit status once the process ended, else None."""
        return self.proc.poll()

    def stop(self, keep_log: bool = False) -> None:
        """SIGTERM (graceful: the router finishes its events, the watcher drains), then
        SIGKILL after 15 s."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        if not keep_log:
            self.log_path.unlink(missing_ok=True)


class RouterProcess(Process):
    """``python -m eventop.router`` under gunicorn on a free loopback port, answering."""

    def __init__(self, env: dict[str, str], workers: int | None = None,
                 log_dir: str | None = None, extra_args: list[str] | None = None,
                 cwd: str | Path | None = None) -> None:
        """``workers``: gunicorn's worker processes (default: the router's own, one)."""
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        chosen = ["--workers", str(workers)] if workers is not None else []
        super().__init__("router", ["eventop.router", "--host", "127.0.0.1",
                                    "--port", str(self.port), *chosen, *(extra_args or [])],
                         env, log_dir, cwd)
        self._started(lambda: wait_http(self.url + "/healthz", proc=self.proc))


class WatcherProcess(Process):
    """``python -m eventop.watcher run`` posting to ``sink``."""

    def __init__(self, sink: str, env: dict[str, str], log_dir: str | None = None,
                 extra_args: list[str] | None = None, cwd: str | Path | None = None, *,
                 wait_watching: bool = False) -> None:
        """``wait_watching``: return only once the watcher logged what it watches (at INFO,
        the default level), and raise if it exited at start instead."""
        super().__init__("watcher", ["eventop.watcher", "run", *(extra_args or [])],
                         {**env, "K_SINK": sink}, log_dir, cwd)
        if wait_watching:
            self._started(self._wait_watching)

    def _wait_watching(self, timeout: float = 30.0, lists: float = 10.0) -> None:
        """Until the watcher says what it watches (its start checks passed: the resources
        exist, the selectors parse); a watcher that exits at start is an error here, not a
        test timing out later on what it never delivered.

        Then, for up to ``lists`` seconds, until it has listed each of them (JSON logs): an
        object a test makes afterwards reaches the router as the change it is, not as an
        add of a later state in the watcher's first list (the router's own watch may have
        handled it meanwhile, and its status write then comes back as that add: the
        echo of the router's own write). A resource not served yet lists later; the wait
        for it ends quietly."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if "watching " in self.log():
                break
            if self.proc.poll() is not None:
                raise RuntimeError(f"the watcher exited with {self.proc.returncode} at start")
            time.sleep(0.05)
        else:
            raise TimeoutError(f"the watcher did not start watching within {timeout:g}s")
        deadline = min(deadline, time.monotonic() + lists)
        while time.monotonic() < deadline and not self._listed_all():
            time.sleep(0.05)

    def _listed_all(self) -> bool:
        """Has the watcher logged a list of every resource its "watching" line names?
        (True for a log that is not JSON: nothing to tell.)"""
        lines = []
        for text in self.log().splitlines():
            with contextlib.suppress(ValueError):
                lines.append(json.loads(text))
        watching = [line.get("resources") for line in lines
                    if isinstance(line, dict) and line.get("resources")]
        if not watching:
            return True
        listed = {line.get("resource") for line in lines if isinstance(line, dict)
                  and ": list of " in str(line.get("message"))}
        return set(watching[-1]) <= listed
