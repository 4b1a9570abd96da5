"""A loopback stand-in for the Frankfurter rates API: the one the demo and the tests use.

``make demo`` works on a machine without internet, and a router in another process (where
requests-mock can not reach) gets an answer a test decides. It answers ``GET
<url>/latest?from=<base>&to=<A,B>`` with Frankfurter's JSON shape, the rates written as raw
decimal text the way Frankfurter writes its numbers, from a table per base: by default
ECB-like reference rates for every base (cross rates through the euro), or the one a test
gives. It records every request (so tests can count them) and can be told to fail.

``with RatesStandIn() as rates:`` then ``RATES_API_URL=rates.url``.
"""

from __future__ import annotations

import threading
from decimal import Decimal
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse

# EUR-based reference rates (ECB, 2026-11-20 style); other bases are derived from them.
EUR_RATES = {"EUR": "1", "USD": "1.0812", "CHF": "0.9391", "GBP": "0.8352", "JPY": "166.45",
             "CAD": "1.5121", "PLN": "4.2735"}
DATE = "2026-11-20"
Rates = dict[str, dict[str, str]]


def cross_rates(per_eur: dict[str, str] = EUR_RATES) -> Rates:
    """A table for every base from rates against the euro (5 decimals, as Frankfurter)."""
    def rate(base: str, currency: str) -> str:
        value = round(Decimal(per_eur[currency]) / Decimal(per_eur[base]), 5).normalize()
        return format(value, "f")

    return {base: {c: rate(base, c) for c in per_eur if c != base} for base in per_eur}


def answer(base: str, date: str, **rates: str) -> bytes:
    """A Frankfurter answer with the rates written as raw JSON numbers."""
    body = ",".join(f'"{c}":{r}' for c, r in sorted(rates.items()))
    return f'{{"amount":1.0,"base":"{base}","date":"{date}","rates":{{{body}}}}}'.encode()


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
        return self._send(200, answer(base, date, **{c: table[c] for c in wanted or table}))

    def _send(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, rates: Rates) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.lock = threading.Lock()
        self.requests: list[tuple[str, list[str]]] = []
        self.rates = {base: dict(table) for base, table in rates.items()}
        self.date = DATE
        self.fail_status = 0


class RatesStandIn:
    """The stand-in on a free loopback port: ``with RatesStandIn() as rates: rates.url``.

    ``rates`` is the table per base (``{"EUR": {"USD": "1.0812"}}``); default
    :func:`cross_rates` of :data:`EUR_RATES`.
    """

    def __init__(self, rates: Rates | None = None) -> None:
        self._server = _Server(cross_rates() if rates is None else rates)
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
        """Every request so far as ``(base, currencies)``."""
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
