"""The engine's writes to the API server: under the handler's field manager, written through
to the cache, and remembered so that their echoes cost nothing.

Write-through: the object the API server answers a write with replaces the cached one when
it is newer, so a run that follows sees the run before it even if the watch event of that
write has not arrived yet (without it, a second run would create the same child again and
learn from a 409 that it exists).

Echoes: every write comes back as a watch event (and, through the watcher, as a CloudEvent)
carrying the resourceVersion the write returned. :class:`Echoes` remembers those per
handler; the engine drops the event of exactly that version for that handler. Another
handler (or a change made meanwhile, which has another version) still sees it.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from eventop.engine.controller import APPLIED_ANNOTATION, CREATED_ANNOTATION
from eventop.engine.desired import Note
from eventop.kube import errors
from eventop.kube.client import Kube
from eventop.kube.informer import Cache
from eventop.kube.objects import content_hash
from eventop.kube.recent import Recent

Obj = dict[str, Any]
#: How long a refused write is refused again without asking the API server (seconds).
REFUSAL_TTL = 30.0
#: How long a write refused with 409 waits for the cache to show what refused it.
CONFLICT_CACHE_WAIT = 1.0
MAX_REMEMBERED = 50_000  # echoes per handler; the oldest are forgotten first


class Echoes:
    """(uid, resourceVersion) of one handler's own writes, bounded."""

    def __init__(self, limit: int = MAX_REMEMBERED) -> None:
        self._writes: Recent[tuple[str, str], bool] = Recent(limit)
        self.dropped = 0  # echoes recognised (for /metrics and tests)

    def mark(self, obj: Obj | None, deleted: bool = False) -> None:
        meta = (obj or {}).get("metadata") or {}
        if meta.get("uid"):
            self._writes.put((str(meta["uid"]), "deleted" if deleted
                              else str(meta.get("resourceVersion"))), True)

    def is_echo(self, uid: str | None, resource_version: str | None, change: str, *,
                consume: bool = True) -> bool:
        """Is this change the event of our own write? (Forgotten once recognised, if
        ``consume``: the router's own watch sees it first and leaves it for the event.)"""
        if not uid:
            return False
        key = (uid, "deleted" if change == "delete" else str(resource_version))
        if not consume:
            return key in self._writes
        if self._writes.pop(key, False):
            self.dropped += 1
            return True
        return False


#: Attempts at adding or removing a finalizer when the parent keeps changing under it.
FINALIZER_TRIES = 4


class KubeWriter:
    """:class:`~eventop.engine.write.Writer` over the API server for one handler.

    It knows which objects it is writing right now (:meth:`writing`): the watch event of a
    write can arrive before the write's answer, so before its echo is remembered; the
    router's own watch leaves such an event to the watcher's, which comes later.
    """

    def __init__(self, kube: Kube, cache: Cache, echoes: Echoes) -> None:
        self.kube = kube
        self.cache = cache
        self.echoes = echoes
        self._lock = threading.Lock()
        self._writing: Counter[tuple[str, str, str]] = Counter()
        self._refused: Recent[tuple[str, ...], tuple[float, errors.KubeError]] = Recent(10_000)

    def writing(self, obj: Obj) -> bool:
        """Is a write of this object (kind, namespace, name) under way?"""
        with self._lock:
            return self._writing[_slot(obj)] > 0

    @contextmanager
    def _write(self, obj: Obj, verb: str = "") -> Iterator[None]:
        """A write of ``obj`` under way. With ``verb``, the very write (same body) the API
        server found invalid (422) less than :data:`REFUSAL_TTL` ago is refused again without
        asking: every event about a child or its parent runs the parent, and each run would
        send the same 422 again (a reviewer counted 22 in three minutes for one immutable
        field); its retries with backoff still ask once it is older."""
        slot = _slot(obj)
        if verb and len(self._refused):  # (the body's digest only while any is refused)
            refused = self._refused.get((verb, *slot, content_hash(obj)))
            if refused is not None and refused[0] > time.monotonic():
                raise refused[1]
        with self._lock:
            self._writing[slot] += 1
        try:
            yield
        except errors.Invalid as exc:
            # Only a body the API server found invalid (422) is refused the same way again;
            # a 403 or 409 can pass a moment later (a kube-apiserver that just restarted
            # answers 403 until its RBAC cache is filled: remembered, a change was lost).
            if verb:
                self._refused.put((verb, *slot, content_hash(obj)),
                                  (time.monotonic() + REFUSAL_TTL, exc))
            raise
        finally:
            with self._lock:
                self._writing[slot] -= 1
                if self._writing[slot] <= 0:
                    del self._writing[slot]

    def _wrote(self, obj: Obj) -> Obj:
        store = self.cache.store(str(obj.get("apiVersion")), str(obj.get("kind")))
        if store is not None:
            store.put_if_newer(obj)
        self.echoes.mark(obj)
        return obj

    def create(self, obj: Obj) -> Obj:
        with self._write(obj, "create"):
            return self._wrote(self.kube.create(obj))

    def apply(self, obj: Obj, *, force: bool, existing: Obj | None = None) -> Obj:
        """Server-side apply. Before the first apply of a child (``existing``, as cached,
        has no applied-hash yet), what this manager wrote by POST is handed to its apply
        entry (:meth:`Kube.upgrade_managed_fields`): else the apply could never remove a
        field the POST set, and the object would briefly hold old and new together (a
        Deployment rolled out with both). Once per child: one read, and a patch if there
        is anything to hand over."""
        with self._write(obj, "apply"):
            if not applied_before(existing):
                meta = obj["metadata"]
                current = self.kube.get_or_none(obj["apiVersion"], obj["kind"], meta["name"],
                                                meta.get("namespace"))
                if current is not None:
                    upgraded = self.kube.upgrade_managed_fields(current)
                    if upgraded is not None:
                        self._wrote(upgraded)
            return self._wrote(self.kube.apply(obj, force=force))

    def replace(self, obj: Obj) -> Obj:
        with self._write(obj, "replace"):
            return self._wrote(self.kube.replace(obj))

    def delete(self, obj: Obj) -> bool:
        """Delete ``obj`` (that very version: a changed one is a 409); False if it was gone
        already (a 404: another replica's delete came first).

        An object held by finalizers (every PersistentVolumeClaim: pvc-protection) is not
        gone when the API server answers: the delete only set its deletionTimestamp, and it
        disappears once someone else removes the last finalizer. That disappearance is not
        this handler's echo: it is what a run waiting to create the object again
        (``Plan.skipped``) must hear. So the answer, the object being deleted, is written
        through as any write's is (a run after it sees it going and skips it; the change
        that set the deletionTimestamp is the echo), and only an object that went at once is
        forgotten and its deletion remembered as our own.
        """
        meta = obj["metadata"]
        with self._write(obj):
            answer = self.kube.delete_answer(obj["apiVersion"], obj["kind"], meta["name"],
                                             meta.get("namespace"), uid=meta.get("uid"),
                                             resource_version=meta.get("resourceVersion"))
            held = answer or {}
            if held.get("kind") == obj["kind"] \
                    and (held.get("metadata") or {}).get("deletionTimestamp"):
                self._wrote({**held, "apiVersion": obj["apiVersion"]})
                return True
            if meta.get("finalizers"):
                # gone before our delete (404), held until then: someone else's removal of
                # the last finalizer made it go, news to a run waiting to make it again
                return answer is not None
            store = self.cache.store(obj["apiVersion"], obj["kind"])
            if store is not None:
                store.forget_deleted(obj)
            self.echoes.mark(obj, deleted=True)
        return answer is not None

    def patch(self, obj: Obj, resource_version: str) -> Obj:
        """A JSON merge patch of ``obj``'s fields into version ``resource_version`` of an
        object someone else made (``Desired.patch``)."""
        meta = obj["metadata"]
        body = {k: v for k, v in obj.items() if k not in ("apiVersion", "kind", "metadata")}
        body["metadata"] = {**{k: v for k, v in meta.items() if k in ("labels", "annotations")},
                            "resourceVersion": resource_version}
        with self._write(obj, "patch"):
            return self._wrote(self.kube.patch(obj["apiVersion"], obj["kind"], meta["name"],
                                               meta.get("namespace"), body))

    def read_after_conflict(self, obj: Obj, tried: str | None) -> Obj | None:
        """``obj`` as it is after a write of it was refused with 409 (a create finding the
        name taken: ``tried`` None; an update of version ``tried`` finding a newer one).
        The cache usually gets that newer version by its watch within milliseconds (another
        replica's write, say), so it is awaited there briefly before asking the API server:
        a read request saved per conflict. Either way the next write carries a precondition."""
        meta = obj["metadata"]
        informer = self.cache.informer(str(obj.get("apiVersion")), str(obj.get("kind")))
        if informer is not None and informer.matches(obj):
            held = informer.wait_newer(meta.get("namespace"), meta["name"], tried,
                                       CONFLICT_CACHE_WAIT)
            if held is not None:
                return held
        return self.read(str(obj["apiVersion"]), str(obj["kind"]), meta["name"],
                         meta.get("namespace"))

    def read(self, api_version: str, kind: str, name: str, namespace: str | None) -> Obj | None:
        found = self.kube.get_or_none(api_version, kind, name, namespace)
        if found is not None:
            store = self.cache.store(api_version, kind)
            if store is not None:
                store.put_if_newer(found)
        return found

    def patch_status(self, parent: Obj, status: Obj) -> Obj:
        """The status, onto the version of the parent the run worked from: changed since
        (the other router replica wrote the same transition, a spec edit), the write is a
        409 and the run is repeated on the fresh parent. Without the precondition both
        replicas wrote each transition and posted its Events twice, and a replica that was
        behind could put an older status back."""
        try:
            with self._write(parent):
                return self._wrote(self.kube.patch_status(
                    parent, status, resource_version=parent["metadata"].get("resourceVersion")))
        except errors.NotFound:
            return parent  # deleted meanwhile: nothing left to report on

    def set_finalizer(self, parent: Obj, finalizer: str, present: bool) -> Obj:
        """Add or remove one finalizer with a resourceVersion precondition (a merge patch
        replaces the whole list: another controller's change meanwhile must not be lost)."""
        with self._write(parent):
            for _ in range(FINALIZER_TRIES - 1):
                try:
                    return self._set_finalizer(parent, finalizer, present)
                except errors.Conflict:
                    # Another writer (the other router replica's status patch, say) changed
                    # the parent since it was read: read it again (from the cache, which
                    # gets that version by its watch) and retry, as client-go's
                    # RetryOnConflict does, instead of failing the run with a Warning Event.
                    meta = parent["metadata"]
                    fresh = self.read_after_conflict(parent, meta.get("resourceVersion"))
                    if fresh is None or fresh["metadata"].get("uid") != meta.get("uid"):
                        if present:
                            raise
                        return parent  # gone: nothing left to hold
                    if present and fresh["metadata"].get("deletionTimestamp"):
                        # Deleted meanwhile: the API server takes no new finalizer now (a
                        # 422). Not a failure: the caller sees it without the finalizer.
                        return fresh
                    parent = fresh
            return self._set_finalizer(parent, finalizer, present)

    def _set_finalizer(self, parent: Obj, finalizer: str, present: bool) -> Obj:
        meta = parent["metadata"]
        have = [f for f in meta.get("finalizers") or [] if f != finalizer]
        wanted = [*have, finalizer] if present else have
        patch = {"metadata": {"finalizers": wanted or None,
                              "resourceVersion": meta.get("resourceVersion")}}
        try:
            written = self.kube.patch(parent["apiVersion"], parent["kind"], meta["name"],
                                      meta.get("namespace"), patch)
        except errors.NotFound:
            if present:
                raise
            # Gone already: an earlier run removed the last finalizer, and this run read the
            # parent from a cache that had not seen that yet. Nothing is left to hold.
            return parent
        if not wanted and meta.get("deletionTimestamp"):
            # Its last finalizer: the API server deletes the parent with this very write.
            # Written through, the answer could put back an object whose deletion the
            # informer has already seen (a cache holding a deleted parent until the next
            # re-list, and every delete event about it answered 503): forget it instead.
            store = self.cache.store(str(parent["apiVersion"]), str(parent["kind"]))
            if store is not None:
                store.forget_deleted(written)
            self.echoes.mark(written, deleted=True)
            return written
        return self._wrote(written)

    def post_event(self, parent: Obj, note: Note) -> None:
        self.kube.post_event(parent, note.type, note.reason, note.message)


def _slot(obj: Obj) -> tuple[str, str, str]:
    meta = obj.get("metadata") or {}
    return (str(obj.get("kind")), str(meta.get("namespace") or ""), str(meta.get("name")))


def applied_before(obj: Obj | None) -> bool:
    """Has the engine applied this object before? Its applied-hash annotation says so,
    unless it was written by the create (POST), which says so too."""
    annotations = ((obj or {}).get("metadata") or {}).get("annotations") or {}
    return APPLIED_ANNOTATION in annotations and CREATED_ANNOTATION not in annotations
