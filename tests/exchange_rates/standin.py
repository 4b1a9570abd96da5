"""A loopback stand-in for Frankfurter that tests can steer, for the router in a subprocess.

requests-mock only reaches into this process; the router of the ``pipeline`` fixture runs
under gunicorn in another one. It gets ``RATES_API_URL`` pointing here instead. The stand-in
answers ``GET /v1/latest?from=<base>&to=<A,B>`` from a table the test sets, records every
request (so tests can count them), and can be told to fail.
"""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def do_GET(self) -> None:
        url = urlparse(self.path)
        query = parse_qs(url.query)
        base = (query.get("from") or ["EUR"])[0]
        wanted = [c for c in (query.get("to") or [""])[0].split(",") if c]
        with self.server.lock:
            self.server.requests.append((base, wanted))
            fail = self.server.fail_status
            table = dict(self.server.rates.get(base) or {})
            date = self.server.date
        if fail:
            return self._send(fail, b'{"message":"stand-in told to fail"}')
        if url.path != "/v1/latest" or not table or any(c not in table for c in wanted):
            return self._send(404, b'{"message":"not found"}')
        # Numbers are written as the raw decimal text, the way the provider's JSON has them.
        rates = ",".join(f'"{c}":{table[c]}' for c in sorted(wanted))
        body = f'{{"amount":1.0,"base":"{base}","date":"{date}","rates":{{{rates}}}}}'
        return self._send(200, body.encode())

    def _send(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.lock = threading.Lock()
        self.requests: list[tuple[str, list[str]]] = []
        self.rates: dict[str, dict[str, str]] = {}
        self.date = "2026-11-20"
        self.fail_status = 0


class RatesStandIn:
    """``with RatesStandIn({"EUR": {"USD": "1.0812"}}) as rates: rates.url ...``"""

    def __init__(self, rates: dict[str, dict[str, str]] | None = None) -> None:
        self._server = _Server()
        self._server.rates = {b: dict(t) for b, t in (rates or {}).items()}
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True,
                                        name="rates-stand-in")
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}/v1"

    def __enter__(self) -> RatesStandIn:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    @property
    def requests(self) -> list[tuple[str, list[str]]]:
        with self._server.lock:
            return list(self._server.requests)

    def set_rate(self, base: str, currency: str, rate: str, date: str | None = None) -> None:
        with self._server.lock:
            self._server.rates.setdefault(base, {})[currency] = rate
            if date:
                self._server.date = date

    def fail(self, status: int) -> None:
        """Answer every request with ``status`` (0: answer normally again)."""
        with self._server.lock:
            self._server.fail_status = status


def answer(base: str, date: str, **rates: str) -> bytes:
    """A Frankfurter answer with the rates written as raw JSON numbers (for requests-mock)."""
    body = ",".join(f'"{c}":{r}' for c, r in sorted(rates.items()))
    return f'{{"amount":1.0,"base":"{base}","date":"{date}","rates":{{{body}}}}}'.encode()


__all__ = ["RatesStandIn", "answer"]
