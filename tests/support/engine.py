"""The reconcile engine as the router runs it, inside the test process: its cache fed by a
real list+watch of the API server under test, events submitted and their runs waited for.

For tests of a handler's behaviour against an API server without the router's HTTP layer
(the ``pipeline`` fixture has the whole thing, in processes)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from eventop.engine.runtime import Engine
from eventop.engine.settings import EngineSettings
from eventop.handlers.events import Event
from eventop.handlers.registry import Outcome, Registry
from eventop.testing.waiting import wait_until


def start_engine(kube: Any, registry: Registry) -> Engine:
    """The registry's controllers on an engine whose caches have synced and whose start-up
    runs (one per parent then cached) are queued (stop it after).

    Without the second wait, the start-up thread, which looks every 0.2 s, could still find
    parents a test created after readiness and run them outside any event: a run no test
    waits for, racing with the ones it does. For the same reason runs start from events
    only (``run_on_watch=False``): these tests say what each event does; the router's runs
    from its own watch are tested in ``tests/engine`` and run in every process pipeline.
    """
    engine = Engine(registry.controllers, kube,
                    settings=EngineSettings(workers=4, write_concurrency=8,
                                            run_on_watch=False)).start()
    if not wait_until(lambda: engine.readiness()[0] and not _starting(), 20):
        engine.stop()
        raise AssertionError(f"engine not ready: {engine.readiness()[1]}")
    return engine


def _starting() -> bool:
    return any(t.name == "engine-start" and t.is_alive() for t in threading.enumerate())


@contextmanager
def running_engine(kube: Any, registry: Registry) -> Iterator[Engine]:
    """:func:`start_engine`, stopped at the end of the block."""
    engine = start_engine(kube, registry)
    try:
        yield engine
    finally:
        engine.stop()


def deliver(engine: Engine, event: Event, registry: Registry | None = None,
            kube: Any = None) -> list[Outcome]:
    """What the router does with an event: the registry's event functions (if given) run
    at once, the controllers' runs are queued and waited for. One Outcome per event
    function, per controller that had nothing to run (saying why) and per run."""
    outcomes = registry.dispatch(event, kube) if registry is not None else []
    ticket, notes = engine.submit(event)
    assert ticket.wait(60), f"runs of {ticket.pending} did not finish"
    return outcomes + [Outcome(name, True, 0.0, note) for name, note in notes.items()] + [
        Outcome(name, r.ok, r.duration, r.detail if r.ok else f"{key}: {r.detail}", r.error)
        for (name, key), r in ticket.results.items()]


def wait_cached(engine: Engine, obj: Any, timeout: float = 10.0) -> None:
    """Wait until the engine's cache holds ``obj`` as the API server stored it: for events
    that name no object (a scheduled refresh), which read the cache as it is."""
    meta = obj["metadata"]
    informer = engine.cache.informer(*(obj["apiVersion"], obj["kind"]))
    assert informer is not None, f"{obj['kind']} is not cached"
    assert informer.wait_for(str(meta["resourceVersion"]), obj, timeout), \
        f"the cache did not reach {obj['kind']} {meta.get('namespace')}/{meta['name']}"
