"""The object store: every write, its resourceVersion and its watch event.

One re-entrant lock guards everything; watchers wait on a Condition of that lock. Each
resourceVersion bump produces exactly one event, so the retained history is a contiguous
window ``[first_rv, rv]`` and a watch position is an index into it (O(1) to resume).

Every write goes create/update/patch/apply -> ``_finish`` (admission, generation, no-op
detection) -> ``_store`` (version, index, event); removals go ``_drop``. Admission
(``admission.py``) and the cluster's controllers (``controllers.py``: GC, namespaces, root
CA, CRDs) are mixins, run inside the triggering write so tests see their effect at once; so
are the API verbs themselves (``verbs.py``: create, update, patch and apply, delete, with
their preconditions), which end in the write pipeline here.
"""

from __future__ import annotations

import bisect
import copy
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from eventop.localkube import apply as ssa
from eventop.localkube import errors
from eventop.localkube.admission import Admission
from eventop.localkube.controllers import Controllers
from eventop.localkube.deferred import Deferred
from eventop.localkube.errors import ApiError
from eventop.localkube.objects import canonical, event_line, now, without_volatile
from eventop.localkube.resources import ResourceTable, ResourceType, load_crd_dir
from eventop.localkube.schema import SchemaValidator
from eventop.localkube.verbs import Verbs

Obj = dict[str, Any]
Key = tuple[str, str]  # (group, plural)
SYSTEM_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease")


@dataclass
class Record:
    obj: Obj
    managers: ssa.Managers = field(default_factory=dict)


@dataclass
class Event:
    rv: int
    key: Key
    type: str  # ADDED, MODIFIED, DELETED
    obj: Obj
    prev: Obj | None
    custom: bool
    _line: bytes | None = None

    @property
    def namespace(self) -> str:
        return str(self.obj["metadata"].get("namespace") or "")

    def line(self) -> bytes:
        if self._line is None:
            self._line = event_line(self.type, self.obj, self.custom)
        return self._line


class Store(Verbs, Admission, Controllers):
    """Objects of every served kind, with real-server write semantics."""

    def __init__(self, crd_dir: str | None = "crds", *, history: int = 10000,
                 bind_pvcs: bool = True, root_ca: bool = True,
                 namespace_delay: float | None = None, gc_dangling: bool = False) -> None:
        self.lock = threading.RLock()
        self.changed = threading.Condition(self.lock)
        self.table = ResourceTable()
        self.history_limit = max(1, history)
        self.bind_pvcs = bind_pvcs
        self.root_ca = root_ca
        self.rv = 0
        self.history: list[Event] = []
        self.first_rv = 1
        self._data: dict[Key, dict[str, dict[str, Record]]] = {}
        self._sorted: dict[Key, list[tuple[str, str]]] = {}
        self._by_uid: dict[str, tuple[Key, str, str]] = {}
        self._dependents: dict[str, set[str]] = {}
        self._schemas: dict[Key, SchemaValidator] = {}
        self._next_ip = 10
        self.namespace_delay = namespace_delay
        self.gc_dangling = gc_dangling
        self.deferred = Deferred()
        with self.lock:
            for ns in SYSTEM_NAMESPACES:
                self.create(self.resource("v1", "Namespace"), None,
                            {"metadata": {"name": ns}}, manager="kube-apiserver")
            for crd in load_crd_dir(crd_dir):
                self.create(self.resource("apiextensions.k8s.io/v1", "CustomResourceDefinition"),
                            None, crd, manager="kubectl")

    # -- lookups ---------------------------------------------------------------------

    def resource(self, api_version: str, kind: str) -> ResourceType:
        res = self.table.by_kind(api_version, kind)
        if res is None:
            raise ApiError(404, "NotFound",
                           f"the server could not find the requested resource: no kind {kind} "
                           f"is served in {api_version} (install its CRD first)", {})
        return res

    def _record(self, res: ResourceType, ns: str | None, name: str) -> Record | None:
        return self._data.get(res.key, {}).get(ns or "", {}).get(name)

    def _require(self, res: ResourceType, ns: str | None, name: str) -> Record:
        rec = self._record(res, ns, name)
        if rec is None:
            raise errors.not_found(res.qualified, res.group, res.plural, name)
        return rec

    def _namespace(self, name: str) -> Obj | None:
        rec = self._data.get(("", "namespaces"), {}).get("", {}).get(name)
        return rec.obj if rec else None

    def _check_namespace(self, res: ResourceType, ns: str | None, name: str) -> None:
        if not res.namespaced:
            return
        if not ns:
            raise errors.bad_request("the namespace of the object is required for a "
                                     f"namespaced {res.kind}")
        nsobj = self._namespace(ns)
        if nsobj is None:
            raise errors.namespace_not_found(ns)
        if nsobj["metadata"].get("deletionTimestamp"):
            raise errors.namespace_terminating(res.qualified, res.group, name, ns)

    def get(self, res: ResourceType, ns: str | None, name: str) -> Obj:
        with self.lock:
            return copy.deepcopy(self._require(res, ns, name).obj)

    def get_or_none(self, res: ResourceType, ns: str | None, name: str) -> Obj | None:
        with self.lock:
            rec = self._record(res, ns, name)
            return copy.deepcopy(rec.obj) if rec else None

    def list(self, res: ResourceType, ns: str | None,
             match: Callable[[Obj], bool] | None = None, *, limit: int = 0,
             start_after: tuple[str, str] | None = None
             ) -> tuple[list[Obj], int, tuple[str, str] | None, int]:
        """(items, list resourceVersion, key to continue after or None, remaining count).

        Items are the stored dicts themselves: stored objects are never mutated in place
        (every write stores a new dict), so callers may serialise them without the lock.
        """
        with self.lock:
            coll = self._data.get(res.key, {})
            if ns and res.namespaced:
                keys = [(ns, name) for name in sorted(coll.get(ns, {}))]
            else:
                keys = self._sorted_keys(res.key)
            if start_after is not None:
                keys = keys[bisect.bisect_right(keys, start_after):]
            items: list[Obj] = []
            for i, (kns, kname) in enumerate(keys):
                obj = coll[kns][kname].obj
                if match is None or match(obj):
                    items.append(obj)
                    if limit and len(items) >= limit:
                        remaining = len(keys) - i - 1
                        return items, self.rv, ((kns, kname) if remaining else None), remaining
            return items, self.rv, None, 0

    def _sorted_keys(self, key: Key) -> list[tuple[str, str]]:
        keys = self._sorted.get(key)
        if keys is None:
            keys = sorted((ns, name) for ns, names in self._data.get(key, {}).items()
                          for name in names)
            self._sorted[key] = keys
        return keys

    # -- the write pipeline ----------------------------------------------------------

    def _emit(self, res: ResourceType, etype: str, obj: Obj, prev: Obj | None) -> None:
        self.history.append(Event(self.rv, res.key, etype, obj, prev, res.custom))
        if len(self.history) > 2 * self.history_limit:
            del self.history[:len(self.history) - self.history_limit]
            self.first_rv = self.history[0].rv
        self.changed.notify_all()

    def _index(self, old: Obj | None, new: Obj | None, loc: tuple[Key, str, str]) -> None:
        for obj, add in ((old, False), (new, True)):
            if obj is None:
                continue
            uid = obj["metadata"].get("uid")
            if not uid:
                continue
            if add:
                self._by_uid[uid] = loc
            elif new is None or new["metadata"].get("uid") != uid:
                self._by_uid.pop(uid, None)
            for ref in obj["metadata"].get("ownerReferences") or []:
                owner = ref.get("uid")
                if not owner:
                    continue
                deps = self._dependents.setdefault(owner, set())
                if add:
                    deps.add(uid)
                else:
                    deps.discard(uid)

    def _store(self, res: ResourceType, new: Obj, managers: ssa.Managers,
               old: Obj | None) -> Obj:
        """Commit a created or changed object: bump the RV, index it, emit its event."""
        self.rv += 1
        meta = new["metadata"]
        meta["resourceVersion"] = str(self.rv)
        if managers:
            meta["managedFields"] = ssa.render(managers)
        else:
            meta.pop("managedFields", None)
        new = new if res.custom else canonical(new)
        ns, name = str(meta.get("namespace") or ""), str(meta["name"])
        coll = self._data.setdefault(res.key, {}).setdefault(ns, {})
        if name not in coll:
            self._sorted.pop(res.key, None)
        coll[name] = Record(new, managers)
        self._index(old, new, (res.key, ns, name))
        self._emit(res, "MODIFIED" if old is not None else "ADDED", new, old)
        return new

    def _drop(self, res: ResourceType, rec: Record) -> Obj:
        """Remove an object for good: DELETED event with its last state and a new RV."""
        self.rv += 1
        meta = rec.obj["metadata"]
        ns, name = str(meta.get("namespace") or ""), str(meta["name"])
        coll = self._data.get(res.key, {}).get(ns, {})
        coll.pop(name, None)
        if not coll:
            self._data.get(res.key, {}).pop(ns, None)
        self._sorted.pop(res.key, None)
        last = copy.copy(rec.obj)
        last["metadata"] = {**meta, "resourceVersion": str(self.rv)}
        self._index(rec.obj, None, (res.key, ns, name))
        self._emit(res, "DELETED", last, None)
        self._after_removal(res, last)
        return last

    def _finish(self, res: ResourceType, ns: str | None, name: str, old: Record | None,
                new: Obj, managers: ssa.Managers, *, dry_run: bool = False,
                keep_generation: bool = False) -> tuple[Obj, bool]:
        """Validate, version and commit ``new``; (stored object, whether anything changed)."""
        new = self._admit(res, copy.deepcopy(new), old.obj if old else None)
        meta = new["metadata"]
        if res.tracks_generation and old is not None and not keep_generation:
            gen = int(old.obj["metadata"].get("generation") or 1)
            if _spec_of(new) != _spec_of(old.obj) or (
                    meta.get("deletionTimestamp") and
                    not old.obj["metadata"].get("deletionTimestamp")):
                gen += 1
            meta["generation"] = gen
        if old is not None and without_volatile(new) == without_volatile(old.obj) \
                and _same_fields(managers, old.managers):
            return old.obj, False
        if dry_run:
            meta["resourceVersion"] = old.obj["metadata"]["resourceVersion"] if old else ""
            return new, True
        stored = self._store(res, new, managers, old.obj if old else None)
        if meta.get("deletionTimestamp") and not meta.get("finalizers") \
                and res.kind != "Namespace":
            self._drop(res, self._require(res, ns, name))
        elif self.gc_dangling and meta.get("ownerReferences") and \
                meta["ownerReferences"] != (old.obj["metadata"].get("ownerReferences")
                                            if old else None):
            self._check_owners(res, self._require(res, ns, name))
        elif res.kind == "CustomResourceDefinition":
            self._install_crd(stored)
        return stored, True

    # -- direct access (the outside world) -------------------------------------------

    def put(self, obj: Obj) -> Obj:
        """Create or replace ``obj`` verbatim (status, uid, generation kept if given)."""
        with self.lock:
            res = self.resource(str(obj.get("apiVersion")), str(obj.get("kind")))
            obj = copy.deepcopy(obj)
            meta = obj.setdefault("metadata", {})
            name = meta.get("name")
            if not name:
                raise ValueError(f"put needs metadata.name: {obj!r}")
            ns = meta.get("namespace") if res.namespaced else None
            if res.namespaced and not ns:
                ns = meta["namespace"] = "default"
            if ns and self._namespace(ns) is None:
                self._create_record(self.resource("v1", "Namespace"), None,
                                    {"metadata": {"name": ns}}, manager="localkube")
            rec = self._record(res, ns, name)
            if rec is not None and meta.get("uid") and meta["uid"] != rec.obj["metadata"]["uid"]:
                self._drop(res, rec)
                rec = None
            given = meta.pop("managedFields", None)
            if rec is None:
                managers = ssa.parse(given) if given else None
                stored, _ = self._create_record(res, ns, obj, manager="localkube",
                                                managers=managers, verbatim=True)
                return copy.deepcopy(stored)
            old_meta = rec.obj["metadata"]
            # A recorded generation is kept when it says something new; otherwise it is
            # counted like any write's (bumped if the spec changed).
            keep_generation = meta.get("generation") not in (None, old_meta.get("generation"))
            for key in ("uid", "creationTimestamp", "generation"):
                if key not in meta and key in old_meta:
                    meta[key] = old_meta[key]
            meta["namespace"] = ns
            if not res.namespaced:
                meta.pop("namespace", None)
            managers = ssa.parse(given) if given else ssa.record_update(
                rec.obj, obj, rec.managers, manager="localkube", api_version=res.api_version,
                now=now(), scope="main", has_status=False)
            stored, _ = self._finish(res, ns, name, rec, obj, managers,
                                     keep_generation=keep_generation)
            return copy.deepcopy(stored)

    def compact(self) -> None:
        """Forget the watch history: any older resourceVersion now gets 410 Expired."""
        with self.lock:
            self.history.clear()
            self.first_rv = self.rv + 1
            self.changed.notify_all()

    def events_after(self, pos: int, limit: int = 500) -> list[Event] | None:
        """Retained events with RV > ``pos`` (at most ``limit``); None if ``pos`` expired."""
        if pos < self.first_rv - 1:
            return None
        start = pos + 1 - self.first_rv
        return self.history[start:start + limit]



def _spec_of(obj: Obj) -> Obj:
    return {k: v for k, v in obj.items() if k not in ("metadata", "status")}


def _same_fields(a: ssa.Managers, b: ssa.Managers) -> bool:
    return {k: m.fields for k, m in a.items()} == {k: m.fields for k, m in b.items()}
