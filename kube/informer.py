"""Informers: a reflector per kind keeping a :class:`~eventop.kube.store.Store` current, so
that handlers read from memory instead of the API server.

The router keeps one per kind its handlers declare. Each knows how far it has caught up (the
resourceVersion of its last list, event or bookmark), so that work triggered by an event is
never done on a cache older than that event (:meth:`Informer.wait_for`). A kind the API
server does not serve (a CRD not installed yet) is looked up again every
``missing_retry`` seconds, quietly; :attr:`Informer.missing` says so for readiness.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from eventop.kube.client import Kube
from eventop.kube.reflector import Reflector, Sink, Watched, WatchSettings, until_served
from eventop.kube.resources import is_custom
from eventop.kube.store import Store, key_of, rv_at_least, slim

log = logging.getLogger("eventop.kube.informer")

Obj = dict[str, Any]
FORBIDDEN_HINT = "grant list and watch on it to the router's ServiceAccount, see deploy/"
OPTIONAL_MISSING_RETRY = 60.0


#: The change a listener gets when a kind that stopped being served is listed again.
SERVED_AGAIN = "served-again"


@dataclass(frozen=True)
class InformerSpec:
    """What to cache of a kind: all objects or those matching a label selector; whole or
    metadata only."""

    api_version: str
    kind: str
    metadata_only: bool = False
    selector: str | None = None
    #: An add-on's kind the cluster may never serve (the snapshot API): looked for once a
    #: minute, not every ``missing_retry`` (one discovery 404 every 10 s, forever, per
    #: replica); an event of it still makes the informer look at once.
    optional: bool = False

    def __str__(self) -> str:
        return f"{self.api_version}/{self.kind}"


class Informer(Sink):
    """One kind, listed and watched into a store."""

    def __init__(self, kube: Kube, spec: InformerSpec, settings: WatchSettings,
                 stop: threading.Event, *, missing_retry: float = 10.0,
                 on_change: Callable[[InformerSpec, str, Obj], None] | None = None) -> None:
        self.kube = kube
        #: Called with each watched change once the store holds it (not for lists).
        self.on_change = on_change
        self.spec = spec
        self.stop = stop
        self.missing_retry = max(missing_retry, OPTIONAL_MISSING_RETRY) if spec.optional \
            else missing_retry
        self.store: Store | None = None
        #: The API server does not serve the kind (its CRD is not installed): retried.
        self.missing = False
        self._look_again = threading.Event()
        self._changed = threading.Condition()
        self._listing: list[Obj] = []
        self._listed = False  # a list completed once
        self._lost = False  # not served since (its CRD deleted, or a 404 in passing)
        self.reflector = Reflector(kube, self._resolve, self, settings, stop, name=str(spec),
                                   hint=FORBIDDEN_HINT, logger=log, says_gone=False)

    # -- state -----------------------------------------------------------------------

    @property
    def synced(self) -> bool:
        return self.reflector.synced.is_set()

    @property
    def resource_version(self) -> str:
        return self.store.resource_version if self.store is not None else ""

    def start(self) -> Informer:
        self.reflector.start()
        return self

    def join(self, timeout: float | None = None) -> None:
        self._look_again.set()  # (out of the wait for a kind not served, when stopping)
        self.reflector.join(timeout)

    def look_again(self) -> None:
        """The kind is served after all (an event of it came, from the watcher or a
        Knative source): while it is missing, look at once instead of at the next of the
        ``missing_retry`` polls, so the event's redelivery finds the cache synced."""
        if self.missing:
            self._look_again.set()

    def matches(self, obj: Obj) -> bool:
        """Would this informer hold ``obj`` (its label selector, if any, matches)?"""
        if not self.spec.selector:
            return True
        labels = (obj.get("metadata") or {}).get("labels") or {}
        return all(_requirement_met(part.strip(), labels)
                   for part in self.spec.selector.split(",") if part.strip())

    def wait_for(self, resource_version: str | None, obj: Obj | None, timeout: float, *,
                 deleted: bool = False) -> bool:
        """Wait until the store reflects ``resource_version`` (a change of ``obj``).

        resourceVersions that are integers (every real API server's) are compared as such,
        as client-go does for consistent reads from its cache. Otherwise the store must
        hold ``obj`` at exactly that resourceVersion. ``deleted``: the store must also no
        longer hold that object (a delete found by a re-list carries the object's last
        resourceVersion, not the delete's). False if not reached within ``timeout`` seconds.
        """
        return self._await(lambda: self._reached(resource_version, obj, deleted)
                           and (not deleted or not self.holds(obj)), timeout)

    def wait_newer(self, namespace: str | None, name: str, than: str | None,
                   timeout: float) -> Obj | None:
        """The object once the store holds it at a version other than ``than`` (None: at
        any version), or None after ``timeout``: what someone else just wrote (a create or
        update refused with 409) usually arrives by the watch within milliseconds."""
        store = self.store
        if self.spec.metadata_only or store is None:
            return None  # without its data the object can not be compared
        found: list[Obj] = []

        def newer() -> bool:
            held = store.get(namespace, name) if self.synced else None
            if held is not None and (than is None or held["metadata"].get(
                    "resourceVersion") != than):
                found.append(held)
            return bool(found)

        return found[0] if self._await(newer, timeout) else None

    def _await(self, ready: Callable[[], bool], timeout: float) -> bool:
        """Wait at most ``timeout`` seconds for ``ready()``, asked again on every change of
        the store; False if it never was (or the cache stopped)."""
        with self._changed:
            return bool(self._changed.wait_for(lambda: ready() or self.stop.is_set(), timeout)
                        and (not self.stop.is_set() or ready()))

    def holds(self, obj: Obj | None) -> bool:
        """Does the store hold this very object (same uid), at any version?"""
        if obj is None or self.store is None:
            return False
        ns, name = key_of(obj)
        held = self.store.get(ns, name)
        uid = (obj.get("metadata") or {}).get("uid")
        return held is not None and (uid is None or (held.get("metadata") or {}).get("uid") == uid)

    def _reached(self, resource_version: str | None, obj: Obj | None, deleted: bool) -> bool:
        if not self.synced or self.store is None:
            return False
        if not resource_version:
            return True
        ordered = rv_at_least(self.store.resource_version, resource_version)
        if ordered is not None:
            return ordered
        if obj is None or deleted:
            return True
        ns, name = key_of(obj)
        held = self.store.get(ns, name)
        return held is not None and (held.get("metadata") or {}).get("resourceVersion") == \
            resource_version

    # -- finding the resource ----------------------------------------------------------

    def _resolve(self) -> Watched:
        why = ("is its CustomResourceDefinition installed?" if is_custom(self.spec.api_version)
               else "this API server does not enable that group/version")

        def find() -> Watched:
            # Discovery, not the static table: whether the kind is served is the question.
            res = self.kube.served(self.spec.api_version, self.spec.kind)
            if self.store is None:
                self.store = Store(res.api_version, res.kind, namespaced=res.namespaced)
            return Watched(res, None, self.spec.selector, self.spec.metadata_only)

        return until_served(find, self.stop, self.missing_retry, log, str(self.spec), why,
                            self._set_missing, self._look_again)

    def _set_missing(self, missing: bool) -> None:
        if missing and self._listed:
            self._lost = True
        self.missing = missing

    # -- the reflector's sink ----------------------------------------------------------

    def begin_list(self, mode: str) -> None:
        self._listing = []

    def list_item(self, obj: Obj) -> None:
        self._listing.append(slim(obj))

    def end_list(self, resource_version: str) -> None:
        assert self.store is not None
        self.store.replace_all(self._listing, resource_version)
        self._listing = []
        log.info("%s: cached %d objects at resourceVersion %s", self.spec, len(self.store),
                 resource_version)
        self._listed = True
        self._notify()
        if self._lost and self.on_change is not None:
            self._lost = False
            try:
                self.on_change(self.spec, SERVED_AGAIN, {})
            except Exception:  # a listener's bug must not stop the cache
                log.exception("%s: a listener failed on %s", self.spec, SERVED_AGAIN)

    def offer(self, change: str, obj: Obj, timeout: float) -> bool:
        assert self.store is not None
        if change == "delete":
            self.store.remove(obj)
        else:
            self.store.put(obj)
        rv = (obj.get("metadata") or {}).get("resourceVersion")
        if rv:
            self.store.resource_version = str(rv)
        self._notify()
        if self.on_change is not None:
            try:
                self.on_change(self.spec, change, obj)
            except Exception:  # a listener's bug must not stop the cache
                log.exception("%s: a listener failed on a %s event", self.spec, change)
        return True

    def bookmark(self, resource_version: str) -> None:
        if self.store is not None:
            self.store.resource_version = resource_version
            self._notify()

    def _notify(self) -> None:
        with self._changed:
            self._changed.notify_all()


def _requirement_met(requirement: str, labels: dict[str, str]) -> bool:
    """One requirement of a label selector in the API's syntax: ``k=v``, ``k==v``, ``k!=v``,
    ``k``, ``!k`` (set-based ``in``/``notin`` are treated as matching: no wait is skipped)."""
    if requirement.startswith("!"):
        return requirement[1:] not in labels
    if "!=" in requirement:
        key, value = requirement.split("!=", 1)
        return labels.get(key.strip()) != value.strip()
    if "=" in requirement:
        key, value = requirement.replace("==", "=").split("=", 1)
        return labels.get(key.strip()) == value.strip()
    if " " in requirement:
        return True
    return requirement in labels


class Cache:
    """The router's informers, one per cached kind."""

    def __init__(self, kube: Kube, specs: Iterable[InformerSpec], *,
                 settings: WatchSettings | None = None, missing_retry: float = 10.0) -> None:
        self.kube = kube
        self.stop_event = threading.Event()
        # The cache needs no periodic re-list: the watch keeps it current, a 410 re-lists.
        self.settings = settings or WatchSettings(resync_seconds=0)
        self._listeners: list[Callable[[InformerSpec, str, Obj], None]] = []
        self.informers = {(s.api_version, s.kind): Informer(kube, s, self.settings,
                                                            self.stop_event,
                                                            missing_retry=missing_retry,
                                                            on_change=self._changed)
                          for s in specs}

    def listen(self, fn: Callable[[InformerSpec, str, Obj], None]) -> None:
        """Call ``fn(spec, change, obj)`` for every change a watch brings (``add``,
        ``update``, ``delete``), on the informer's thread, after its store holds it.
        Changes found by a (re)list are not announced: whoever listens runs everything
        once the cache has synced, as a controller does at start, and again on
        ``SERVED_AGAIN`` (``obj`` empty): the kind was not served for a while (its CRD
        deleted and installed again, a 404 in passing) and is listed again, so what a
        listener dropped meanwhile is run."""
        self._listeners.append(fn)

    def _changed(self, spec: InformerSpec, change: str, obj: Obj) -> None:
        for fn in self._listeners:
            fn(spec, change, obj)

    def start(self) -> Cache:
        for informer in self.informers.values():
            informer.start()
        return self

    def stop(self, join_seconds: float = 1.0) -> None:
        self.stop_event.set()
        deadline = time.monotonic() + join_seconds
        for informer in self.informers.values():
            informer.join(max(0.0, deadline - time.monotonic()))

    def informer(self, api_version: str, kind: str) -> Informer | None:
        return self.informers.get((api_version, kind))

    def store(self, api_version: str, kind: str) -> Store | None:
        """The store of a kind, once its informer has synced; None otherwise."""
        informer = self.informers.get((api_version, kind))
        if informer is None or not informer.synced:
            return None
        return informer.store

    def wait_synced(self, timeout: float, kinds: Iterable[tuple[str, str]] | None = None,
                    ready: Callable[[Informer], bool] = lambda i: i.synced) -> bool:
        """True once the informers of ``kinds`` (default: all) have synced."""
        deadline = time.monotonic() + timeout
        wanted = [self.informers[k] for k in kinds] if kinds is not None else \
            list(self.informers.values())
        for informer in wanted:
            if not informer.reflector.synced.wait(max(0.0, deadline - time.monotonic())):
                return False
        return all(ready(i) for i in wanted)
