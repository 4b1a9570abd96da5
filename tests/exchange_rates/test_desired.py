"""The ExchangeRate controller on the engine's in-memory World, requests-mock as provider:
what a rate's ConfigMap and status become, and how many provider requests that costs."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
import requests_mock as rm

from demo.provider import answer
from eventop.engine.testing import World
from eventop.events import PING_TYPE, REFRESH_TYPE
from eventop.handlers import exchange_rates
from eventop.handlers.events import Event
from eventop.handlers.exchange_rates import fetch, rates
from eventop.handlers.exchange_rates.desired import RETRY_UNFILLED_SECONDS
from eventop.handlers.exchange_rates.provider import (
    FrankfurterClient,
    ProviderRejected,
    ProviderUnavailable,
)
from tests.exchange_rates.support import (
    BASE_URL,
    NAMESPACE,
    Clock,
    base_url,
    exchange_rate,
    later,
)

pytestmark = pytest.mark.usefixtures("rates_client")

ER = "eventop.dev/v1/ExchangeRate"
Obj = dict[str, Any]



def configmap(world: World, name: str, namespace: str = NAMESPACE) -> Obj | None:
    return world.get("v1/ConfigMap", name, namespace)


def cr(world: World, name: str) -> Obj:
    found: Obj = world.get(ER, name, NAMESPACE)
    return found


def ready(world: World, name: str) -> Obj:
    return next(c for c in cr(world, name)["status"]["conditions"] if c["type"] == "Ready")


def warnings(world: World, name: str) -> list[str]:
    return [n.reason for who, n in world.events if who == name and n.type == "Warning"]


def configmap_writes(world: World) -> list[tuple[str, str, str, str]]:
    return [w for w in world.writes if w[1] == "ConfigMap"]


def added(world: World, obj: Obj) -> Obj:
    stored = world.put(obj)
    world.changed(rates, stored)
    return stored


def refresh(world: World, type_: str = REFRESH_TYPE) -> None:
    """A scheduled refresh, an hour after anything before it."""
    later()
    world.triggered(rates, Event.simple(type_))


def written_then_down(requests_mock: rm.Mocker) -> tuple[World, Obj]:
    """ExchangeRate ``er`` (USD) with its ConfigMap written from a good answer, then the
    provider down (503); the world and that ConfigMap."""
    requests_mock.get(base_url("EUR"), content=answer("EUR", "2026-11-20", USD="1.0812"))
    world = World()
    added(world, exchange_rate("er", "USD"))
    good = configmap(world, "er")
    assert good is not None
    requests_mock.get(base_url("EUR"), status_code=503)
    return world, good


def written_then_stale(requests_mock: rm.Mocker) -> tuple[World, Obj]:
    """ExchangeRate ``er`` (JPY) written from an answer of 2026-11-25 (170.01), then the
    provider answering with an older one (2026-10-01, 150.00); the world and that ConfigMap."""
    requests_mock.get(base_url("EUR"), content=answer("EUR", "2026-11-25", JPY="170.01"))
    world = World()
    added(world, exchange_rate("er", "JPY"))
    written = configmap(world, "er")
    assert written is not None
    requests_mock.get(base_url("EUR"), content=answer("EUR", "2026-10-01", JPY="150.00"))
    return world, written


# -- one ExchangeRate added or changed ---------------------------------------------------------

def test_added_exchange_rate_gets_an_owned_configmap_with_the_exact_rate(
        requests_mock: rm.Mocker) -> None:
    requests_mock.get(base_url("EUR"), content=answer("EUR", "2026-11-20", USD="1.08120"))
    world = World()
    stored = added(world, exchange_rate("exchange-rate-usd", "USD"))
    cm = configmap(world, "exchange-rate-usd")
    assert cm is not None
    assert cm["data"] == {"rate": "1.08120", "base": "EUR", "currency": "USD",
                          "date": "2026-11-20", "source": BASE_URL,
                          "fetchedAt": cm["data"]["fetchedAt"]}
    assert cm["data"]["fetchedAt"].startswith("2026-11-21T")
    (owner,) = cm["metadata"]["ownerReferences"]
    assert (owner["uid"], owner["kind"], owner["controller"]) == (
        stored["metadata"]["uid"], "ExchangeRate", True)
    assert cm["metadata"]["labels"]["app.kubernetes.io/instance"] == "exchange-rate-usd"
    assert requests_mock.last_request.qs == {"from": ["eur"], "to": ["usd"]}
    status = cr(world, "exchange-rate-usd")["status"]
    assert (status["rate"], status["date"]) == ("1.08120", "2026-11-20")
    assert status["lastSuccessfulFetch"] == cm["data"]["fetchedAt"]
    assert status["observedGeneration"] == 1
    assert ready(world, "exchange-rate-usd")["status"] == "True"
    assert world.writes == [("create", "ConfigMap", NAMESPACE, "exchange-rate-usd"),
                            ("status", "ExchangeRate", NAMESPACE, "exchange-rate-usd")]


def test_a_converged_exchange_rate_costs_no_provider_request(requests_mock: rm.Mocker) -> None:
    requests_mock.get(base_url("EUR"), content=answer("EUR", "2026-11-20", USD="1.0812"))
    world = World()
    added(world, exchange_rate("er", "USD"))
    writes = len(world.writes)
    world.changed(rates, cr(world, "er"))  # its own status write, or a restarted watcher
    assert requests_mock.call_count == 1
    assert len(world.writes) == writes


def test_spec_change_fetches_and_rewrites_at_once(requests_mock: rm.Mocker) -> None:
    requests_mock.get(base_url("EUR"), [
        {"content": answer("EUR", "2026-11-20", CHF="0.9391")},
        {"content": answer("EUR", "2026-11-20", GBP="0.8352")},
    ])
    world = World()
    stored = added(world, exchange_rate("er", "CHF"))
    world.changed(rates, world.put({**stored, "spec": {"currency": "GBP", "base": "EUR"},
                                    "metadata": {**stored["metadata"], "generation": 2}}))
    cm = configmap(world, "er")
    assert cm is not None and (cm["data"]["currency"], cm["data"]["rate"]) == ("GBP", "0.8352")
    status = cr(world, "er")["status"]
    assert (status["observedGeneration"], status["rate"]) == (2, "0.8352")


def test_a_configmap_deleted_by_hand_is_restored(requests_mock: rm.Mocker) -> None:
    requests_mock.get(base_url("EUR"), content=answer("EUR", "2026-11-20", USD="1.0812"))
    world = World()
    added(world, exchange_rate("er", "USD"))
    cm = configmap(world, "er")
    world.delete("v1/ConfigMap", "er", NAMESPACE)
    assert [str(r.key) for r in world.changed(rates, cm)] == [f"{NAMESPACE}/er"]
    assert configmap(world, "er")["data"]["rate"] == "1.0812"  # type: ignore[index]


def test_same_base_and_currency_is_reported_without_asking_the_provider(
        requests_mock: rm.Mocker) -> None:
    world = World()
    added(world, exchange_rate("er", "USD", base="USD"))
    assert requests_mock.call_count == 0
    assert configmap(world, "er") is None
    condition = ready(world, "er")
    assert (condition["status"], condition["reason"]) == ("False", "InvalidSpec")
    assert "pick a different base" in condition["message"]
    assert warnings(world, "er") == ["InvalidSpec"]


def test_an_unavailable_provider_is_reported_and_the_next_change_a_minute_later_asks_again(
        requests_mock: rm.Mocker) -> None:
    requests_mock.get(base_url("EUR"), status_code=503)
    world = World()
    stored = added(world, exchange_rate("er", "USD"))
    assert ready(world, "er")["reason"] == "ProviderUnavailable"
    assert configmap(world, "er") is None
    requests_mock.get(base_url("EUR"), content=answer("EUR", "2026-11-20", USD="1.0812"))
    later(fetch.TTL)  # (within it, the failure is reused: see the outage tests below)
    world.changed(rates, stored)
    assert configmap(world, "er")["data"]["rate"] == "1.0812"  # type: ignore[index]
    assert ready(world, "er")["status"] == "True"
    normal = [n for who, n in world.events if who == "er" and n.type == "Normal"]
    assert [(n.reason, n.message) for n in normal] == [
        ("Recovered", "ProviderUnavailable resolved: 1 EUR = 1.0812 USD on 2026-11-20")]
    world.changed(rates, cr(world, "er"))  # converged: no second one
    assert [n for who, n in world.events if who == "er" and n.type == "Normal"] == normal


def test_an_outage_before_any_rate_was_written_is_asked_again_without_waiting_for_the_refresh(
        requests_mock: rm.Mocker) -> None:
    requests_mock.get(base_url("EUR"), status_code=503)
    world = World()
    stored = world.put(exchange_rate("er", "USD"))
    [first] = world.changed(rates, stored)
    assert first.requeue_after == RETRY_UNFILLED_SECONDS
    requests_mock.get(base_url("EUR"), content=answer("EUR", "2026-11-20", USD="1.0812"))
    later(first.requeue_after)
    [again] = [world.reconcile(rates, "er", NAMESPACE)]  # what the queue runs when it is due
    assert again.requeue_after is None
    assert configmap(world, "er")["data"]["rate"] == "1.0812"  # type: ignore[index]


def test_an_outage_after_a_rate_was_written_waits_for_the_refresh_and_keeps_the_rate(
        requests_mock: rm.Mocker) -> None:
    world, _good = written_then_down(requests_mock)
    [result] = world.triggered(rates, Event.simple(REFRESH_TYPE))
    assert ready(world, "er")["reason"] == "ProviderUnavailable"
    assert result.requeue_after is None
    assert configmap(world, "er")["data"]["rate"] == "1.0812"  # type: ignore[index]


def test_an_answer_that_asking_again_can_not_fix_is_not_retried(requests_mock: rm.Mocker) -> None:
    requests_mock.get(base_url("EUR"), status_code=404, json={"message": "not found"})
    world = World()
    [result] = world.changed(rates, world.put(exchange_rate("er", "USD")))
    assert ready(world, "er")["status"] == "False"
    assert result.requeue_after is None


def test_a_foreign_configmap_of_the_same_name_is_left_alone(requests_mock: rm.Mocker) -> None:
    requests_mock.get(base_url("EUR"), content=answer("EUR", "2026-11-20", USD="1.0812"))
    world = World()
    foreign = world.put({"apiVersion": "v1", "kind": "ConfigMap",
                         "metadata": {"name": "er", "namespace": NAMESPACE},
                         "data": {"rate": "42"}})
    added(world, exchange_rate("er", "USD"))
    assert configmap(world, "er") == foreign
    condition = ready(world, "er")
    assert (condition["status"], condition["reason"]) == ("False", "ConfigMapConflict")
    assert warnings(world, "er") == ["ConfigMapConflict"]
    assert configmap_writes(world) == []


def test_a_configmap_made_by_someone_while_the_rate_was_fetched_is_never_merged_into(
        requests_mock: rm.Mocker) -> None:
    """The function read no ConfigMap; one appears before the engine writes: a conflict,
    reported, and the object left exactly as its maker wrote it."""
    world = World()
    theirs = {"apiVersion": "v1", "kind": "ConfigMap",
              "metadata": {"name": "er", "namespace": NAMESPACE}, "data": {"mine": "yes"}}

    def someone_creates_it_meanwhile(request: Any, context: Any) -> bytes:
        world.put(theirs)
        return answer("EUR", "2026-11-20", USD="1.08120")
    requests_mock.get(base_url("EUR"), content=someone_creates_it_meanwhile)
    added(world, exchange_rate("er", "USD"))
    cm = configmap(world, "er")
    assert cm is not None and cm["data"] == {"mine": "yes"}
    assert not cm["metadata"].get("ownerReferences")
    assert ready(world, "er")["reason"] == "ConfigMapConflict"
    assert configmap_writes(world) == []


def test_the_configmap_of_an_earlier_exchange_rate_of_that_name_is_taken_over(
        requests_mock: rm.Mocker) -> None:
    requests_mock.get(base_url("EUR"), content=answer("EUR", "2026-11-20", USD="1.08120"))
    keeper = {"apiVersion": "v1", "kind": "ConfigMap", "name": "keeper", "uid": "u-keeper"}
    world = World([{"apiVersion": "v1", "kind": "ConfigMap", "metadata": {
        "name": "exchange-rate-usd", "namespace": NAMESPACE,
        "ownerReferences": [keeper, {
            "apiVersion": "eventop.dev/v1", "kind": "ExchangeRate", "name": "exchange-rate-usd",
            "uid": "u-earlier", "controller": True, "blockOwnerDeletion": True}]},
        "data": {"rate": "0.5"}}])
    stored = added(world, exchange_rate("exchange-rate-usd", "USD"))
    cm = configmap(world, "exchange-rate-usd")
    assert cm is not None and cm["data"]["rate"] == "1.08120"
    assert [(r["name"], r["uid"]) for r in cm["metadata"]["ownerReferences"]] == [
        ("keeper", "u-keeper"), ("exchange-rate-usd", stored["metadata"]["uid"])]
    assert ready(world, "exchange-rate-usd")["status"] == "True"


# -- the scheduled refresh ---------------------------------------------------------------------

def test_refresh_of_many_exchange_rates_across_two_bases_makes_two_requests(
        requests_mock: rm.Mocker) -> None:
    wanted = [("usd", "USD", None, NAMESPACE), ("gbp", "GBP", "EUR", NAMESPACE),
              ("chf", "CHF", None, "treasury"), ("usd", "USD", "EUR", "treasury"),
              ("yen", "JPY", "USD", NAMESPACE), ("cad", "CAD", "USD", "treasury")]
    world = World([exchange_rate(name, currency, base, namespace=ns)
                   for name, currency, base, ns in wanted])
    requests_mock.get(base_url("EUR"), content=answer("EUR", "2026-11-20", USD="1.0812",
                                                      GBP="0.8352", CHF="0.9391"))
    requests_mock.get(base_url("USD"), content=answer("USD", "2026-11-20", JPY="153.94",
                                                      CAD="1.3985"))
    refresh(world)
    assert requests_mock.call_count == 2
    asked = sorted((r.qs["from"][0], r.qs["to"][0]) for r in requests_mock.request_history)
    assert asked == [("eur", "chf,gbp,usd"), ("usd", "cad,jpy")]
    rates_now = {(ns, name): configmap(world, name, ns)["data"]["rate"]  # type: ignore[index]
                 for name, _, _, ns in wanted}
    assert rates_now == {(NAMESPACE, "usd"): "1.0812", (NAMESPACE, "gbp"): "0.8352",
                         ("treasury", "chf"): "0.9391", ("treasury", "usd"): "1.0812",
                         (NAMESPACE, "yen"): "153.94", ("treasury", "cad"): "1.3985"}


def test_ping_from_knative_refreshes_like_the_cronjob(requests_mock: rm.Mocker) -> None:
    world = World([exchange_rate("er", "PLN")])
    requests_mock.get(base_url("EUR"), content=answer("EUR", "2026-11-20", PLN="4.2735"))
    refresh(world, PING_TYPE)
    assert configmap(world, "er")["data"]["rate"] == "4.2735"  # type: ignore[index]


def test_an_unchanged_rate_causes_no_configmap_write_but_status_records_the_fetch(
        requests_mock: rm.Mocker) -> None:
    requests_mock.get(base_url("EUR"), content=answer("EUR", "2026-11-20", USD="1.0812"))
    world = World()
    added(world, exchange_rate("er", "USD"))
    before, status_before = configmap(world, "er"), cr(world, "er")["status"]
    refresh(world)
    refresh(world)
    assert requests_mock.call_count == 3
    assert configmap(world, "er") == before  # fetchedAt did not move it either
    assert len(configmap_writes(world)) == 1
    status = cr(world, "er")["status"]
    assert status["lastSuccessfulFetch"] > status_before["lastSuccessfulFetch"]
    assert ready(world, "er")["lastTransitionTime"] == next(
        c for c in status_before["conditions"] if c["type"] == "Ready")["lastTransitionTime"]


def test_a_new_rate_or_date_is_written(requests_mock: rm.Mocker) -> None:
    requests_mock.get(base_url("EUR"), content=answer("EUR", "2026-11-20", USD="1.0812"))
    world = World()
    added(world, exchange_rate("er", "USD"))
    requests_mock.get(base_url("EUR"), content=answer("EUR", "2026-11-24", USD="1.0799"))
    refresh(world)
    cm = configmap(world, "er")
    assert cm is not None and (cm["data"]["date"], cm["data"]["rate"]) == ("2026-11-24",
                                                                          "1.0799")
    assert cr(world, "er")["status"]["rate"] == "1.0799"
    assert len(configmap_writes(world)) == 2


def test_a_failed_refresh_leaves_the_configmap_and_counts_a_warning_per_attempt(
        requests_mock: rm.Mocker) -> None:
    requests_mock.get(base_url("EUR"), content=answer("EUR", "2026-11-20", USD="1.0812"))
    world = World()
    added(world, exchange_rate("er", "USD"))
    before, good = configmap(world, "er"), cr(world, "er")["status"]
    requests_mock.get(base_url("EUR"), status_code=404, json={"message": "not found"})
    refresh(world)
    status_writes = len(world.writes)
    refresh(world)
    assert len(world.writes) == status_writes, "the same failure rewrites no status"
    assert configmap(world, "er") == before
    status = cr(world, "er")["status"]
    assert (status["rate"], status["lastSuccessfulFetch"]) == (good["rate"],
                                                               good["lastSuccessfulFetch"])
    condition = ready(world, "er")
    assert (condition["status"], condition["reason"]) == ("False", "ProviderRejected")
    assert warnings(world, "er") == ["ProviderRejected", "ProviderRejected"]
    assert requests_mock.call_count == 3


@pytest.mark.parametrize("harm", ["deleted", "edited"])
def test_during_an_outage_a_deleted_or_edited_configmap_gets_the_last_good_rate_back(
        requests_mock: rm.Mocker, harm: str) -> None:
    world, good = written_then_down(requests_mock)
    if harm == "deleted":
        world.delete("v1/ConfigMap", "er", NAMESPACE)
    else:
        world.put({**good, "data": {**good["data"], "rate": "999"}})
    world.changed(rates, cr(world, "er"))  # (the engine maps the ConfigMap's change to it)
    back = configmap(world, "er")
    assert back is not None and back["data"] == good["data"]
    assert ready(world, "er")["reason"] == "ProviderUnavailable"
    assert cr(world, "er")["status"]["rate"] == "1.0812"


def test_during_an_outage_a_rate_of_another_currency_is_never_written_back(
        requests_mock: rm.Mocker) -> None:
    world, _good = written_then_down(requests_mock)
    world.delete("v1/ConfigMap", "er", NAMESPACE)
    changed = cr(world, "er")
    changed = world.put({**changed, "spec": {**changed["spec"], "currency": "GBP"}})
    world.changed(rates, changed)
    assert configmap(world, "er") is None  # the USD rate is no GBP rate
    assert ready(world, "er")["reason"] == "ProviderUnavailable"


def test_during_an_outage_a_newer_rate_another_replica_wrote_is_left_alone(
        requests_mock: rm.Mocker) -> None:
    world, good = written_then_down(requests_mock)
    newer = {**good["data"], "rate": "1.0900", "date": "2026-11-21",
             "fetchedAt": "2999-01-01T00:00:00Z"}
    world.put({**good, "data": newer})
    world.changed(rates, cr(world, "er"))
    assert configmap(world, "er")["data"] == newer  # type: ignore[index]


def test_a_refresh_failure_of_one_base_does_not_stop_the_other(requests_mock: rm.Mocker) -> None:
    world = World([exchange_rate("eur-usd", "USD"), exchange_rate("usd-jpy", "JPY", base="USD")])
    requests_mock.get(base_url("EUR"), status_code=500)
    requests_mock.get(base_url("USD"), content=answer("USD", "2026-11-20", JPY="153.94"))
    refresh(world)
    assert configmap(world, "eur-usd") is None
    assert ready(world, "eur-usd")["reason"] == "ProviderUnavailable"
    assert configmap(world, "usd-jpy")["data"]["rate"] == "153.94"  # type: ignore[index]


def test_a_refresh_answer_without_a_currency_fails_only_that_rate_with_one_request(
        requests_mock: rm.Mocker) -> None:
    world = World([exchange_rate("usd", "USD"), exchange_rate("cad", "CAD")])
    requests_mock.get(base_url("EUR"), content=answer("EUR", "2026-11-20", USD="1.0812"))
    refresh(world)
    assert requests_mock.call_count == 1
    assert configmap(world, "usd")["data"]["rate"] == "1.0812"  # type: ignore[index]
    assert configmap(world, "cad") is None
    condition = ready(world, "cad")
    assert condition["reason"] == "MalformedAnswer"
    assert "without a rate for CAD" in condition["message"]


@pytest.mark.parametrize(("usd", "problem"), [("-1.5", "a non-positive rate for USD: -1.5"),
                                               ("1e400", "out of the range of a 64-bit float")])
def test_a_bad_rate_in_a_refresh_answer_fails_only_that_currency_and_the_others_are_written(
        requests_mock: rm.Mocker, usd: str, problem: str) -> None:
    world = World([exchange_rate("usd", "USD"), exchange_rate("cad", "CAD"),
                   exchange_rate("jpy", "JPY")])
    requests_mock.get(base_url("EUR"), content=answer("EUR", "2026-11-20", USD="1.0812",
                                                      CAD="1.4521", JPY="166.12"))
    refresh(world)
    requests_mock.get(base_url("EUR"), content=answer("EUR", "2026-11-25", USD=usd,
                                                      CAD="1.4600", JPY="170.01"))
    refresh(world)
    assert requests_mock.call_count == 2
    assert configmap(world, "cad")["data"]["rate"] == "1.4600"  # type: ignore[index]
    assert configmap(world, "jpy")["data"]["rate"] == "170.01"  # type: ignore[index]
    assert ready(world, "jpy")["status"] == "True"
    assert configmap(world, "usd")["data"]["rate"] == "1.0812"  # type: ignore[index]
    assert cr(world, "usd")["status"]["rate"] == "1.0812"
    condition = ready(world, "usd")
    assert (condition["status"], condition["reason"]) == ("False", "MalformedAnswer")
    assert problem in condition["message"]


def test_an_answer_published_before_the_rate_held_never_overwrites_it(
        requests_mock: rm.Mocker) -> None:
    world, written = written_then_stale(requests_mock)
    refresh(world)
    assert configmap(world, "er") == written
    status = cr(world, "er")["status"]
    assert (status["rate"], status["date"]) == ("170.01", "2026-11-25")
    condition = ready(world, "er")
    assert (condition["status"], condition["reason"]) == ("True", "StaleAnswer")
    assert "150.00 on 2026-10-01" in condition["message"]
    assert "170.01 JPY on 2026-11-25 kept" in condition["message"]
    assert warnings(world, "er") == ["StaleAnswer"]
    refresh(world)
    assert warnings(world, "er") == ["StaleAnswer"], "a stale answer again posts nothing new"
    requests_mock.get(base_url("EUR"), content=answer("EUR", "2026-11-26", JPY="171.50"))
    refresh(world)
    assert configmap(world, "er")["data"]["rate"] == "171.50"  # type: ignore[index]
    assert ready(world, "er")["reason"] == "RateFetched"


def test_while_answers_are_stale_a_deleted_configmap_gets_the_held_rate_back(
        requests_mock: rm.Mocker) -> None:
    world, written = written_then_stale(requests_mock)
    world.delete("v1/ConfigMap", "er", NAMESPACE)
    world.changed(rates, written)
    back = configmap(world, "er")
    assert back is not None and back["data"] == written["data"]  # type: ignore[index]
    assert ready(world, "er")["reason"] == "StaleAnswer"


def test_a_configmap_that_lost_its_owner_reference_but_has_our_labels_is_adopted_again(
        requests_mock: rm.Mocker) -> None:
    requests_mock.get(base_url("EUR"), content=answer("EUR", "2026-11-20", USD="1.0812"))
    world = World()
    stored = added(world, exchange_rate("exchange-rate-usd", "USD"))
    cm = configmap(world, "exchange-rate-usd")
    assert cm is not None
    world.put({**cm, "metadata": {k: v for k, v in cm["metadata"].items()
                                  if k != "ownerReferences"}})
    refresh(world)
    again = configmap(world, "exchange-rate-usd")
    assert again is not None and again["data"]["rate"] == "1.0812"
    assert [r["uid"] for r in again["metadata"]["ownerReferences"]] == [
        stored["metadata"]["uid"]]
    assert ready(world, "exchange-rate-usd")["status"] == "True"


@pytest.mark.parametrize("labels", [
    {"app.kubernetes.io/managed-by": "eventop"},
    {"app.kubernetes.io/name": "exchange-rate", "app.kubernetes.io/instance": "other",
     "app.kubernetes.io/component": "rates", "app.kubernetes.io/managed-by": "eventop"},
])
def test_a_configmap_without_all_our_labels_for_this_name_stays_a_conflict(
        requests_mock: rm.Mocker, labels: dict[str, str]) -> None:
    requests_mock.get(base_url("EUR"), content=answer("EUR", "2026-11-20", USD="1.0812"))
    world = World()
    foreign = world.put({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {
        "name": "er", "namespace": NAMESPACE, "labels": labels}, "data": {"rate": "42"}})
    added(world, exchange_rate("er", "USD"))
    assert configmap(world, "er") == foreign
    assert ready(world, "er")["reason"] == "ConfigMapConflict"
    assert configmap_writes(world) == []


def test_a_configmap_with_our_labels_that_another_controller_owns_stays_a_conflict(
        requests_mock: rm.Mocker) -> None:
    requests_mock.get(base_url("EUR"), content=answer("EUR", "2026-11-20", USD="1.0812"))
    world = World()
    labels = {"app.kubernetes.io/name": "exchange-rate", "app.kubernetes.io/instance": "er",
              "app.kubernetes.io/component": "rates", "app.kubernetes.io/managed-by": "eventop"}
    theirs = world.put({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {
        "name": "er", "namespace": NAMESPACE, "labels": labels, "ownerReferences": [{
            "apiVersion": "apps/v1", "kind": "Deployment", "name": "x", "uid": "u-x",
            "controller": True}]}, "data": {"rate": "42"}})
    added(world, exchange_rate("er", "USD"))
    assert configmap(world, "er") == theirs
    assert ready(world, "er")["reason"] == "ConfigMapConflict"


def test_a_refresh_reports_invalid_specs_and_asks_only_for_the_valid(
        requests_mock: rm.Mocker) -> None:
    world = World([exchange_rate("usd", "USD"), exchange_rate("same", "USD", base="USD")])
    requests_mock.get(base_url("EUR"), content=answer("EUR", "2026-11-20", USD="1.0812"))
    refresh(world)
    assert [(r.qs["from"][0], r.qs["to"][0]) for r in requests_mock.request_history] == [
        ("eur", "usd")]
    assert ready(world, "same")["reason"] == "InvalidSpec"


def test_a_refresh_with_no_exchange_rates_asks_nothing(requests_mock: rm.Mocker) -> None:
    refresh(World())
    assert requests_mock.call_count == 0


def test_a_name_longer_than_a_label_value_still_gets_its_configmap(
        requests_mock: rm.Mocker) -> None:
    name = "exchange-rate-" + "usd-" * 20 + "x"
    requests_mock.get(base_url("EUR"), content=answer("EUR", "2026-11-20", USD="1.08120"))
    world = World()
    added(world, exchange_rate(name, "USD"))
    cm = configmap(world, name)
    assert cm is not None and cm["data"]["rate"] == "1.08120"
    instance = cm["metadata"]["labels"]["app.kubernetes.io/instance"]
    assert len(instance) <= 63 and instance.startswith("exchange-rate-usd-")


def test_429s_that_outlast_the_retries_are_reported_as_rate_limiting_not_an_outage(
        requests_mock: rm.Mocker) -> None:
    requests_mock.get(base_url("EUR"), status_code=429, headers={"Retry-After": "0"})
    world = World()
    [result] = world.changed(rates, world.put(exchange_rate("er", "USD")))
    condition = ready(world, "er")
    assert (condition["status"], condition["reason"]) == ("False", "ProviderRateLimited")
    assert "rate limited (429)" in condition["message"]
    assert "reachable from the cluster" not in condition["message"]
    assert result.requeue_after == RETRY_UNFILLED_SECONDS  # no rate yet: asked again soon


# -- answers from the future ------------------------------------------------------------------

TODAY = "2026-12-02"


@pytest.fixture
def today(monkeypatch: pytest.MonkeyPatch) -> str:
    """The handler's "now" (what it also writes in status) is on :data:`TODAY`."""
    monkeypatch.setattr(exchange_rates, "now_rfc3339", lambda: f"{TODAY}T09:30:00Z")
    return TODAY


def test_an_answer_dated_after_tomorrow_is_refused_and_the_last_good_rate_kept(
        requests_mock: rm.Mocker, today: str) -> None:
    requests_mock.get(base_url("EUR"), content=answer("EUR", "2026-12-01", USD="1.0812"))
    world = World()
    added(world, exchange_rate("er", "USD"))
    good = configmap(world, "er")
    requests_mock.get(base_url("EUR"), content=answer("EUR", "2099-12-31", USD="9.9999"))
    refresh(world)
    assert configmap(world, "er") == good
    assert cr(world, "er")["status"]["date"] == "2026-12-01"
    condition = ready(world, "er")
    assert (condition["status"], condition["reason"]) == ("False", "ImplausibleDate")
    assert "2099-12-31" in condition["message"] and today in condition["message"]
    assert warnings(world, "er") == ["ImplausibleDate"]
    # the next real answer is written: nothing from the future was held against it
    requests_mock.get(base_url("EUR"), content=answer("EUR", today, USD="1.0830"))
    refresh(world)
    assert configmap(world, "er")["data"]["rate"] == "1.0830"  # type: ignore[index]
    assert ready(world, "er")["reason"] == "RateFetched"


def test_an_answer_dated_tomorrow_is_a_rate(requests_mock: rm.Mocker, today: str) -> None:
    """ECB publishes for the current day; a provider a time zone ahead of UTC is already
    on tomorrow."""
    requests_mock.get(base_url("EUR"), content=answer("EUR", "2026-12-03", USD="1.0812"))
    world = World()
    added(world, exchange_rate("er", "USD"))
    assert configmap(world, "er")["data"]["date"] == "2026-12-03"  # type: ignore[index]
    assert ready(world, "er")["reason"] == "RateFetched"


def test_a_held_date_after_tomorrow_does_not_stop_newer_real_answers(
        requests_mock: rm.Mocker, monkeypatch: pytest.MonkeyPatch) -> None:
    """An older version wrote an answer dated 2099-12-31 (as if its clock said so); the
    next real answer replaces it, instead of being refused as older for 73 years."""
    requests_mock.get(base_url("EUR"), content=answer("EUR", "2099-12-31", USD="9.9999"))
    world = World()
    monkeypatch.setattr(exchange_rates, "now_rfc3339", lambda: "2099-12-31T00:00:00Z")
    added(world, exchange_rate("er", "USD"))
    assert cr(world, "er")["status"]["date"] == "2099-12-31"
    monkeypatch.setattr(exchange_rates, "now_rfc3339", lambda: f"{TODAY}T09:30:00Z")
    requests_mock.get(base_url("EUR"), content=answer("EUR", TODAY, USD="1.0830"))
    refresh(world)
    cm = configmap(world, "er")
    assert cm is not None and (cm["data"]["rate"], cm["data"]["date"]) == ("1.0830", TODAY)
    assert (ready(world, "er")["status"], ready(world, "er")["reason"]) == ("True",
                                                                            "RateFetched")


# -- what an outage or a redelivered refresh costs --------------------------------------------

def test_a_refresh_delivered_again_within_a_minute_asks_the_provider_nothing_more(
        requests_mock: rm.Mocker) -> None:
    """The router answered 503 (the API server was down) and the sender delivered the
    refresh again: the answers of the first delivery serve it."""
    requests_mock.get(base_url("EUR"), content=answer("EUR", "2026-11-20", USD="1.0812"))
    requests_mock.get(base_url("USD"), content=answer("USD", "2026-11-20", JPY="153.94"))
    world = World()
    world.put(exchange_rate("eur-usd", "USD"))
    world.put(exchange_rate("usd-jpy", "JPY", base="USD"))
    refresh(world)
    assert requests_mock.call_count == 2
    for _ in range(5):
        later(5)
        world.triggered(rates, Event.simple(REFRESH_TYPE))
    assert requests_mock.call_count == 2
    assert configmap(world, "usd-jpy")["data"]["rate"] == "153.94"  # type: ignore[index]
    refresh(world)  # the next hour's asks again
    assert requests_mock.call_count == 4


def test_during_an_outage_new_exchange_rates_of_one_base_share_one_failed_request_a_minute(
        requests_mock: rm.Mocker) -> None:
    requests_mock.get(base_url("EUR"), status_code=500)
    world = World()
    results = [result for c in ("USD", "GBP", "CHF", "JPY", "PLN")
               for result in world.changed(rates, world.put(exchange_rate(f"er-{c.lower()}",
                                                                          c)))]
    attempts = requests_mock.call_count
    assert attempts == 4  # one fetch, with the client's retries
    assert {ready(world, f"er-{c}")["reason"] for c in ("usd", "gbp", "chf", "jpy", "pln")} \
        == {"ProviderUnavailable"}
    # the every-minute retry of those without a rate: one fetch again, not five
    due = max(r.requeue_after or 0 for r in results)
    assert due == RETRY_UNFILLED_SECONDS
    later(due)
    for c in ("usd", "gbp", "chf", "jpy", "pln"):
        world.reconcile(rates, f"er-{c}", NAMESPACE)
    assert requests_mock.call_count == 2 * attempts
    # the provider back: the next retry, a minute on, fills them all
    requests_mock.get(base_url("EUR"), content=answer(
        "EUR", "2026-11-20", USD="1.08", GBP="0.83", CHF="0.93", JPY="170.0", PLN="4.27"))
    later(due)
    for c in ("usd", "gbp", "chf", "jpy", "pln"):
        world.reconcile(rates, f"er-{c}", NAMESPACE)
        assert ready(world, f"er-{c}")["status"] == "True"


def test_after_a_failed_refresh_the_runs_that_follow_reuse_its_failure(
        requests_mock: rm.Mocker, monkeypatch: pytest.MonkeyPatch) -> None:
    """Even though each status reporting the failure was decided after it came (the runs
    follow the refresh by seconds): that is the same news, not newer."""
    requests_mock.get(base_url("EUR"), content=answer("EUR", "2026-11-20", USD="1.08",
                                                      GBP="0.83"))
    world = World()
    added(world, exchange_rate("usd", "USD"))
    added(world, exchange_rate("gbp", "GBP"))
    requests_mock.get(base_url("EUR"), status_code=503)
    monkeypatch.setattr(fetch, "now_rfc3339", lambda: "2026-11-29T10:00:00Z")  # the failure
    monkeypatch.setattr(exchange_rates, "now_rfc3339", lambda: "2026-11-29T10:00:02Z")
    refresh(world)
    asked = requests_mock.call_count
    later(20)
    for name in ("usd", "gbp"):  # its status written elsewhere, its ConfigMap edited...
        world.changed(rates, cr(world, name))
    assert requests_mock.call_count == asked
    assert ready(world, "usd")["reason"] == ready(world, "gbp")["reason"] == \
        "ProviderUnavailable"


def test_a_rejected_currency_does_not_stop_another_currency_of_its_base_being_asked(
        requests_mock: rm.Mocker) -> None:
    """A 404 is about what was asked: a spec that fixes the currency asks at once."""
    requests_mock.get(base_url("EUR"), status_code=404, json={"message": "not found"})
    world = World()
    stored = added(world, exchange_rate("er", "CHF"))
    assert ready(world, "er")["reason"] == "ProviderRejected"
    requests_mock.get(base_url("EUR"), content=answer("EUR", "2026-11-20", GBP="0.8352"))
    world.changed(rates, world.put({**cr(world, "er"), "spec": {"currency": "GBP"},
                                    "metadata": {**stored["metadata"], "generation": 2}}))
    assert configmap(world, "er")["data"]["rate"] == "0.8352"  # type: ignore[index]


def test_a_kept_failure_is_not_reported_over_a_success_another_replica_wrote_after_it(
        requests_mock: rm.Mocker) -> None:
    requests_mock.get(base_url("EUR"), status_code=503)
    world = World()
    added(world, exchange_rate("er", "USD"))  # this process keeps that failure
    requests_mock.get(base_url("EUR"), content=answer("EUR", "2026-11-20", USD="1.0812"))
    theirs = cr(world, "er")
    theirs["status"] = {**theirs["status"], "lastSuccessfulFetch": "2099-01-01T00:00:00Z"}
    world.changed(rates, world.put(theirs))
    assert requests_mock.call_count == 5  # asked again, rather than report the old failure
    assert ready(world, "er")["status"] == "True"


def test_concurrent_fetches_of_one_base_during_an_outage_ask_once(
        requests_mock: rm.Mocker) -> None:
    """The router's workers run ExchangeRates of one base at the same time: one asks, the
    others wait for it and take its failure."""

    def slow_error(request: Any, context: Any) -> str:
        time.sleep(0.02)
        context.status_code = 503
        return "busy"

    requests_mock.get(base_url("EUR"), text=slow_error)
    clock = Clock()
    kept = fetch.Answers(FrankfurterClient(BASE_URL, sleep=clock.advance, clock=clock))
    got: list[object] = []
    threads = [threading.Thread(target=lambda c=c: got.append(kept.fetch("EUR", c)))
               for c in ("USD", "GBP", "CHF", "JPY", "PLN")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert requests_mock.call_count == 4
    assert len(got) == 5 and all(isinstance(r, ProviderUnavailable) for r in got)


def test_runs_of_a_bases_currencies_that_succeed_ask_side_by_side(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A reviewer: with one lock per base held while asking, 30 new ExchangeRates of a base
    on a slow provider fetched one behind the other, each holding a router thread. (The
    client's request is replaced: requests-mock answers one request at a time.)"""
    lock = threading.Lock()
    flying, most, asked = [0], [0], []
    client = FrankfurterClient(BASE_URL)

    def slow_latest(base: str, currencies: Any, *, deadline: Any = None) -> Any:
        with lock:
            flying[0] += 1
            most[0] = max(most[0], flying[0])
            asked.append(sorted(currencies))
        time.sleep(0.2)
        with lock:
            flying[0] -= 1
        raise ProviderRejected(f"no {sorted(currencies)} today")  # a per-currency answer

    monkeypatch.setattr(client, "latest", slow_latest)
    kept = fetch.Answers(client)
    threads = [threading.Thread(target=kept.fetch, args=("EUR", c))
               for c in ("USD", "GBP", "CHF", "JPY", "PLN")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(asked) == [["CHF"], ["GBP"], ["JPY"], ["PLN"], ["USD"]]
    assert most[0] >= 2


def test_a_failure_another_exchange_rates_fetch_met_is_not_news_to_a_converged_one(
        requests_mock: rm.Mocker) -> None:
    """Only runs that would ask take it: a label edit of a converged ExchangeRate during an
    outage turned it Ready=False, though no request for it failed."""
    requests_mock.get(base_url("EUR"), status_code=503, text="busy")
    clock = Clock()
    kept = fetch.Answers(FrankfurterClient(BASE_URL, sleep=clock.advance, clock=clock))
    assert isinstance(kept.fetch("EUR", "USD"), ProviderUnavailable)
    assert kept.recent("EUR", "GBP", run_failures=False) is None
    assert isinstance(kept.recent("EUR", "GBP"), ProviderUnavailable)


def test_the_refresh_log_line_counts_bases_asked_not_http_requests(
        requests_mock: rm.Mocker, caplog: pytest.LogCaptureFixture) -> None:
    requests_mock.get(base_url("EUR"), [{"status_code": 500}, {"status_code": 500},
                                        {"content": answer("EUR", "2026-11-20", USD="1.08")}])
    requests_mock.get(base_url("USD"), content=answer("USD", "2026-11-20", JPY="153.94"))
    world = World()
    world.put(exchange_rate("eur-usd", "USD"))
    world.put(exchange_rate("usd-jpy", "JPY", base="USD"))
    caplog.set_level("INFO", logger="eventop.exchange_rates")
    refresh(world)
    world.triggered(rates, Event.simple(REFRESH_TYPE))  # delivered again
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("refresh:")]
    assert lines == [
        "refresh: 2 ExchangeRate(s), 2 base(s) asked of the provider, 0 answered from the "
        "last 60s",
        "refresh: 2 ExchangeRate(s), 0 base(s) asked of the provider, 2 answered from the "
        "last 60s"]
    assert requests_mock.call_count == 4  # (what the line does not claim to count)


def test_a_key_added_by_hand_stays_until_the_next_new_rate_replaces_the_data(
        requests_mock: rm.Mocker) -> None:
    """What the ConfigMap holds beyond eventop's keys (desired.py's docstring says so)."""
    requests_mock.get(base_url("EUR"), content=answer("EUR", "2026-11-20", USD="1.0812"))
    world = World()
    added(world, exchange_rate("er", "USD"))
    cm = configmap(world, "er")
    assert cm is not None
    world.changed(rates, world.put({**cm, "data": {**cm["data"], "note": "by hand"}}))
    refresh(world)
    assert configmap(world, "er")["data"]["note"] == "by hand"  # type: ignore[index]
    requests_mock.get(base_url("EUR"), content=answer("EUR", "2026-11-23", USD="1.0799"))
    refresh(world)
    assert "note" not in configmap(world, "er")["data"]  # type: ignore[index]


def test_a_provider_too_slow_for_every_base_leaves_out_other_bases_at_each_refresh(
        requests_mock: rm.Mocker) -> None:
    """The bases were asked in alphabetical order under one budget: with a slow provider the
    last ones were never asked, refresh after refresh, and their ExchangeRates said "no
    attempt made ... (is the provider reachable from the cluster?)" (a user's trial)."""
    clock = Clock()
    client = FrankfurterClient(BASE_URL, sleep=clock.advance, clock=clock, refresh_budget=20.0)
    asked: list[str] = []

    def slowly(base: str) -> Any:
        def respond(request: Any, context: Any) -> bytes:
            asked.append(base)
            clock.advance(9.0)  # answers within the read timeout, slowly
            return answer(base, "2026-11-20", **{"USD" if base != "USD" else "EUR": "1.1"})
        return respond

    for base in ("CHF", "EUR", "GBP", "JPY"):
        requests_mock.get(base_url(base), content=slowly(base))
    kept = fetch.Answers(client, clock=clock)
    wanted = {base: {"USD"} for base in ("CHF", "EUR", "GBP", "JPY")}
    kept.refresh(wanted)
    assert asked == ["CHF", "EUR"]  # 18 s: less left than an answer may take (10 s)
    left_out = kept.recent("JPY", "USD")
    assert isinstance(left_out, ProviderUnavailable)
    assert left_out.message == (
        f"{BASE_URL}/latest?from=JPY: not asked: the refresh's 20s went to other base "
        "currencies first (the provider answers slowly); it is asked first at the next "
        "refresh")
    asked.clear()
    kept.refresh(wanted)  # within the minute (a redelivery): "not asked" is no answer
    assert asked == ["GBP", "JPY"]
    clock.advance(3600)
    asked.clear()
    kept.refresh(wanted)
    assert asked == ["CHF", "EUR"]


def test_a_base_the_refresh_had_no_time_for_leaves_a_converged_exchange_rate_as_it_is(
        requests_mock: rm.Mocker) -> None:
    """Not asked is no news: such ExchangeRates went Ready=False with a Warning each, their
    rate less than a tick old (a user's trial: 50-61 of them at every tick)."""
    requests_mock.get(base_url("EUR"), content=answer("EUR", "2026-11-20", USD="1.0812"))
    world = World()
    added(world, exchange_rate("er", "USD"))
    before = cr(world, "er")["status"]
    events, writes = len(world.events), len(world.writes)
    later()
    kept = fetch.answers()
    kept._keep(kept._refreshed, "EUR", {"USD"}, ProviderUnavailable(
        "not asked: the refresh's 40s went to other base currencies first", not_asked=True))
    world.reconcile(rates, "er", NAMESPACE)
    assert cr(world, "er")["status"] == before
    assert (len(world.events), len(world.writes)) == (events, writes)
