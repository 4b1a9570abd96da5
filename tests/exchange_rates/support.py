"""Helpers of the ExchangeRate tests: the provider's address, ExchangeRates, and the router
as it runs in this process (its event functions at once, its controller through the engine)."""

from __future__ import annotations

from typing import Any

from eventop.engine.runtime import Engine
from eventop.events import REFRESH_TYPE
from eventop.handlers.events import Event
from eventop.handlers.exchange_rates import provider
from eventop.handlers.registry import Outcome, Registry
from tests.support.engine import deliver, wait_cached

BASE_URL = "https://rates.test/v1"
STANDIN_RATES = {"EUR": {"USD": "1.0812", "CHF": "0.9391", "GBP": "0.8352"},
                 "USD": {"JPY": "153.94"}}
NAMESPACE = "finance"
ER = ("eventop.dev/v1", "ExchangeRate")
FIELD_MANAGER = "eventop-exchange-rates"  # derived from the module: handlers write as this
Obj = dict[str, Any]


class Clock:
    """A stand-in for ``time.monotonic`` that moves only when told to (or slept on): the
    provider client's, and so the one its kept answers (``fetch.TTL``) age by."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def later(seconds: float = 3600.0) -> None:
    """Let ``seconds`` pass for the answers kept in this process (default: an hour, the
    time between two scheduled refreshes), so that what they kept is too old to reuse.
    And a millisecond: what waits ``seconds`` runs a moment after that (and the clock's float
    sums must not make it a hair early)."""
    clock = provider.get_client().clock
    assert isinstance(clock, Clock), "the rates_client fixture's client has a Clock"
    clock.advance(seconds + 0.001)


def base_url(base: str) -> str:
    """Matches any ``to=`` for this base (requests-mock matches a subset of the query)."""
    return f"{BASE_URL}/latest?from={base}"


def exchange_rate(name: str, currency: str, base: str | None = None,
                  namespace: str = NAMESPACE) -> Obj:
    spec: Obj = {"currency": currency}
    if base is not None:
        spec["base"] = base
    return {"apiVersion": "eventop.dev/v1", "kind": "ExchangeRate",
            "metadata": {"name": name, "namespace": namespace}, "spec": spec}


class Router:
    """What the router does with an event, in this process: the ExchangeRate event
    functions run at once, the controller's runs go through the engine (its cache fed by a
    list+watch of the local API server) and are waited for."""

    def __init__(self, registry: Registry, kube: Any, engine: Engine) -> None:
        self.registry, self.kube, self.engine = registry, kube, engine


def dispatch(router: Router, event: Event) -> list[Outcome]:
    """Deliver and insist some handler took the event."""
    outcomes = deliver(router.engine, event, router.registry, router.kube)
    assert outcomes, f"no handler took {event.type}"
    return outcomes


def put_cached(router: Router, local_kube: Any, obj: Obj) -> Obj:
    """Create an object, and wait until the engine's cache has it (a refresh reads it)."""
    stored: Obj = local_kube.put(obj)
    wait_cached(router.engine, stored)
    return stored


def assert_ok(outcomes: list[Outcome]) -> None:
    failed = [o for o in outcomes if not o.ok]
    assert not failed, [o.detail for o in failed]


# -- reading and changing the local API server ---------------------------------------------

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
    """A scheduled refresh (an hour after anything before it): one run per ExchangeRate
    (none without any), none failing."""
    later()
    assert_ok(deliver(router.engine, Event.simple(type_), router.registry, router.kube))
