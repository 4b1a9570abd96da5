"""``LocalKube``: start/stop the server, in-process access, and fault injection for tests."""

from __future__ import annotations

import copy
import threading
from pathlib import Path
from types import TracebackType

from eventop.localkube.deferred import Deferred
from eventop.localkube.selectors import parse_label_selector
from eventop.localkube.server import Server
from eventop.localkube.store import Obj, Store

REPO_CRDS = Path(__file__).resolve().parents[1] / "crds"


class RequestLog(list[tuple[str, str, str, int]]):
    """Served requests as ``(method, path, query_string, status)``, appended by server threads.

    ``append``/``clear``/``len`` are atomic on a list; copy it (``list(log)``) to iterate
    while requests are still being served.
    """


class LocalKube:
    """A local stand-in for kube-apiserver over real HTTP (see the package docstring).

    ``history`` is how many watch events are kept for resuming watches (older
    resourceVersions get 410 Expired); ``bookmark_interval`` is how often watches that ask
    for bookmarks get one (seconds); ``bind_pvcs`` makes new PVCs Bound at once;
    ``root_ca`` publishes ``kube-root-ca.crt`` into every namespace like a real cluster.

    Controllers (garbage collector, namespace controller, PVC binder) run inside the write
    that triggers them, so a test sees their result as soon as the call returns. With
    ``namespace_delay`` (seconds) a deleted namespace stays Terminating, content and all,
    for that long before the namespace controller empties and removes it, as on a real
    cluster; ``wait_idle()`` waits for that work. With ``gc_dangling`` the garbage
    collector also deletes objects written with ownerReferences that point at no existing
    owner (wrong uid, kind or name, or a namespaced owner in another namespace), as the real
    one does; it is off by default so tests may put objects with made-up owners.
    """

    def __init__(self, crd_dir: str | Path | None = "crds", *, host: str = "127.0.0.1",
                 port: int = 0, history: int = 10000, bookmark_interval: float = 1.0,
                 bind_pvcs: bool = True, root_ca: bool = True,
                 namespace_delay: float | None = None, gc_dangling: bool = False) -> None:
        if crd_dir is not None and not Path(crd_dir).is_dir() and \
                not Path(crd_dir).is_absolute() and (REPO_CRDS.parent / crd_dir).is_dir():
            crd_dir = REPO_CRDS.parent / crd_dir
        self.store = Store(str(crd_dir) if crd_dir is not None else None, history=history,
                           bind_pvcs=bind_pvcs, root_ca=root_ca,
                           namespace_delay=namespace_delay, gc_dangling=gc_dangling)
        self.host, self.port = host, port
        self.bookmark_interval = bookmark_interval
        self.requests = RequestLog()
        self.unavailable = False
        self.hung = False
        self.stopping = False
        self.watch_epoch = 0
        self._server: Server | None = None
        self._thread: threading.Thread | None = None
        self.url = ""

    # -- lifecycle -------------------------------------------------------------------

    def start(self) -> str:
        """Listen (port 0 picks a free one) and serve in a background thread; return the URL."""
        if self._server is not None:
            return self.url
        if self.store.deferred.stopped:
            self.store.deferred = Deferred()
        self.stopping = False
        self._server = Server((self.host, self.port), self)
        self.port = self._server.server_address[1]
        self.url = f"http://{self.host}:{self.port}"
        self._thread = threading.Thread(target=self._server.serve_forever,
                                        kwargs={"poll_interval": 0.05},
                                        name=f"localkube:{self.port}", daemon=True)
        self._thread.start()
        return self.url

    def stop(self) -> None:
        """Stop serving: end every watch, close every connection, join every thread."""
        self.store.deferred.stop()
        server, self._server = self._server, None
        if server is None:
            return
        self.stopping = True
        with self.store.changed:
            self.store.changed.notify_all()
        server.shutdown()
        server.close_connections()
        server.server_close()
        if self._thread is not None:
            self._thread.join()

    def __enter__(self) -> LocalKube:
        self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    def serve_forever(self) -> None:
        """Serve in the calling thread (the CLI)."""
        self.start()
        assert self._thread is not None
        self._thread.join()

    # -- in-process access (no HTTP, same semantics) -----------------------------------

    def put(self, obj: Obj) -> Obj:
        """Create or replace ``obj`` as the outside world would; returns the stored object.

        Status, uid, generation, creationTimestamp and managedFields are kept when given; a
        different uid than the stored one means delete-and-recreate. A missing namespace is
        created first. Raises :class:`eventop.localkube.errors.ApiError` if validation refuses it.
        """
        return self.store.put(obj)

    def get(self, api_version: str, kind: str, name: str,
            namespace: str | None = None) -> Obj | None:
        """A copy of the stored object, or None (an unknown kind raises ApiError 404)."""
        res = self.store.resource(api_version, kind)
        return self.store.get_or_none(res, namespace if res.namespaced else None, name)

    def list(self, api_version: str, kind: str, namespace: str | None = None,
             label_selector: str | None = None) -> list[Obj]:
        """Copies of the matching objects (every namespace when ``namespace`` is None), in
        the order the API lists them (namespace, then name)."""
        res = self.store.resource(api_version, kind)
        items, _, _, _ = self.store.list(res, namespace, parse_label_selector(label_selector))
        return copy.deepcopy(items)

    def remove(self, api_version: str, kind: str, name: str,
               namespace: str | None = None) -> Obj | None:
        """Delete like the API (finalizers, GC, namespace termination); None if absent."""
        res = self.store.resource(api_version, kind)
        ns = namespace if res.namespaced else None
        with self.store.lock:
            if self.store.get_or_none(res, ns, name) is None:
                return None
            obj, _ = self.store.delete(res, ns, name)
            return obj

    def compact(self) -> None:
        self.store.compact()

    def wait_idle(self, timeout: float = 10.0) -> bool:
        """Wait until deferred controller work (``namespace_delay``) is done.

        Returns at once without it (controllers then run inside each write). False if
        ``timeout`` seconds passed first.
        """
        return self.store.deferred.wait_idle(timeout)

    @property
    def resource_version(self) -> int:
        """The current (latest) resourceVersion."""
        return self.store.rv

    # -- fault injection -------------------------------------------------------------

    def break_watches(self) -> None:
        """Cut every open watch connection mid-stream (no terminating chunk)."""
        with self.store.changed:
            self.watch_epoch += 1
            self.store.changed.notify_all()

    def hang_watches(self, on: bool = True) -> None:
        """Open watches send nothing (no events, no bookmarks, no timeout end) while on.

        Events are not lost: once turned off, each watch continues where it stopped.
        """
        with self.store.changed:
            self.hung = on
            self.store.changed.notify_all()

    def set_unavailable(self, on: bool = True) -> None:
        """While on, every request is answered 503 ServiceUnavailable (a Status body), and
        turning it on also cuts the open watches, like an API server going away."""
        self.unavailable = on
        if on:
            self.break_watches()

    def __repr__(self) -> str:
        return f"LocalKube({self.url or 'not started'}, rv={self.store.rv})"

