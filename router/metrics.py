"""Prometheus metrics of the router, correct under several gunicorn workers.

Each gunicorn worker is its own process with its own counters, and a scrape reaches just
one of them. ``python -m eventop.router`` therefore runs prometheus_client in multiprocess mode:
it points ``PROMETHEUS_MULTIPROC_DIR`` at a fresh directory *before* prometheus_client is
imported anywhere, every process writes its samples to files there, and :func:`render`
sums them over all workers (alive or dead). Without that variable (tests, a plain
``flask run``) the ordinary in-process registry is used.
"""

from __future__ import annotations

import functools
import os
from typing import Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    REGISTRY,
    CollectorRegistry,
    Counter,
    Histogram,
    generate_latest,
)
from prometheus_client import multiprocess as _multiprocess

from eventop.kube.metrics import KUBE_REQUESTS

EVENTS = Counter(
    "eventop_events", "CloudEvents received, by type, object kind and outcome "
    "(ok, ignored, error, unavailable, invalid, too_large, unsupported_media_type)",
    ["type", "kind", "outcome"],
)
HANDLER_DURATION = Histogram(
    "eventop_handler_duration_seconds", "Time spent in each handler function, by handler",
    ["handler"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
             30.0),
)

__all__ = ["EVENTS", "HANDLER_DURATION", "KUBE_REQUESTS", "event_counter", "handler_duration",
           "multiprocess_dir", "render"]


MAX_EVENT_SERIES = 500  # distinct (type, kind) label pairs per worker; the rest are "other"
_series: set[tuple[str, str]] = set()


@functools.lru_cache(maxsize=4096)
def event_counter(type_: str, kind: str, outcome: str) -> Any:
    """``EVENTS.labels(...)``, remembered: ``labels()`` validates and locks on every call,
    a visible share of a request that otherwise does little.

    Type and kind come from the sender, so a misbehaving one could create a time series per
    request; past :data:`MAX_EVENT_SERIES` distinct pairs new ones are counted as ``other``.
    """
    if (type_, kind) not in _series:
        if len(_series) >= MAX_EVENT_SERIES:
            type_, kind = "other", "other"
        else:
            _series.add((type_, kind))
    return EVENTS.labels(type_, kind, outcome)


@functools.lru_cache(maxsize=1024)
def handler_duration(handler: str) -> Any:
    """``HANDLER_DURATION.labels(handler)``, remembered (see :func:`event_counter`)."""
    return HANDLER_DURATION.labels(handler)


def multiprocess_dir() -> str | None:
    return os.environ.get("PROMETHEUS_MULTIPROC_DIR") or None


def render() -> tuple[bytes, str]:
    """The Prometheus text exposition of all metrics and its content type."""
    if multiprocess_dir():
        registry = CollectorRegistry()
        _multiprocess.MultiProcessCollector(registry)
        return generate_latest(registry), CONTENT_TYPE_LATEST
    return generate_latest(REGISTRY), CONTENT_TYPE_LATEST
