"""A small CloudEvents sink for the watcher tests: records what it accepts, fails on demand.

It stands in for the router: a threaded HTTP server on a free loopback port that can answer
an error status (with ``Retry-After``), hang, or be down altogether (its port closed) for a
while, the failures the watcher must survive without losing an event.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest


@dataclass
class Received:
    headers: dict[str, str]
    body: bytes

    @property
    def id(self) -> str:
        return self.headers["ce-id"]

    @property
    def type(self) -> str:
        return self.headers["ce-type"]

    @property
    def subject(self) -> str:
        return self.headers.get("ce-subject", "")


@dataclass
class _Plan:
    status: int = 200
    retry_after: str | None = None
    hang: bool = False
    body: bytes = b"{}"


@dataclass
class Sink:
    """Records accepted CloudEvents; ``fail``/``hang``/``down`` misbehave on demand."""

    accepted: list[Received] = field(default_factory=list)
    attempts: int = 0
    _plans: list[_Plan] = field(default_factory=list)
    _default: _Plan = field(default_factory=_Plan)
    _lock: threading.Condition = field(default_factory=threading.Condition)
    _release: threading.Event = field(default_factory=threading.Event)
    _broken: dict[str, int] = field(default_factory=dict)
    _slow: dict[str, float] = field(default_factory=dict)
    hanging: int = 0
    _server: ThreadingHTTPServer | None = None
    _thread: threading.Thread | None = None
    port: int = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/"

    def start(self) -> Sink:
        sink = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                event_id = self.headers.get("ce-id", "")
                plan = sink._next_plan(event_id)
                for part, seconds in list(sink._slow.items()):
                    if part in event_id:
                        time.sleep(seconds)
                if plan.hang:
                    with sink._lock:
                        sink.hanging += 1
                    sink._release.wait(10)
                    with sink._lock:
                        sink.hanging -= 1
                    self.close_connection = True
                    return
                if 200 <= plan.status < 300:
                    with sink._lock:
                        sink.accepted.append(Received(
                            {k.lower(): v for k, v in self.headers.items()}, body))
                        sink._lock.notify_all()
                self.send_response(plan.status)
                if plan.retry_after is not None:
                    self.send_header("Retry-After", plan.retry_after)
                self.send_header("Content-Length", str(len(plan.body)))
                self.end_headers()
                self.wfile.write(plan.body)

        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever,
                                        kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()
        return self

    def _next_plan(self, event_id: str) -> _Plan:
        with self._lock:
            self.attempts += 1
            for part, status in self._broken.items():
                if part in event_id:
                    return _Plan(status)
            return self._plans.pop(0) if self._plans else self._default

    def break_events(self, id_part: str, status: int = 500) -> None:
        """Every event whose id contains ``id_part`` is answered ``status`` (a handler that
        keeps failing on one object), until :meth:`mend_events`."""
        with self._lock:
            self._broken[id_part] = status

    def slow_events(self, id_part: str, seconds: float) -> None:
        """Events whose id contains ``id_part`` are answered only after ``seconds``."""
        self._slow[id_part] = seconds

    def mend_events(self, id_part: str) -> None:
        with self._lock:
            self._broken.pop(id_part, None)

    def answer(self, status: int, body: bytes) -> None:
        """The next request is answered ``status`` with ``body``."""
        with self._lock:
            self._plans.append(_Plan(status, body=body))

    def fail(self, times: int, status: int = 500, retry_after: str | None = None) -> None:
        """The next ``times`` requests are answered ``status``."""
        with self._lock:
            self._plans.extend(_Plan(status, retry_after) for _ in range(times))

    def hang(self, times: int = 1) -> None:
        """The next ``times`` requests get no answer (until :meth:`stop`)."""
        with self._lock:
            self._plans.extend(_Plan(hang=True) for _ in range(times))

    def always(self, status: int) -> None:
        self._default = _Plan(status)

    def down(self) -> None:
        """Close the port: connections are refused until :meth:`start` again (same port)."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def stop(self) -> None:
        self._release.set()
        self.down()

    def wait_for(self, n: int, timeout: float = 20.0) -> bool:
        """Wait until at least ``n`` events were accepted."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while len(self.accepted) < n:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._lock.wait(left)
        return True

    def ids(self) -> list[str]:
        with self._lock:
            return [r.id for r in self.accepted]


@pytest.fixture
def sink() -> Iterator[Sink]:
    s = Sink().start()
    try:
        yield s
    finally:
        s.stop()
