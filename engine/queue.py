"""A keyed work queue with client-go's workqueue semantics, plus tickets for the events.

* A key already queued is not queued twice: N requests for it cost one run.
* A key being worked on is never handed to a second worker; a request for it meanwhile
  marks it dirty, and exactly one more run follows when the current one ends.
* Delayed requests (:meth:`WorkQueue.add_after`) and per-key rate-limited retries
  (:meth:`WorkQueue.retry`, exponential backoff per key: a failing key backs off alone
  while the others flow).

A :class:`Ticket` is what an event waits on: it is done once, for each of its keys, a run
that *started after the ticket was added* has finished. That is what makes answering the
event only after its change was acted upon exact: a run already under way when the event
arrived may have read the world before the change, so it does not count.
"""

from __future__ import annotations

import heapq
import itertools
import threading
import time
from collections import deque
from collections.abc import Hashable
from dataclasses import dataclass, field

from eventop.kube.backoff import Backoff

Item = Hashable


@dataclass
class Result:
    """How one run of one key ended."""

    item: Item
    ok: bool
    detail: str = ""
    error: BaseException | None = None
    duration: float = 0.0


class Ticket:
    """Waits for one run of each of its keys that started after it was added."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._pending: set[Item] = set()
        self.results: dict[Item, Result] = {}
        self._sealed = False

    def _expect(self, item: Item) -> None:
        with self._lock:
            self._pending.add(item)

    def _finish(self, result: Result) -> None:
        with self._lock:
            if result.item not in self._pending:
                return
            self._pending.discard(result.item)
            self.results[result.item] = result
            if self._sealed and not self._pending:
                self._done.set()

    def seal(self) -> Ticket:
        """No more keys will be added; the ticket can complete."""
        with self._lock:
            self._sealed = True
            if not self._pending:
                self._done.set()
        return self

    def wait(self, timeout: float | None = None) -> bool:
        return self._done.wait(timeout)

    @property
    def pending(self) -> set[Item]:
        with self._lock:
            return set(self._pending)


@dataclass
class _State:
    queued: bool = False
    running: bool = False
    dirty: bool = False
    failures: int = 0
    #: Tickets waiting for a run that starts after they were added.
    next_run: list[Ticket] = field(default_factory=list)
    #: Tickets the current run satisfies.
    this_run: list[Ticket] = field(default_factory=list)


class WorkQueue:
    """Keys to work on, each worked on by one worker at a time."""

    def __init__(self, backoff: Backoff | None = None) -> None:
        self.backoff = backoff or Backoff(0.5, 300.0)
        self._cond = threading.Condition()
        self._ready: deque[Item] = deque()
        self._states: dict[Item, _State] = {}
        self._delayed: list[tuple[float, int, Item]] = []
        self._seq = itertools.count()
        self._closed = False
        #: Counts for /metrics and tests: requests, merged into a queued or running key, runs.
        self.added = self.merged = self.started = 0

    def __len__(self) -> int:
        with self._cond:
            return len(self._ready)

    def idle(self) -> bool:
        """Nothing queued, running or waiting for a delay."""
        with self._cond:
            return not self._ready and not self._delayed and not any(
                s.running or s.queued for s in self._states.values())

    def add(self, item: Item, ticket: Ticket | None = None) -> None:
        """Request a run of ``item``; ``ticket`` completes after a run started from now."""
        with self._cond:
            self.added += 1
            state = self._states.setdefault(item, _State())
            if ticket is not None:
                ticket._expect(item)
                state.next_run.append(ticket)
            if state.running:
                self.merged += 1
                state.dirty = True
            elif state.queued:
                self.merged += 1
            else:
                state.queued = True
                self._ready.append(item)
                self._cond.notify()

    def add_after(self, item: Item, delay: float) -> None:
        """Request a run of ``item`` in ``delay`` seconds (a handler's requeue_after)."""
        with self._cond:
            heapq.heappush(self._delayed, (time.monotonic() + max(0.0, delay),
                                           next(self._seq), item))
            self._cond.notify()

    def retry(self, item: Item) -> float:
        """Request a run after this key's next backoff delay; returns the delay."""
        with self._cond:
            state = self._states.setdefault(item, _State())
            delay = self.backoff.delay(state.failures)
            state.failures += 1
        self.add_after(item, delay)
        return delay

    def forget(self, item: Item) -> None:
        """The key succeeded: its next failure starts the backoff from the beginning."""
        with self._cond:
            state = self._states.get(item)
            if state is not None:
                state.failures = 0

    def get(self, timeout: float | None = None) -> Item | None:
        """The next key to work on (now running), or None on timeout or close."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while True:
                self._promote_due()
                if self._ready:
                    item = self._ready.popleft()
                    state = self._states[item]
                    state.queued, state.running = False, True
                    state.this_run, state.next_run = state.next_run, []
                    self.started += 1
                    return item
                if self._closed:
                    return None
                now = time.monotonic()
                waits = []
                if deadline is not None:
                    if now >= deadline:
                        return None
                    waits.append(deadline - now)
                if self._delayed:
                    waits.append(max(0.0, self._delayed[0][0] - now))
                self._cond.wait(min(waits) if waits else None)

    def done(self, result: Result) -> None:
        """The run of ``result.item`` ended; its tickets learn how, a dirty key runs again."""
        with self._cond:
            state = self._states[result.item]
            state.running = False
            tickets, state.this_run = state.this_run, []
            if state.dirty or state.next_run:
                state.dirty = False
                state.queued = True
                self._ready.append(result.item)
                self._cond.notify()
            elif state.failures == 0 and not self._is_delayed(result.item):
                del self._states[result.item]
        for ticket in tickets:
            ticket._finish(result)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def _promote_due(self) -> None:
        now = time.monotonic()
        while self._delayed and self._delayed[0][0] <= now:
            _, _, item = heapq.heappop(self._delayed)
            state = self._states.setdefault(item, _State())
            if state.running:
                state.dirty = True
            elif not state.queued:
                state.queued = True
                self._ready.append(item)

    def _is_delayed(self, item: Item) -> bool:
        return any(entry[2] == item for entry in self._delayed)
