"""List and watch Kubernetes resources, resiliently, and hand every change to delivery.

One :class:`ResourceWatcher` thread per configured resource runs forever:

1. **LIST** (paginated, page by page, so 10,000 objects are never all in memory at once) and
   emit each object, then **WATCH** from the list's resourceVersion with
   ``allowWatchBookmarks``, a server-side ``timeoutSeconds`` and a client read timeout. A watch
   that goes quiet longer than the read timeout (no event, no bookmark) is treated as hung: the
   silent stall is the classic failure of Python watchers.
2. On any disconnect (server timeout, broken connection, undecodable line such as a truncated
   one) it **resumes from the last resourceVersion** it saw and queued (bookmarks included),
   so nothing is repeated and nothing is skipped.
3. On **410 Expired** (an ERROR event or an HTTP 410: the server no longer has the history) it
   lists again and emits exactly the difference from what it last knew: ``add`` for new objects,
   ``update`` for changed ones, ``delete`` for vanished ones.
4. Every ``resync`` seconds it lists again and emits every object as ``update`` (ids repeat;
   delivery is at-least-once and the handlers are idempotent), so handlers converge even if a
   message was lost downstream.
5. Any API failure (unreachable API server, 5xx, RBAC, resource not installed) is logged with
   what to do and retried with exponential backoff, forever: the loop never silently stops.

Memory stays bounded: per object only its uid, resourceVersion, namespace, name, labels and
ownerReferences are kept (:class:`Known`), never the object. The price: a delete found by a
re-list (the object vanished while the watch history was lost) carries that metadata as its
data (plus the annotation ``eventop.dev/deleted-while-unwatched: "true"``), not the full last
state. Handlers read the API server anyway, and match deleted objects by labels and owners,
so that is enough for them.

Back-pressure: when the delivery buffer is full, :meth:`Deliverer.submit` blocks and the watch
stops reading. If it stays blocked longer than the read timeout, the stream is closed (the API
server would time it out anyway); the event in hand is queued as soon as there is room and the
watch resumes from its resourceVersion. No event is ever dropped.
"""

from __future__ import annotations

import logging
import math
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import urllib3
from prometheus_client import Counter

from eventop.events import WATCH_TYPE_TO_CHANGE, to_cloudevent
from eventop.kube import Kube, KubeError, Unavailable
from eventop.kube.resources import Resource
from eventop.watcher.delivery import Backoff, Deliverer, Outgoing
from eventop.watcher.recording import parse_watch_line

log = logging.getLogger("eventop.watcher")

Obj = dict[str, Any]

WATCH_STARTS = Counter("eventop_watcher_watch_starts_total",
                       "Watch requests opened (first start and every resume)", ["resource"])
RELISTS = Counter("eventop_watcher_relists_total",
                  "Re-lists after 410 Expired (watch history lost)", ["resource"])
RESYNCS = Counter("eventop_watcher_resyncs_total", "Periodic full resyncs", ["resource"])
API_ERRORS = Counter("eventop_watcher_api_errors_total",
                     "List/watch failures that were retried with backoff", ["resource"])
EVENTS_EMITTED = Counter("eventop_watcher_events_emitted_total",
                         "CloudEvents queued for delivery, by kind and type", ["kind", "type"])

DELETED_UNWATCHED = "eventop.dev/deleted-while-unwatched"
MANAGED_SELECTOR = "app.kubernetes.io/managed-by=eventop"
DEFAULT_RESOURCES = (
    "eventop.dev/v1/registrymirrors",
    "eventop.dev/v1/copyrules",
    "eventop.dev/v1/exchangerates",
    "v1/namespaces",
    "v1/configmaps",
    "v1/secrets",
    f"apps/v1/statefulsets:{MANAGED_SELECTOR}",
    f"apps/v1/daemonsets:{MANAGED_SELECTOR}",
)


class Expired(Exception):
    """The API server no longer has the history the watch asked for (410): list again."""


class WatchFailed(Exception):
    """The watch stream carried an ERROR event other than 410."""


class Stopped(Exception):
    """The watcher is shutting down."""


@dataclass(frozen=True)
class ResourceSpec:
    """What to watch: ``[group/]version/plural[@namespace][:label-selector]``.

    Examples: ``v1/configmaps``, ``eventop.dev/v1/copyrules``, ``v1/secrets@team-a``,
    ``apps/v1/statefulsets:app.kubernetes.io/managed-by=eventop``. No namespace means all.
    """

    group: str
    version: str
    plural: str
    namespace: str | None = None
    label_selector: str | None = None

    @classmethod
    def parse(cls, text: str) -> ResourceSpec:
        head, _, selector = text.strip().partition(":")
        head, _, namespace = head.partition("@")
        parts = head.split("/")
        if len(parts) == 3:
            group, version, plural = parts
        elif len(parts) == 2:
            group, version, plural = "", parts[0], parts[1]
        elif len(parts) == 1 and parts[0] and "." not in parts[0]:
            group, version, plural = "", "v1", parts[0]
        else:
            raise ValueError(f"cannot read resource {text!r}: write [group/]version/plural"
                             "[@namespace][:selector], e.g. apps/v1/statefulsets or v1/secrets")
        if not (version and plural):
            raise ValueError(f"resource {text!r} needs a version and a plural")
        return cls(group, version, plural, namespace or None, selector or None)

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    def __str__(self) -> str:
        out = f"{self.api_version}/{self.plural}"
        if self.namespace:
            out += f"@{self.namespace}"
        if self.label_selector:
            out += f":{self.label_selector}"
        return out


def parse_resources(text: str) -> list[ResourceSpec]:
    """Resources separated by whitespace or newlines (label selectors contain commas)."""
    return [ResourceSpec.parse(t) for t in text.split() if t.strip()]


@dataclass(frozen=True)
class WatchSettings:
    """Every interval is configurable so tests can make failures happen in a second."""

    # How fast a silently hung watch is noticed rests on these two. Measured on the real
    # kube-apiserver v1.24: it sends a BOOKMARK only ~2 s before the deadline the client
    # asked for (timeoutSeconds=45: at 43.7 s), and only when the resource changed
    # somewhere since the watch began; an idle resource gets none at all (timeoutSeconds=
    # 300: nothing for 300 s, then the end of the stream). Newer servers add one about
    # every minute. So the server-side timeout is what bounds a healthy watch's silence:
    # 45 s, after which the stream ends and is resumed. A read timeout of 60 s then never
    # fires on a healthy watch and notices a hung one within a minute (client-go notices
    # a dead HTTP/2 connection in ~45 s by pings; HTTP/1.1 has none). The price is one
    # watch request per resource every 45 s.
    watch_timeout: int = 45  # server-side timeoutSeconds of one watch request
    read_timeout: float = 60.0  # client: no byte for this long means the watch hung
    connect_timeout: float = 5.0
    resync_seconds: float = 300.0  # 0 disables the periodic resync
    page_size: int = 500
    backoff: Backoff = field(default_factory=lambda: Backoff(0.5, 30.0))


def resolve(kube: Kube, spec: ResourceSpec) -> Resource:
    """The :class:`Resource` of a spec: the static table, else API discovery."""
    res = kube.resources.by_plural(spec.group, spec.plural)
    if res is not None and res.version == spec.version:
        return res
    path = f"/apis/{spec.api_version}" if spec.group else f"/api/{spec.version}"
    doc = kube.request("GET", path, verb="discovery")
    for item in doc.get("resources", []):
        if item.get("name") == spec.plural:
            res = Resource(spec.group, spec.version, str(item["kind"]), spec.plural,
                           bool(item.get("namespaced")))
            kube.resources.add(res)
            return res
    raise KubeError(f"the API server does not serve {spec.plural} in {spec.api_version} "
                    "(is the CRD installed? kubectl apply -k crds/)", status=404,
                    reason="NotFound")


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


class ResourceWatcher:
    """List+watch one resource forever; see the module docstring for the behaviour."""

    def __init__(self, kube: Kube, spec: ResourceSpec, deliverer: Deliverer, source: str,
                 settings: WatchSettings, stop: threading.Event) -> None:
        self.kube = kube
        self.spec = spec
        self.deliverer = deliverer
        self.source = source
        self.settings = settings
        self.stop = stop
        self.name = str(spec)
        self.res: Resource | None = None
        self.rv = ""  # where the next watch starts: the last change queued or bookmark seen
        self.known: dict[str, Known] = {}  # uid -> what a delete found by a re-list needs
        self.synced = threading.Event()  # set after the first complete list
        self._seen_since_list = 0  # watch events and bookmarks since the last list
        self._lines_ok = 0  # decodable watch lines ever: progress, as opposed to spinning
        self._next_resync = math.inf
        self._thread: threading.Thread | None = None

    # -- lifecycle -------------------------------------------------------------------

    def start(self) -> ResourceWatcher:
        self._thread = threading.Thread(target=self.run, name=f"watch {self.name}", daemon=True)
        self._thread.start()
        return self

    def join(self, timeout: float | None = None) -> None:
        if self._thread is not None:
            self._thread.join(timeout)

    def run(self) -> None:
        """The forever loop: never returns until stopped, whatever the API server does."""
        mode: str | None = "list"
        failures = expired_streak = 0
        while not self.stop.is_set():
            try:
                if self.res is None:
                    self.res = resolve(self.kube, self.spec)
                if mode is not None:
                    self.rv = self._sync(mode)
                    mode = None
                    self.synced.set()
                    if self.settings.resync_seconds > 0:
                        self._next_resync = time.monotonic() + self.settings.resync_seconds
                progressed = self._watch()
                failures = 0 if progressed else failures + 1
                if self._resync_due():
                    mode = "resync"
                elif not progressed:  # an empty, short-lived stream: do not spin
                    self.stop.wait(self.settings.backoff.delay(failures - 1))
            except Stopped:
                return
            except Expired as exc:
                RELISTS.labels(self.name).inc()
                # Expired again right after a list, with nothing seen in between: back off,
                # or a server with a very short history would be hammered with LISTs.
                expired_streak = expired_streak + 1 if self._seen_since_list == 0 else 1
                log.warning("%s: watch history expired (%s); listing again to emit what "
                            "changed since resourceVersion %s", self.name, exc, self.rv,
                            extra={"fields": {"resource": self.name, "rv": self.rv}})
                mode = mode or "list"
                if expired_streak > 1:
                    self.stop.wait(self.settings.backoff.delay(expired_streak - 2))
            except Exception as exc:
                failures += 1
                API_ERRORS.labels(self.name).inc()
                delay = self.settings.backoff.delay(failures - 1)
                expected = isinstance(exc, KubeError | urllib3.exceptions.HTTPError | OSError
                                      | WatchFailed)
                log.error("%s: %s; retrying in %.1fs (attempt %d)", self.name,
                          _describe(exc, self.kube), delay, failures, exc_info=not expected,
                          extra={"fields": {"resource": self.name, "attempt": failures}})
                self.stop.wait(delay)

    def _resync_due(self) -> bool:
        return time.monotonic() >= self._next_resync

    # -- list ------------------------------------------------------------------------

    def _sync(self, mode: str) -> str:
        """List every object; emit the difference from ``known`` (``resync``: all as update).

        Returns the list's resourceVersion, where the next watch starts.
        """
        assert self.res is not None
        if mode == "resync":
            RESYNCS.labels(self.name).inc()
        res, spec = self.res, self.spec
        seen: set[str] = set()
        cont = ""
        counts = {"add": 0, "update": 0, "delete": 0}
        while True:
            query: list[tuple[str, Any]] = [("limit", self.settings.page_size)]
            if spec.label_selector:
                query.append(("labelSelector", spec.label_selector))
            if cont:
                query.append(("continue", cont))
            try:
                page = self.kube.request(
                    "GET", res.path(spec.namespace), verb="list", query=query,
                    timeout=(self.settings.connect_timeout, max(30.0, self.settings.read_timeout)))
            except KubeError as exc:
                if exc.status == 410 and cont:  # the continue token outlived its snapshot
                    log.info("%s: list continue token expired; listing from the start",
                             self.name)
                    seen.clear()
                    cont = ""
                    continue
                raise
            for item in page.get("items") or []:
                item.setdefault("apiVersion", res.api_version)
                item.setdefault("kind", res.kind)
                meta = item.get("metadata") or {}
                uid, rv = str(meta.get("uid")), str(meta.get("resourceVersion"))
                seen.add(uid)
                prev = self.known.get(uid)
                change = ("add" if prev is None else
                          "update" if prev.rv != rv or mode == "resync" else None)
                if change:
                    self._emit(change, item)
                    counts[change] += 1
                self._remember(uid, rv, meta)
            meta = page.get("metadata") or {}
            cont = meta.get("continue") or ""
            del page
            if not cont:
                break
        for uid in [u for u in self.known if u not in seen]:
            self._emit("delete", self.known[uid].last_state(res, uid))
            counts["delete"] += 1
            del self.known[uid]
        list_rv = str(meta.get("resourceVersion") or "")
        self._seen_since_list = 0
        log.info("%s: %s of %d objects at resourceVersion %s: %d add, %d update, %d delete",
                 self.name, mode, len(self.known), list_rv, counts["add"], counts["update"],
                 counts["delete"], extra={"fields": {"resource": self.name, **counts}})
        return list_rv

    def _remember(self, uid: str, rv: str, meta: Obj) -> None:
        ns = meta.get("namespace")
        self.known[uid] = Known(rv, sys.intern(ns) if ns else None, str(meta.get("name")),
                                meta.get("labels") or None, meta.get("ownerReferences") or None)

    # -- watch -----------------------------------------------------------------------

    def _watch(self) -> bool:
        """One watch request from ``self.rv``. True if it carried anything (progress)."""
        assert self.res is not None
        timeout = self.settings.watch_timeout
        if self._next_resync != math.inf:
            timeout = max(1, min(timeout, math.ceil(self._next_resync - time.monotonic())))
        query: list[tuple[str, Any]] = [("resourceVersion", self.rv),
                                        ("allowWatchBookmarks", "true"),
                                        ("timeoutSeconds", timeout)]
        if self.spec.label_selector:
            query.append(("labelSelector", self.spec.label_selector))
        WATCH_STARTS.labels(self.name).inc()
        log.debug("%s: watching from resourceVersion %s", self.name, self.rv)
        # A generator: the request itself is made by the first iteration, inside the try.
        lines = self.kube.iter_watch(self.res, self.spec.namespace, query,
                                     (self.settings.connect_timeout, self.settings.read_timeout))
        before = self._lines_ok
        try:
            for line in lines:
                if self.stop.is_set():
                    raise Stopped
                if not self._handle_line(line, lines):
                    break
                if self._resync_due():
                    break
        except urllib3.exceptions.ReadTimeoutError:
            log.warning("%s: no event or bookmark for %.0fs, the watch looks hung; "
                        "reconnecting from resourceVersion %s", self.name,
                        self.settings.read_timeout, self.rv,
                        extra={"fields": {"resource": self.name, "rv": self.rv}})
            return True  # a timely, deliberate reconnect; no backoff needed
        except KubeError as exc:
            if exc.status == 410:  # the watch request itself answered 410 Gone
                raise Expired(str(exc)) from exc
            raise
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            log.warning("%s: watch connection broke (%s); resuming from resourceVersion %s",
                        self.name, exc, self.rv,
                        extra={"fields": {"resource": self.name, "rv": self.rv}})
        finally:
            lines.close()
        return self._lines_ok > before

    def _handle_line(self, line: bytes, lines: Any) -> bool:
        """Process one watch line; False means: close this stream and resume from ``self.rv``."""
        try:
            wtype, obj = parse_watch_line(line)
        except ValueError as exc:
            log.warning("%s: undecodable watch line (%d bytes: %s), the stream was cut; "
                        "resuming from resourceVersion %s", self.name, len(line), exc, self.rv,
                        extra={"fields": {"resource": self.name, "rv": self.rv}})
            return False
        meta = obj.get("metadata") or {}
        if wtype != "ERROR":
            self._seen_since_list += 1
            self._lines_ok += 1
        if wtype == "BOOKMARK":
            if meta.get("resourceVersion"):
                self.rv = str(meta["resourceVersion"])
            return True
        if wtype == "ERROR":
            if obj.get("code") == 410:
                raise Expired(f"{obj.get('reason')}: {obj.get('message')}")
            raise WatchFailed(f"the watch returned an ERROR event: {obj.get('code')} "
                              f"{obj.get('reason')}: {obj.get('message')}")
        change = WATCH_TYPE_TO_CHANGE.get(wtype)
        if change is None:
            log.warning("%s: unknown watch event type %r ignored", self.name, wtype)
            return True
        assert self.res is not None
        obj.setdefault("apiVersion", self.res.api_version)
        obj.setdefault("kind", self.res.kind)
        item = self._outgoing(change, obj)
        if not self.deliverer.submit(item, timeout=self.settings.read_timeout):
            log.warning("%s: the sink is slow (%d events waiting); stopped reading the watch "
                        "and will resume from resourceVersion %s once delivery catches up",
                        self.name, self.deliverer.pending, self.rv,
                        extra={"fields": {"resource": self.name, "rv": self.rv}})
            lines.close()
            self._submit(item)
            self._record(change, obj)
            return False
        self._record(change, obj)
        return True

    def _record(self, change: str, obj: Obj) -> None:
        meta = obj.get("metadata") or {}
        uid, rv = str(meta.get("uid")), str(meta.get("resourceVersion"))
        if change == "delete":
            self.known.pop(uid, None)
        else:
            self._remember(uid, rv, meta)
        self.rv = rv

    # -- emit ------------------------------------------------------------------------

    def _outgoing(self, change: str, obj: Obj) -> Outgoing:
        assert self.res is not None
        event = to_cloudevent(change, obj, self.source, plural=self.res.plural)
        meta = obj.get("metadata") or {}
        # One lane per name (not per uid): a delete and a re-create stay in order too.
        key = f"{obj['kind']}/{meta.get('namespace') or ''}/{meta.get('name')}"
        EVENTS_EMITTED.labels(obj["kind"], event.get_type()).inc()
        return Outgoing.of(event, key)

    def _emit(self, change: str, obj: Obj) -> None:
        self._submit(self._outgoing(change, obj))

    def _submit(self, item: Outgoing) -> None:
        """Queue, waiting as long as it takes (back-pressure), unless shutting down."""
        while not self.deliverer.submit(item, timeout=1.0):
            if self.stop.is_set():
                raise Stopped


def _describe(exc: BaseException, kube: Kube) -> str:
    """A failure as one line that says what is wrong and what to check."""
    if isinstance(exc, KubeError):
        if exc.status == 403:
            return (f"forbidden: {exc.message} (grant list and watch on it to the watcher's "
                    "ServiceAccount, see deploy/)")
        if exc.status == 404:
            return (f"not found: {exc.message} (is the resource served? for eventop.dev "
                    "kinds install the CRDs: kubectl apply -k crds/)")
        if isinstance(exc, Unavailable) and not exc.reason:
            return f"{exc} (is the API server up and reachable?)"
        if exc.status >= 500 or exc.status == 429:
            return f"Kubernetes API at {kube.host} answered {exc}"
        return str(exc)
    return f"{type(exc).__name__}: {exc}"


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
