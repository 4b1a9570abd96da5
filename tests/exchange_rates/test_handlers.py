"""The ExchangeRate handlers against the local API server, with requests-mock as provider."""

from __future__ import annotations

from typing import Any

import pytest
import requests_mock as rm

from demo.provider import answer
from eventop.handlers.events import Event
from eventop.handlers.exchange_rates import fetch
from eventop.testing.waiting import wait_until
from tests.exchange_rates.support import (
    BASE_URL,
    ER,
    NAMESPACE,
    Router,
    add,
    assert_ok,
    base_url,
    configmap,
    cr,
    dispatch,
    exchange_rate,
    later,
    ready,
    warnings,
)

pytestmark = pytest.mark.usefixtures("rates_client", "finance")

Obj = dict[str, Any]



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


def test_a_configmap_edited_during_an_outage_is_written_back_after_one_fetch_not_two(
        router: Router, local_kube: Any, requests_mock: rm.Mocker,
        rates_client: Any) -> None:
    """The write-back's status is about the provider, not about the ConfigMap written, so
    no run follows the write to look at it: that run asked the provider again, 8 requests
    for one hand edit instead of 4 (a reviewer's count on a real API server)."""
    requests_mock.get(base_url("EUR"), content=answer("EUR", "2026-11-20", USD="1.0812"))
    add(router, local_kube, exchange_rate("er", "USD"))
    requests_mock.get(base_url("EUR"), status_code=500)
    before = requests_mock.call_count
    cm = configmap(local_kube, "er")
    edited = local_kube.put({**cm, "data": {**cm["data"], "rate": "7"}})  # type: ignore[index]
    assert_ok(dispatch(router, Event.for_object("update", edited)))
    assert configmap(local_kube, "er")["data"]["rate"] == "1.0812"  # type: ignore[index]
    # a run after the write would start once the cache holds it: wait until nothing runs
    assert wait_until(router.engine.queue.idle, 10)
    assert requests_mock.call_count - before == rates_client.max_attempts


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
    later(fetch.TTL)  # (within it, the failure just met is reused)
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


def test_an_exchange_rate_held_back_by_a_foreign_configmap_writes_its_own_once_it_is_gone(
        router: Router, local_kube: Any, requests_mock: rm.Mocker) -> None:
    """ConfigMapConflict says "delete or rename it". Its deletion maps to no ExchangeRate
    (nobody owns it), so the rate stayed missing until the hourly refresh (found on a real
    API server); the engine now runs the ExchangeRate again when that ConfigMap goes."""
    requests_mock.get(base_url("EUR"), content=answer("EUR", "2026-11-20", USD="1.0812"))
    foreign = local_kube.put({"apiVersion": "v1", "kind": "ConfigMap",
                              "metadata": {"name": "er", "namespace": NAMESPACE},
                              "data": {"rate": "42"}})
    add(router, local_kube, exchange_rate("er", "USD"))
    assert ready(cr(local_kube, "er"))["reason"] == "ConfigMapConflict"
    local_kube.remove("v1", "ConfigMap", "er", NAMESPACE)
    assert_ok(dispatch(router, Event.for_object("delete", foreign)))
    assert configmap(local_kube, "er")["data"]["rate"] == "1.0812"
    assert ready(cr(local_kube, "er"))["status"] == "True"


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


def test_own_configmap_whose_owner_reference_was_removed_is_adopted_again_at_once(
        router: Router, local_kube: Any, requests_mock: rm.Mocker) -> None:
    """``kubectl patch cm ... remove /metadata/ownerReferences``: the ConfigMap still carries
    eventop's labels for this ExchangeRate, so its change brings the ExchangeRate's run,
    which takes it back (no ConfigMapConflict)."""
    requests_mock.get(base_url("EUR"), content=answer("EUR", "2026-11-20", USD="1.08120"))
    stored = add(router, local_kube, exchange_rate("exchange-rate-usd", "USD"))
    cm = configmap(local_kube, "exchange-rate-usd")
    assert cm is not None
    orphan = local_kube.put({**cm, "metadata": {k: v for k, v in cm["metadata"].items()
                                                if k != "ownerReferences"}})
    assert not orphan["metadata"].get("ownerReferences")
    assert_ok(dispatch(router, Event.for_object("update", orphan)))

    cm = configmap(local_kube, "exchange-rate-usd")
    assert [r["uid"] for r in cm["metadata"]["ownerReferences"]] == [stored["metadata"]["uid"]]
    assert cm["data"]["rate"] == "1.08120"
    condition = ready(cr(local_kube, "exchange-rate-usd"))
    assert (condition["status"], condition["reason"]) == ("True", "RateFetched")
    assert warnings(local_kube, "exchange-rate-usd") == []
