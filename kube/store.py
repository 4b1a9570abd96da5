"""An in-memory, indexed set of objects of one kind: what an informer holds.

Filled by a list+watch (:mod:`eventop.kube.informer`), or directly by tests and the handler
test kit. Reads are by namespace/name, by namespace, by name across namespaces (which
finds an object of ours *and* someone else's of the same name in one lookup) and by
controlling owner uid (a parent's children), so that no read a handler makes is a scan of
everything unless it asks for everything.

Objects are stored as given and handed out as they are, never copied: readers must treat
them as read-only (copying 10,000 objects on every read would cost more than the API
request the cache saves). ``managedFields`` is dropped on the way in: nothing here reads it
and it is often the largest part of an object.

resourceVersions are opaque strings to Kubernetes clients, but on every real API server
they are etcd revisions, integers that grow with every write. Comparisons that need an
order (:meth:`Store.put_if_newer`, :func:`rv_at_least`) use integers when both sides are,
and otherwise decline to decide (the caller then falls back to waiting for the watch).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from eventop.kube.objects import selector_matches
from eventop.kube.recent import Recent

Obj = dict[str, Any]
Key = tuple[str, str]  # (namespace or "", name)
MAX_REMOVED = 10_000  # deletions whose time is remembered
HISTORY = 4  # versions per object whose time is remembered


def rv_int(rv: Any) -> int | None:
    """A resourceVersion as an integer, or None if it is not one."""
    if isinstance(rv, int):
        return rv
    if isinstance(rv, str) and rv.isdigit():
        return int(rv)
    return None


def rv_at_least(have: Any, want: Any) -> bool | None:
    """Is resourceVersion ``have`` at or after ``want``? None when they can not be ordered."""
    h, w = rv_int(have), rv_int(want)
    if h is None or w is None:
        return None
    return h >= w


def key_of(obj: Obj) -> Key:
    meta = obj.get("metadata") or {}
    return (meta.get("namespace") or "", str(meta.get("name")))


def controller_uid(obj: Obj) -> str | None:
    """The uid of the object's controlling owner (the ownerReference with controller=true)."""
    ref = controller_ref(obj)
    return str(ref.get("uid")) if ref is not None else None


def controller_ref(obj: Obj) -> Obj | None:
    """The object's controlling ownerReference (controller=true), if any (not a copy)."""
    for ref in (obj.get("metadata") or {}).get("ownerReferences") or ():
        if ref.get("controller"):
            return ref
    return None


def slim(obj: Obj) -> Obj:
    """The object without ``metadata.managedFields`` (a shallow copy if it had any)."""
    meta = obj.get("metadata")
    if isinstance(meta, dict) and "managedFields" in meta:
        meta = {k: v for k, v in meta.items() if k != "managedFields"}
        obj = {**obj, "metadata": meta}
    return obj


class Store:
    """Objects of one kind by (namespace, name), with indexes; thread-safe."""

    def __init__(self, api_version: str, kind: str, *, namespaced: bool | None = True) -> None:
        self.api_version = api_version
        self.kind = kind
        #: As discovery says; None: not known (a test world's kind it holds nothing of yet).
        self.namespaced = namespaced
        self._lock = threading.Lock()
        self._objects: dict[Key, Obj] = {}
        self._by_namespace: dict[str, dict[str, Obj]] = {}
        self._by_name: dict[str, set[str]] = {}
        self._by_owner: dict[str, set[Key]] = {}
        self._gone: dict[str, int] = {}  # uid -> resourceVersion of a delete we made
        #: When the store learned each object's last few versions (resourceVersion, time),
        #: and of recent deletions (uid -> time, bounded): what "a run that started after
        #: this change" means.
        self._learned: dict[Key, list[tuple[int | None, float]]] = {}
        self._removed: Recent[str, float] = Recent(MAX_REMOVED)
        #: The controller ownerReference an object lost in its last change (uid -> ref,
        #: bounded): that owner's reconcile must learn it lost a child, as controller-runtime
        #: maps the old object's owner as well as the new one's.
        self._disowned: Recent[str, Obj] = Recent(MAX_REMOVED)
        #: The resourceVersion the store reflects: of its last list, event or bookmark.
        self.resource_version = ""

    # -- reads -----------------------------------------------------------------------

    def get(self, namespace: str | None, name: str) -> Obj | None:
        return self._objects.get((namespace or "", name))

    def __len__(self) -> int:
        return len(self._objects)

    def list(self, namespace: str | None = None, *, name: str | None = None,
             owner: str | None = None, labels: dict[str, str] | None = None,
             selector: Obj | None = None) -> list[Obj]:
        """Objects matching every given filter: namespace, name, controlling owner uid,
        labels (equality) and a metav1.LabelSelector. Sorted by namespace and name."""
        with self._lock:
            if owner is not None:
                found = [self._objects[k] for k in self._by_owner.get(owner, ())]
                if namespace is not None:
                    found = [o for o in found if key_of(o)[0] == namespace]
                if name is not None:
                    found = [o for o in found if key_of(o)[1] == name]
            elif name is not None:
                namespaces = self._by_name.get(name, set())
                if namespace is not None:
                    namespaces = namespaces & {namespace}
                found = [self._by_namespace[ns][name] for ns in namespaces]
            elif namespace is not None:
                found = list(self._by_namespace.get(namespace or "", {}).values())
            else:
                found = list(self._objects.values())
        if labels:
            found = [o for o in found if _has_labels(o, labels)]
        if selector:
            found = [o for o in found
                     if selector_matches(selector, (o.get("metadata") or {}).get("labels"))]
        found.sort(key=key_of)
        return found

    def learned_at(self, obj: Obj, resource_version: str | None = None, *,
                   deleted: bool = False) -> float | None:
        """When (:func:`time.monotonic`) the store first held ``obj`` at ``resource_version``
        or later (default: the version it holds), or learned of its deletion. None if it
        holds no such version of that object (another uid, or never seen)."""
        uid = (obj.get("metadata") or {}).get("uid")
        with self._lock:
            if deleted:
                return self._removed.get(str(uid)) if uid else None
            key = key_of(obj)
            held = self._objects.get(key)
            history = self._learned.get(key)
            if held is None or not history or (uid is not None and _uid(held) != uid):
                return None
            want = rv_int(resource_version) if resource_version else None
            if want is None:
                return history[-1][1]
            return next((at for rv, at in history if rv is not None and rv >= want), None)

    def items(self) -> list[Obj]:
        with self._lock:
            return list(self._objects.values())

    # -- writes ----------------------------------------------------------------------

    def put(self, obj: Obj) -> None:
        """Store ``obj`` (from a watch: the server's order is the truth), unless the store
        holds that object at a later resourceVersion already (the answer to our own write,
        stored before its watch event arrived) or we deleted it after this version."""
        obj = slim(obj)
        uid = str((obj.get("metadata") or {}).get("uid"))
        rv = rv_int(_rv(obj))
        with self._lock:
            if uid in self._gone and rv is not None and rv <= self._gone[uid]:
                return  # an event older than our own delete of it
            current = self._objects.get(key_of(obj))
            if (current is not None and rv is not None and _uid(current) == uid
                    and (rv_int(_rv(current)) or 0) > rv):
                return
            self._put(obj)

    def put_if_newer(self, obj: Obj) -> bool:
        """Store ``obj`` (the answer to our own write) unless the store already holds that
        object at the same or a later resourceVersion, or the two can not be ordered."""
        obj = slim(obj)
        with self._lock:
            current = self._objects.get(key_of(obj))
            if current is not None:
                newer = rv_at_least(_rv(obj), _rv(current))
                if not newer or _rv(obj) == _rv(current):
                    return False
            elif rv_int(_rv(obj)) is None:
                return False
            self._put(obj)
            return True

    def remove(self, obj: Obj) -> None:
        """Forget ``obj`` (a DELETED event: its key, if it is still that uid)."""
        key = key_of(obj)
        uid = (obj.get("metadata") or {}).get("uid")
        with self._lock:
            current = self._objects.get(key)
            if current is not None and (uid is None or _uid(current) == uid):
                self._drop(key, current)
            if uid:
                self._gone.pop(str(uid), None)
                self._removed.put(str(uid), time.monotonic())

    def former_owner(self, uid: str | None) -> Obj | None:
        """The controller ownerReference the object of ``uid`` lost in its last change."""
        with self._lock:
            return self._disowned.get(str(uid)) if uid else None

    def forget_deleted(self, obj: Obj) -> None:
        """Our own delete of ``obj`` succeeded: drop it now and ignore watch events of that
        uid up to its resourceVersion (they are older than the delete)."""
        key, uid, rv = key_of(obj), str(_uid(obj)), rv_int(_rv(obj))
        with self._lock:
            current = self._objects.get(key)
            if current is not None and _uid(current) == uid:
                self._drop(key, current)
            if rv is not None:
                self._gone[uid] = rv
            self._removed.put(uid, time.monotonic())

    def replace_all(self, objs: Iterable[Obj], resource_version: str) -> None:
        """The result of a (re)list: exactly these objects, at this resourceVersion.

        Applied as the difference from what the store holds, as the changes a watch would
        have shown: an object gone (or made again under its name) counts as deleted, a
        changed one keeps its history and records a lost controller, an unchanged one stays
        as it is. A re-list after a 410 thus forgets nothing it must tell (a former owner,
        a deletion's time) and keeps nothing of what is gone."""
        fresh = {key_of(o): o for o in (slim(o) for o in objs)}
        with self._lock:
            now = time.monotonic()
            for key, current in list(self._objects.items()):
                listed = fresh.get(key)
                if listed is None or _uid(listed) != _uid(current):
                    self._drop(key, current)
                    self._removed.put(str(_uid(current)), now)
            self._gone.clear()
            for key, obj in fresh.items():
                current = self._objects.get(key)
                if current is None or _rv(current) != _rv(obj):
                    self._put(obj)
            self.resource_version = resource_version

    # -- internals -------------------------------------------------------------------

    def _put(self, obj: Obj) -> None:
        key = key_of(obj)
        previous = self._objects.get(key)
        history = self._learned.get(key) if previous is not None \
            and _uid(previous) == _uid(obj) else None
        owner = controller_uid(obj)
        if previous is not None:
            self._drop(key, previous)
            before = controller_ref(previous)
            uid = str(_uid(obj))
            if history is not None and before is not None and before.get("uid") != owner:
                self._disowned.put(uid, before)
            else:
                self._disowned.pop(uid)
        ns, name = key
        self._objects[key] = obj
        entry = (rv_int(_rv(obj)), time.monotonic())
        self._learned[key] = [*history[-(HISTORY - 1):], entry] if history else [entry]
        self._by_namespace.setdefault(ns, {})[name] = obj
        self._by_name.setdefault(name, set()).add(ns)
        if owner:
            self._by_owner.setdefault(owner, set()).add(key)

    def _drop(self, key: Key, obj: Obj) -> None:
        ns, name = key
        del self._objects[key]
        self._learned.pop(key, None)
        _discard(self._by_namespace, ns, name)
        names = self._by_name.get(name)
        if names is not None:
            names.discard(ns)
            if not names:
                del self._by_name[name]
        owner = controller_uid(obj)
        if owner:
            keys = self._by_owner.get(owner)
            if keys is not None:
                keys.discard(key)
                if not keys:
                    del self._by_owner[owner]


def _discard(index: dict[str, dict[str, Obj]], outer: str, inner: str) -> None:
    entries = index.get(outer)
    if entries is not None:
        entries.pop(inner, None)
        if not entries:
            del index[outer]


def _rv(obj: Obj) -> Any:
    return (obj.get("metadata") or {}).get("resourceVersion")


def _uid(obj: Obj) -> Any:
    return (obj.get("metadata") or {}).get("uid")


def _has_labels(obj: Obj, wanted: dict[str, str]) -> bool:
    have = (obj.get("metadata") or {}).get("labels") or {}
    return all(have.get(k) == v for k, v in wanted.items())


StoreLookup = Callable[[str, str], "Store | None"]
