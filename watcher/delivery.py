"""Posting CloudEvents to the sink: retries, per-object order, bounded memory, back-pressure.

Why it is shaped like this:

* **Never drop, never flood.** Events wait in a bounded buffer (``queue_size``, in-flight
  included). When it is full, :meth:`Deliverer.submit` blocks, so the watch loop stops reading
  the API server (back-pressure) instead of buffering without limit; the watch loop, not this
  module, decides to drop its stream and resume later from its resourceVersion.
* **Per-object order.** Each event goes to one of ``lanes`` worker threads chosen by a hash of
  its key (the watcher uses kind/namespace/name, so a delete and a re-create under the same
  name stay in order too); a lane posts its events one at a time, in order. Different
  objects are posted in parallel, at most ``lanes`` requests in flight.
* **Retry what can succeed later.** Connection errors, timeouts (a hanging sink), 5xx, 404
  (the router or its route not up yet), 408, 409 and 429 are retried with exponential backoff
  and jitter, honouring ``Retry-After``. Any other 4xx means the sink will never take this
  event: it is given up, loudly (an ERROR line with the event id and the sink's answer).
  Event data is never logged: it may be a Secret.
* **One broken event must not stall the others.** A lane retries its event before it posts
  the next, so an event the router keeps failing would hold back every object sharing its
  lane, then fill the buffer and stop the watch altogether. A ``500`` is the router saying a
  handler failed (a bug, a missing RBAC rule, an object the API server refuses), which may
  never heal by itself; it is retried ``max_error_attempts`` times and then given up, loudly.
  That is not a lost change: the next periodic resync sends the object again, and handlers
  are level-triggered. ``503`` (Kubernetes API unavailable) and the other transient answers
  above heal when the outage ends and are retried without limit.
"""

from __future__ import annotations

import logging
import queue
import random
import threading
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC
from email.utils import parsedate_to_datetime
from typing import Any

import requests
from cloudevents.core.v1.event import CloudEvent
from prometheus_client import Counter, Gauge

from eventop.watcher.cloudevent import to_http

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

RETRY_STATUSES = frozenset({404, 408, 409, 429})


@dataclass(frozen=True)
class Backoff:
    """Exponential backoff with jitter: attempt n waits between d/2 and d, d = base * 2**n."""

    base: float = 0.5
    cap: float = 60.0

    def delay(self, attempt: int) -> float:
        d = min(self.cap, self.base * (2 ** min(attempt, 30)))
        return d / 2 + random.uniform(0, d / 2)


@dataclass(frozen=True)
class RetryPolicy:
    backoff: Backoff = field(default_factory=Backoff)
    timeout: tuple[float, float] = (5.0, 30.0)  # connect, read: a hanging sink is a failure
    max_attempts: int = 0  # 0: retry transient failures forever (the watcher's setting)
    max_retry_after: float = 300.0
    max_error_attempts: int = 8  # attempts at an event answered 500 (handler failed); 0: forever


@dataclass
class Outgoing:
    """One serialized event. Bytes, not the object: less memory while it waits."""

    event_id: str
    headers: dict[str, str]
    body: bytes
    key: str  # lane key (the watcher: kind/namespace/name): one object's events stay in order
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


def retry_after_seconds(value: str | None) -> float | None:
    """``Retry-After`` as seconds: either a number or an HTTP date (RFC 9110)."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:  # "-0000": UTC with no zone stated, not the local time
        when = when.replace(tzinfo=UTC)
    return max(0.0, when.timestamp() - time.time())


def post(session: requests.Session, sink: str, item: Outgoing, policy: RetryPolicy,
         stop: threading.Event | None = None) -> Result:
    """Post one event until the sink accepts it, refuses it (4xx), or attempts run out.

    ``stop`` ends the waiting between attempts early (shutdown); the result is then not ok.
    """
    stop = stop or threading.Event()
    attempt = 0
    while True:
        attempt += 1
        status: int | None = None
        wait: float | None = None
        try:
            resp = session.post(sink, headers=item.headers, data=item.body,
                                timeout=policy.timeout)
            status = resp.status_code
            if 200 <= status < 300:
                EVENTS_DELIVERED.labels(item.kind, item.type).inc()
                return Result(True, status, attempt)
            detail = resp.text[:500]
            if 400 <= status < 500 and status not in RETRY_STATUSES:
                DELIVERY_FAILURES.labels(str(status)).inc()
                log.error("sink %s refused event %s (%s %s) with HTTP %d: %s; giving up: this "
                          "event will not be retried (fix the router or the handler, a resync "
                          "will send the object again)", sink, item.event_id, item.kind,
                          item.type, status, detail,
                          extra={"fields": {"event_id": item.event_id, "status": status}})
                return Result(False, status, attempt, detail)
            cause = str(status)
            wait = retry_after_seconds(resp.headers.get("Retry-After"))
        except requests.RequestException as exc:
            cause = "timeout" if isinstance(exc, requests.Timeout) else "connection"
            detail = f"{type(exc).__name__}: {exc}"
        if policy.max_attempts and attempt >= policy.max_attempts:
            log.error("event %s not delivered to %s after %d attempts: %s", item.event_id, sink,
                      attempt, detail, extra={"fields": {"event_id": item.event_id}})
            return Result(False, status, attempt, detail)
        if status == 500 and policy.max_error_attempts and attempt >= policy.max_error_attempts:
            DELIVERY_FAILURES.labels(str(status)).inc()
            log.error("sink %s failed to handle event %s (%s %s) %d times, last with HTTP 500: "
                      "%s; giving up so that the events behind it are delivered (see the "
                      "router's log for the handler error; the next resync sends the object "
                      "again)", sink, item.event_id, item.kind, item.type, attempt, detail,
                      extra={"fields": {"event_id": item.event_id, "status": status}})
            return Result(False, status, attempt, detail)
        delay = policy.backoff.delay(attempt - 1)
        if wait is not None:
            delay = min(max(wait, 0.0), policy.max_retry_after)
        DELIVERY_RETRIES.labels(cause).inc()
        log.warning("delivery of event %s to %s failed (%s), retry %d in %.1fs",
                    item.event_id, sink, detail if status is None else f"HTTP {status}",
                    attempt, delay,
                    extra={"fields": {"event_id": item.event_id, "cause": cause}})
        if stop.wait(delay):
            return Result(False, status, attempt, "stopped before delivery")


class Deliverer:
    """Bounded, ordered-per-object, parallel delivery of :class:`Outgoing` events."""

    def __init__(self, sink: str, *, lanes: int = 8, queue_size: int = 1000,
                 policy: RetryPolicy | None = None,
                 on_result: Callable[[Outgoing, Result], Any] | None = None) -> None:
        if lanes < 1 or queue_size < 1:
            raise ValueError("lanes (--max-in-flight) and --queue-size must be at least 1")
        self.sink = sink
        self.policy = policy or RetryPolicy()
        self.on_result = on_result
        self._capacity = threading.Semaphore(queue_size)
        self._queues: list[queue.SimpleQueue[Outgoing | None]] = [
            queue.SimpleQueue() for _ in range(lanes)]
        self._threads: list[threading.Thread] = []
        self._pending = 0
        self._lock = threading.Condition()
        self._stop = threading.Event()
        self.delivered = 0
        self.refused = 0

    def start(self) -> Deliverer:
        for i, q in enumerate(self._queues):
            t = threading.Thread(target=self._lane, args=(q,), name=f"deliver-{i}", daemon=True)
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
        with self._lock:
            self._pending += 1
            QUEUE_DEPTH.set(self._pending)
        lane = zlib.crc32(item.key.encode()) % len(self._queues)
        self._queues[lane].put(item)
        return True

    def _lane(self, q: queue.SimpleQueue[Outgoing | None]) -> None:
        session = requests.Session()
        try:
            while True:
                item = q.get()
                if item is None:
                    return
                try:
                    result = (Result(False, None, 0, "stopped") if self._stop.is_set()
                              else post(session, self.sink, item, self.policy, self._stop))
                except Exception as exc:  # never let a lane die: it would stall its objects
                    log.exception("unexpected error delivering event %s", item.event_id)
                    result = Result(False, None, 0, str(exc))
                with self._lock:
                    if result.ok:
                        self.delivered += 1
                    elif result.status is not None and 400 <= result.status < 500:
                        self.refused += 1
                    self._pending -= 1
                    QUEUE_DEPTH.set(self._pending)
                    self._lock.notify_all()
                self._capacity.release()
                if self.on_result is not None:
                    try:
                        self.on_result(item, result)
                    except Exception:
                        log.exception("result callback failed for event %s", item.event_id)
        finally:
            session.close()

    def join(self, timeout: float | None = None) -> bool:
        """Wait until every submitted event is delivered or given up. False on timeout."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            while self._pending:
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return False
                self._lock.wait(remaining)
        return True

    def stop(self, drain_seconds: float = 0.0) -> int:
        """Drain for up to ``drain_seconds``, then stop the lanes; returns events left undelivered.

        Undelivered events are not lost for good: the next watcher start lists every object
        again (and emits it), and the handlers converge from the current state.
        """
        if drain_seconds > 0:
            self.join(drain_seconds)
        left = self._pending
        self._stop.set()
        for q in self._queues:
            q.put(None)
        for t in self._threads:
            t.join(timeout=self.policy.timeout[0] + self.policy.timeout[1] + 1)
        if left:
            log.warning("stopping with %d events not delivered (they are sent again on the "
                        "next start, which lists every object)", left)
        return left
