"""Fixtures for the ExchangeRate tests: a provider client that never sleeps, CR helpers."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import pytest

from demo.provider import RatesStandIn
from eventop import handlers
from eventop.engine.runtime import Engine
from eventop.handlers.events import Event
from eventop.handlers.exchange_rates import provider
from eventop.handlers.exchange_rates.provider import FrankfurterClient
from eventop.handlers.registry import Outcome, Registry
from tests.support.engine import deliver, running_engine, wait_cached

BASE_URL = "https://rates.test/v1"
STANDIN_RATES = {"EUR": {"USD": "1.0812", "CHF": "0.9391", "GBP": "0.8352"},
                 "USD": {"JPY": "153.94"}}
NAMESPACE = "finance"
Obj = dict[str, Any]


@pytest.fixture
def sleeps() -> list[float]:
    return []


@pytest.fixture
def rates_client(monkeypatch: pytest.MonkeyPatch, sleeps: list[float]) -> FrankfurterClient:
    """The client the handlers use: requests-mock answers it, its waits are only recorded.

    ``fetchedAt`` comes from a clock that ticks a minute per fetch, so tests can tell
    fetches apart without waiting.
    """
    client = FrankfurterClient(BASE_URL, sleep=sleeps.append)
    monkeypatch.setattr(provider, "get_client", lambda: client)
    minutes = itertools.count()

    def tick() -> str:
        minute = next(minutes)
        return f"2026-11-21T{8 + minute // 60:02d}:{minute % 60:02d}:00Z"

    monkeypatch.setattr(provider, "now_rfc3339", tick)
    return client


@pytest.fixture
def standin() -> Iterator[RatesStandIn]:
    """The provider on loopback, for a router in another process (requests-mock can not
    reach there), answering :data:`STANDIN_RATES`."""
    with RatesStandIn(STANDIN_RATES) as rates:
        yield rates


@pytest.fixture
def pipeline_env(standin: RatesStandIn) -> dict[str, str]:
    """The router of ``pipeline``/``cluster_pipeline`` asks the stand-in, and runs only the
    ExchangeRate handlers."""
    return {"RATES_API_URL": standin.url, "EVENTOP_BUILTIN_HANDLERS": "exchange_rates"}


@pytest.fixture
def registry() -> Registry:
    return handlers.load("", builtin="exchange_rates")


@pytest.fixture
def finance(local_kube: Any) -> Iterator[str]:
    local_kube.put({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
    yield NAMESPACE


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


@pytest.fixture
def router(registry: Registry, kube: Any) -> Iterator[Router]:
    with running_engine(kube, registry) as engine:
        yield Router(registry, kube, engine)


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
