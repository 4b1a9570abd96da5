"""The scheduled refresh of ExchangeRates (CronJob or PingSource) against the local API
server, requests-mock as provider: one request per base, writes only on change, and every
kind of provider failure leaving the last good ConfigMap alone."""

from __future__ import annotations

import time
from typing import Any

import pytest
import requests
import requests_mock as rm

from demo.provider import answer
from eventop import handlers
from eventop.events import PING_TYPE, REFRESH_TYPE
from eventop.handlers.events import Event
from eventop.kube import Kube, now_rfc3339, set_condition
from tests.exchange_rates.support import (
    FIELD_MANAGER,
    NAMESPACE,
    Router,
    add,
    assert_ok,
    base_url,
    configmap,
    configmap_writes,
    cr,
    dispatch,
    exchange_rate,
    put_cached,
    ready,
    refresh,
    warnings,
)
from tests.support.engine import deliver, wait_cached

pytestmark = pytest.mark.usefixtures("rates_client", "finance")

Obj = dict[str, Any]


# -- provider failures leave the last good ConfigMap alone -----------------------------------

FAILURES = {
    "server-errors": {"status_code": 500, "text": "internal error"},
    "timeout": {"exc": requests.exceptions.ReadTimeout("read timed out")},
    "connection-refused": {"exc": requests.exceptions.ConnectionError("refused")},
    "unknown-currency-404": {"status_code": 404, "json": {"message": "not found"}},
    "same-currency-422": {"status_code": 422, "json": {"message": "bad currency pair"}},
    "rate-limited-429": {"status_code": 429, "headers": {"Retry-After": "86400"}},
    "malformed-json": {"text": '{"amount":1.0,"base":"EUR",'},
    "no-rates": {"json": {"amount": 1.0, "base": "EUR", "date": "2026-11-21"}},
    "missing-currency": {"content": answer("EUR", "2026-11-21", GBP="0.85")},
}
REASONS = {
    "server-errors": "ProviderUnavailable", "timeout": "ProviderUnavailable",
    "connection-refused": "ProviderUnavailable", "unknown-currency-404": "ProviderRejected",
    "same-currency-422": "ProviderRejected", "rate-limited-429": "ProviderRateLimited",
    "malformed-json": "MalformedAnswer", "no-rates": "MalformedAnswer",
    "missing-currency": "MalformedAnswer",
}


@pytest.mark.parametrize("failure", sorted(FAILURES))
def test_provider_failure_leaves_the_configmap_byte_for_byte(
        router: Router, local_kube: Any, requests_mock: rm.Mocker,
        failure: str) -> None:
    requests_mock.get(base_url("EUR"), content=answer("EUR", "2026-11-20", USD="1.0812"))
    add(router, local_kube, exchange_rate("er", "USD"))
    before = configmap(local_kube, "er")
    good_status = cr(local_kube, "er")["status"]
    writes_before = configmap_writes(local_kube)

    requests_mock.get(base_url("EUR"), **FAILURES[failure])  # type: ignore[arg-type]
    refresh(router)  # provider failures never fail a refresh

    assert configmap(local_kube, "er") == before  # whole object, resourceVersion included
    assert configmap_writes(local_kube) == writes_before
    status = cr(local_kube, "er")["status"]
    condition = ready(cr(local_kube, "er"))
    assert (condition["status"], condition["reason"]) == ("False", REASONS[failure])
    assert condition["message"]
    # the last good values stay in status too
    assert status["rate"] == good_status["rate"] == "1.0812"
    assert status["lastSuccessfulFetch"] == good_status["lastSuccessfulFetch"]
    assert [e["reason"] for e in warnings(local_kube, "er")] == [REASONS[failure]]


def test_repeated_failure_does_not_rewrite_status_but_counts_the_event(
        router: Router, local_kube: Any, requests_mock: rm.Mocker) -> None:
    requests_mock.get(base_url("EUR"), status_code=404, json={"message": "not found"})
    add(router, local_kube, exchange_rate("er", "USD"))
    first = cr(local_kube, "er")
    refresh(router)
    refresh(router)
    assert cr(local_kube, "er")["metadata"]["resourceVersion"] == \
        first["metadata"]["resourceVersion"]
    (event,) = warnings(local_kube, "er")
    assert event["count"] == 3


def test_an_answer_kept_from_before_another_replica_decided_the_status_is_not_written_back(
        router: Router, local_kube: Any, kube: Kube, requests_mock: rm.Mocker) -> None:
    """Each router process keeps its own refresh answers. This one refreshed while the
    provider answered; another replica refreshed later, found the provider failing and
    wrote Ready=False. A run here (this replica's watch sees that status write) must not
    write its older answer back over the newer failure: it asks the provider itself."""
    requests_mock.get(base_url("EUR"), content=answer("EUR", "2026-11-20", USD="1.0812"))
    add(router, local_kube, exchange_rate("er", "USD"))
    refresh(router)  # this process now keeps a successful answer for EUR
    time.sleep(1.1)  # the other replica's refresh comes in a later second
    stored = cr(local_kube, "er")
    theirs = kube.patch_status(stored, {"conditions": set_condition(
        stored["status"]["conditions"], "Ready", False, "ProviderUnavailable",
        "server error 500, after 4 attempt(s)", now_rfc3339())})
    wait_cached(router.engine, theirs)
    requests_mock.get(base_url("EUR"), status_code=500, text="internal error")
    asked = requests_mock.call_count

    assert_ok(dispatch(router, Event.for_object("update", theirs)))
    condition = ready(cr(local_kube, "er"))
    assert (condition["status"], condition["reason"]) == ("False", "ProviderUnavailable")
    assert requests_mock.call_count > asked  # asked the provider, not its kept answer


def test_an_answer_older_than_the_configmap_another_replica_wrote_is_not_written_back(
        router: Router, local_kube: Any, kube: Kube, requests_mock: rm.Mocker) -> None:
    """Two replicas, a refresh each within a minute: the other one's ConfigMap write (a
    newer rate) reaches this one before its status does. This replica's run, started by
    that ConfigMap change, wrote its own older rate back (reviewer: 0.8652 -> 0.8552 ->
    0.8652 within 50 ms); the ConfigMap's fetchedAt now counts as decided too."""
    requests_mock.get(base_url("EUR"), content=answer("EUR", "2026-11-20", USD="1.0812"))
    add(router, local_kube, exchange_rate("er", "USD"))
    refresh(router)  # this process now keeps its answer: 1.0812
    time.sleep(1.1)  # the other replica's refresh comes in a later second
    stored = configmap(local_kube, "er")
    assert stored is not None and stored["data"]["rate"] == "1.0812"
    theirs = kube.replace({**stored, "data": {**stored["data"], "rate": "1.0999",
                                              "fetchedAt": now_rfc3339()}})
    wait_cached(router.engine, theirs)
    requests_mock.get(base_url("EUR"), content=answer("EUR", "2026-11-20", USD="1.0999"))
    writes = configmap_writes(local_kube)

    assert_ok(dispatch(router, Event.for_object("update", theirs)))
    assert configmap(local_kube, "er")["data"]["rate"] == "1.0999"
    assert configmap_writes(local_kube) == writes


def test_a_configmap_another_replica_wrote_ahead_of_its_status_is_not_fetched_again(
        router: Router, local_kube: Any, kube: Kube, requests_mock: rm.Mocker) -> None:
    """The other replica refreshed and wrote the ConfigMap; this one's watch saw that before
    the status the other writes next, found the two apart and asked the provider for the
    same rate again (a trial with two routers: 22 requests for 3 bases, 116 ExchangeRates).
    It looks again shortly instead; the status that comes meanwhile settles it."""
    requests_mock.get(base_url("EUR"), content=answer("EUR", "2026-11-20", USD="1.0812"))
    add(router, local_kube, exchange_rate("er", "USD"))  # a run's own fetch: not kept
    time.sleep(1.1)  # the other replica's refresh comes in a later second
    stored = configmap(local_kube, "er")
    assert stored is not None
    theirs = kube.replace({**stored, "data": {**stored["data"], "rate": "1.0999",
                                              "date": "2026-11-21", "fetchedAt": now_rfc3339()}})
    wait_cached(router.engine, theirs)
    asked, writes = requests_mock.call_count, configmap_writes(local_kube)

    assert_ok(dispatch(router, Event.for_object("update", theirs)))
    assert requests_mock.call_count == asked
    assert configmap_writes(local_kube) == writes
    assert cr(local_kube, "er")["status"]["rate"] == "1.0812"  # the other one writes it


def test_a_status_another_replica_wrote_ahead_of_its_configmap_is_not_fetched_again(
        router: Router, local_kube: Any, kube: Kube, requests_mock: rm.Mocker) -> None:
    """The other order of the same two writes: this replica's cache gets the other's status
    before its ConfigMap, and the run asked the provider and wrote the ConfigMap too (a
    trial with two routers: 0-2 extra writes a tick, 2-7 requests for 2 bases)."""
    requests_mock.get(base_url("EUR"), content=answer("EUR", "2026-11-20", USD="1.0812"))
    add(router, local_kube, exchange_rate("er", "USD"))  # a run's own fetch: not kept
    time.sleep(1.1)  # the other replica's refresh comes in a later second
    stored = cr(local_kube, "er")
    theirs = kube.patch_status(stored, {"rate": "1.0999", "date": "2026-11-21",
                                        "lastSuccessfulFetch": now_rfc3339()})
    wait_cached(router.engine, theirs)
    asked, writes = requests_mock.call_count, configmap_writes(local_kube)

    assert_ok(dispatch(router, Event.for_object("update", theirs)))
    assert requests_mock.call_count == asked
    assert configmap_writes(local_kube) == writes


# -- the scheduled refresh ---------------------------------------------------------------------

def test_refresh_of_many_exchange_rates_across_two_bases_makes_two_requests(
        router: Router, local_kube: Any, requests_mock: rm.Mocker) -> None:
    local_kube.put({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "treasury"}})
    wanted = [("usd", "USD", None, NAMESPACE), ("gbp", "GBP", "EUR", NAMESPACE),
              ("chf", "CHF", None, "treasury"), ("usd", "USD", "EUR", "treasury"),
              ("yen", "JPY", "USD", NAMESPACE), ("cad", "CAD", "USD", "treasury")]
    for name, currency, base, ns in wanted:
        put_cached(router, local_kube, exchange_rate(name, currency, base, namespace=ns))
    requests_mock.get(base_url("EUR"), content=answer("EUR", "2026-11-20", USD="1.0812",
                                                      GBP="0.8352", CHF="0.9391"))
    requests_mock.get(base_url("USD"), content=answer("USD", "2026-11-20", JPY="153.94",
                                                      CAD="1.3985"))
    refresh(router)

    assert requests_mock.call_count == 2
    asked = sorted((r.qs["from"][0], r.qs["to"][0]) for r in requests_mock.request_history)
    assert asked == [("eur", "chf,gbp,usd"), ("usd", "cad,jpy")]
    rates = {(ns, name): local_kube.get("v1", "ConfigMap", name, ns)["data"]["rate"]
             for name, _, _, ns in wanted}
    assert rates == {(NAMESPACE, "usd"): "1.0812", (NAMESPACE, "gbp"): "0.8352",
                     ("treasury", "chf"): "0.9391", ("treasury", "usd"): "1.0812",
                     (NAMESPACE, "yen"): "153.94", ("treasury", "cad"): "1.3985"}


def test_refresh_rides_out_a_server_error_with_one_retry(
        router: Router, local_kube: Any, requests_mock: rm.Mocker,
        sleeps: list[float]) -> None:
    put_cached(router, local_kube, exchange_rate("er", "USD"))
    requests_mock.get(base_url("EUR"), [
        {"status_code": 500, "text": "upstream hiccup"},
        {"content": answer("EUR", "2026-11-20", USD="1.0812")},
    ])
    refresh(router)
    assert requests_mock.call_count == 2
    assert len(sleeps) == 1
    assert configmap(local_kube, "er")["data"]["rate"] == "1.0812"  # type: ignore[index]
    assert ready(cr(local_kube, "er"))["status"] == "True"
    assert warnings(local_kube, "er") == []


def test_ping_from_knative_refreshes_like_the_cronjob(
        router: Router, local_kube: Any, requests_mock: rm.Mocker) -> None:
    put_cached(router, local_kube, exchange_rate("er", "PLN"))
    requests_mock.get(base_url("EUR"), content=answer("EUR", "2026-11-20", PLN="4.2735"))
    refresh(router, PING_TYPE)
    assert configmap(local_kube, "er")["data"]["rate"] == "4.2735"  # type: ignore[index]


def test_unchanged_rate_causes_no_configmap_write(
        router: Router, local_kube: Any, requests_mock: rm.Mocker) -> None:
    requests_mock.get(base_url("EUR"), content=answer("EUR", "2026-11-20", USD="1.0812"))
    add(router, local_kube, exchange_rate("er", "USD"))
    before = configmap(local_kube, "er")
    writes_before = configmap_writes(local_kube)
    status_before = cr(local_kube, "er")["status"]

    refresh(router)
    refresh(router)

    assert requests_mock.call_count == 3
    assert configmap(local_kube, "er") == before  # fetchedAt did not move it either
    assert configmap_writes(local_kube) == writes_before
    # status still records each successful fetch (a status write restarts nothing)
    status = cr(local_kube, "er")["status"]
    assert status["lastSuccessfulFetch"] > status_before["lastSuccessfulFetch"]
    assert ready(cr(local_kube, "er"))["lastTransitionTime"] == \
        ready({"status": status_before})["lastTransitionTime"]


def test_new_rate_or_date_is_written(
        router: Router, local_kube: Any, requests_mock: rm.Mocker) -> None:
    requests_mock.get(base_url("EUR"), content=answer("EUR", "2026-11-20", USD="1.0812"))
    add(router, local_kube, exchange_rate("er", "USD"))
    before = configmap(local_kube, "er")
    assert before is not None

    requests_mock.get(base_url("EUR"), content=answer("EUR", "2026-11-23", USD="1.0812"))
    refresh(router)
    after_date = configmap(local_kube, "er")
    assert after_date is not None
    assert after_date["data"]["date"] == "2026-11-23"
    assert after_date["data"]["fetchedAt"] > before["data"]["fetchedAt"]

    requests_mock.get(base_url("EUR"), content=answer("EUR", "2026-11-24", USD="1.0799"))
    refresh(router)
    after_rate = configmap(local_kube, "er")
    assert after_rate is not None
    assert after_rate["data"]["rate"] == "1.0799"
    assert int(after_rate["metadata"]["resourceVersion"]) > \
        int(after_date["metadata"]["resourceVersion"])
    assert cr(local_kube, "er")["status"]["rate"] == "1.0799"


def test_refresh_failure_of_one_base_does_not_stop_the_other(
        router: Router, local_kube: Any, requests_mock: rm.Mocker) -> None:
    put_cached(router, local_kube, exchange_rate("eur-usd", "USD"))
    put_cached(router, local_kube, exchange_rate("usd-jpy", "JPY", base="USD"))
    requests_mock.get(base_url("EUR"), status_code=500)
    requests_mock.get(base_url("USD"), content=answer("USD", "2026-11-20", JPY="153.94"))
    refresh(router)
    assert configmap(local_kube, "eur-usd") is None
    assert ready(cr(local_kube, "eur-usd"))["reason"] == "ProviderUnavailable"
    assert configmap(local_kube, "usd-jpy")["data"]["rate"] == "153.94"  # type: ignore[index]


def test_refresh_with_missing_currency_fails_only_that_exchange_rate(
        router: Router, local_kube: Any, requests_mock: rm.Mocker) -> None:
    put_cached(router, local_kube, exchange_rate("usd", "USD"))
    put_cached(router, local_kube, exchange_rate("cad", "CAD"))
    requests_mock.get(base_url("EUR"), content=answer("EUR", "2026-11-20", USD="1.0812"))
    refresh(router)
    assert configmap(local_kube, "usd")["data"]["rate"] == "1.0812"  # type: ignore[index]
    assert configmap(local_kube, "cad") is None
    condition = ready(cr(local_kube, "cad"))
    assert condition["reason"] == "MalformedAnswer"
    assert "without a rate for CAD" in condition["message"]


def test_refresh_with_no_exchange_rates_asks_nothing(
        router: Router, requests_mock: rm.Mocker) -> None:
    refresh(router)
    assert requests_mock.call_count == 0


def test_refresh_reports_kubernetes_errors_for_redelivery(
        router: Router, local_kube: Any, requests_mock: rm.Mocker,
        monkeypatch: pytest.MonkeyPatch) -> None:
    from eventop.kube.errors import Unavailable

    put_cached(router, local_kube, exchange_rate("a", "USD"))
    put_cached(router, local_kube, exchange_rate("b", "GBP"))
    requests_mock.get(base_url("EUR"), content=answer("EUR", "2026-11-20", USD="1.0812",
                                                      GBP="0.8352"))
    def flaky(write: Any) -> Any:
        def write_unless_a(obj: Obj, **kw: Any) -> Obj:
            if obj["metadata"]["name"] == "a":
                raise Unavailable("API server overloaded")
            result: Obj = write(obj, **kw)
            return result
        return write_unless_a

    mine = router.kube.for_manager(FIELD_MANAGER)  # what the handlers are given
    monkeypatch.setattr(mine, "replace", flaky(mine.replace))  # later writes
    monkeypatch.setattr(mine, "create", flaky(mine.create))  # the first one
    outcomes = dispatch(router, Event.simple(REFRESH_TYPE))
    (outcome,) = [o for o in outcomes if not o.ok]
    assert isinstance(outcome.error, Unavailable)  # answered 5xx: the sender retries
    assert "finance/a" in outcome.detail
    assert configmap(local_kube, "b")["data"]["rate"] == "0.8352"  # type: ignore[index]


def test_refresh_without_the_crd_installed_is_not_an_error(
        requests_mock: rm.Mocker, tmp_path: Any) -> None:
    from eventop.engine.runtime import Engine
    from eventop.localkube import LocalKube

    server = LocalKube(crd_dir=str(tmp_path))  # no CustomResourceDefinition at all
    server.start()
    engine = None
    try:
        no_crd = Kube.connect(url=server.url)
        registry = handlers.load("", builtin="exchange_rates")
        engine = Engine(registry.controllers, no_crd).start()
        outcomes = deliver(engine, Event.simple(REFRESH_TYPE), registry, no_crd)
        assert all(o.ok for o in outcomes)
        assert "eventop.dev/v1/ExchangeRate" in engine.readiness()[1]  # says what it waits for
        assert requests_mock.call_count == 0
    finally:
        if engine is not None:
            engine.stop()
        server.stop()


def test_a_refresh_before_the_first_exchange_rate_is_answered_not_ignored(
        router: Router, requests_mock: rm.Mocker) -> None:
    """A fresh install's hourly CronJob: `watcher emit` fails on an event no handler wants
    (202 ignored), so the refresh must say it ran, for nothing."""
    outcomes = dispatch(router, Event.simple(REFRESH_TYPE))
    assert [(o.handler, o.ok, o.detail) for o in outcomes] == [
        ("exchange-rates", True, "no ExchangeRate to run for")]
    assert requests_mock.call_count == 0
