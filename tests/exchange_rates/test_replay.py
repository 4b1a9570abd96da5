"""Replay the recorded ExchangeRate traffic of ``mirrors-and-rates`` with a mocked provider.

The recording: ``exchange-rate-usd`` and ``exchange-rate-chf`` created in ``finance``; ``chf``
switched to GBP; ``chf`` deleted. Afterwards the ConfigMap of ``usd`` holds the mocked USD
rate, and of ``chf`` nothing is left; in between it held the GBP rate.

Twice: handlers run in-process by the engine (requests-mock answers the provider), and through the
whole pipeline (router under gunicorn in a subprocess, where requests-mock can not reach: a
loopback stand-in answers instead, named by ``RATES_API_URL``).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests_mock as rm

from demo.provider import RatesStandIn, answer
from eventop.events import REFRESH_TYPE
from eventop.handlers.events import Event
from eventop.testing import LocalCluster, replay
from tests.exchange_rates.support import (
    BASE_URL,
    STANDIN_RATES,
    Router,
    assert_ok,
    dispatch,
)
from tests.support.apiserver import local_kube_server

RECORDING = Path(__file__).resolve().parents[1] / "recordings" / "mirrors-and-rates"
PATHS = [RECORDING / "apis_eventop.dev_v1_exchangerates.list.json",
         RECORDING / "apis_eventop.dev_v1_exchangerates.watch.jsonl"]
NS = "finance"
Obj = dict[str, Any]


def rates_configmap(get: Any, name: str) -> Obj | None:
    cm: Obj | None = get("v1", "ConfigMap", name, NS)
    return cm


def check_after(change: str, obj: Obj, get: Any, seen: dict[str, list[str]]) -> None:
    """After each recorded change, what the ConfigMap of that ExchangeRate must hold."""
    name = obj["metadata"]["name"]
    cm = rates_configmap(get, name)
    if change == "delete":
        assert cm is None, f"{name} deleted but its ConfigMap is left"
        seen.setdefault(name, []).append("gone")
        return
    assert cm is not None, f"{name} has no ConfigMap after {change}"
    currency = obj["spec"]["currency"]
    assert cm["data"]["currency"] == currency
    assert cm["data"]["rate"] == STANDIN_RATES["EUR"][currency]
    seen.setdefault(name, []).append(f"{currency}={cm['data']['rate']}")


@pytest.fixture
def local_kube() -> Iterator[Any]:
    """As a real cluster's garbage collector does, the local API server collects an object
    whose owner is gone: the run of the ExchangeRate's delete event may read the ExchangeRate
    from a cache that has not seen the deletion yet, and write its ConfigMap once more."""
    with local_kube_server(gc_dangling=True) as server:
        yield server


def test_recorded_session_in_process_asks_once_per_change_and_removes_deleted_rates(
        router: Router, local_kube: Any, rates_client: Any, requests_mock: rm.Mocker) -> None:
    requests_mock.get(f"{BASE_URL}/latest?from=EUR",
                      content=answer("EUR", "2026-11-20", **STANDIN_RATES["EUR"]))
    local_kube.put({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
    seen: dict[str, list[str]] = {}
    replay(
        LocalCluster(local=local_kube), PATHS,
        lambda change, obj: assert_ok(
            dispatch(router, Event.for_object(change, obj))),
        after_each=lambda change, obj: check_after(change, obj, local_kube.get, seen))

    assert seen == {"exchange-rate-usd": ["USD=1.0812"],
                    "exchange-rate-chf": ["CHF=0.9391", "GBP=0.8352", "gone"]}
    usd = rates_configmap(local_kube.get, "exchange-rate-usd")
    assert usd is not None
    assert usd["data"]["base"] == "EUR"
    assert local_kube.get("eventop.dev/v1", "ExchangeRate", "exchange-rate-chf", NS) is None
    leftovers = [cm["metadata"]["name"] for cm in local_kube.list("v1", "ConfigMap", NS)
                 if "chf" in cm["metadata"]["name"]]
    assert leftovers == []
    # one request per change that needed a rate (add usd, add chf, chf -> GBP)
    assert requests_mock.call_count == 3


# -- the same through the whole pipeline -----------------------------------------------------

def test_recorded_session_through_the_router_converges_and_replays_write_nothing_new(
        pipeline: Any, standin: RatesStandIn) -> None:
    pipeline.cluster.put({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
    get = pipeline.cluster.local.get
    seen: dict[str, list[str]] = {}
    statuses = pipeline.replay(PATHS, after_each=lambda change, obj: check_after(
        change, obj, get, seen))
    assert statuses and all(s in (200, 202) for s in statuses), statuses
    assert seen == {"exchange-rate-usd": ["USD=1.0812"],
                    "exchange-rate-chf": ["CHF=0.9391", "GBP=0.8352", "gone"]}
    # Each change is asked for once per worker at most: the one holding the Lease runs it
    # from its own watch; the other, when the event reaches it before its cache shows the
    # leader's result, runs it again (level-triggered: the same rate, nothing new written).
    asked = [(base, tuple(wanted)) for base, wanted in standin.requests]
    assert list(dict.fromkeys(asked)) == [("EUR", ("USD",)), ("EUR", ("CHF",)),
                                          ("EUR", ("GBP",))], asked
    assert max(asked.count(a) for a in asked) <= 2, asked

    # Replaying the recording again, then a refresh, leaves the same state; the unchanged
    # USD rate is not written again (same resourceVersion).
    usd_before = rates_configmap(get, "exchange-rate-usd")
    statuses = pipeline.replay(PATHS)
    assert all(s in (200, 202) for s in statuses), statuses
    assert pipeline.post_event(REFRESH_TYPE) in (200, 202)
    pipeline.cluster.settle()
    assert rates_configmap(get, "exchange-rate-usd") == usd_before
    assert rates_configmap(get, "exchange-rate-chf") is None
    assert standin.requests[-1] == ("EUR", ["USD"])  # the refresh: one request for the base
