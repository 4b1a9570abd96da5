"""How the engine in the router is tuned: workers, waits, runs from its own watch, leader
election; read from ``EVENTOP_*`` variables by :meth:`EngineSettings.from_env`."""

from __future__ import annotations

import os
from argparse import ArgumentTypeError
from dataclasses import dataclass

from eventop.cli import boolean


@dataclass(frozen=True)
class EngineSettings:
    workers: int = 8
    #: Parallel writes of one run (a fan-out to 1,000 namespaces), shared by all runs.
    write_concurrency: int = 32
    #: How long an event waits for the cache to reach its resourceVersion before 503.
    cache_wait: float = 10.0
    #: How long an event waits for its runs before 503 (the runs go on).
    answer_wait: float = 45.0
    #: Runs of one parent at once: one computing, the others' writes in flight.
    pipeline_depth: int = 4
    #: Start runs from the cache's own watch events too, not only from the watcher's events
    #: (which still guarantee every change is acted upon). With several replicas each
    #: replica's watch would start every run: see ``leader_elect`` (docs/ENGINE.md section 10).
    run_on_watch: bool = True
    #: Only while this process holds the Lease ``eventop-router`` (in its own namespace) do
    #: its watch events start runs; the other replicas run what events ask for.
    leader_elect: bool = False
    #: The Lease's duration, renew deadline and retry period (client-go's defaults).
    lease_timing: tuple[float, float, float] = (15.0, 10.0, 2.0)

    @classmethod
    def from_env(cls) -> EngineSettings:
        """``EVENTOP_CACHE_WAIT_SECONDS``, ``EVENTOP_ANSWER_WAIT_SECONDS`` and
        ``EVENTOP_RUN_ON_WATCH`` (true, false or leader); ValueError saying which and what
        is accepted for a value that is not."""
        run_on_watch, leader = _run_on_watch(cls.run_on_watch)
        return cls(cache_wait=_seconds("EVENTOP_CACHE_WAIT_SECONDS", cls.cache_wait),
                   answer_wait=_seconds("EVENTOP_ANSWER_WAIT_SECONDS", cls.answer_wait),
                   run_on_watch=run_on_watch, leader_elect=leader)


def _seconds(name: str, default: float) -> float:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise ValueError(f"{name} must be a positive number of seconds, not {raw!r}")
    return value


def _run_on_watch(default: bool) -> tuple[bool, bool]:
    """``EVENTOP_RUN_ON_WATCH``: whether the watch starts runs, and whether only while
    holding the Lease (``leader``)."""
    raw = os.environ.get("EVENTOP_RUN_ON_WATCH", "").strip().lower()
    if raw == "leader":
        return True, True
    if not raw:
        return default, False
    try:
        return boolean(raw), False
    except ArgumentTypeError:
        raise ValueError(f"EVENTOP_RUN_ON_WATCH must be true, false or leader, "
                         f"not {raw!r}") from None
