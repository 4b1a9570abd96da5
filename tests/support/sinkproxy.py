"""An HTTP front for the router that can play a router that is down or failing.

The watcher posts to it (``K_SINK``); it relays each request to the real router and its
answer back, unless told to fail: :meth:`SinkProxy.down` closes its port (connections
refused, as when every router pod is gone), :meth:`SinkProxy.answer` makes it answer a
status itself (500, or 429 with ``Retry-After``) for every event or only for events of one
kind. The router itself keeps running, so its ``/metrics`` count every write it made across
the whole fault.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import requests

HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "host", "content-length"}


class SinkProxy:
    def __init__(self, router_url: str) -> None:
        self.router_url = router_url
        self.port = 0
        self._status: int | None = None
        self._kind: str | None = None
        self._retry_after: str | None = None
        self._server: ThreadingHTTPServer | None = None
        self._lock = threading.Lock()
        self._open: set[socket.socket] = set()  # keep-alive connections being served
        self.relayed = 0
        self.failed = 0  # requests answered with a fault status
        self.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/"

    def start(self) -> None:
        proxy = self
        session = requests.Session()

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def setup(self) -> None:
                super().setup()
                with proxy._lock:
                    proxy._open.add(self.connection)

            def finish(self) -> None:
                with proxy._lock:
                    proxy._open.discard(self.connection)
                with contextlib.suppress(OSError):
                    super().finish()

            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                status = proxy._fault_for(self.headers.get("ce-kind"))
                if status is not None:
                    payload, headers = b'{"error": "injected fault"}', {}
                    if status == 429 and proxy._retry_after:
                        headers["Retry-After"] = proxy._retry_after
                else:
                    relay = {k: v for k, v in self.headers.items()
                             if k.lower() not in HOP_BY_HOP}
                    try:
                        resp = session.post(proxy.router_url, data=body, headers=relay,
                                            timeout=120)
                    except requests.RequestException:
                        status, payload, headers = 502, b'{"error": "router unreachable"}', {}
                    else:
                        status, payload, headers = resp.status_code, resp.content, {}
                        with proxy._lock:
                            proxy.relayed += 1
                try:
                    self.send_response(status)
                    for k, v in headers.items():
                        self.send_header(k, v)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                except OSError:  # the watcher went away (killed, or gave up waiting)
                    self.close_connection = True

        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05},
                         daemon=True).start()

    def _fault_for(self, kind: str | None) -> int | None:
        with self._lock:
            if self._status is None or (self._kind is not None and kind != self._kind):
                return None
            self.failed += 1
            return self._status

    def answer(self, status: int | None, kind: str | None = None,
               retry_after: str | None = None) -> None:
        """Answer ``status`` instead of relaying (only events of ``kind`` if given);
        ``None`` relays again."""
        with self._lock:
            self._status, self._kind, self._retry_after = status, kind, retry_after

    def down(self) -> None:
        """Close the port: every connection is refused until :meth:`start` (same port)."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        with self._lock:  # a kept-alive connection must not outlive the "dead" router
            conns, self._open = list(self._open), set()
        for conn in conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self.down()
