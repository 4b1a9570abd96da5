"""A keyed work queue with client-go's workqueue semantics, plus tickets for the events.

* A key already queued is not queued twice: N requests for it cost one run.
* A key is never *computed* by two workers at once; a request for it meanwhile marks it
  dirty, and exactly one more run follows.
* Pipelined runs: a run that has computed its writes and sent them
  (:meth:`WorkQueue.release`) lets the next run of its key start while its writes are in
  flight, up to ``depth`` runs of one key at once. One slow write no longer holds back every
  change queued behind it (a namespace created while a rule's run waits for another
  namespace's copy). The engine keeps the runs of a key from writing a child twice and
  finishes them in order (see ``engine/write.py`` and ``engine/runtime.py``).
* Delayed requests (:meth:`WorkQueue.add_after`) and per-key rate-limited retries
  (:meth:`WorkQueue.retry`, exponential backoff per key: a failing key backs off alone
  while the others flow).

A :class:`Ticket` is what an event waits on: it is done once, for each of its keys, a run
that *started after the change it reports was in the cache* has finished (``since``, the
cache's own time for it; without one, after the ticket was added). A run that began before
may have read the world without the change, so it does not count; a run under way that
began after, even one started by the router's own watch before the event arrived, does,
and so does a finished one the watch started for that very change (see ``add``).
"""

from __future__ import annotations

import heapq
import itertools
import math
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field

from eventop.kube.backoff import Backoff
from eventop.kube.recent import Recent

Item = Hashable
MAX_REMEMBERED = 10_000  # keys whose last successful run is remembered
#: The longest a failing key waits for its next try (backoff from 0.5 s, doubling).
MAX_BACKOFF = 300.0


@dataclass
class Result:
    """How one run of one key ended."""

    item: Item
    ok: bool
    detail: str = ""
    error: BaseException | None = None
    duration: float = 0.0
    #: The run wrote nothing and left nothing to do (``RunResult.quiet``).
    quiet: bool = False


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
class _Run:
    """One run of one key: when it started, and the tickets it satisfies."""

    started: float
    tickets: list[Ticket] = field(default_factory=list)


@dataclass
class _State:
    queued: bool = False
    #: The run between :meth:`WorkQueue.get` and :meth:`WorkQueue.release`.
    computing: _Run | None = None
    #: Released runs, oldest first, whose writes are still in flight.
    completing: list[_Run] = field(default_factory=list)
    dirty: bool = False
    failures: int = 0
    #: Tickets waiting for a run that starts after they were added.
    next_run: list[Ticket] = field(default_factory=list)

    @property
    def running(self) -> bool:
        return self.computing is not None or bool(self.completing)


class WorkQueue:
    """Keys to work on, each worked on by one worker at a time."""

    def __init__(self, backoff: Backoff | None = None, *, depth: int = 4,
                 share: tuple[Callable[[Item], Hashable], int] | None = None) -> None:
        """``share``: (the group of a key, how many workers one group may hold at once).
        The engine's groups are its handlers: one whose runs are slow (a rates provider
        that does not answer, each run spending its retries) must not take every worker
        while the copies of new namespaces wait behind it (measured: 4-5 s)."""
        self.backoff = backoff or Backoff(0.5, MAX_BACKOFF)
        #: Runs of one key at once (one computing, the others' writes in flight).
        self.depth = max(1, depth)
        self._group, self._share = share if share is not None else (None, 0)
        self._held: Counter[Hashable] = Counter()  # workers each group holds
        #: Per key, the start and result of its last successful run (bounded, oldest first).
        self._succeeded: Recent[Item, tuple[float, Result]] = Recent(MAX_REMEMBERED)

        self._cond = threading.Condition()
        self._ready: deque[Item] = deque()
        self._states: dict[Item, _State] = {}
        self._delayed: list[tuple[float, int, Item]] = []  # a heap: one entry per key
        self._due: dict[Item, float] = {}  # each delayed key's one due time, the earliest
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
            return not self._ready and not self._due and not any(
                s.running or s.queued for s in self._states.values())

    def add(self, item: Item, ticket: Ticket | None = None, since: float | None = None, *,
            finished: bool = False) -> None:
        """Request a run of ``item``. ``ticket`` completes after a run that started at or
        after ``since`` (a :func:`time.monotonic` time; default: from now) has finished: a
        run under way that qualifies is used, else the next one. ``finished``: a successful
        run that qualifies and has finished is used too (the event of a change the router's
        own watch already acted on; a resync or a redelivery gets a run of its own, for
        handlers that read the world outside the cache: a rates provider, the time)."""
        with self._cond:
            self.added += 1
            if ticket is not None and since is not None \
                    and self._join(item, ticket, since, finished):
                self.merged += 1
                return
            state = self._states.setdefault(item, _State())
            if ticket is not None:
                ticket._expect(item)
                state.next_run.append(ticket)
            if self._request(item, state):
                self.merged += 1

    def _join(self, item: Item, ticket: Ticket, since: float, finished: bool) -> bool:
        """Give ``ticket`` to a run of ``item`` under way that started at or after ``since``;
        if ``finished``, also to the last successful one."""
        state = self._states.get(item) or _State()
        runs = [*state.completing, *([state.computing] if state.computing else [])]
        for run in reversed(runs):
            if run.started >= since:
                ticket._expect(item)
                run.tickets.append(ticket)
                return True
        last = self._succeeded.get(item) if finished else None
        if last is not None and last[0] >= since:
            ticket._expect(item)
            ticket._finish(last[1])
            return True
        return False

    def _busy(self, state: _State) -> bool:
        """May no new run of the key start now? One is computing, or ``depth`` runs have
        their writes in flight."""
        return state.computing is not None or len(state.completing) >= self.depth

    def _request(self, item: Item, state: _State) -> bool:
        """One more run of ``item``: queued now if it may start, else once it may (dirty).
        True if that merged into a run already queued or under way."""
        if state.queued:
            return True
        if self._busy(state):
            state.dirty = True
            return True
        self._enqueue(item, state)
        return False

    def _enqueue(self, item: Item, state: _State) -> None:
        state.queued = True
        state.dirty = False
        self._ready.append(item)
        self._cond.notify()

    def add_after(self, item: Item, delay: float) -> None:
        """Request a run of ``item`` in ``delay`` seconds (a handler's requeue_after).

        A key keeps one due time, the earliest asked for: the run then recomputes what it
        waits for and asks again. (Every run of a Database asks for one at its next backup
        tick; kept apart, they piled up by the thousand until the tick, each making every
        :meth:`done` scan longer.)"""
        due = time.monotonic() + max(0.0, delay)
        with self._cond:
            if self._due.get(item, math.inf) <= due:
                return
            if item in self._due:  # an earlier time replaces the later one
                self._delayed = [entry for entry in self._delayed if entry[2] != item]
                heapq.heapify(self._delayed)
            self._due[item] = due
            heapq.heappush(self._delayed, (due, next(self._seq), item))
            self._cond.notify()

    def retry(self, item: Item, *, cap: float | None = None) -> float:
        """Request a run after this key's next backoff delay (at most ``cap`` seconds, if
        given); returns the delay."""
        with self._cond:
            state = self._states.setdefault(item, _State())
            delay = self.backoff.delay(state.failures)
            if cap is not None:
                delay = min(delay, cap)
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
                item = self._take()
                if item is not None:
                    state = self._states[item]
                    state.queued = False
                    state.computing = _Run(time.monotonic(), state.next_run)
                    state.next_run = []
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

    def release(self, item: Item) -> None:
        """The computing run of ``item`` has sent its writes: the key may run again (a dirty
        key is queued) while they are in flight. Its tickets wait for :meth:`done`."""
        with self._cond:
            state = self._states.get(item)
            if state is None or state.computing is None:
                return
            state.completing.append(state.computing)
            state.computing = None
            self._again(item, state)

    def done(self, result: Result, *, released: bool = False) -> None:
        """A run of ``result.item`` ended: the computing one, or if ``released`` the oldest
        released one (the engine finishes the runs of a key in the order they began). Its
        tickets learn how; a dirty key runs again."""
        with self._cond:
            state = self._states[result.item]
            if released:
                run = state.completing.pop(0)
            else:
                assert state.computing is not None, f"{result.item!r} is not computing"
                run, state.computing = state.computing, None
            if self._group is not None:
                self._held[self._group(result.item)] -= 1
                self._cond.notify()  # a worker may take a key of that group now
            if result.ok:
                self._succeeded.put(result.item, (run.started, result))
            self._again(result.item, state)
            if not state.running and not state.queued and state.failures == 0 \
                    and not self._is_delayed(result.item):
                del self._states[result.item]
        for ticket in run.tickets:
            ticket._finish(result)

    def _again(self, item: Item, state: _State) -> None:
        """Queue a key that is wanted again, once it may run."""
        if (state.dirty or state.next_run) and not state.queued and not self._busy(state):
            self._enqueue(item, state)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def _take(self) -> Item | None:
        """The first ready key whose group holds fewer than its share of the workers."""
        if self._group is None:
            return self._ready.popleft() if self._ready else None
        for i, item in enumerate(self._ready):
            group = self._group(item)
            if self._held[group] < self._share:
                del self._ready[i]
                self._held[group] += 1
                return item
        return None

    def _promote_due(self) -> None:
        now = time.monotonic()
        while self._delayed and self._delayed[0][0] <= now:
            _, _, item = heapq.heappop(self._delayed)
            del self._due[item]
            self._request(item, self._states.setdefault(item, _State()))

    def _is_delayed(self, item: Item) -> bool:
        return item in self._due
