"""A loopback stand-in for the Frankfurter rates API, for the demo and the tests.

It answers ``GET /latest?from=<base>&to=<A,B>`` (and ``base``/``symbols``) with the same JSON
shape as Frankfurter, from a fixed table of ECB-like reference rates, so ``make demo`` works
on a machine without internet. Point ``RATES_API_URL`` at it.
"""

from __future__ import annotations

import json
import threading
from decimal import Decimal
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse

# EUR-based reference rates (ECB, 2026-11-20 style); other bases are derived from them.
EUR_RATES = {"EUR": "1", "USD": "1.0812", "CHF": "0.9391", "GBP": "0.8352", "JPY": "166.45",
             "CAD": "1.5121", "PLN": "4.2735"}
DATE = "2026-11-20"


def quote(base: str, currencies: list[str]) -> dict[str, Any] | None:
    if base not in EUR_RATES or any(c not in EUR_RATES for c in currencies):
        return None
    per_eur = Decimal(EUR_RATES[base])
    rates = {c: float(round(Decimal(EUR_RATES[c]) / per_eur, 5)) for c in currencies if c != base}
    return {"amount": 1.0, "base": base, "date": DATE, "rates": rates}


class _Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        url = urlparse(self.path)
        query = parse_qs(url.query)
        if not url.path.rstrip("/").endswith("/latest"):
            return self._send(404, {"message": "not found"})
        base = (query.get("from") or query.get("base") or ["EUR"])[0].upper()
        wanted = (query.get("to") or query.get("symbols") or [""])[0]
        currencies = [c.upper() for c in wanted.split(",") if c] or sorted(EUR_RATES)
        answer = quote(base, currencies)
        if answer is None:
            return self._send(404, {"message": "not found"})
        self.server.requests_served += 1  # type: ignore[attr-defined]
        return self._send(200, answer)

    def _send(self, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass


class RatesStandIn:
    """``with RatesStandIn() as url: ...`` serves the stand-in on a free loopback port."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self.server = ThreadingHTTPServer((host, port), _Handler)
        self.server.requests_served = 0  # type: ignore[attr-defined]
        self.url = f"http://{host}:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> str:
        self._thread.start()
        return self.url

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
