"""Kubernetes changes as CloudEvents: one reflector per watched resource, one deliverer.

The list/watch loop itself (resume, 410 re-list, bookmarks, hung watches, back-pressure) is
:class:`eventop.kube.reflector.Reflector`, shared with the router's cache. What this module
adds is what the watcher says about the changes:

* after a (re)list, exactly the difference from what it last knew: ``add`` for new objects,
  ``update`` for changed ones, ``delete`` for vanished ones; after a periodic ``resync``,
  every object as ``update`` (ids repeat; delivery is at-least-once and the handlers are
  idempotent), so handlers converge even if a message was lost downstream;
* every watched change as the CloudEvent of :mod:`eventop.events`, queued for delivery in
  one lane per object name (a delete and a re-create stay in order).

Memory stays bounded: per object only its uid, resourceVersion, namespace, name, labels and
ownerReferences are kept (:class:`Known`), never the object. The price: a delete found by a
re-list (the object vanished while the watch history was lost) carries that metadata as its
data (plus the annotation ``eventop.dev/deleted-while-unwatched: "true"``), not the full last
state. Handlers read the API server anyway, and match deleted objects by labels and owners,
so that is enough for them.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from typing import Any, NamedTuple

from prometheus_client import Counter

from eventop.events import to_cloudevent
from eventop.kube import Kube
from eventop.kube.reflector import Reflector, Sink, Stopped, Watched, WatchSettings, until_served
from eventop.kube.resources import Resource
from eventop.watcher.delivery import Deliverer, Outgoing
from eventop.watcher.specs import ResourceSpec

log = logging.getLogger("eventop.watcher")

Obj = dict[str, Any]

EVENTS_EMITTED = Counter("eventop_watcher_events_emitted_total",
                         "CloudEvents queued for delivery, by kind and type", ["kind", "type"])

DELETED_UNWATCHED = "eventop.dev/deleted-while-unwatched"
FORBIDDEN_HINT = "grant list and watch on it to the watcher's ServiceAccount, see deploy/"
OPTIONAL_RETRY_SECONDS = 60.0


class Known(NamedTuple):
    """What is kept per object: enough to notice changes and to describe a vanished object.

    Labels and ownerReferences are kept (small, and what handlers match deleted objects by:
    a copy rule's selector, a mirror's ownership of its StatefulSet); data, spec, status and
    annotations are not.
    """

    rv: str
    namespace: str | None
    name: str
    labels: dict[str, str] | None
    owners: list[Obj] | None

    def last_state(self, res: Resource, uid: str) -> Obj:
        """The data of a delete found by a re-list: the last known metadata, marked as such."""
        meta: Obj = {"name": self.name, "uid": uid, "resourceVersion": self.rv,
                     "annotations": {DELETED_UNWATCHED: "true"}}
        if self.namespace:
            meta["namespace"] = self.namespace
        if self.labels:
            meta["labels"] = self.labels
        if self.owners:
            meta["ownerReferences"] = self.owners
        return {"apiVersion": res.api_version, "kind": res.kind, "metadata": meta}


class ResourceWatcher(Sink):
    """One resource's changes, as CloudEvents, into the deliverer."""

    def __init__(self, kube: Kube, spec: ResourceSpec, deliverer: Deliverer, source: str,
                 settings: WatchSettings, stop: threading.Event) -> None:
        self.spec = spec
        self.deliverer = deliverer
        self.source = source
        self.stop = stop
        self.name = str(spec)
        self.known: dict[str, Known] = {}  # uid -> what a delete found by a re-list needs
        self._mode = "list"
        self._seen: set[str] = set()
        self._by_name: dict[tuple[str | None, str], str] = {}  # during a re-list only
        self._counts: dict[str, int] = {}
        self._pending: Outgoing | None = None  # the event the deliverer had no room for
        def resolve() -> Watched:
            if not spec.optional:  # not served: an error, retried with backoff
                return spec.resolve(kube)
            return until_served(lambda: spec.resolve(kube), stop, OPTIONAL_RETRY_SECONDS, log,
                                self.name, "optional: a handler can do without it")

        self.reflector = Reflector(kube, resolve, self, settings, stop, name=self.name,
                                   hint=FORBIDDEN_HINT, logger=log)

    # -- lifecycle -------------------------------------------------------------------

    @property
    def synced(self) -> threading.Event:
        return self.reflector.synced

    @property
    def rv(self) -> str:
        return self.reflector.rv

    def start(self) -> ResourceWatcher:
        self.reflector.start()
        return self

    def join(self, timeout: float | None = None) -> None:
        self.reflector.join(timeout)

    # -- the reflector's sink ----------------------------------------------------------

    def begin_list(self, mode: str) -> None:
        self._mode = mode
        self._seen = set()
        self._counts = {"add": 0, "update": 0, "delete": 0}
        # A re-list finds an object deleted and made again under its name while unwatched
        # as a new uid: its old uid's delete must go first (same lane, per-object order).
        self._by_name = {(k.namespace, k.name): uid for uid, k in self.known.items()}

    def list_item(self, obj: Obj) -> None:
        meta = obj.get("metadata") or {}
        uid, rv = str(meta.get("uid")), str(meta.get("resourceVersion"))
        self._seen.add(uid)
        prev = self.known.get(uid)
        if prev is None and self._by_name:
            ns = meta.get("namespace") or None
            old = self._by_name.get((ns, str(meta.get("name"))))
            if old is not None and old != uid and old in self.known and old not in self._seen:
                self._deleted_unwatched(old)
        change = ("add" if prev is None else
                  "update" if prev.rv != rv or self._mode == "resync" else None)
        if change:
            self._submit(self._outgoing(change, obj))
            self._counts[change] += 1
        self._remember(uid, rv, meta)

    def end_list(self, resource_version: str) -> None:
        for uid in [u for u in self.known if u not in self._seen]:
            self._deleted_unwatched(uid)
        self._seen = set()
        self._by_name = {}
        log.info("%s: %s of %d objects at resourceVersion %s: %d add, %d update, %d delete",
                 self.name, self._mode, len(self.known), resource_version, self._counts["add"],
                 self._counts["update"], self._counts["delete"],
                 extra={"fields": {"resource": self.name, **self._counts}})

    def offer(self, change: str, obj: Obj, timeout: float) -> bool:
        item = self._outgoing(change, obj)
        if not self.deliverer.submit(item, timeout=timeout):
            self._pending = item
            return False
        self._record(change, obj)
        return True

    def put(self, change: str, obj: Obj) -> None:
        log.warning("%s: the sink is slow (%d events waiting)", self.name,
                    self.deliverer.pending)
        item, self._pending = self._pending, None
        self._submit(item or self._outgoing(change, obj))
        self._record(change, obj)

    # -- internals -------------------------------------------------------------------

    def _deleted_unwatched(self, uid: str) -> None:
        """A known object a re-list no longer finds: its delete, from its last known state."""
        self._submit(self._outgoing("delete", self.known[uid].last_state(self.reflector.res,
                                                                          uid)))
        self._counts["delete"] += 1
        del self.known[uid]

    def _remember(self, uid: str, rv: str, meta: Obj) -> None:
        ns = meta.get("namespace")
        self.known[uid] = Known(rv, sys.intern(ns) if ns else None, str(meta.get("name")),
                                meta.get("labels") or None, meta.get("ownerReferences") or None)

    def _record(self, change: str, obj: Obj) -> None:
        meta = obj.get("metadata") or {}
        uid, rv = str(meta.get("uid")), str(meta.get("resourceVersion"))
        if change == "delete":
            self.known.pop(uid, None)
        else:
            self._remember(uid, rv, meta)

    def _outgoing(self, change: str, obj: Obj) -> Outgoing:
        event = to_cloudevent(change, obj, self.source, plural=self.reflector.res.plural)
        meta = obj.get("metadata") or {}
        # One lane per name (not per uid): a delete and a re-create stay in order too.
        key = f"{obj['kind']}/{meta.get('namespace') or ''}/{meta.get('name')}"
        EVENTS_EMITTED.labels(obj["kind"], event.get_type()).inc()
        return Outgoing.of(event, key)

    def _submit(self, item: Outgoing) -> None:
        """Queue, waiting as long as it takes (back-pressure), unless shutting down."""
        while not self.deliverer.submit(item, timeout=1.0):
            if self.stop.is_set():
                raise Stopped


class Watcher:
    """All resource loops plus one deliverer: what ``python -m eventop.watcher run`` runs."""

    def __init__(self, kube: Kube, specs: list[ResourceSpec], deliverer: Deliverer, *,
                 settings: WatchSettings | None = None, source: str | None = None) -> None:
        self.kube = kube
        self.deliverer = deliverer
        self.stop_event = threading.Event()
        self.settings = settings or WatchSettings()
        self.source = source or kube.host
        self.loops = [ResourceWatcher(kube, s, deliverer, self.source, self.settings,
                                      self.stop_event) for s in specs]

    def start(self) -> Watcher:
        self.deliverer.start()
        for loop in self.loops:
            loop.start()
        return self

    def wait_synced(self, timeout: float) -> bool:
        """True once every resource finished its first list (events queued, maybe not sent)."""
        deadline = time.monotonic() + timeout
        return all(loop.synced.wait(max(0.0, deadline - time.monotonic()))
                   for loop in self.loops)

    def stop(self, drain_seconds: float = 0.0, join_seconds: float = 1.0) -> int:
        """Stop reading, deliver what is queued (up to ``drain_seconds``); returns undelivered.

        A loop blocked in a quiet watch notices the stop at its next line or read timeout;
        it is not waited for longer than ``join_seconds`` (the threads are daemons and end
        with the process, and a pod has a termination grace period to respect).
        """
        self.stop_event.set()
        left = self.deliverer.stop(drain_seconds)
        deadline = time.monotonic() + join_seconds
        for loop in self.loops:
            loop.join(max(0.0, deadline - time.monotonic()))
        return left
