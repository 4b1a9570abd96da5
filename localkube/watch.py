"""One watch stream: initial state, events after a resourceVersion, bookmarks, 410, faults.

A stream keeps a position (the last resourceVersion it has passed) in the store's
contiguous event history and sleeps on the store's Condition until there is something to
send, a bookmark is due, its timeout ends it, or a fault is injected.
"""

from __future__ import annotations

import time
from enum import Enum
from typing import TYPE_CHECKING

from eventop.localkube import errors
from eventop.localkube.errors import ApiError
from eventop.localkube.metadata import partial
from eventop.localkube.negotiate import PLAIN, View
from eventop.localkube.objects import event_line
from eventop.localkube.resources import ResourceType
from eventop.localkube.selectors import parse_selectors
from eventop.localkube.store import Event, Obj
from eventop.localkube.tables import table

if TYPE_CHECKING:
    from eventop.localkube.server import Handler

# What the real server puts in a BOOKMARK besides metadata: the zero values of the kind's
# non-pointer structs (the recordings show Namespace's; the others are from the Go types).
BOOKMARK_EXTRA: dict[str, Obj] = {
    "Namespace": {"spec": {}, "status": {}},
    "Service": {"spec": {}, "status": {"loadBalancer": {}}},
    "Lease": {"spec": {}},
}


class Next(Enum):
    EVENTS = 1
    BOOKMARK = 2
    TIMEOUT = 3
    EXPIRED = 4
    ABORT = 5


class WatchStream:
    """Serve ``?watch=1`` for one request, writing chunks through its handler.

    ``view`` is what the client's Accept asked for: each event's object as itself, as
    PartialObjectMetadata, or as a one-row Table (column definitions in the first event
    only); as PartialObjectMetadataList the real server cannot encode any event and ends
    the stream at the first one, and so does this (all recorded).
    """

    def __init__(self, handler: Handler, res: ResourceType, ns: str | None,
                 query: dict[str, str], view: View = PLAIN) -> None:
        self.handler = handler
        self.kube = handler.kube
        self.store = handler.kube.store
        self.res, self.ns = res, ns
        self.query = query
        self.match = parse_selectors(res.kind, query)
        self.bookmarks = query.get("allowWatchBookmarks") in ("true", "1", "True")
        self.timeout = float(query.get("timeoutSeconds") or 1800)
        self.view = view
        self.include = query.get("includeObject", "Metadata")
        self.headers_sent = False
        if view.kind == "Table":  # refuse a bad includeObject before the stream starts
            table(res, [], {}, view, self.include)

    def serve(self) -> None:
        kube, store, handler = self.kube, self.store, self.handler
        rv_param = self.query.get("resourceVersion") or ""
        initial: list[bytes] = []
        expired: ApiError | None = None
        with store.lock:
            epoch = kube.watch_epoch
            if rv_param in ("", "0"):
                pos = store.rv
                items, _, _, _ = store.list(self.res, self.ns, self.match)
                initial = [self._as_view("ADDED", i) for i in items]
            else:
                try:
                    pos = int(rv_param)
                except ValueError as exc:
                    raise errors.bad_request(
                        f'invalid resource version "{rv_param}": must be an integer') from exc
                if pos < store.first_rv - 1:
                    expired = errors.expired(pos, store.first_rv - 1)
        path, _, query = handler.path.partition("?")
        kube.requests.append(("GET", path, query, 200))  # logged before the client can look
        handler.send_response(200)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Transfer-Encoding", "chunked")
        handler.end_headers()
        try:
            if not self._wait_while_hung(epoch):
                handler.abort()
                return
            if expired is not None:
                handler.chunk(event_line("ERROR", expired.status(), False))
                handler.chunk(b"")
                return
            for line in initial:
                if self.view.kind == "PartialObjectMetadataList":
                    handler.chunk(b"")
                    return
                handler.chunk(line)
            self._stream(pos, epoch)
        except OSError:
            handler.close_connection = True

    def _wait_while_hung(self, epoch: int) -> bool:
        """A new watch on a hung server gets its headers, then silence (no initial events).

        False if the watch was broken or the server stopped meanwhile.
        """
        kube = self.kube
        with self.store.changed:
            while kube.hung and not kube.stopping and kube.watch_epoch == epoch:
                self.store.changed.wait(1.0)
            return not kube.stopping and kube.watch_epoch == epoch

    def _next(self, pos: int, epoch: int, deadline: float,
              next_bookmark: float) -> tuple[Next, list[Event]]:
        """Sleep until there is something to do (called with nothing held)."""
        kube, store = self.kube, self.store
        with store.changed:
            while True:
                now = time.monotonic()
                if kube.stopping or kube.watch_epoch != epoch:
                    return Next.ABORT, []
                if store.table.by_kind(self.res.api_version, self.res.kind) is not self.res:
                    # Its CRD was deleted: the real server stops serving the resource and
                    # ends its watches (the client's next list is a 404).
                    return Next.TIMEOUT, []
                if kube.hung:  # silent: no events, no bookmarks, no timeout end
                    store.changed.wait(1.0)
                    continue
                if now >= deadline:
                    return Next.TIMEOUT, []
                found = store.events_after(pos)
                if found is None:
                    return Next.EXPIRED, []
                if found:
                    return Next.EVENTS, found
                if self.bookmarks and now >= next_bookmark:
                    return Next.BOOKMARK, []
                wake = min(deadline, next_bookmark) if self.bookmarks else deadline
                store.changed.wait(max(0.005, wake - now))

    def _stream(self, pos: int, epoch: int) -> None:
        handler, res = self.handler, self.res
        deadline = time.monotonic() + self.timeout
        next_bookmark = time.monotonic() + self.kube.bookmark_interval
        while True:
            action, batch = self._next(pos, epoch, deadline, next_bookmark)
            if action is Next.ABORT:
                handler.abort()
                return
            if action is Next.TIMEOUT:
                handler.chunk(b"")
                return
            if action is Next.EXPIRED:
                oldest = self.store.first_rv - 1
                handler.chunk(event_line("ERROR", errors.expired(pos, oldest).status(), False))
                handler.chunk(b"")
                return
            if action is Next.BOOKMARK:
                if self.view.kind == "PartialObjectMetadataList":
                    handler.chunk(b"")
                    return
                handler.chunk(self._as_view("BOOKMARK", bookmark(res, pos)))
                next_bookmark = time.monotonic() + self.kube.bookmark_interval
                continue
            lines = [line for line in (self._line(e) for e in batch) if line is not None]
            pos = batch[-1].rv
            if lines and self.view.kind == "PartialObjectMetadataList":
                handler.chunk(b"")
                return
            if lines:
                handler.chunk(b"".join(lines))

    def _line(self, event: Event) -> bytes | None:
        """What this watch sends for ``event``: selector transitions become ADDED/DELETED."""
        if event.key != self.res.key or (self.ns and event.namespace != self.ns):
            return None
        match = self.match
        if match is None:
            return self._event_line(event)
        now_ok = match(event.obj)
        if event.type != "MODIFIED":
            return self._event_line(event) if now_ok else None
        was_ok = event.prev is not None and match(event.prev)
        if now_ok and was_ok:
            return self._event_line(event)
        if now_ok:
            return self._as_view("ADDED", event.obj)
        if was_ok and event.prev is not None:
            # Left the selection: DELETED with the state it was last seen in, at this version.
            gone = dict(event.prev)
            gone["metadata"] = {**event.prev["metadata"], "resourceVersion": str(event.rv)}
            return self._as_view("DELETED", gone)
        return None

    def _event_line(self, event: Event) -> bytes:
        if self.view is PLAIN:
            return event.line()  # cached: shared by every plain watch
        return self._as_view(event.type, event.obj)

    def _as_view(self, etype: str, obj: Obj) -> bytes:
        """The watch line for ``obj`` in this watch's view."""
        if self.view.kind in ("", "PartialObjectMetadataList"):
            return event_line(etype, obj, self.res.custom)
        if self.view.kind == "PartialObjectMetadata":
            return event_line(etype, partial(obj, self.view.api_version), False)
        meta = {"resourceVersion": obj["metadata"].get("resourceVersion", "")}
        line = event_line(etype, table(self.res, [obj], meta, self.view, self.include,
                                       headers=not self.headers_sent), False)
        self.headers_sent = True
        return line


def bookmark(res: ResourceType, rv: int) -> Obj:
    """A BOOKMARK object exactly as the real server writes it for ``res``."""
    if res.custom:
        return {"apiVersion": res.api_version, "kind": res.kind,
                "metadata": {"resourceVersion": str(rv)}}
    return {"kind": res.kind, "apiVersion": res.api_version,
            "metadata": {"resourceVersion": str(rv), "creationTimestamp": None},
            **BOOKMARK_EXTRA.get(res.kind, {})}


