"""One HTTP POST to the sink: a urllib3 connection pool, with the environment read once.

Why not ``requests``: the watcher posts one small request per watch event, and requests'
session machinery around urllib3 (preparing the request, merging settings, hooks, cookies,
building a response object) was most of the CPU of a post: measured against a local HTTP
server, 348 us per event through a ``requests.Session`` against 141 us through urllib3's pool,
which requests itself sends through. In a fan-out that CPU is taken from the API server on the
same cores. What requests did for the watcher is kept here:

* the sink's proxy comes from ``HTTP_PROXY``/``HTTPS_PROXY``/``ALL_PROXY`` unless ``NO_PROXY``
  names it (resolved by requests' own helper, once: the sink does not move while the watcher
  runs);
* an ``https`` sink is verified against ``REQUESTS_CA_BUNDLE`` or ``CURL_CA_BUNDLE`` when set,
  else certifi's bundle (what requests uses);
* connect and read timeouts; no retries and no redirects here (the caller decides, from the
  answer, whether and when to try again);
* ``~/.netrc`` is not read: the watcher authenticates with its bearer token header, which a
  ``~/.netrc`` entry for the sink's host would have replaced.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from types import TracebackType
from urllib.parse import urlsplit

import certifi
import urllib3
from requests.utils import get_environ_proxies, prepend_scheme_if_needed
from urllib3.exceptions import HTTPError, NewConnectionError, TimeoutError

from eventop import __version__

__all__ = ["Answer", "SinkClient", "SinkUnreachable"]

USER_AGENT = f"eventop-watcher/{__version__}"


class SinkUnreachable(Exception):
    """No HTTP answer: ``cause`` is ``timeout`` or ``connection``."""

    def __init__(self, cause: str, detail: str) -> None:
        super().__init__(detail)
        self.cause = cause


@dataclass(frozen=True)
class Answer:
    status: int
    retry_after: str | None
    text: str  # the first 500 characters of the body (a refusal's, a 202's)


class SinkClient:
    """POSTs to one sink URL over kept-alive connections (``connections`` at most).

    Raises ``ValueError``, naming the variables to fix, for a proxy it can not use (a
    ``socks5://`` one, a malformed one): said once at start, not at every event.
    """

    def __init__(self, url: str, headers: dict[str, str] | None = None, *,
                 connections: int = 1) -> None:
        self.url = url
        self.headers = {"User-Agent": USER_AGENT, **(headers or {})}
        parts = urlsplit(url)
        self._target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        proxies = get_environ_proxies(url)
        proxy = proxies.get(parts.scheme.lower()) or proxies.get("all") or None
        # "proxy:3128" means http://proxy:3128, as requests (and curl) read it.
        self.proxy = prepend_scheme_if_needed(proxy, "http") if proxy else None
        tls = {}
        if parts.scheme.lower() == "https":
            tls = {"cert_reqs": "CERT_REQUIRED",
                   "ca_certs": (os.environ.get("REQUESTS_CA_BUNDLE")
                                or os.environ.get("CURL_CA_BUNDLE") or certifi.where())}
        try:
            manager: urllib3.PoolManager = (
                urllib3.ProxyManager(self.proxy, maxsize=connections, block=False, **tls)
                if self.proxy else urllib3.PoolManager(maxsize=connections, block=False, **tls))
            # Straight to the sink: its pool, asked for the path alone (the manager would
            # parse the URL and look the pool up again for every event). Through a proxy,
            # the manager writes the request for the proxy.
            self._pool = None if self.proxy else manager.connection_from_url(url)
        except ValueError as exc:  # urllib3's ProxySchemeUnknown, LocationValueError
            where = f" through the proxy {self.proxy!r}" if self.proxy else ""
            hint = (" (from HTTP_PROXY, HTTPS_PROXY or ALL_PROXY: use an http:// or https:// "
                    "proxy, or name the sink's host in NO_PROXY)") if self.proxy else ""
            raise ValueError(f"cannot post to the sink {url}{where}: {exc}{hint}") from None
        self._manager = manager

    def post(self, body: bytes, headers: dict[str, str],
             timeout: tuple[float, float]) -> Answer:
        """One POST; raises :class:`SinkUnreachable` when no HTTP answer came back."""
        options = {"body": body, "headers": {**self.headers, **headers},
                   "timeout": urllib3.Timeout(connect=timeout[0], read=timeout[1]),
                   "retries": False, "redirect": False}
        try:
            if self._pool is not None:
                resp = self._pool.urlopen("POST", self._target, **options)
            else:
                resp = self._manager.urlopen("POST", self.url, **options)
        except NewConnectionError as exc:  # refused, unresolvable (a TimeoutError to urllib3)
            raise SinkUnreachable("connection", f"{type(exc).__name__}: {exc}") from None
        except TimeoutError as exc:
            raise SinkUnreachable("timeout", f"{type(exc).__name__}: {exc}") from None
        except HTTPError as exc:
            raise SinkUnreachable("connection", f"{type(exc).__name__}: {exc}") from None
        status = resp.status
        # The body only where it says something: a refusal's reason, or a 202's (the
        # router's "no handler wants it"); a delivered event's answer is not read into text.
        text = "" if 200 <= status < 300 and status != 202 \
            else resp.data[:2000].decode("utf-8", "replace")[:500]
        return Answer(status, resp.headers.get("Retry-After"), text)

    def close(self) -> None:
        self._manager.clear()

    def __enter__(self) -> SinkClient:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()
