"""One event, every handler: the event functions run in the request, the controllers'
runs are queued on the engine and waited for.

The engine is made once per worker process, after gunicorn's fork (its informers hold watch
connections and threads of their own), when the Kubernetes API is first available: until
then events for controllers are answered 503 and readiness says why.
"""

from __future__ import annotations

import fnmatch
import logging
import os
import threading
import time
from typing import Any

from eventop.engine.catchup import CacheBehind
from eventop.engine.runtime import QUIET_NOTES, Engine
from eventop.engine.settings import EngineSettings
from eventop.handlers.events import Event
from eventop.handlers.registry import Outcome, Registry
from eventop.kube.errors import KubeError, Unavailable

log = logging.getLogger("eventop.router")

_forks = 0


def _count_fork() -> None:
    global _forks
    _forks += 1


os.register_at_fork(after_in_child=_count_fork)


def process_generation() -> int:
    """A number that changes in a child process after ``os.fork``: what a worker made for
    itself (a connection pool, an engine) is remade if it was made before the fork. Cheaper
    than comparing ``os.getpid()``, a system call on every request."""
    return _forks


class EngineProvider:
    """The engine of this worker process: started once the Kubernetes API is reachable."""

    def __init__(self, registry: Registry, kube_provider: Any) -> None:
        self.controllers = list(registry.controllers)
        self.settings = EngineSettings.from_env()  # a mistyped value fails the start
        self.kube_provider = kube_provider
        self._engine: Engine | None = None
        self._generation: int | None = None
        self._lock = threading.Lock()
        self._error = "not started yet"

    def __bool__(self) -> bool:
        return bool(self.controllers)

    def get(self) -> Engine:
        """The running engine, started on first use; Unavailable while it can not be."""
        generation = process_generation()
        engine = self._engine
        if engine is not None and self._generation == generation:
            return engine
        with self._lock:
            if self._engine is None or self._generation != generation:
                try:
                    kube = self.kube_provider.get()
                    self._engine = Engine(self.controllers, kube,
                                          settings=self.settings).start()
                    self._generation = generation
                except KubeError as exc:
                    self._error = str(exc)
                    raise
            return self._engine

    def start_soon(self, retry_seconds: float = 2.0) -> None:
        """Start the engine in the background as soon as the API is reachable, so that its
        caches are warm (and readiness true) before the first event."""
        def starter() -> None:
            while True:
                try:
                    self.get()
                    return
                except KubeError:
                    threading.Event().wait(retry_seconds)

        threading.Thread(target=starter, name="eventop-engine-start", daemon=True).start()

    def stop(self) -> None:
        if self._engine is not None:
            self._engine.stop()

    def readiness(self) -> tuple[bool, str]:
        try:
            return self.get().readiness()
        except KubeError:
            return False, self._error

    def interested(self, event: Event) -> list[str]:
        """The controllers this event may concern (without the engine: by declaration)."""
        ref = event.ref
        names = []
        for ctl in self.controllers:
            if ref is not None:
                if any(k.key == (ref.api_version, ref.kind) for k in ctl.event_kinds()):
                    names.append(ctl.name)
            elif any(fnmatch.fnmatchcase(event.type, p) for p in ctl.triggers_by_type):
                names.append(ctl.name)
        return names


def validate(engines: EngineProvider, event: Event) -> None:
    """:class:`InvalidEvent` for an event the engine's caches say no API server could send,
    checked before any handler runs; nothing is checked while the engine is not running."""
    if not engines or not engines.interested(event):
        return
    try:
        engine = engines.get()
    except KubeError:
        return  # the runs will be answered unavailable; the resend is checked then
    engine.validate(event)


def run_controllers(engines: EngineProvider, event: Event) -> list[Outcome]:
    """Queue the event's runs and wait for them; Unavailable if they can not be run.

    The answer comes within ``answer_wait`` of the call, whatever queueing took: a refresh's
    ``@triggers`` function asks the rates provider before its runs are queued (up to 40 s
    with the provider down), and ``watcher emit`` waits 60 s for the answer before it posts
    the refresh again, which would ask the provider once more.
    """
    if not engines or not engines.interested(event):
        return []
    started = time.monotonic()
    engine = engines.get()
    try:
        ticket, notes = engine.submit(event)
    except CacheBehind:
        raise
    except KubeError as exc:
        raise Unavailable(str(exc)) from exc
    outcomes = [Outcome(name, True, 0.0, note, quiet=note in QUIET_NOTES)
                for name, note in notes.items()]
    wait = engines.settings.answer_wait
    if not ticket.wait(max(0.0, started + wait - time.monotonic())):
        waiting = ", ".join(f"{name} {key}" for name, key in sorted(ticket.pending))
        raise Unavailable(f"runs of {waiting} not finished within {wait:.0f}s; they go on, "
                          "send the event again to learn how they ended")
    for (name, _key), result in sorted(ticket.results.items(), key=lambda kv: str(kv[0])):
        outcomes.append(Outcome(name, result.ok, result.duration, result.detail, result.error,
                                result.quiet))
    return outcomes
