"""List and watch one resource forever, resiliently, and hand every change to a sink.

The one list/watch loop of eventop, shared by the watcher (changes become CloudEvents), the
router's informer cache (changes fill a :class:`~eventop.kube.store.Store`) and ``watcher
record`` (changes are saved verbatim). Behaviour:

1. **LIST** page by page (10,000 objects are never all in memory at once), then **WATCH**
   from the list's resourceVersion with ``allowWatchBookmarks``, a server-side
   ``timeoutSeconds`` and a client read timeout. A watch quiet for longer than the read
   timeout (no event, no bookmark) is treated as hung: the silent stall is the classic
   failure of Python watchers.
2. On any disconnect (server timeout, broken connection, an undecodable line such as a
   truncated one) it **resumes from the last resourceVersion** it handed over (bookmarks
   included), so nothing is repeated and nothing is skipped.
3. On **410 Expired** (an ERROR event or an HTTP 410: the server no longer has the history)
   it lists again; the sink sees a new list and works out the difference.
4. Every ``resync_seconds`` (0: never) it lists again (mode ``resync``).
5. Any API failure (unreachable API server, 5xx, RBAC, resource not installed) is logged
   with what to do and retried with exponential backoff, forever: the loop never silently
   stops.

Back-pressure: a sink that can not take an event within the read timeout
(:meth:`Sink.offer` is False) makes the loop close the stream (the API server would time it
out anyway), hand the event over as soon as the sink takes it (:meth:`Sink.put`), and resume
from its resourceVersion. No event is ever dropped.

Metadata-only: with ``metadata_only`` the server is asked for PartialObjectMetadata (only
``metadata`` of each object: a fraction of the bytes); the objects handed over carry the
resource's own apiVersion and kind.
"""

from __future__ import annotations

import json
import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import urllib3
from prometheus_client import Counter

from eventop.kube.backoff import Backoff
from eventop.kube.client import Kube
from eventop.kube.errors import JUST_STARTED, ContinueExpired, KubeError, Unavailable
from eventop.kube.resources import Resource

log = logging.getLogger("eventop.kube.reflector")

Obj = dict[str, Any]

WATCH_STARTS = Counter("eventop_watcher_watch_starts_total",
                       "Watch requests opened (first start and every resume)", ["resource"])
RELISTS = Counter("eventop_watcher_relists_total",
                  "Re-lists after 410 Expired (watch history lost)", ["resource"])
RESYNCS = Counter("eventop_watcher_resyncs_total", "Periodic full resyncs", ["resource"])
API_ERRORS = Counter("eventop_watcher_api_errors_total",
                     "List/watch failures that were retried with backoff", ["resource"])


#: How often a resource that stopped being served (its CRD deleted) is looked up again.
GONE_POLL = 10.0


class Expired(Exception):
    """The API server no longer has the history the watch asked for (410): list again."""


class WatchFailed(Exception):
    """The watch stream carried an ERROR event other than 410."""


class Stopped(Exception):
    """The loop is shutting down."""


#: Longest wait between attempts to list/watch while the API server fails (the watcher's
#: ``--api-backoff-max`` default too).
API_BACKOFF_MAX = 4.0


@dataclass(frozen=True)
class WatchSettings:
    """Every interval is configurable so tests can make failures happen in a second."""

    # How fast a silently hung watch is noticed rests on these two. Measured on the real
    # kube-apiserver v1.24: it sends a BOOKMARK only ~2 s before the deadline the client
    # asked for (timeoutSeconds=45: at 43.7 s), and only when the resource changed
    # somewhere since the watch began; an idle resource gets none at all (timeoutSeconds=
    # 300: nothing for 300 s, then the end of the stream). Newer servers add one about
    # every minute. So the server-side timeout is what bounds a healthy watch's silence:
    # 45 s, after which the stream ends and is resumed. A read timeout of 55 s then never
    # fires on a healthy watch and notices a hung one within a minute (client-go notices
    # a dead HTTP/2 connection in ~45 s by pings; HTTP/1.1 has none). The price is one
    # watch request per resource every 45 s.
    watch_timeout: int = 45  # server-side timeoutSeconds of one watch request
    read_timeout: float = 55.0  # client: no byte for this long means the watch hung
    connect_timeout: float = 5.0
    resync_seconds: float = 300.0  # 0 disables the periodic resync
    page_size: int = 500
    # Short, so that a cache is current within seconds of the API server answering again:
    # capped at 30 s (client-go's), the router's caches came back up to 24 s after the
    # watcher, and the events in between waited for them and were answered 503.
    backoff: Backoff = field(default_factory=lambda: Backoff(0.5, API_BACKOFF_MAX))
    # A stream that ended with nothing in it is spinning only if it was this short (client-go's
    # "very short watch": under a second, no items). An idle kind's watch ends empty at its
    # timeout every time; resuming it at once keeps the cache and the watcher current.
    short_watch: float = 1.0


@dataclass(frozen=True)
class Watched:
    """What one loop lists and watches: a resource, in one namespace or all, maybe only the
    objects matching a label selector, maybe only their metadata."""

    resource: Resource
    namespace: str | None = None
    label_selector: str | None = None
    metadata_only: bool = False

    def __str__(self) -> str:
        return watch_string(self.resource.api_version, self.resource.plural, self.namespace,
                            self.label_selector)


def watch_string(api_version: str, plural: str, namespace: str | None = None,
                 label_selector: str | None = None) -> str:
    """``<apiVersion>/<plural>[@namespace][:selector]``: how the watcher's flags, its logs
    and metrics name what is watched."""
    out = f"{api_version}/{plural}"
    if namespace:
        out += f"@{namespace}"
    if label_selector:
        out += f":{label_selector}"
    return out


class Sink:
    """Where a :class:`Reflector` hands what it sees. Every method has a do-nothing default.

    A list is ``begin_list(mode)``, then ``list_item(obj)`` per object, then
    ``end_list(resourceVersion)``; ``mode`` is ``list`` (the first, or after 410) or
    ``resync``. Watch events come as ``offer(change, obj)`` (change is add, update or
    delete). ``raw_page`` and ``raw_line`` see what the server sent, before anything is made
    of it (a recording keeps exactly that).
    """

    def begin_list(self, mode: str) -> None:
        """A (re)list starts; ``mode`` is ``list`` or ``resync``."""

    def raw_page(self, page: Obj) -> None:
        """One LIST page exactly as the server sent it (do not keep a reference: its items
        are completed with apiVersion and kind right after)."""

    def list_item(self, obj: Obj) -> None:
        """One listed object (apiVersion and kind filled in)."""

    def end_list(self, resource_version: str) -> None:
        """The list is complete, at this resourceVersion; the watch starts from it."""

    def offer(self, change: str, obj: Obj, timeout: float) -> bool:
        """One watched change; False if it could not be taken within ``timeout`` seconds
        (the loop then closes the stream and calls :meth:`put`)."""
        return True

    def put(self, change: str, obj: Obj) -> None:
        """Take the change, waiting as long as it takes; raise :class:`Stopped` to stop."""

    def bookmark(self, resource_version: str) -> None:
        """The watch has reached this resourceVersion (no change to hand over)."""

    def raw_line(self, line: bytes) -> None:
        """One watch line exactly as the server sent it (before parsing)."""


def parse_watch_line(line: str | bytes) -> tuple[str, Obj]:
    """One watch line as (watch type, object); ValueError if it is not one (e.g. cut short)."""
    try:
        ev = json.loads(line)
        wtype, obj = ev["type"], ev["object"]
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"not a watch event: {exc}") from exc
    if not isinstance(obj, dict):
        raise ValueError("not a watch event: its object is not a JSON object")
    return str(wtype), obj


#: How the watch API names a change, and how eventop (and its event types) do.
WATCH_TYPE_TO_CHANGE = {"ADDED": "add", "MODIFIED": "update", "DELETED": "delete"}


class Reflector:
    """List+watch one resource forever into a :class:`Sink`; see the module docstring."""

    def __init__(self, kube: Kube, watched: Watched | Callable[[], Watched], sink: Sink,
                 settings: WatchSettings, stop: threading.Event, *, name: str | None = None,
                 hint: str = "", logger: logging.Logger | None = None,
                 says_gone: bool = True) -> None:
        """``watched`` may be a function finding it (API discovery), called inside the loop
        so that a resource not served yet (a CRD to be installed) is retried, not fatal.
        ``says_gone``: a resource served and then not is one warning here; False where that
        function says it already (the router's informers wait in it, and say so)."""
        self.says_gone = says_gone
        self.kube = kube
        self._resolve = watched if callable(watched) else None
        self._watched = None if callable(watched) else watched
        self.sink = sink
        self.settings = settings
        self.stop = stop
        self.name = name or str(watched)
        self.hint = hint  # what to do about a 403, for this component (see describe)
        self.log = logger or log
        self.rv = ""  # where the next watch starts: the last change handed over or bookmark
        self.synced = threading.Event()  # set after the first complete list
        self._seen_since_list = 0  # watch events and bookmarks since the last list
        self._lines_ok = 0  # decodable watch lines ever: progress, as opposed to spinning
        self._next_resync = math.inf
        self._thread: threading.Thread | None = None

    @property
    def watched(self) -> Watched:
        if self._watched is None:
            raise LookupError(f"{self.name}: not resolved yet")
        return self._watched

    @property
    def res(self) -> Resource:
        return self.watched.resource

    # -- lifecycle -------------------------------------------------------------------

    def start(self) -> Reflector:
        self._thread = threading.Thread(target=self.run, name=f"watch {self.name}", daemon=True)
        self._thread.start()
        return self

    def join(self, timeout: float | None = None) -> None:
        if self._thread is not None:
            self._thread.join(timeout)

    @property
    def running(self) -> bool:
        """Its thread has started and not ended."""
        return self._thread is not None and self._thread.is_alive()

    def run(self) -> None:
        """The forever loop: never returns until stopped, whatever the API server does."""
        mode: str | None = "list"
        failures = expired_streak = errors = 0
        gone = False  # served once, not served now: looked up again quietly
        while not self.stop.is_set():
            try:
                if self._watched is None:
                    assert self._resolve is not None
                    self._watched = self._resolve()
                if mode is not None:
                    self.rv = self._list(mode)
                    mode = None
                    if gone:
                        gone = False
                        if self.says_gone:
                            self.log.info("%s: served again; listed", self.name,
                                          extra={"fields": {"resource": self.name}})
                    self.synced.set()
                    if self.settings.resync_seconds > 0:
                        self._next_resync = time.monotonic() + self.settings.resync_seconds
                    errors = self._recovered(errors)
                progressed = self._watch()
                failures = 0 if progressed else failures + 1
                if progressed:
                    errors = self._recovered(errors)
                if self._resync_due():
                    mode = "resync"
                elif not progressed:  # an empty stream under short_watch: do not spin
                    self.stop.wait(self.settings.backoff.delay(failures - 1))
            except Stopped:
                return
            except Expired as exc:
                RELISTS.labels(self.name).inc()
                # Expired again right after a list, with nothing seen in between: back off,
                # or a server with a very short history would be hammered with LISTs.
                expired_streak = expired_streak + 1 if self._seen_since_list == 0 else 1
                self.log.warning("%s: watch history expired (%s); listing again to catch up on "
                            "what changed since resourceVersion %s", self.name, exc, self.rv,
                            extra={"fields": {"resource": self.name, "rv": self.rv}})
                mode = mode or "list"
                if expired_streak > 1:
                    self.stop.wait(self.settings.backoff.delay(expired_streak - 2))
            except Exception as exc:
                if (isinstance(exc, KubeError) and exc.status == 404
                        and self._resolve is not None and (self.synced.is_set() or gone)):
                    # Served until now, gone now (its CRD deleted): not synced any more, so
                    # readers see it is not served (an optional kind's handler takes its other
                    # way), and it is looked up again, quietly, until it is served again
                    # (each 404 after the first at debug: ERRORs at every doubling of the
                    # backoff read as an outage).
                    if gone:
                        self.log.debug("%s: still not served: %s", self.name, exc)
                        self.stop.wait(GONE_POLL)
                    elif not self.says_gone:
                        self.log.debug("%s: not served any more: %s", self.name, exc)
                    else:
                        self.log.warning("%s: not served by the API server any more (%s); "
                                         "waiting until it is, looking every %.0fs",
                                         self.name, describe(exc, self.kube, self.hint),
                                         GONE_POLL, extra={"fields": {"resource": self.name}})
                    gone = True
                    self.synced.clear()
                    self._watched = None
                    mode = "list"
                    continue
                failures += 1
                errors += 1
                API_ERRORS.labels(self.name).inc()
                delay = self.settings.backoff.delay(failures - 1)
                expected = isinstance(exc, KubeError | urllib3.exceptions.HTTPError | OSError
                                      | WatchFailed)
                # The first failure and then every doubling at ERROR: an API server down for
                # minutes is a few lines per resource, not one every backoff period (every
                # attempt is still counted in eventop_watcher_api_errors_total).
                level = logging.ERROR if failures & (failures - 1) == 0 or not expected \
                    else logging.DEBUG
                self.log.log(level, "%s: %s; retrying in %.1fs (attempt %d)", self.name,
                             describe(exc, self.kube, self.hint), delay, failures,
                             exc_info=not expected,
                             extra={"fields": {"resource": self.name, "attempt": failures}})
                self.stop.wait(delay)

    def _recovered(self, errors: int) -> int:
        """After failed attempts (logged from the first, then at each doubling), one line
        that they are over: else the log ends on its last error and looks stuck."""
        if errors:
            self.log.info("%s: the API server answers again after %d failed attempt%s; "
                          "watching from resourceVersion %s", self.name, errors,
                          "" if errors == 1 else "s", self.rv,
                          extra={"fields": {"resource": self.name, "attempts": errors}})
        return 0

    def _resync_due(self) -> bool:
        return time.monotonic() >= self._next_resync

    # -- list ------------------------------------------------------------------------

    def _list(self, mode: str) -> str:
        """List every object into the sink; returns the list's resourceVersion."""
        if mode == "resync":
            RESYNCS.labels(self.name).inc()
        w = self.watched
        timeout = (self.settings.connect_timeout, max(30.0, self.settings.read_timeout))
        while True:
            self.sink.begin_list(mode)
            try:
                rv = ""
                for page in self.kube.pages(w.resource, w.namespace,
                                            label_selector=w.label_selector,
                                            limit=self.settings.page_size,
                                            metadata_only=w.metadata_only, timeout=timeout):
                    self.sink.raw_page(page)
                    for item in page["items"]:
                        self.kube.fill_kind(item, w.resource, w.metadata_only)
                        self.sink.list_item(item)
                    rv = str((page.get("metadata") or {}).get("resourceVersion") or "")
                    del page
            except ContinueExpired:  # the continue token outlived its snapshot
                self.log.info("%s: list continue token expired; listing from the start", self.name)
                continue
            self._seen_since_list = 0
            self.sink.end_list(rv)
            return rv

    # -- watch -----------------------------------------------------------------------

    def _watch(self) -> bool:
        """One watch request from ``self.rv``. True if it carried anything, or the server ended
        it after at least ``short_watch`` (a healthy stream of an idle kind ends empty at its
        timeout); False for an empty stream that ended at once or broke, which the loop backs
        off from."""
        timeout = self.settings.watch_timeout
        if self._next_resync != math.inf:
            timeout = max(1, min(timeout, math.ceil(self._next_resync - time.monotonic())))
        w = self.watched
        query: list[tuple[str, Any]] = [("resourceVersion", self.rv),
                                        ("allowWatchBookmarks", "true"),
                                        ("timeoutSeconds", timeout)]
        if w.label_selector:
            query.append(("labelSelector", w.label_selector))
        WATCH_STARTS.labels(self.name).inc()
        self.log.debug("%s: watching from resourceVersion %s", self.name, self.rv)
        # A generator: the request itself is made by the first iteration, inside the try.
        lines = self.kube.iter_watch(w.resource, w.namespace, query,
                                     (self.settings.connect_timeout, self.settings.read_timeout),
                                     **({"metadata_only": True} if w.metadata_only else {}))
        before = self._lines_ok
        began = time.monotonic()
        try:
            for line in lines:
                if self.stop.is_set():
                    raise Stopped
                if not self._handle_line(line, lines):
                    break
                if self._resync_due():
                    break
            else:  # the server ended the stream, at its timeoutSeconds if it lasted that long
                if time.monotonic() - began >= self.settings.short_watch:
                    return True
        except urllib3.exceptions.ReadTimeoutError:
            self.log.warning("%s: no event or bookmark for %.0fs, the watch looks hung; "
                        "reconnecting from resourceVersion %s", self.name,
                        self.settings.read_timeout, self.rv,
                        extra={"fields": {"resource": self.name, "rv": self.rv}})
            return True  # a timely, deliberate reconnect; no backoff needed
        except KubeError as exc:
            if exc.status == 410:  # the watch request itself answered 410 Gone
                raise Expired(str(exc)) from exc
            raise
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            self.log.warning("%s: watch connection broke (%s); resuming from resourceVersion %s",
                        self.name, exc, self.rv,
                        extra={"fields": {"resource": self.name, "rv": self.rv}})
        finally:
            lines.close()
        return self._lines_ok > before

    def _handle_line(self, line: bytes, lines: Any) -> bool:
        """Process one watch line; False means: close this stream and resume from ``self.rv``."""
        self.sink.raw_line(line)
        try:
            wtype, obj = parse_watch_line(line)
        except ValueError as exc:
            self.log.warning("%s: undecodable watch line (%d bytes: %s), the stream was cut; "
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
                self.sink.bookmark(self.rv)
            return True
        if wtype == "ERROR":
            if obj.get("code") == 410:
                raise Expired(f"{obj.get('reason')}: {obj.get('message')}")
            raise WatchFailed(f"the watch returned an ERROR event: {obj.get('code')} "
                              f"{obj.get('reason')}: {obj.get('message')}")
        change = WATCH_TYPE_TO_CHANGE.get(wtype)
        if change is None:
            self.log.warning("%s: unknown watch event type %r ignored", self.name, wtype)
            return True
        self.kube.fill_kind(obj, self.res, self.watched.metadata_only)
        rv = str(meta.get("resourceVersion"))
        if not self.sink.offer(change, obj, self.settings.read_timeout):
            self.log.warning("%s: the sink is slow; stopped reading the watch and will resume from "
                        "resourceVersion %s once it catches up", self.name, self.rv,
                        extra={"fields": {"resource": self.name, "rv": self.rv}})
            lines.close()
            self.sink.put(change, obj)
            self.rv = rv
            return False
        self.rv = rv
        return True


def until_served(find: Callable[[], Watched], stop: threading.Event, retry_seconds: float,
                 logger: logging.Logger, what: str, why: str,
                 on_missing: Callable[[bool], None] = lambda _missing: None,
                 look_again: threading.Event | None = None) -> Watched:
    """``find()``, retried every ``retry_seconds`` while it raises NotFound (a kind not
    served: a CustomResourceDefinition not installed yet), saying so once, not at every
    attempt; ``on_missing(True/False)`` learns whether it is missing. Setting
    ``look_again`` (also set when stopping) tries again at once: something saw the kind
    served. Raises :class:`Stopped` when stopping."""
    said = False
    while True:
        try:
            watched = find()
        except KubeError as exc:
            if exc.status != 404:
                raise
            on_missing(True)
            if not said:
                logger.warning("%s is not served by the API server (%s); looking again every "
                               "%.0fs", what, why, retry_seconds)
                said = True
            if look_again is None:
                stop.wait(retry_seconds)
            elif look_again.wait(retry_seconds):
                look_again.clear()
            if stop.is_set():
                raise Stopped from None
            continue
        if said:
            logger.info("%s is served now", what)
        on_missing(False)
        return watched


def describe(exc: BaseException, kube: Kube, hint: str = "") -> str:
    """A list/watch failure as one line that says what is wrong and what to check."""
    if isinstance(exc, KubeError):
        if exc.status == 403:
            hint = hint or "grant list and watch on it to this ServiceAccount, see deploy/"
            return f"forbidden: {exc.message} ({hint}; {JUST_STARTED})"
        if exc.status == 404:
            message = " ".join(str(exc.message).split())  # "404 page not found\n"
            if "?" in message:  # it says what to check already
                return f"not found: {message}"
            return (f"not found: {message} (is the resource served? for eventop.dev "
                    "kinds install the CRDs: kubectl apply -k crds/)")
        if isinstance(exc, Unavailable) and not exc.reason:
            return f"{exc} (is the API server up and reachable?)"
        if exc.status >= 500 or exc.status == 429:
            return f"Kubernetes API at {kube.host} answered {exc}"
        return str(exc)
    return f"{type(exc).__name__}: {exc}"
