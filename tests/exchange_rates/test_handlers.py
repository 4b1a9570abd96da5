"""The ExchangeRate handlers against the local API server, with requests-mock as provider."""

from __future__ import annotations

from typing import Any

import pytest
import requests
import requests_mock as rm

from demo.provider import answer
from eventop import handlers
from eventop.events import PING_TYPE, REFRESH_TYPE
from eventop.handlers.events import Event
from eventop.kube import Kube
from tests.exchange_rates.conftest import (
    BASE_URL,
    NAMESPACE,
    Router,
    assert_ok,
    dispatch,
    exchange_rate,
    put_cached,
)
from tests.support.engine import deliver

pytestmark = pytest.mark.usefixtures("rates_client", "finance")

ER = ("eventop.dev/v1", "ExchangeRate")
Obj = dict[str, Any]
FIELD_MANAGER = "eventop-exchange-rates"  # derived from the module: handlers write as this


def base_url(base: str) -> str:
    """Matches any ``to=`` for this base (requests-mock matches a subset of the query)."""
    return f"{BASE_URL}/latest?from={base}"


def configmap(local_kube: Any, name: str) -> Obj | None:
    cm: Obj | None = local_kube.get("v1", "ConfigMap", name, NAMESPACE)
    return cm


def cr(local_kube: Any, name: str) -> Obj:
    obj: Obj = local_kube.get(*ER, name, NAMESPACE)
    return obj


def ready(obj: Obj) -> Obj:
    return next(c for c in obj["status"]["conditions"] if c["type"] == "Ready")


def warnings(local_kube: Any, name: str) -> list[Obj]:
    return [e for e in local_kube.list("v1", "Event", NAMESPACE)
            if e["involvedObject"]["name"] == name and e["type"] == "Warning"]


def configmap_writes(local_kube: Any) -> list[tuple[str, str]]:
    return [(r[0], r[1]) for r in local_kube.requests
            if "/configmaps" in r[1] and r[0] in ("POST", "PUT", "PATCH", "DELETE")]


def add(router: Router, local_kube: Any, obj: Obj) -> Obj:
    stored: Obj = local_kube.put(obj)
    assert_ok(dispatch(router, Event.for_object("add", stored)))
    return stored


def refresh(router: Router, type_: str = REFRESH_TYPE) -> None:
    """A scheduled refresh: one run per ExchangeRate (none without any), none failing."""
    assert_ok(deliver(router.engine, Event.simple(type_), router.registry, router.kube))


# -- one ExchangeRate added or changed ---------------------------------------------------------

def test_added_exchange_rate_gets_an_owned_configmap_with_the_exact_rate(
        router: Router, local_kube: Any, requests_mock: rm.Mocker) -> None:
    requests_mock.get(base_url("EUR"), content=answer("EUR", "2026-11-20", USD="1.08120"))
    stored = add(router, local_kube, exchange_rate("exchange-rate-usd", "USD"))

    cm = configmap(local_kube, "exchange-rate-usd")
    assert cm is not None
    assert cm["data"]["rate"] == "1.08120"  # the provider's text, trailing zero included
    assert cm["data"]["base"] == "EUR"
    assert cm["data"]["currency"] == "USD"
    assert cm["data"]["date"] == "2026-11-20"
    assert cm["data"]["source"] == BASE_URL
    assert cm["data"]["fetchedAt"].startswith("2026-11-21T")
    (owner,) = cm["metadata"]["ownerReferences"]
    assert owner["uid"] == stored["metadata"]["uid"]
    assert owner["kind"] == "ExchangeRate"
    assert owner["controller"] is True
    assert cm["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "eventop"
    assert cm["metadata"]["labels"]["app.kubernetes.io/instance"] == "exchange-rate-usd"
    assert requests_mock.last_request.qs == {"from": ["eur"], "to": ["usd"]}

    status = cr(local_kube, "exchange-rate-usd")["status"]
    assert status["rate"] == "1.08120"
    assert status["date"] == "2026-11-20"
    assert status["lastSuccessfulFetch"] == cm["data"]["fetchedAt"]
    assert status["observedGeneration"] == stored["metadata"]["generation"]
    assert ready(cr(local_kube, "exchange-rate-usd"))["status"] == "True"


def test_reference_mode_event_reads_the_object_itself(
        router: Router, local_kube: Any, requests_mock: rm.Mocker) -> None:
    requests_mock.get(base_url("USD"), content=answer("USD", "2026-11-20", JPY="153.94"))
    stored = local_kube.put(exchange_rate("yen", "JPY", base="USD"))
    ref = {"apiVersion": "eventop.dev/v1", "kind": "ExchangeRate", "name": "yen",
           "namespace": NAMESPACE, "uid": stored["metadata"]["uid"]}
    event = Event(id="1", type="dev.knative.apiserver.ref.add", source="test", data=ref)
    assert_ok(dispatch(router, event))
    cm = configmap(local_kube, "yen")
    assert cm is not None
    assert (cm["data"]["base"], cm["data"]["currency"], cm["data"]["rate"]) == \
        ("USD", "JPY", "153.94")


def test_event_body_is_only_a_hint_the_spec_is_read_from_the_api_server(
        router: Router, local_kube: Any, requests_mock: rm.Mocker) -> None:
    requests_mock.get(base_url("EUR"), content=answer("EUR", "2026-11-20", GBP="0.8352"))
    stored = local_kube.put(exchange_rate("er", "GBP"))
    forged = {**stored, "spec": {"currency": "JPY", "base": "USD"}}
    assert_ok(dispatch(router, Event.for_object("update", forged)))
    assert configmap(local_kube, "er")["data"]["currency"] == "GBP"  # type: ignore[index]


def test_event_for_a_deleted_exchange_rate_does_nothing(
        router: Router, local_kube: Any, requests_mock: rm.Mocker) -> None:
    stored = local_kube.put(exchange_rate("er", "USD"))
    local_kube.remove(*ER, "er", NAMESPACE)
    outcomes = dispatch(router, Event.for_object("add", stored))
    assert_ok(outcomes)
    assert "gone" in outcomes[0].detail
    assert requests_mock.call_count == 0
    assert configmap(local_kube, "er") is None


def test_own_status_write_coming_back_as_update_costs_no_provider_request(
        router: Router, local_kube: Any, requests_mock: rm.Mocker) -> None:
    requests_mock.get(base_url("EUR"), content=answer("EUR", "2026-11-20", USD="1.0812"))
    add(router, local_kube, exchange_rate("er", "USD"))
    assert requests_mock.call_count == 1
    after_status_write = cr(local_kube, "er")
    outcomes = dispatch(router, Event.for_object("update", after_status_write))
    assert_ok(outcomes)
    assert outcomes[0].detail == "echo of its own write"  # the engine knows its own write
    # the same object again, as a restarted watcher's "add": converged, nothing asked
    outcomes = dispatch(router, Event.for_object("add", after_status_write))
    assert_ok(outcomes)
    assert "already written" in outcomes[0].detail
    assert requests_mock.call_count == 1


def test_spec_change_fetches_and_rewrites_at_once(
        router: Router, local_kube: Any, requests_mock: rm.Mocker) -> None:
    requests_mock.get(base_url("EUR"), [
        {"content": answer("EUR", "2026-11-20", CHF="0.9391")},
        {"content": answer("EUR", "2026-11-20", GBP="0.8352")},
    ])
    stored = add(router, local_kube, exchange_rate("er", "CHF"))
    changed = local_kube.put({**stored, "spec": {"currency": "GBP", "base": "EUR"}})
    assert changed["metadata"]["generation"] > stored["metadata"]["generation"]
    assert_ok(dispatch(router, Event.for_object("update", changed)))
    cm = configmap(local_kube, "er")
    assert cm is not None
    assert (cm["data"]["currency"], cm["data"]["rate"]) == ("GBP", "0.8352")
    status = cr(local_kube, "er")["status"]
    assert status["observedGeneration"] == changed["metadata"]["generation"]
    assert status["rate"] == "0.8352"


def test_deleted_configmap_is_restored_on_the_next_event(
        router: Router, local_kube: Any, requests_mock: rm.Mocker) -> None:
    requests_mock.get(base_url("EUR"), content=answer("EUR", "2026-11-20", USD="1.0812"))
    add(router, local_kube, exchange_rate("er", "USD"))
    last_state = configmap(local_kube, "er")
    local_kube.remove("v1", "ConfigMap", "er", NAMESPACE)
    assert_ok(dispatch(router, Event.for_object("delete", last_state)))  # type: ignore[arg-type]
    assert configmap(local_kube, "er")["data"]["rate"] == "1.0812"  # type: ignore[index]


def test_same_base_and_currency_is_reported_without_asking_the_provider(
        router: Router, local_kube: Any, requests_mock: rm.Mocker) -> None:
    add(router, local_kube, exchange_rate("er", "USD", base="USD"))
    assert requests_mock.call_count == 0
    assert configmap(local_kube, "er") is None
    condition = ready(cr(local_kube, "er"))
    assert (condition["status"], condition["reason"]) == ("False", "InvalidSpec")
    assert "pick a different base" in condition["message"]
    assert [e["reason"] for e in warnings(local_kube, "er")] == ["InvalidSpec"]


def test_unsupported_base_is_a_clear_condition(
        router: Router, local_kube: Any, requests_mock: rm.Mocker) -> None:
    requests_mock.get(base_url("XYZ"), status_code=404, json={"message": "not found"})
    add(router, local_kube, exchange_rate("er", "USD", base="XYZ"))
    condition = ready(cr(local_kube, "er"))
    assert (condition["status"], condition["reason"]) == ("False", "ProviderRejected")
    assert "answered 404: not found" in condition["message"]
    assert configmap(local_kube, "er") is None
    assert requests_mock.call_count == 1  # not retried


def test_unavailable_provider_is_reported_in_status_without_asking_for_redelivery(
        router: Router, local_kube: Any, requests_mock: rm.Mocker) -> None:
    """A 5xx answer would make the sender retry the event, holding a delivery slot and a
    router thread per attempt: the outage is in status, that is enough."""
    requests_mock.get(base_url("EUR"), status_code=503)
    stored = local_kube.put(exchange_rate("er", "USD"))
    assert_ok(dispatch(router, Event.for_object("add", stored)))
    assert ready(cr(local_kube, "er"))["reason"] == "ProviderUnavailable"
    assert configmap(local_kube, "er") is None
    # the next delivery of the object (a resync) once the provider is back: converges
    requests_mock.get(base_url("EUR"), content=answer("EUR", "2026-11-20", USD="1.0812"))
    assert_ok(dispatch(router, Event.for_object("add", stored)))
    assert configmap(local_kube, "er")["data"]["rate"] == "1.0812"  # type: ignore[index]
    assert ready(cr(local_kube, "er"))["status"] == "True"


def test_rejected_question_does_not_fail_the_event(
        router: Router, local_kube: Any, requests_mock: rm.Mocker) -> None:
    requests_mock.get(base_url("EUR"), status_code=422, json={"message": "bad currency pair"})
    stored = local_kube.put(exchange_rate("er", "USD"))
    assert_ok(dispatch(router, Event.for_object("add", stored)))
    assert ready(cr(local_kube, "er"))["reason"] == "ProviderRejected"


def test_foreign_configmap_of_the_same_name_is_left_alone(
        router: Router, local_kube: Any, requests_mock: rm.Mocker) -> None:
    requests_mock.get(base_url("EUR"), content=answer("EUR", "2026-11-20", USD="1.0812"))
    foreign = local_kube.put({"apiVersion": "v1", "kind": "ConfigMap",
                              "metadata": {"name": "er", "namespace": NAMESPACE},
                              "data": {"rate": "42"}})
    add(router, local_kube, exchange_rate("er", "USD"))
    assert configmap(local_kube, "er") == foreign
    condition = ready(cr(local_kube, "er"))
    assert (condition["status"], condition["reason"]) == ("False", "ConfigMapConflict")
    # and deleting the ExchangeRate does not delete somebody else's ConfigMap
    gone = cr(local_kube, "er")
    local_kube.remove(*ER, "er", NAMESPACE)
    assert_ok(dispatch(router, Event.for_object("delete", gone)))
    assert configmap(local_kube, "er") == foreign


def test_delete_leaves_nothing_and_is_idempotent(
        router: Router, local_kube: Any, requests_mock: rm.Mocker) -> None:
    requests_mock.get(base_url("EUR"), content=answer("EUR", "2026-11-20", USD="1.0812"))
    add(router, local_kube, exchange_rate("er", "USD"))
    last_state = cr(local_kube, "er")
    local_kube.remove(*ER, "er", NAMESPACE)
    for _ in range(2):
        assert_ok(dispatch(router, Event.for_object("delete", last_state)))
        assert configmap(local_kube, "er") is None


def test_delete_handler_removes_the_configmap_even_before_gc(
        router: Router, local_kube: Any, requests_mock: rm.Mocker) -> None:
    """Where the garbage collector lags, the delete event itself cleans up."""
    requests_mock.get(base_url("EUR"), content=answer("EUR", "2026-11-20", USD="1.0812"))
    stored = add(router, local_kube, exchange_rate("er", "USD"))
    cm = configmap(local_kube, "er")
    assert cm is not None
    local_kube.remove(*ER, "er", NAMESPACE)
    if configmap(local_kube, "er") is None:  # GC was quick: put the orphan back
        orphan = {k: v for k, v in cm.items() if k != "status"}
        orphan["metadata"] = {k: v for k, v in cm["metadata"].items()
                              if k in ("name", "namespace", "labels", "ownerReferences")}
        local_kube.put(orphan)
    assert_ok(dispatch(router, Event.for_object("delete", stored)))
    assert configmap(local_kube, "er") is None


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


def test_name_longer_than_a_label_value_still_gets_its_configmap(
        router: Router, local_kube: Any, requests_mock: rm.Mocker) -> None:
    """Object names may be 253 characters, label values only 63: the instance label is
    shortened (with a hash) instead of the apply being refused."""
    name = "exchange-rate-" + "usd-" * 20 + "x"
    requests_mock.get(base_url("EUR"), content=answer("EUR", "2026-11-20", USD="1.08120"))
    add(router, local_kube, exchange_rate(name, "USD"))

    cm = configmap(local_kube, name)
    assert cm is not None and cm["data"]["rate"] == "1.08120"
    instance = cm["metadata"]["labels"]["app.kubernetes.io/instance"]
    assert len(instance) <= 63 and instance.startswith("exchange-rate-usd-")
    assert ready(cr(local_kube, name))["status"] == "True"


def test_configmap_created_by_someone_after_the_read_is_never_merged_into(
        router: Router, local_kube: Any, requests_mock: rm.Mocker) -> None:
    """Server-side apply would merge our keys and ownerReference into an object sharing no
    field with ours (so it would be deleted with the ExchangeRate): the ConfigMap is created
    with POST, which fails if the name is taken. Here it is made while the rate is fetched,
    after the handler saw no ConfigMap."""
    theirs = {"apiVersion": "v1", "kind": "ConfigMap",
              "metadata": {"name": "exchange-rate-usd", "namespace": NAMESPACE},
              "data": {"mine": "yes"}}
    made: list[Obj] = []

    def someone_creates_it_meanwhile(request: Any, context: Any) -> bytes:
        made.append(local_kube.put(theirs))
        return answer("EUR", "2026-11-20", USD="1.08120")
    requests_mock.get(base_url("EUR"), content=someone_creates_it_meanwhile)

    add(router, local_kube, exchange_rate("exchange-rate-usd", "USD"))

    cm = configmap(local_kube, "exchange-rate-usd")
    assert cm["data"] == {"mine": "yes"} and not cm["metadata"].get("ownerReferences")
    assert cm["metadata"]["resourceVersion"] == made[0]["metadata"]["resourceVersion"]
    assert ready(cr(local_kube, "exchange-rate-usd"))["reason"] == "ConfigMapConflict"


def test_configmap_of_an_earlier_exchange_rate_of_that_name_is_taken_over(
        router: Router, local_kube: Any, requests_mock: rm.Mocker) -> None:
    """Deleted and created again before the garbage collector ran: the ConfigMap's owner is
    replaced (not added to: two controller owners are refused), other owners are kept."""
    requests_mock.get(base_url("EUR"), content=answer("EUR", "2026-11-20", USD="1.08120"))
    other_owner = {"apiVersion": "v1", "kind": "ConfigMap", "name": "keeper", "uid": "u-keeper"}
    # Delivered as the watcher would: once answered, the router's cache holds it (put alone,
    # the ExchangeRate's run could meet it only as a create answered 409, a conflict until
    # the ConfigMap's own event arrives).
    add(router, local_kube, {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {
        "name": "exchange-rate-usd", "namespace": NAMESPACE,
        "ownerReferences": [other_owner, {
            "apiVersion": "eventop.dev/v1", "kind": "ExchangeRate", "name": "exchange-rate-usd",
            "uid": "u-earlier", "controller": True, "blockOwnerDeletion": True}]},
        "data": {"rate": "0.5"}})
    stored = add(router, local_kube, exchange_rate("exchange-rate-usd", "USD"))

    cm = configmap(local_kube, "exchange-rate-usd")
    assert cm["data"]["rate"] == "1.08120"
    assert [(r["name"], r["uid"]) for r in cm["metadata"]["ownerReferences"]] == [
        ("keeper", "u-keeper"), ("exchange-rate-usd", stored["metadata"]["uid"])]
    assert ready(cr(local_kube, "exchange-rate-usd"))["status"] == "True"
