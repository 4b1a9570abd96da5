"""The Frankfurter client against requests-mock: answers, failures, retries, ETags."""

from __future__ import annotations

import re
from typing import Any

import pytest
import requests
import requests_mock as rm
from prometheus_client import REGISTRY

from eventop.handlers.exchange_rates import provider
from eventop.handlers.exchange_rates.provider import (
    FrankfurterClient,
    MalformedAnswer,
    ProviderRateLimited,
    ProviderRejected,
    ProviderUnavailable,
    parse_answer,
)

BASE_URL = "https://rates.test/v1"
# The shape Frankfurter answers, byte for byte as it sends it (floats, amount 1.0).
REAL_ANSWER = b'{"amount":1.0,"base":"EUR","date":"2026-11-20","rates":{"GBP":0.8352,"USD":1.0812}}'


class Sleeps(list[float]):
    """Records the waits instead of waiting."""

    def __call__(self, seconds: float) -> None:
        self.append(seconds)


@pytest.fixture
def sleeps() -> Sleeps:
    return Sleeps()


@pytest.fixture
def client(sleeps: Sleeps) -> FrankfurterClient:
    return FrankfurterClient(BASE_URL, sleep=sleeps, max_attempts=4, backoff=0.5)


def latest_url(base: str = "EUR", to: str = "USD") -> str:
    return f"{BASE_URL}/latest?from={base}&to={to}"


def test_real_answer_shape_gives_exact_decimal_strings(client: FrankfurterClient,
                                                       requests_mock: rm.Mocker) -> None:
    requests_mock.get(latest_url(to="GBP,USD"), content=REAL_ANSWER)
    quote = client.latest("EUR", ["USD", "GBP"])
    assert quote.base == "EUR"
    assert quote.date == "2026-11-20"
    assert quote.rates == {"GBP": "0.8352", "USD": "1.0812"}
    assert quote.rate("USD") == "1.0812"
    assert quote.source == BASE_URL
    assert requests_mock.call_count == 1
    sent = requests_mock.last_request
    assert sent.qs == {"from": ["eur"], "to": ["gbp,usd"]}  # requests-mock lowercases qs


def test_rates_keep_digits_a_float_would_lose(client: FrankfurterClient,
                                              requests_mock: rm.Mocker) -> None:
    body = b'{"amount":1.0,"base":"EUR","date":"2026-11-20",' \
           b'"rates":{"JPY":166,"USD":1.08120000000000000001,"PLN":4.2735E0}}'
    requests_mock.get(latest_url(to="JPY,PLN,USD"), content=body)
    quote = client.latest("EUR", ["USD", "JPY", "PLN"])
    assert quote.rates == {"JPY": "166", "USD": "1.08120000000000000001", "PLN": "4.2735E0"}
    assert all(type(v) is str for v in quote.rates.values())


def test_missing_currency_in_answer_is_malformed(client: FrankfurterClient,
                                                 requests_mock: rm.Mocker) -> None:
    requests_mock.get(latest_url(to="GBP,USD"),
                      content=b'{"amount":1.0,"base":"EUR","date":"2026-11-20",'
                              b'"rates":{"USD":1.0812}}')
    quote = client.latest("EUR", ["USD", "GBP"])
    assert quote.rate("USD") == "1.0812"
    with pytest.raises(MalformedAnswer, match="without a rate for GBP"):
        quote.rate("GBP")


@pytest.mark.parametrize(("body", "expected"), [
    (b"<html>Bad gateway</html>", "did not answer JSON"),
    (b'{"amount":1.0,"base":"EUR","date":"2026-11-20"', "did not answer JSON"),
    (b"[1, 2]", "not a JSON object"),
    (b'{"amount":1.0,"base":"EUR","date":"2026-11-20"}', "without a 'rates' object"),
    (b'{"amount":1.0,"base":"EUR","date":"2026-11-20","rates":[]}', "without a 'rates'"),
    (b'{"amount":1.0,"base":"USD","date":"2026-11-20","rates":{"USD":1}}', "base 'USD'"),
    (b'{"amount":1.0,"base":"EUR","rates":{"USD":1.08}}', "YYYY-MM-DD"),
    (b'{"amount":1.0,"base":"EUR","date":"2026-11-20","rates":{"USD":NaN}}',
     "did not answer JSON"),
    (b'{"amount":100,"base":"EUR","date":"2026-11-20","rates":{"USD":108.12}}',
     "amount '100'"),
])
def test_malformed_answers_fail_clearly_without_retry(client: FrankfurterClient,
                                                      requests_mock: rm.Mocker, body: bytes,
                                                      expected: str) -> None:
    requests_mock.get(latest_url(), content=body)
    with pytest.raises(MalformedAnswer, match=expected) as err:
        client.latest("EUR", ["USD"])
    assert err.value.reason == "MalformedAnswer"
    assert not err.value.transient
    assert requests_mock.call_count == 1


@pytest.mark.parametrize(("usd", "expected"), [
    ('"1.08"', "sent a rate that is not a number for USD: '1.08'"),
    ("0", "sent a non-positive rate for USD: 0"),
    ("-1.5", "sent a non-positive rate for USD: -1.5"),
    ("null", "sent a rate that is not a number for USD: None"),
    ("1e400", "sent a rate out of the range of a 64-bit float for USD: 1e400"),
    ("1E-400", "sent a rate out of the range of a 64-bit float for USD: 1E-400"),
])
def test_a_bad_rate_fails_only_its_own_currency(client: FrankfurterClient,
                                                requests_mock: rm.Mocker, usd: str,
                                                expected: str) -> None:
    body = ('{"amount":1.0,"base":"EUR","date":"2026-11-20",'
            f'"rates":{{"CAD":1.4521,"USD":{usd},"JPY":170.01}}}}').encode()
    requests_mock.get(latest_url(to="CAD,JPY,USD"), content=body)
    quote = client.latest("EUR", ["CAD", "JPY", "USD"])
    assert (quote.rate("CAD"), quote.rate("JPY")) == ("1.4521", "170.01")
    with pytest.raises(MalformedAnswer, match=re.escape(expected)) as err:
        quote.rate("USD")
    assert err.value.reason == "MalformedAnswer"
    assert "USD" not in quote.rates
    assert requests_mock.call_count == 1


@pytest.mark.parametrize("huge", ["1e400", "1.7976931348623159e308", "-1e400"])
def test_a_rate_beyond_a_float_is_never_handed_out(huge: str) -> None:
    body = f'{{"base":"EUR","date":"2026-11-20","rates":{{"USD":{huge}}}}}'.encode()
    quote = parse_answer(body, "EUR", BASE_URL, "2026-11-20T16:00:00Z")
    with pytest.raises(MalformedAnswer, match="for USD"):
        quote.rate("USD")


@pytest.mark.parametrize(("status", "message"), [
    (404, "not found"),  # Frankfurter: unknown currency
    (422, "bad currency pair"),  # Frankfurter: same base and target
])
def test_provider_rejections_fail_at_once_with_its_message(
        client: FrankfurterClient, requests_mock: rm.Mocker, sleeps: Sleeps,
        status: int, message: str) -> None:
    requests_mock.get(latest_url(base="XYZ"), status_code=status, json={"message": message})
    with pytest.raises(ProviderRejected) as err:
        client.latest("XYZ", ["USD"])
    assert err.value.status == status
    assert err.value.reason == "ProviderRejected"
    assert f"answered {status}: {message}" in str(err.value)
    assert not err.value.transient
    assert requests_mock.call_count == 1
    assert sleeps == []


def test_server_error_then_success_is_retried_with_backoff(
        client: FrankfurterClient, requests_mock: rm.Mocker, sleeps: Sleeps) -> None:
    requests_mock.get(latest_url(), [
        {"status_code": 500, "text": "boom"},
        {"status_code": 503, "text": "busy"},
        {"content": b'{"amount":1.0,"base":"EUR","date":"2026-11-20","rates":{"USD":1.0812}}'},
    ])
    assert client.latest("EUR", ["USD"]).rate("USD") == "1.0812"
    assert requests_mock.call_count == 3
    # exponential: 0.5s then 1s, each with jitter down to half
    assert len(sleeps) == 2
    assert 0.25 <= sleeps[0] <= 0.5
    assert 0.5 <= sleeps[1] <= 1.0


def test_server_errors_exhaust_the_retries(client: FrankfurterClient,
                                           requests_mock: rm.Mocker, sleeps: Sleeps) -> None:
    requests_mock.get(latest_url(), status_code=502, text="bad gateway")
    with pytest.raises(ProviderUnavailable, match=r"server error 502, after 4 attempt") as err:
        client.latest("EUR", ["USD"])
    assert err.value.transient
    assert requests_mock.call_count == 4
    assert len(sleeps) == 3


def test_an_outage_is_said_the_same_whichever_currencies_were_asked(
        client: FrankfurterClient, requests_mock: rm.Mocker, sleeps: Sleeps) -> None:
    """A refresh asks for a base's currencies together, an ExchangeRate's own run for one:
    with the request's URL in it, each said the outage in other words, every such run
    changed the status back and forth, and each change posted another Warning Event (a
    second router process's runs, on the real cluster)."""
    requests_mock.get(re.compile(r"/latest\?"), status_code=500, text="boom")
    said = []
    for currencies in (["GBP", "USD"], ["GBP"], ["USD"]):
        with pytest.raises(ProviderUnavailable) as err:
            client.latest("EUR", currencies)
        said.append(str(err.value))
    assert said[0] == said[1] == said[2]
    assert said[0].startswith(f"{BASE_URL}/latest?from=EUR: server error 500")


def test_timeout_is_retried_then_reported(client: FrankfurterClient,
                                          requests_mock: rm.Mocker, sleeps: Sleeps) -> None:
    requests_mock.get(latest_url(), exc=requests.exceptions.ReadTimeout("read timed out"))
    with pytest.raises(ProviderUnavailable, match="timed out waiting for an answer") as err:
        client.latest("EUR", ["USD"])
    assert err.value.reason == "ProviderUnavailable"
    assert requests_mock.call_count == 4


def test_timeout_then_success(client: FrankfurterClient, requests_mock: rm.Mocker) -> None:
    requests_mock.get(latest_url(), [
        {"exc": requests.exceptions.ConnectTimeout("connect timed out")},
        {"exc": requests.exceptions.ConnectionError("refused")},
        {"content": b'{"amount":1.0,"base":"EUR","date":"2026-11-20","rates":{"USD":1.1}}'},
    ])
    assert client.latest("EUR", ["USD"]).rate("USD") == "1.1"


def test_requests_carry_a_timeout(requests_mock: rm.Mocker, sleeps: Sleeps) -> None:
    seen: list[Any] = []

    class Spy(requests.Session):
        def get(self, url: str | bytes, **kwargs: Any) -> requests.Response:  # type: ignore
            seen.append(kwargs.get("timeout"))
            return super().get(url, **kwargs)

    requests_mock.get(latest_url(), content=REAL_ANSWER.replace(b'"GBP":0.8352,', b""))
    FrankfurterClient(BASE_URL, session=Spy(), timeout=(1.0, 2.0), sleep=sleeps).latest(
        "EUR", ["USD"])
    assert seen == [(1.0, 2.0)]


def test_connection_error_message_has_no_object_addresses(
        client: FrankfurterClient, requests_mock: rm.Mocker) -> None:
    """Status messages must be stable, or every failed refresh would rewrite status."""
    requests_mock.get(latest_url(), exc=requests.exceptions.ConnectionError(
        "HTTPConnectionPool: <urllib3.connection.HTTPConnection object at 0x7f00deadbeef>"))
    with pytest.raises(ProviderUnavailable) as err:
        client.latest("EUR", ["USD"])
    assert "0x" not in str(err.value)
    assert "connection failed (ConnectionError)" in str(err.value)


def test_429_waits_as_long_as_retry_after_says(client: FrankfurterClient,
                                               requests_mock: rm.Mocker, sleeps: Sleeps) -> None:
    requests_mock.get(latest_url(), [
        {"status_code": 429, "headers": {"Retry-After": "3"}, "json": {"message": "slow down"}},
        {"content": b'{"amount":1.0,"base":"EUR","date":"2026-11-20","rates":{"USD":1.0812}}'},
    ])
    assert client.latest("EUR", ["USD"]).rate("USD") == "1.0812"
    assert sleeps == [3.0]


def test_429_with_http_date_retry_after(client: FrankfurterClient,
                                        requests_mock: rm.Mocker, sleeps: Sleeps) -> None:
    requests_mock.get(latest_url(), [
        {"status_code": 429, "headers": {"Retry-After": "Wed, 21 Oct 2015 07:28:00 GMT"}},
        {"content": b'{"amount":1.0,"base":"EUR","date":"2026-11-20","rates":{"USD":1.0812}}'},
    ])
    client.latest("EUR", ["USD"])
    assert sleeps == [0.0]  # a date in the past: go again at once


def test_429_asking_for_too_long_a_wait_gives_up_without_waiting(
        client: FrankfurterClient, requests_mock: rm.Mocker, sleeps: Sleeps) -> None:
    requests_mock.get(latest_url(), status_code=429, headers={"Retry-After": "3600"})
    with pytest.raises(ProviderRateLimited, match="asks to wait 3600s") as err:
        client.latest("EUR", ["USD"])
    assert err.value.reason == "ProviderRateLimited"
    assert not err.value.transient  # redelivering would only ask again too early
    assert requests_mock.call_count == 1
    assert sleeps == []


def test_429_without_retry_after_uses_backoff(client: FrankfurterClient,
                                              requests_mock: rm.Mocker, sleeps: Sleeps) -> None:
    requests_mock.get(latest_url(), status_code=429)
    with pytest.raises(ProviderRateLimited, match="rate limited"):
        client.latest("EUR", ["USD"])
    assert requests_mock.call_count == 4
    assert len(sleeps) == 3


def test_429s_with_short_retry_after_that_never_clear_are_reported_as_rate_limited(
        client: FrankfurterClient, requests_mock: rm.Mocker, sleeps: Sleeps) -> None:
    requests_mock.get(latest_url(), status_code=429, headers={"Retry-After": "2"})
    with pytest.raises(ProviderRateLimited) as err:
        client.latest("EUR", ["USD"])
    assert err.value.reason == "ProviderRateLimited"
    assert err.value.status == 429
    assert "rate limited (429), after 4 attempt(s)" in err.value.message
    assert "reachable from the cluster" not in err.value.message
    assert err.value.transient  # it asked for short waits: asking again soon is fair
    assert sleeps == [2.0, 2.0, 2.0]


def test_a_429_before_a_final_server_error_is_an_outage_not_rate_limiting(
        client: FrankfurterClient, requests_mock: rm.Mocker) -> None:
    requests_mock.get(latest_url(), [{"status_code": 429, "headers": {"Retry-After": "1"}},
                                     {"status_code": 503}])
    with pytest.raises(ProviderUnavailable, match="server error 503"):
        client.latest("EUR", ["USD"])


def test_retries_stop_when_the_time_budget_would_run_out(requests_mock: rm.Mocker) -> None:
    now = [0.0]
    waits: list[float] = []

    def sleep(seconds: float) -> None:
        waits.append(seconds)
        now[0] += seconds

    client = FrankfurterClient(BASE_URL, max_attempts=10, max_retry_after=10, budget=5.0,
                               sleep=sleep, clock=lambda: now[0])
    requests_mock.get(latest_url(), status_code=429, headers={"Retry-After": "2"})
    with pytest.raises(ProviderRateLimited, match="out of time before the next attempt"):
        client.latest("EUR", ["USD"])
    assert waits == [2.0, 2.0]
    assert requests_mock.call_count == 3


def test_shared_deadline_stops_before_asking(requests_mock: rm.Mocker) -> None:
    now = [100.0]
    client = FrankfurterClient(BASE_URL, clock=lambda: now[0], sleep=lambda s: None)
    with pytest.raises(ProviderUnavailable, match=r"not asked: the refresh's 40s went to "
                                                  r"other base currencies first") as caught:
        client.latest("EUR", ["USD"], deadline=99.0)
    assert caught.value.not_asked
    assert requests_mock.call_count == 0


def test_per_request_timeout_shrinks_to_the_time_left(requests_mock: rm.Mocker) -> None:
    requests_mock.get(latest_url(), content=REAL_ANSWER.replace(b'"GBP":0.8352,', b""))
    client = FrankfurterClient(BASE_URL, timeout=(3.0, 10.0), clock=lambda: 100.0, budget=2.0)
    client.latest("EUR", ["USD"])
    assert requests_mock.last_request.timeout == (2.0, 2.0)


def test_a_refresh_starts_no_base_with_less_time_left_than_an_answer_may_take(
        requests_mock: rm.Mocker) -> None:
    """Started with 4 s of the refresh's budget left, a base a slow provider answers in 9 s
    timed out, and its ExchangeRates said "is the provider reachable?" (a user's trial)."""
    client = FrankfurterClient(BASE_URL, timeout=(3.0, 10.0), clock=lambda: 100.0)
    with pytest.raises(ProviderUnavailable, match="not asked") as caught:
        client.latest("EUR", ["USD"], deadline=104.0)
    assert caught.value.not_asked and requests_mock.call_count == 0


def test_etag_is_sent_back_and_304_reuses_the_cached_answer(
        client: FrankfurterClient, requests_mock: rm.Mocker) -> None:
    requests_mock.get(latest_url(), [
        {"content": b'{"amount":1.0,"base":"EUR","date":"2026-11-20","rates":{"USD":1.0812}}',
         "headers": {"ETag": 'W/"abc"'}},
        {"status_code": 304},
    ])
    first = client.latest("EUR", ["USD"])
    second = client.latest("EUR", ["USD"])
    assert requests_mock.request_history[0].headers.get("If-None-Match") is None
    assert requests_mock.request_history[1].headers["If-None-Match"] == 'W/"abc"'
    assert second.rates == first.rates
    assert second.date == first.date


def test_no_etag_no_conditional_request(client: FrankfurterClient,
                                        requests_mock: rm.Mocker) -> None:
    requests_mock.get(latest_url(), content=REAL_ANSWER.replace(b'"GBP":0.8352,', b""))
    client.latest("EUR", ["USD"])
    client.latest("EUR", ["USD"])
    assert all("If-None-Match" not in r.headers for r in requests_mock.request_history)


def test_invalid_codes_are_rejected_before_any_request(client: FrankfurterClient,
                                                       requests_mock: rm.Mocker) -> None:
    with pytest.raises(ProviderRejected, match="not an ISO 4217"):
        client.latest("eur", ["USD"])
    with pytest.raises(ProviderRejected, match="not an ISO 4217"):
        client.latest("EUR", ["US&D"])
    assert requests_mock.call_count == 0


def test_parse_answer_accepts_integer_amount() -> None:
    quote = parse_answer(b'{"amount":1,"base":"CHF","date":"2026-11-20","rates":{"USD":1.15}}',
                         "CHF", "x", "t")
    assert quote.rates == {"USD": "1.15"}


def test_client_follows_rates_api_url(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RATES_API_URL", "http://127.0.0.1:9/v1/")
    assert provider.get_client().base_url == "http://127.0.0.1:9/v1"
    monkeypatch.delenv("RATES_API_URL")
    assert provider.get_client().base_url == provider.DEFAULT_URL


# -- messages ---------------------------------------------------------------------------------

def test_a_404_also_names_rates_api_url_as_what_may_be_wrong(
        client: FrankfurterClient, requests_mock: rm.Mocker) -> None:
    """A mistyped path in RATES_API_URL is answered 404 as an unknown currency is; the
    spec is not all there is to check."""
    requests_mock.get(latest_url(), status_code=404, json={"message": "not found"})
    with pytest.raises(ProviderRejected) as err:
        client.latest("EUR", ["USD"])
    assert f"RATES_API_URL ({BASE_URL})" in err.value.message
    assert "check that base and currency are different currencies" in err.value.message


def test_an_answer_of_only_unusable_rates_says_so_for_a_currency_it_lacks() -> None:
    body = (b'{"amount":1.0,"base":"EUR","date":"2026-11-20",'
            b'"rates":{"GBP":"x","JPY":0,"PLN":-1,"USD":null}}')
    quote = parse_answer(body, "EUR", BASE_URL, "2026-11-20T16:00:00Z")
    with pytest.raises(MalformedAnswer) as err:
        quote.rate("CHF")
    assert "it sent no usable rate, only unusable ones for GBP, JPY, PLN, USD" in \
        err.value.message
    assert "no rates" not in err.value.message


# -- metrics ----------------------------------------------------------------------------------

def requests_counted(outcome: str, code: str) -> float:
    return REGISTRY.get_sample_value("eventop_rates_provider_requests_total",
                                     {"outcome": outcome, "code": code}) or 0.0


def requests_timed() -> float:
    return REGISTRY.get_sample_value(
        "eventop_rates_provider_request_duration_seconds_count") or 0.0


def test_each_request_to_the_provider_is_counted_by_outcome_and_timed(
        client: FrankfurterClient, requests_mock: rm.Mocker) -> None:
    requests_mock.get(latest_url(), [
        {"exc": requests.exceptions.ConnectTimeout("slow")},
        {"status_code": 503, "text": "busy"},
        {"content": REAL_ANSWER.replace(b'"GBP":0.8352,', b""), "headers": {"ETag": '"e1"'}},
        {"status_code": 304},
        {"content": b"<html>oops</html>"},
    ])
    kinds = [("timeout", ""), ("server_error", "503"), ("ok", "200"), ("not_modified", "304"),
             ("malformed", "200")]
    before = {kind: requests_counted(*kind) for kind in kinds}
    timed = requests_timed()

    client.latest("EUR", ["USD"])  # timeout, 503, then the answer
    client.latest("EUR", ["USD"])  # 304: the copy
    with pytest.raises(MalformedAnswer):
        client.latest("EUR", ["USD"])

    assert {kind: requests_counted(*kind) - before[kind] for kind in kinds} == {
        ("timeout", ""): 1, ("server_error", "503"): 1, ("ok", "200"): 1,
        ("not_modified", "304"): 1, ("malformed", "200"): 1}
    assert requests_timed() - timed == 5


def test_the_provider_metrics_are_in_what_the_routers_metrics_endpoint_serves(
        client: FrankfurterClient, requests_mock: rm.Mocker) -> None:
    from eventop.router.metrics import render

    requests_mock.get(latest_url(), status_code=404, json={"message": "not found"})
    with pytest.raises(ProviderRejected):
        client.latest("EUR", ["USD"])
    text = render()[0].decode()
    assert 'eventop_rates_provider_requests_total{code="404",outcome="rejected"}' in text
    assert "eventop_rates_provider_request_duration_seconds_bucket" in text
