"""Posting CloudEvents to the sink: retries, per-object order, bounded memory, back-pressure.

Why it is shaped like this:

* **Never drop, never flood.** Events wait in a bounded buffer (``queue_size``, in-flight
  included). When it is full, :meth:`Deliverer.submit` blocks, so the watch loop stops reading
  the API server (back-pressure) instead of buffering without limit; the watch loop, not this
  module, decides to drop its stream and resume later from its resourceVersion.
* **Per-object order, no head-of-line blocking.** Events are queued per key (the watcher uses
  kind/namespace/name, so a delete and a re-create under the same name stay in order too).
  A key is posted by one worker at a time, oldest event first; keys take turns on
  ``lanes`` workers, so at most ``lanes`` requests are in flight. This is client-go's
  rate-limited work queue: **an object whose event keeps failing backs off alone** (its key
  waits, exponential backoff with jitter) while every other object flows. Before, a fixed
  lane retried its event in place, and every object hashed into that lane waited minutes
  behind one broken ExchangeRate.
* **Object failures and sink failures are told apart.** A ``500`` is the router saying a
  handler failed on *this* object (a bug, a missing RBAC rule, an object the API server
  refuses), which may never heal by itself: that key backs off, up to
  ``max_error_attempts`` attempts, then the event is given up, loudly. That is not a lost
  change: the next periodic resync sends the object again, and handlers are level-triggered.
  No answer at all (connection refused, timeout), ``502``/``503``/``504`` (the Kubernetes API
  or the router is down), ``404`` (its route not up yet), ``401`` (the router does not take
  our token: a rotation half done) and ``429`` say the *sink* cannot
  take anything now: those pause every worker together (one shared gate, ``Retry-After``
  honoured) with a short backoff capped at ``sink_backoff.cap``, and are retried without
  limit. Pausing everyone keeps an outage from aging each key's backoff to minutes, so
  delivery resumes within a couple of seconds of the sink answering again, in order.
* **No kind takes every worker.** A kind whose events are slow (ExchangeRates while the rates
  provider is down: each event spends the provider client's retries inside the router) may
  hold at most ``max_per_kind`` workers (half of them by default); its other keys wait their
  turn while every other kind keeps the remaining workers. Kubernetes gets the same from one
  work queue per controller.
* Any other ``4xx`` means the sink will never take this event: it is given up, loudly (an
  ERROR line with the event id and the sink's answer). Event data is never logged: it may
  be a Secret.
* **Shutdown is bounded.** :meth:`Deliverer.stop` drains for at most ``drain_seconds`` and
  then returns at once: a POST still in flight is abandoned (its worker is a daemon thread),
  never waited for, so a pod exits well inside its termination grace period.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from cloudevents.core.v1.event import CloudEvent
from prometheus_client import Counter, Gauge

from eventop.events import to_http
from eventop.kube.backoff import Backoff, retry_after
from eventop.watcher.ready import ReadyKeys
from eventop.watcher.sink import SinkClient, SinkUnreachable

log = logging.getLogger("eventop.watcher.delivery")

EVENTS_DELIVERED = Counter("eventop_watcher_events_delivered_total",
                           "CloudEvents accepted by the sink, by kind and type", ["kind", "type"])
DELIVERY_RETRIES = Counter("eventop_watcher_delivery_retries_total",
                           "Delivery attempts that failed and were retried, by cause", ["cause"])
DELIVERY_FAILURES = Counter("eventop_watcher_delivery_failures_total",
                            "CloudEvents given up: refused by the sink (4xx) or failing in its "
                            "handlers (500) past --max-error-attempts", ["code"])
QUEUE_DEPTH = Gauge("eventop_watcher_queue_depth",
                    "CloudEvents waiting for or in delivery (bounded by --queue-size)")

RETRY_STATUSES = frozenset({401, 404, 408, 409, 429})
#: Answers that say the sink as a whole cannot take events now (not this event's fault).
#: 401: the router does not take the watcher's token (EVENTOP_ROUTER_TOKEN rotated on one
#: side first): every event would be refused alike, and all are taken once both agree.
SINK_STATUSES = frozenset({401, 404, 429, 502, 503, 504})


@dataclass(frozen=True)
class RetryPolicy:
    backoff: Backoff = field(default_factory=Backoff)
    timeout: tuple[float, float] = (5.0, 30.0)  # connect, read: a hanging sink is a failure
    max_attempts: int = 0  # 0: retry transient failures forever (the watcher's setting)
    max_retry_after: float = 300.0
    max_error_attempts: int = 8  # attempts at an event answered 500 (handler failed); 0: forever
    # The shared pause of the Deliverer while the sink itself is down: short, so delivery
    # resumes within about this long of the sink answering again.
    sink_backoff: Backoff = field(default_factory=lambda: Backoff(0.25, 2.0))


@dataclass
class Outgoing:
    """One serialized event. Bytes, not the object: less memory while it waits."""

    event_id: str
    headers: dict[str, str]
    body: bytes
    key: str  # queue key (the watcher: kind/namespace/name): one object's events stay in order
    kind: str = ""
    type: str = ""

    @classmethod
    def of(cls, event: CloudEvent, key: str | None = None) -> Outgoing:
        headers, body = to_http(event)
        return cls(event.get_id(), headers, body, key or event.get_id(),
                   str(event.get_extension("kind") or ""), event.get_type())


@dataclass
class Result:
    ok: bool
    status: int | None  # last HTTP status, None if the sink never answered
    attempts: int
    detail: str = ""


@dataclass
class Attempt:
    """The verdict on one POST."""

    ok: bool
    final: bool  # accepted, or refused for good: no retry can change the answer
    status: int | None
    cause: str = ""  # why it should be retried (metric label): a status or a transport error
    detail: str = ""
    retry_after: float | None = None

    @property
    def sink_down(self) -> bool:
        """Did the sink as a whole fail (rather than a handler, on this event)?"""
        return not self.final and (self.status is None or self.status in SINK_STATUSES)


def attempt(client: SinkClient, item: Outgoing, policy: RetryPolicy) -> Attempt:
    """POST ``item`` once and classify the answer. Never raises for transport failures."""
    sink = client.url
    try:
        resp = client.post(item.body, item.headers, policy.timeout)
    except SinkUnreachable as exc:
        return Attempt(False, False, None, exc.cause, str(exc))
    status = resp.status
    if 200 <= status < 300:
        EVENTS_DELIVERED.labels(item.kind, item.type).inc()
        # A 202 from the router says why (no handler wants it): kept for ``emit``.
        return Attempt(True, True, status, detail=resp.text if status == 202 else "")
    detail = resp.text
    if 400 <= status < 500 and status not in RETRY_STATUSES:
        DELIVERY_FAILURES.labels(str(status)).inc()
        log.error("sink %s refused event %s (%s %s) with HTTP %d: %s; giving up: this "
                  "event will not be retried (fix the router or the handler, a resync "
                  "will send the object again)", sink, item.event_id, item.kind,
                  item.type, status, detail,
                  extra={"fields": {"event_id": item.event_id, "status": status}})
        return Attempt(False, True, status, detail=detail)
    return Attempt(False, False, status, str(status), detail, retry_after(resp.retry_after))


def _give_up(sink: str, item: Outgoing, policy: RetryPolicy, tries: int,
             att: Attempt) -> bool:
    """Has ``item`` had its last attempt? Logs why, loudly, when it has."""
    if policy.max_attempts and tries >= policy.max_attempts:
        log.error("event %s not delivered to %s after %d attempts: %s", item.event_id, sink,
                  tries, att.detail, extra={"fields": {"event_id": item.event_id}})
        return True
    if att.status == 500 and policy.max_error_attempts and tries >= policy.max_error_attempts:
        DELIVERY_FAILURES.labels("500").inc()
        log.error("sink %s failed to handle event %s (%s %s) %d times, last with HTTP 500: "
                  "%s; giving up so that the events behind it are delivered (see the "
                  "router's log for the handler error; the next resync sends the object "
                  "again)", sink, item.event_id, item.kind, item.type, tries, att.detail,
                  extra={"fields": {"event_id": item.event_id, "status": 500}})
        return True
    return False


def _log_retry(sink: str, item: Outgoing, att: Attempt, tries: int, delay: float) -> None:
    DELIVERY_RETRIES.labels(att.cause).inc()
    # First failure and then every doubling: an outage of minutes is not a wall of lines.
    level = logging.WARNING if tries & (tries - 1) == 0 else logging.DEBUG
    why = att.detail if att.status is None else f"HTTP {att.status}"
    if att.status == 401:
        why += (": the router refuses the watcher's token; EVENTOP_ROUTER_TOKEN must be the "
                "same for both (retried until it is; emit and replay give up after "
                "--max-attempts)")
    log.log(level, "delivery of event %s to %s failed (%s), retry %d in %.1fs",
            item.event_id, sink, why, tries, delay,
            extra={"fields": {"event_id": item.event_id, "cause": att.cause}})


def post(client: SinkClient, item: Outgoing, policy: RetryPolicy,
         stop: threading.Event | None = None) -> Result:
    """Post one event until the sink accepts it, refuses it (4xx), or attempts run out.

    The one-shot senders (``replay``, ``emit``) use this. ``stop`` ends the waiting between
    attempts early (shutdown); the result is then not ok.
    """
    stop = stop or threading.Event()
    tries = 0
    while True:
        tries += 1
        att = attempt(client, item, policy)
        if att.final or _give_up(client.url, item, policy, tries, att):
            return Result(att.ok, att.status, tries, att.detail)
        delay = policy.backoff.delay(tries - 1)
        if att.retry_after is not None:
            delay = min(att.retry_after, policy.max_retry_after)
        _log_retry(client.url, item, att, tries, delay)
        if stop.wait(delay):
            return Result(False, att.status, tries, "stopped before delivery")


class Deliverer:
    """Bounded, ordered-per-object, parallel delivery of :class:`Outgoing` events.

    Every key with events is in exactly one place: ``_ready`` (waiting for a worker), with a
    worker, or in ``_delayed`` (backing off after a failure of its oldest event).
    """

    def __init__(self, sink: str, *, lanes: int = 8, queue_size: int = 1000,
                 policy: RetryPolicy | None = None,
                 on_result: Callable[[Outgoing, Result], Any] | None = None,
                 headers: dict[str, str] | None = None,
                 max_per_kind: int | None = None) -> None:
        if lanes < 1 or queue_size < 1:
            raise ValueError("lanes (--max-in-flight) and --queue-size must be at least 1")
        self.max_per_kind = max_per_kind or max(1, lanes // 2)
        self.sink = sink
        self.policy = policy or RetryPolicy()
        self.on_result = on_result
        self.headers = dict(headers or {})
        self.workers = lanes
        self._capacity = threading.Semaphore(queue_size)
        # One lock, two conditions: workers wait for a key to post, join() for the drain, so
        # that waking one worker (notify) can not be taken by a joiner instead.
        lock = threading.RLock()
        self._cv = threading.Condition(lock)
        self._drained = threading.Condition(lock)
        self._events: dict[str, deque[Outgoing]] = {}  # key -> its events, oldest first
        self._tries: dict[str, int] = {}  # key -> failed attempts at its oldest event
        self._ready = ReadyKeys()
        self._delayed: list[tuple[float, int, str]] = []  # (due, tie-breaker, key)
        self._seq = itertools.count()
        self._gate_until = 0.0  # the sink is down: nobody posts before this (monotonic)
        self._gate_failures = 0
        self._busy: dict[str, int] = {}  # kind -> workers posting one of its events now
        self._threads: list[threading.Thread] = []
        self._client: SinkClient | None = None
        self._pending = 0
        self._stop = threading.Event()
        self.delivered = 0
        self.refused = 0

    def start(self) -> Deliverer:
        """Start the workers; a sink that can not be posted to (a proxy of a scheme urllib3
        does not speak) raises ``ValueError`` here, not in a worker where it would go
        unseen."""
        # One pool for all workers (urllib3's pools are thread-safe), a connection each.
        client = self._client = SinkClient(self.sink, self.headers, connections=self.workers)
        for i in range(self.workers):
            t = threading.Thread(target=self._work, args=(client,), name=f"deliver-{i}",
                                 daemon=True)
            t.start()
            self._threads.append(t)
        return self

    @property
    def pending(self) -> int:
        """Events queued or in flight."""
        return self._pending

    def submit(self, item: Outgoing, timeout: float | None = None) -> bool:
        """Queue ``item``; blocks while the buffer is full. False if ``timeout`` ran out first."""
        if self._stop.is_set():
            return False
        if not self._capacity.acquire(timeout=timeout):
            return False
        with self._cv:
            if self._stop.is_set():
                self._capacity.release()
                return False
            queued = self._events.get(item.key)
            if queued is None:
                self._events[item.key] = deque([item])
                self._ready.append(item.key, item.kind)
                self._cv.notify()
            else:  # the key is waiting, in flight or backing off: its turn comes, in order
                queued.append(item)
            self._pending += 1
            QUEUE_DEPTH.set(self._pending)
        return True

    # -- workers -------------------------------------------------------------------

    def _next_key(self) -> str | None:
        """The next key to post (lock held); waits for one, or returns None once stopped."""
        while not self._stop.is_set():
            now = time.monotonic()
            while self._delayed and self._delayed[0][0] <= now:
                due = heapq.heappop(self._delayed)[2]
                self._ready.append(due, self._events[due][0].kind)
            if self._ready and now >= self._gate_until:
                key = self._take_ready()
                if key is not None:
                    return key
            waits = [t - now for t in (self._gate_until,) if t > now]
            if self._delayed:
                waits.append(self._delayed[0][0] - now)
            self._cv.wait(min(waits) if waits else None)
        return None

    def _take_ready(self) -> str | None:
        """The first ready key whose kind is below its share of the workers (lock held)."""
        taken = self._ready.take(self._busy, self.max_per_kind)
        if taken is None:
            return None
        key, kind = taken
        self._busy[kind] = self._busy.get(kind, 0) + 1
        return key

    def _work(self, client: SinkClient) -> None:
        while True:
            with self._cv:
                key = self._next_key()
                if key is None:
                    return
                item = self._events[key][0]
                tries = self._tries.get(key, 0) + 1
            try:
                att = attempt(client, item, self.policy)
            except Exception as exc:  # never let a worker die: it would stall its keys
                log.exception("unexpected error delivering event %s", item.event_id)
                att = Attempt(False, False, None, "error", f"{type(exc).__name__}: {exc}")
            self._settle(key, item, tries, att)

    def _settle(self, key: str, item: Outgoing, tries: int, att: Attempt) -> None:
        """Record one attempt's outcome: done, the key backs off, or everyone pauses."""
        result: Result | None = None
        if att.final or (not att.sink_down
                         and _give_up(self.sink, item, self.policy, tries, att)):
            result = Result(att.ok, att.status, tries, att.detail)
        with self._cv:
            self._busy[item.kind] -= 1
            if att.status is not None and not att.sink_down:
                self._gate_failures = 0  # the sink answered: it is up
            if result is not None:
                self._finish(key, result)
            elif att.sink_down:
                self._gate_failures += 1
                delay = self.policy.sink_backoff.delay(self._gate_failures - 1)
                if att.retry_after is not None:
                    delay = min(att.retry_after, self.policy.max_retry_after)
                self._gate_until = max(self._gate_until, time.monotonic() + delay)
                self._ready.appendleft(key, item.kind)  # first in line once the sink is back
                _log_retry(self.sink, item, att, self._gate_failures, delay)
            else:
                self._tries[key] = tries
                delay = self.policy.backoff.delay(tries - 1)
                if att.retry_after is not None:
                    delay = min(att.retry_after, self.policy.max_retry_after)
                heapq.heappush(self._delayed, (time.monotonic() + delay, next(self._seq), key))
                _log_retry(self.sink, item, att, tries, delay)
            if result is not None:
                # One more key may start now (a slot of its kind, or this key's next event):
                # one worker is enough, and this one will look again itself. Waking all of
                # them made every delivery wake the idle ones to find nothing.
                self._cv.notify()
            else:
                # A backoff or the sink's pause: the waiting workers' deadlines changed.
                self._cv.notify_all()
        if result is not None:
            self._capacity.release()
            if self.on_result is not None:
                try:
                    self.on_result(item, result)
                except Exception:
                    log.exception("result callback failed for event %s", item.event_id)

    def _finish(self, key: str, result: Result) -> None:
        """The key's oldest event is done (lock held): count it, pass the turn on."""
        queued = self._events[key]
        queued.popleft()
        self._tries.pop(key, None)
        if result.ok:
            self.delivered += 1
            self._gate_failures = 0
        elif result.status is not None and 400 <= result.status < 500:
            self.refused += 1
        if queued:
            self._ready.append(key, queued[0].kind)
        else:
            del self._events[key]
        self._pending -= 1
        if not self._pending:
            self._drained.notify_all()
        QUEUE_DEPTH.set(self._pending)

    # -- waiting and stopping ----------------------------------------------------------

    def join(self, timeout: float | None = None) -> bool:
        """Wait until every submitted event is delivered or given up. False on timeout."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._drained:
            while self._pending:
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return False
                self._drained.wait(remaining)
        return True

    def stop(self, drain_seconds: float = 0.0, grace: float = 1.0) -> int:
        """Drain for up to ``drain_seconds``, then stop; returns events left undelivered.

        Returns at most ``grace`` seconds after the drain: a POST still in flight then is
        abandoned, not waited for (a hanging sink would otherwise hold the process for its
        whole read timeout, past Kubernetes' SIGKILL). Undelivered events are not lost for
        good: the next watcher start lists every object again (and emits it), and the
        handlers converge from the current state.
        """
        if drain_seconds > 0:
            self.join(drain_seconds)
        with self._cv:
            self._stop.set()
            left = self._pending
            self._cv.notify_all()
            self._drained.notify_all()
        deadline = time.monotonic() + grace
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))
        if self._client is not None:
            # Idle connections close now; one a post still holds closes when that post ends.
            self._client.close()
        if left:
            log.warning("stopping with %d events not delivered (they are sent again on the "
                        "next start, which lists every object)", left)
        return left
