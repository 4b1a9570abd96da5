"""Fixtures for the ExchangeRate tests: a provider client that never sleeps, a loopback
stand-in, the registry and the router running in this process (helpers: ``support.py``)."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import pytest

from demo.provider import RatesStandIn
from eventop import handlers
from eventop.handlers.exchange_rates import provider
from eventop.handlers.exchange_rates.provider import FrankfurterClient
from eventop.handlers.registry import Registry
from tests.exchange_rates.support import BASE_URL, NAMESPACE, STANDIN_RATES, Clock, Router
from tests.support.engine import running_engine


@pytest.fixture
def sleeps() -> list[float]:
    return []


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def rates_client(monkeypatch: pytest.MonkeyPatch, sleeps: list[float],
                 clock: Clock) -> FrankfurterClient:
    """The client the handlers use: requests-mock answers it, its waits are only recorded
    (and move its ``clock``, which ages kept answers: see ``support.later``).

    ``fetchedAt`` comes from a clock that ticks a minute per fetch, so tests can tell
    fetches apart without waiting.
    """
    def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        clock.advance(seconds)

    client = FrankfurterClient(BASE_URL, sleep=sleep, clock=clock)
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


@pytest.fixture
def router(registry: Registry, kube: Any) -> Iterator[Router]:
    with running_engine(kube, registry) as engine:
        yield Router(registry, kube, engine)
