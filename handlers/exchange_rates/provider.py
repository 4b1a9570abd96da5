"""The exchange-rate provider: Frankfurter (ECB reference rates, no API key).

``GET <base-url>/latest?from=EUR&to=USD,GBP`` answers
``{"amount": 1.0, "base": "EUR", "date": "2026-11-20", "rates": {"USD": 1.0812, "GBP": 0.8741}}``.
One request serves every currency of one base, which is how a refresh asks: once per base.

What this module promises its callers:

* rates come back as the *exact* decimal text the provider sent (``"1.0812"``, never the
  float ``1.0812000000000002``), because the ConfigMap must hold what the ECB published;
* one bad rate in an answer (not a number, not positive, beyond what a float holds) fails
  only its own currency (:meth:`Quote.rate` raises for it), as a missing one does: the other
  currencies of that base are still good news. Only an answer bad as a whole (not JSON, no
  ``rates`` object, a wrong base, amount or date) fails every currency asked;
* every failure is a :class:`ProviderError` with a ``reason`` fit for a status condition
  and a message fit for a human, never a bare ``requests`` exception (whose text carries
  object addresses and would make every status write look like a change);
* transient failures (connection errors, timeouts, 5xx, 429) are retried a bounded number
  of times with exponential backoff inside one overall time budget, so a handler never
  holds a router worker for long (429s that outlast it are :class:`ProviderRateLimited`,
  not an outage); answers that retrying can not fix (404/422, malformed
  JSON) fail at once;
* ``If-None-Match`` is sent when an earlier answer for the same URL carried an ``ETag``;
  a ``304`` then reuses that earlier body. This cache is only an optimisation (it lives in
  one process and may be empty at any time); nothing depends on it for correctness.

Every HTTP request to the provider (each retry included) is counted in
:data:`PROVIDER_REQUESTS` by outcome and HTTP code, and timed in
:data:`PROVIDER_REQUEST_DURATION`: module-level prometheus_client metrics, which the
router's ``/metrics`` serves as it serves the engine's (the router loads this package).

The base URL comes from ``RATES_API_URL`` (default :data:`DEFAULT_URL`), so a self-hosted
Frankfurter (``docker run lineofflight/frankfurter``) can be used instead of the public one.
"""

from __future__ import annotations

import json
import logging
import math
import os
import random
import re
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from typing import Any

import requests
from prometheus_client import Counter, Histogram

from eventop.kube import now_rfc3339, retry_after
from eventop.kube.recent import Recent

log = logging.getLogger("eventop.exchange_rates.provider")

#: The public Frankfurter endpoint (``api.frankfurter.app`` is its older alias and redirects).
DEFAULT_URL = "https://api.frankfurter.dev/v1"
USER_AGENT = "eventop-exchange-rates/0.1 (+https://github.com/eventop)"

CURRENCY = re.compile(r"^[A-Z]{3}$")
DATE = re.compile(r"^\d{4}-\d{2}-\d{2}$")
# A JSON number as the grammar allows it; what the provider sent is kept verbatim.
JSON_NUMBER = re.compile(r"^-?(0|[1-9]\d*)(\.\d+)?([eE][+-]?\d+)?$")


# -- metrics ----------------------------------------------------------------------------------

PROVIDER_REQUESTS = Counter(
    "eventop_rates_provider_requests_total",
    "HTTP requests to the exchange-rate provider (each retry counts), by outcome (ok, "
    "not_modified, malformed, rejected, rate_limited, server_error, timeout, "
    "connection_error, request_error) and HTTP code (\"\" when no answer came)",
    ["outcome", "code"],
)
PROVIDER_REQUEST_DURATION = Histogram(
    "eventop_rates_provider_request_duration_seconds",
    "Time from sending a request to the exchange-rate provider to its answer or failure",
    buckets=(0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0),
)


def _count(outcome: str, code: str, sent: float) -> None:
    """Count one request to the provider, and how long it took since ``sent``
    (``time.perf_counter()``)."""
    PROVIDER_REQUESTS.labels(outcome, code).inc()
    PROVIDER_REQUEST_DURATION.observe(time.perf_counter() - sent)


def _outcome(status: int) -> str:
    """The ``outcome`` label of an HTTP answer with this status (``malformed`` is decided
    after parsing a 2xx)."""
    if status == 304:
        return "not_modified"
    if 200 <= status < 300:
        return "ok"
    if status == 429:
        return "rate_limited"
    if status >= 500:
        return "server_error"
    return "rejected"


# -- failures ---------------------------------------------------------------------------------

class ProviderError(Exception):
    """The provider did not give us a usable rate. ``reason`` is a condition reason."""

    reason = "ProviderError"
    #: Would asking again later (a redelivered event) plausibly succeed?
    transient = False

    def __init__(self, message: str, *, status: int | None = None,
                 transient: bool | None = None, not_asked: bool = False) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        #: No request was sent (the time ran out before the first attempt).
        self.not_asked = not_asked
        if transient is not None:  # this failure's own answer, not its class's
            self.transient = transient


def not_asked(result: object) -> bool:
    """Is ``result`` the failure of a base the provider was never asked for (a refresh's
    time ran out before it)? No news about the rate, and no answer to reuse."""
    return isinstance(result, ProviderError) and result.not_asked


class ProviderUnavailable(ProviderError):
    """Connection failure, timeout or 5xx, still failing when the retries ran out."""

    reason = "ProviderUnavailable"
    transient = True


class ProviderRateLimited(ProviderError):
    """429 with a Retry-After longer than we are willing to wait inside one event, or 429s
    that waiting as asked did not clear before the retries or the time ran out.

    Not ``transient`` on purpose when the provider asked for a long wait: a redelivered
    event would only ask again too early. 429s with short waits that outlasted our retries
    are transient (asking again in a minute is as patient as the provider asked us to be).
    """

    reason = "ProviderRateLimited"


class ProviderRejected(ProviderError):
    """The provider refused the question (404 unknown currency, 422 same base and target)."""

    reason = "ProviderRejected"


class MalformedAnswer(ProviderError):
    """The answer is not JSON, or lacks ``rates``, the currency, a usable rate for it, or a
    sane date/base."""

    reason = "MalformedAnswer"


# -- answers ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Quote:
    """The provider's answer for one base: rates as exact decimal strings.

    ``bad``: the currencies the answer sent an unusable rate for, each with what is wrong
    with it (kept apart so that they fail alone, see the module docstring)."""

    base: str
    date: str
    rates: dict[str, str]
    source: str
    fetched_at: str
    bad: dict[str, str] = field(default_factory=dict)

    def rate(self, currency: str) -> str:
        """The rate of ``currency``, or :class:`MalformedAnswer` if the answer lacks it or
        sent an unusable one for it."""
        if currency in self.bad:
            raise MalformedAnswer(self.bad[currency])
        try:
            return self.rates[currency]
        except KeyError:
            raise MalformedAnswer(
                f"{self.source} answered for base {self.base} on {self.date} without a rate "
                f"for {currency} ({self._sent()}); check that the provider publishes "
                f"{currency}") from None

    def _sent(self) -> str:
        """What the answer did send, usable or not (a missing rate is told apart from an
        answer whose rates were all unusable)."""
        unusable = f"unusable ones for {', '.join(sorted(self.bad))}" if self.bad else ""
        if self.rates:
            return (f"it sent rates for {', '.join(sorted(self.rates))}"
                    + (f", and {unusable}" if unusable else ""))
        return f"it sent no usable rate, only {unusable}" if unusable else "it sent no rates"


class _Number(str):
    """A JSON number kept as the text it was written as (marks numbers apart from strings)."""


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a valid JSON number")


def parse_answer(body: bytes, base: str, source: str, fetched_at: str) -> Quote:
    """Validate and convert a ``/latest`` answer. Raises :class:`MalformedAnswer` for an
    answer bad as a whole; a bad rate only lands in :attr:`Quote.bad`."""
    try:
        doc = json.loads(body, parse_float=_Number, parse_int=_Number,
                         parse_constant=_reject_constant)
    except (ValueError, UnicodeDecodeError) as exc:
        snippet = body[:120].decode("utf-8", "replace")
        raise MalformedAnswer(f"{source} did not answer JSON ({exc}); it sent: {snippet!r}") \
            from None
    if not isinstance(doc, dict):
        raise MalformedAnswer(f"{source} answered {type(doc).__name__}, not a JSON object")
    rates = doc.get("rates")
    if not isinstance(rates, dict):
        raise MalformedAnswer(f"{source} answered without a 'rates' object")
    if doc.get("base") != base:
        raise MalformedAnswer(f"{source} answered for base {doc.get('base')!r}, asked for {base}")
    date = doc.get("date")
    if not isinstance(date, str) or not DATE.match(date):
        raise MalformedAnswer(f"{source} answered without a YYYY-MM-DD 'date' (got {date!r})")
    amount = doc.get("amount")
    if amount is not None and (not isinstance(amount, _Number) or Decimal(amount) != 1):
        raise MalformedAnswer(f"{source} answered for amount {amount!r}, not 1")
    clean: dict[str, str] = {}
    bad: dict[str, str] = {}
    for currency, value in rates.items():
        problem = _rate_problem(value)
        if problem is None:
            clean[str(currency)] = str(value)
        else:
            shown = str(value) if isinstance(value, _Number) else repr(value)
            bad[str(currency)] = f"{source} sent {problem} for {currency}: {shown}"
    return Quote(base=base, date=date, rates=clean, source=source, fetched_at=fetched_at,
                 bad=bad)


def _rate_problem(value: Any) -> str | None:
    """What makes ``value`` (one entry of ``rates``) unusable as a rate, or None if it is
    usable: a JSON number, positive, and one a 64-bit float holds (the apps reading the
    ConfigMap parse it as one: ``1e400`` would be infinity to them, ``1e-400`` zero)."""
    if not isinstance(value, _Number) or not JSON_NUMBER.match(value):
        return "a rate that is not a number"
    try:
        positive = Decimal(value) > 0
    except InvalidOperation:
        positive = False
    if not positive:
        return "a non-positive rate"
    number = float(value)
    if not math.isfinite(number) or number == 0:
        return "a rate out of the range of a 64-bit float"
    return None


# -- the client -------------------------------------------------------------------------------

@dataclass
class _Cached:
    etag: str
    body: bytes


def _error_message(resp: requests.Response) -> str:
    """The provider's own explanation (Frankfurter answers ``{"message": ...}``)."""
    try:
        doc = resp.json()
    except ValueError:
        return resp.text[:200].strip() or resp.reason or ""
    if isinstance(doc, dict) and doc.get("message"):
        return str(doc["message"])
    return resp.text[:200].strip()


class FrankfurterClient:
    """Fetches latest rates, with timeouts, bounded retries, Retry-After and ETags.

    ``sleep`` and ``clock`` are injectable so tests can check the waits without waiting.
    Thread-safe: the ETag cache is guarded, the ``requests.Session`` is only used for GETs.
    """

    def __init__(self, base_url: str = DEFAULT_URL, *,
                 session: requests.Session | None = None,
                 timeout: tuple[float, float] = (3.05, 10.0),
                 max_attempts: int = 4,
                 backoff: float = 0.5,
                 max_backoff: float = 8.0,
                 max_retry_after: float = 10.0,
                 budget: float = 25.0,
                 refresh_budget: float = 40.0,
                 cache_size: int = 64,
                 sleep: Callable[[float], None] = time.sleep,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.base_url = base_url.rstrip("/")
        self.session = session or requests.Session()
        self.timeout = timeout
        self.max_attempts = max(1, max_attempts)
        self.backoff = backoff
        self.max_backoff = max_backoff
        self.max_retry_after = max_retry_after
        self.budget = budget
        self.refresh_budget = refresh_budget
        self.cache_size = cache_size
        self.sleep = sleep
        self.clock = clock
        self._cache: Recent[str, _Cached] = Recent(cache_size)

    @property
    def source(self) -> str:
        """What the ConfigMap's ``source`` says: where the rates came from."""
        return self.base_url

    def url(self, base: str, currencies: Iterable[str]) -> str:
        return f"{self.base_url}/latest?from={base}&to={','.join(sorted(set(currencies)))}"

    def latest(self, base: str, currencies: Iterable[str], *,
               deadline: float | None = None) -> Quote:
        """Latest rates of ``currencies`` against ``base``, in one request (plus retries).

        ``deadline`` (a ``clock()`` value) caps the time spent, on top of the client's own
        per-call ``budget``: a refresh shares one deadline across its bases so that, with
        the provider down, it still answers well within the router's worker timeout.
        Raises a :class:`ProviderError` subclass; never a ``requests`` exception.
        """
        wanted = sorted(set(currencies))
        for code in (base, *wanted):
            if not CURRENCY.match(code):
                raise ProviderRejected(f"{code!r} is not an ISO 4217 currency code (three "
                                       f"capital letters); fix the ExchangeRate's spec")
        if not wanted:
            raise ProviderRejected("no currency to quote was asked for")
        url = self.url(base, wanted)
        # An outage is the provider's, whichever currencies were asked: said the same way
        # by a refresh and by an ExchangeRate's own run that reuses or meets it, so that the
        # status (and its Warning Event) does not change between the two.
        where = f"{self.base_url}/latest?from={base}"
        own = self.clock() + self.budget
        shared = deadline is not None
        deadline = own if deadline is None else min(own, deadline)
        last = ""  # what the last attempt met
        attempt = 0
        limited = False
        while attempt < self.max_attempts:
            remaining = deadline - self.clock()
            # Under a refresh's shared budget a base is not started without the time a
            # whole answer may take: cut short, it would time out and read as an outage.
            if attempt == 0 and (remaining <= 0 or (shared and remaining < self.timeout[1])):
                raise ProviderUnavailable(
                    f"{where}: not asked: the refresh's {self.refresh_budget:g}s went to "
                    "other base currencies first (the provider answers slowly); it is asked "
                    "first at the next refresh", not_asked=True)
            if remaining <= 0:
                last += "; out of time before the next attempt"
                break
            attempt += 1
            wait: float | None = None
            limited = False  # was this attempt's failure a 429?
            timeout = (min(self.timeout[0], remaining), min(self.timeout[1], remaining))
            sent = time.perf_counter()
            try:
                resp = self.session.get(url, headers=self._headers(url), timeout=timeout)
            except requests.Timeout:
                last = "timed out waiting for an answer"
                _count("timeout", "", sent)
            except requests.ConnectionError as exc:
                last = f"connection failed ({type(exc).__name__})"
                _count("connection_error", "", sent)
            except requests.RequestException as exc:
                last = f"request failed ({type(exc).__name__})"
                _count("request_error", "", sent)
            else:
                code = resp.status_code
                answered = code == 304 or 200 <= code < 300
                if not answered:  # (an answer is counted once parsed: it may be malformed)
                    _count(_outcome(code), str(code), sent)
                if answered:
                    try:
                        quote = self._quote(url, resp, base)
                    except MalformedAnswer:
                        _count("malformed", str(code), sent)
                        raise
                    _count(_outcome(code), str(code), sent)
                    if quote is not None:
                        return quote
                    last = "answered 304 Not Modified to a request we had no copy for"
                elif code == 429:
                    wait = retry_after(resp.headers.get("Retry-After"))
                    if wait is not None and wait > self.max_retry_after:
                        raise ProviderRateLimited(
                            f"{where} is rate limited (429) and asks to wait {wait:g}s, longer "
                            f"than the {self.max_retry_after:g}s we wait inside one event; the "
                            f"next scheduled refresh asks again", status=429)
                    last, limited = "rate limited (429)", True
                elif code >= 500:
                    last = f"server error {code}"
                else:
                    raise self._rejected(url, resp)
            if attempt == self.max_attempts:
                break
            if wait is None:
                delay = min(self.max_backoff, self.backoff * 2 ** (attempt - 1))
                wait = delay * random.uniform(0.5, 1.0)  # jitter: replicas do not sync up
            if self.clock() + wait >= deadline:
                last += "; out of time before the next attempt"
                break
            log.info("%s: %s (attempt %d of %d), retrying in %.2fs",
                     url, last, attempt, self.max_attempts, wait)
            self.sleep(wait)
        if limited:  # the provider is reachable and answering, only not to us for now
            raise ProviderRateLimited(
                f"{where}: {last}, after {attempt} attempt(s) (the provider is reachable but "
                "refuses more requests for now)", status=429, transient=True)
        raise ProviderUnavailable(f"{where}: {last}, after {attempt} attempt(s) (is the "
                                  "provider reachable from the cluster?)")

    def _quote(self, url: str, resp: requests.Response, base: str) -> Quote | None:
        """The quote a 2xx answer holds, or a 304's from the cached copy (None if there is
        none); raises :class:`MalformedAnswer`."""
        if resp.status_code == 304:
            cached = self._cached(url)
            if cached is None:
                return None
            log.debug("%s not modified (ETag %s)", url, cached.etag)
            return parse_answer(cached.body, base, self.source, now_rfc3339())
        quote = parse_answer(resp.content, base, self.source, now_rfc3339())
        self._remember(url, resp)
        return quote

    def _rejected(self, url: str, resp: requests.Response) -> ProviderRejected:
        """A 4xx the provider will answer again: what to check. A 404 is also what a wrong
        ``RATES_API_URL`` gets (a mistyped path), which the spec can not fix."""
        detail = _error_message(resp)
        hint = "check that base and currency are different currencies the provider publishes"
        if resp.status_code == 404:
            hint += (f", and that RATES_API_URL ({self.base_url}) is the provider's API: a "
                     "wrong path is answered 404 too")
        return ProviderRejected(f"{url} answered {resp.status_code}"
                                f"{': ' + detail if detail else ''}; {hint}",
                                status=resp.status_code)

    # -- ETag cache -----------------------------------------------------------------------

    def _headers(self, url: str) -> dict[str, str]:
        headers = {"Accept": "application/json", "User-Agent": USER_AGENT}
        cached = self._cached(url)
        if cached is not None:
            headers["If-None-Match"] = cached.etag
        return headers

    def _cached(self, url: str) -> _Cached | None:
        return self._cache.get(url)

    def _remember(self, url: str, resp: requests.Response) -> None:
        etag = resp.headers.get("ETag")
        if etag:
            self._cache.put(url, _Cached(etag, resp.content))
        else:
            self._cache.pop(url)


# -- the process-wide client ------------------------------------------------------------------

_client: FrankfurterClient | None = None
_client_lock = threading.Lock()


def get_client() -> FrankfurterClient:
    """The client for the configured ``RATES_API_URL`` (one per process, ETag cache included).

    Rebuilt when the variable changes, so a test or a reconfigured process never talks to a
    stale URL.
    """
    global _client
    url = (os.environ.get("RATES_API_URL") or DEFAULT_URL).rstrip("/")
    with _client_lock:
        if _client is None or _client.base_url != url:
            _client = FrankfurterClient(url)
        return _client
