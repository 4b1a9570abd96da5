"""ExchangeRate scenarios against a real API server (``pytest -m cluster``).

The router runs on this machine (``cluster_pipeline``), so a loopback stand-in can play the
provider. Each test works in its own namespace and deletes it afterwards.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

from demo.provider import RatesStandIn
from eventop.events import REFRESH_TYPE
from eventop.handlers.exchange_rates import fetch
from eventop.handlers.exchange_rates.provider import FrankfurterClient
from eventop.kube.errors import KubeError
from tests.exchange_rates.support import exchange_rate

pytestmark = pytest.mark.cluster

ER = ("eventop.dev/v1", "ExchangeRate")
Obj = dict[str, Any]


@pytest.fixture
def namespace(cluster_pipeline: Any) -> Iterator[str]:
    name = f"eventop-test-rates-{uuid.uuid4().hex[:8]}"
    cluster_pipeline.cluster.put({"apiVersion": "v1", "kind": "Namespace",
                                  "metadata": {"name": name}})
    try:
        yield name
    finally:
        with contextlib.suppress(KeyError, KubeError):
            cluster_pipeline.cluster.world.delete("v1", "Namespace", name)


def put_and_post(pipe: Any, obj: Obj, change: str = "add") -> Obj:
    stored: Obj = pipe.cluster.put(obj)
    assert pipe.post(change, stored) in (200, 202)
    return stored


def test_exchange_rate_lifecycle_on_a_real_cluster(cluster_pipeline: Any, namespace: str,
                                                   standin: RatesStandIn) -> None:
    pipe = cluster_pipeline
    put_and_post(pipe, exchange_rate("usd", "USD", namespace=namespace))
    stored = put_and_post(pipe, exchange_rate("chf", "CHF", namespace=namespace))

    usd = pipe.cluster.kube.get("v1", "ConfigMap", "usd", namespace)
    assert usd["data"]["rate"] == "1.0812"
    assert usd["data"]["base"] == "EUR"  # the CRD's default, applied by the API server
    chf = pipe.cluster.kube.get("v1", "ConfigMap", "chf", namespace)
    assert chf["metadata"]["ownerReferences"][0]["uid"] == stored["metadata"]["uid"]
    status = pipe.cluster.kube.get(*ER, "usd", namespace)["status"]
    assert status["rate"] == "1.0812"
    assert status["observedGeneration"] == 1

    # switched to GBP: rewritten at once
    put_and_post(pipe, exchange_rate("chf", "GBP", namespace=namespace), "update")
    chf = pipe.cluster.kube.get("v1", "ConfigMap", "chf", namespace)
    assert (chf["data"]["currency"], chf["data"]["rate"]) == ("GBP", "0.8352")

    # a refresh with unchanged rates writes no ConfigMap
    rv = usd["metadata"]["resourceVersion"]
    assert pipe.post_event(REFRESH_TYPE) in (200, 202)
    usd = pipe.cluster.kube.get("v1", "ConfigMap", "usd", namespace)
    assert usd["metadata"]["resourceVersion"] == rv

    # deleted: nothing left (the handler deletes it; the garbage collector would too)
    last = pipe.cluster.kube.get(*ER, "chf", namespace)
    pipe.cluster.remove(*ER, "chf", namespace)
    assert pipe.post("delete", last) in (200, 202)
    pipe.cluster.wait_for(
        lambda: pipe.cluster.kube.get_or_none("v1", "ConfigMap", "chf", namespace) is None,
        what="ConfigMap chf gone")


def _settled(standin: RatesStandIn, quiet: float = 3.0) -> None:
    """Wait until the stand-in has had no request for ``quiet`` seconds (runs asking with
    retries finish after the refresh is answered)."""
    count, since = len(standin.requests), time.monotonic()
    deadline = since + 120
    while time.monotonic() < deadline:
        time.sleep(0.2)
        if len(standin.requests) != count:
            count, since = len(standin.requests), time.monotonic()
        elif time.monotonic() - since >= quiet:
            return


def test_refresh_on_a_real_cluster_asks_once_per_base_and_keeps_values_on_failure(
        cluster_pipeline: Any, namespace: str, standin: RatesStandIn,
        pipeline_workers: int) -> None:
    pipe = cluster_pipeline
    for name, currency, base in [("usd", "USD", None), ("gbp", "GBP", "EUR"),
                                 ("yen", "JPY", "USD")]:
        pipe.cluster.put(exchange_rate(name, currency, base, namespace=namespace))

    # No add event is sent: the refresh alone fills the ConfigMaps. It reads the router's
    # cache, which may not hold ExchangeRates made a moment ago yet (those are the next
    # refresh's, or their own add event's): refresh until all three are there.
    def refreshed() -> bool:
        assert pipe.post_event(REFRESH_TYPE) in (200, 202)
        return all(pipe.cluster.kube.get_or_none("v1", "ConfigMap", n, namespace)
                   for n in ("usd", "gbp", "yen"))
    pipe.cluster.wait_for(refreshed, what="the refresh filled the three ConfigMaps")
    before = len(standin.requests)
    assert pipe.post_event(REFRESH_TYPE) in (200, 202)
    # other namespaces of the cluster may hold ExchangeRates too: at most one request per
    # base (none, most often: the answers the last refresh got within the minute serve it)
    bases = [base for base, _ in standin.requests[before:]]
    assert len(bases) == len(set(bases))
    cms = {n: pipe.cluster.kube.get("v1", "ConfigMap", n, namespace) for n in ("usd", "gbp", "yen")}
    assert cms["yen"]["data"]["rate"] == "153.94"

    time.sleep(fetch.TTL)  # the router's kept answers age out: the next refresh asks
    standin.fail(500)
    before = len(standin.requests)
    assert pipe.post_event(REFRESH_TYPE) in (200, 202)  # provider failures do not fail it
    # each base asked once (its retries included) by each router process: the refresh's
    # process keeps the failure for its runs; another process, whose runs the refresh's
    # status writes start, asks once and keeps it for the rest of its runs
    _settled(standin)
    asked = Counter(base for base, _ in standin.requests[before:])
    assert {"EUR", "USD"} <= set(asked)
    assert max(asked.values()) <= FrankfurterClient().max_attempts * pipeline_workers, \
        repr(standin.requests[before:])
    for name, cm in cms.items():
        assert pipe.cluster.kube.get("v1", "ConfigMap", name, namespace) == cm
        ready = next(c for c in pipe.cluster.kube.get(*ER, name, namespace)["status"]["conditions"]
                     if c["type"] == "Ready")
        assert (ready["status"], ready["reason"]) == ("False", "ProviderUnavailable")
    events = [e for e in pipe.cluster.kube.list("v1", "Event", namespace)
              if e["involvedObject"]["name"] == "usd" and e["type"] == "Warning"]
    assert [e["reason"] for e in events] == ["ProviderUnavailable"], \
        [(e["message"], e.get("source")) for e in events]

    # a ConfigMap deleted during the outage comes back with the last good rate, which the
    # real API server kept in status (its CRD's status schema has every field of it)
    status = pipe.cluster.kube.get(*ER, "usd", namespace)["status"]
    assert (status["base"], status["currency"], status["rate"]) == ("EUR", "USD", "1.0812")
    gone = pipe.cluster.kube.get("v1", "ConfigMap", "usd", namespace)
    pipe.cluster.remove("v1", "ConfigMap", "usd", namespace)
    assert pipe.post("delete", gone) in (200, 202)

    def values(data: dict[str, str]) -> dict[str, str]:  # fetchedAt: the last good fetch's
        return {k: v for k, v in data.items() if k != "fetchedAt"}

    def restored() -> bool:
        cm = pipe.cluster.kube.get_or_none("v1", "ConfigMap", "usd", namespace)
        return cm is not None and values(cm["data"]) == values(cms["usd"]["data"])
    pipe.cluster.wait_for(restored, what="ConfigMap usd written back with the last good rate")
