"""The object store: every write, its resourceVersion and its watch event.

One re-entrant lock guards everything; watchers wait on a Condition of that lock. Each
resourceVersion bump produces exactly one event, so the retained history is a contiguous
window ``[first_rv, rv]`` and a watch position is an index into it (O(1) to resume).

Every write goes create/update/patch/apply -> ``_finish`` (admission, generation, no-op
detection) -> ``_store`` (version, index, event); removals go ``_drop``. Admission
(``admission.py``) and the cluster's controllers (``controllers.py``: GC, namespaces, root
CA, CRDs) are mixins, run inside the triggering write so tests see their effect at once.
"""

from __future__ import annotations

import bisect
import copy
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from eventop.localkube import apply as ssa
from eventop.localkube import errors
from eventop.localkube.admission import Admission
from eventop.localkube.controllers import PROTECTED_NAMESPACES, Controllers
from eventop.localkube.deferred import Deferred
from eventop.localkube.errors import ApiError
from eventop.localkube.objects import canonical, event_line, now, without_volatile
from eventop.localkube.patches import json_patch, merge_patch
from eventop.localkube.resources import ResourceTable, ResourceType, load_crd_dir
from eventop.localkube.schema import SchemaValidator

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


class Store(Admission, Controllers):
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

    # -- verbs -----------------------------------------------------------------------

    def create(self, res: ResourceType, ns: str | None, body: Obj, *, manager: str,
               dry_run: bool = False) -> Obj:
        with self.lock:
            obj = copy.deepcopy(body)
            meta = obj.setdefault("metadata", {})
            if not isinstance(meta, dict):
                raise errors.bad_request("metadata must be an object")
            if res.namespaced:
                ns = ns or meta.get("namespace") or None
                if meta.get("namespace") and ns != meta["namespace"]:
                    raise errors.bad_request("the namespace of the provided object does not "
                                             "match the namespace sent on the request")
            if not meta.get("name") and meta.get("generateName"):
                meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
            name = str(meta.get("name") or "")
            if not name:
                raise errors.invalid(res.kind, res.group, "", [errors.cause(
                    "FieldValueRequired", "metadata.name",
                    "Required value: name or generateName is required")])
            self._check_namespace(res, ns, name)
            if self._record(res, ns, name) is not None:
                raise errors.already_exists(res.qualified, res.group, res.plural, name)
            if res.has_status and res.kind != "CustomResourceDefinition":
                obj.pop("status", None)
            stored, _ = self._create_record(res, ns, obj, manager=manager, dry_run=dry_run)
            return copy.deepcopy(stored)

    def _create_record(self, res: ResourceType, ns: str | None, obj: Obj, *, manager: str,
                       managers: ssa.Managers | None = None, verbatim: bool = False,
                       dry_run: bool = False) -> tuple[Obj, bool]:
        meta = obj["metadata"]
        for key in ("resourceVersion", "deletionTimestamp", "deletionGracePeriodSeconds"):
            if not verbatim:
                meta.pop(key, None)
        if res.namespaced:
            meta["namespace"] = ns
        else:
            meta.pop("namespace", None)
        if not (verbatim and meta.get("uid")):
            meta["uid"] = str(uuid.uuid4())
        if not (verbatim and meta.get("creationTimestamp")):
            meta["creationTimestamp"] = now()
        if res.tracks_generation and not (verbatim and meta.get("generation")):
            meta["generation"] = 1
        if managers is None:
            meta.pop("managedFields", None)
            managers = ssa.record_update(None, obj, {}, manager=manager,
                                         api_version=res.api_version, now=now(), scope="main",
                                         has_status=False)
        result = self._finish(res, ns, meta["name"], None, obj, managers, dry_run=dry_run)
        if not dry_run and res.kind == "Namespace" and self.root_ca:
            self._publish_root_ca(meta["name"])
        return result

    def update(self, res: ResourceType, ns: str | None, name: str, body: Obj, *,
               manager: str, subresource: str = "", dry_run: bool = False) -> Obj:
        """PUT: replace the object (or only its status), honouring a resourceVersion."""
        with self.lock:
            rec = self._require(res, ns, name)
            meta = body.get("metadata") or {}
            if meta.get("name") and meta["name"] != name:
                raise errors.bad_request(f"the name of the object ({meta['name']}) does not "
                                         f"match the name on the URL ({name})")
            self._preconditions(res, rec, meta)
            new = self._merge_system(res, rec.obj, copy.deepcopy(body), subresource)
            managers = ssa.record_update(rec.obj, new, rec.managers, manager=manager,
                                         api_version=res.api_version, now=now(),
                                         scope=_scope(subresource), has_status=res.has_status)
            stored, _ = self._finish(res, ns, name, rec, new, managers, dry_run=dry_run)
            return copy.deepcopy(stored)

    def _preconditions(self, res: ResourceType, rec: Record, meta: Obj) -> None:
        name = rec.obj["metadata"]["name"]
        want_rv = meta.get("resourceVersion")
        if want_rv and str(want_rv) != rec.obj["metadata"]["resourceVersion"]:
            raise errors.conflict_modified(res.qualified, res.group, res.plural, name)
        want_uid = meta.get("uid")
        if want_uid and want_uid != rec.obj["metadata"]["uid"]:
            raise errors.uid_precondition(res.qualified, res.group, res.plural, name,
                                          want_uid, rec.obj["metadata"]["uid"])

    def _merge_system(self, res: ResourceType, old: Obj, new: Obj, subresource: str) -> Obj:
        """Keep what a client cannot change through this endpoint."""
        if subresource == "status":
            out = copy.deepcopy(old)
            if "status" in new:
                out["status"] = new["status"]
            else:
                out.pop("status", None)
            return out
        meta = new.setdefault("metadata", {})
        old_meta = old["metadata"]
        for key in ("name", "namespace", "uid", "creationTimestamp", "generation",
                    "deletionTimestamp", "deletionGracePeriodSeconds", "resourceVersion"):
            if key in old_meta:
                meta[key] = old_meta[key]
            else:
                meta.pop(key, None)
        meta.pop("managedFields", None)
        if res.has_status:
            if "status" in old:
                new["status"] = copy.deepcopy(old["status"])
            else:
                new.pop("status", None)
        return new

    def patch(self, res: ResourceType, ns: str | None, name: str, patch_type: str,
              body: Any, *, manager: str, subresource: str = "", force: bool = False,
              dry_run: bool = False) -> tuple[Obj, bool]:
        """PATCH of any type; returns (object, created) — only apply can create."""
        with self.lock:
            if patch_type == "apply":
                return self._apply(res, ns, name, body, manager=manager,
                                   subresource=subresource, force=force, dry_run=dry_run)
            rec = self._require(res, ns, name)
            if patch_type == "json":
                patched = json_patch(rec.obj, body)
            else:
                if not isinstance(body, dict):
                    raise errors.bad_request("a merge patch must be a JSON object")
                patched = merge_patch(rec.obj, body)
            meta_patch = body.get("metadata") if isinstance(body, dict) else None
            if isinstance(meta_patch, dict):  # a resourceVersion in a patch is a precondition
                self._preconditions(res, rec, meta_patch)
            new = self._merge_system(res, rec.obj, patched, subresource)
            managers = ssa.record_update(rec.obj, new, rec.managers, manager=manager,
                                         api_version=res.api_version, now=now(),
                                         scope=_scope(subresource), has_status=res.has_status)
            stored, _ = self._finish(res, ns, name, rec, new, managers, dry_run=dry_run)
            return copy.deepcopy(stored), False

    def _apply(self, res: ResourceType, ns: str | None, name: str, body: Any, *,
               manager: str, subresource: str, force: bool,
               dry_run: bool) -> tuple[Obj, bool]:
        if not isinstance(body, dict):
            raise errors.bad_request("an apply patch must be a YAML or JSON object")
        if not manager:
            raise errors.bad_request("PATCH requests with apply content type must set "
                                     "fieldManager: add ?fieldManager=<your controller>")
        meta = body.get("metadata") or {}
        if meta.get("name") and meta["name"] != name:
            raise errors.bad_request(f"the name of the object ({meta['name']}) does not match "
                                     f"the name on the URL ({name})")
        rec = self._record(res, ns, name)
        scope = _scope(subresource)
        if rec is None:
            if subresource:
                raise errors.not_found(res.qualified, res.group, res.plural, name)
            self._check_namespace(res, ns, name)
            merged, managers = ssa.apply({}, body, {}, manager=manager,
                                         api_version=res.api_version, now=now(), force=force,
                                         scope="main", has_status=res.has_status)
            merged["metadata"] = {**merged.get("metadata", {}), "name": name}
            if meta.get("generateName"):
                merged["metadata"]["generateName"] = meta["generateName"]
            stored, _ = self._create_record(res, ns, merged, manager=manager,
                                            managers=managers, dry_run=dry_run)
            return copy.deepcopy(stored), True
        self._preconditions(res, rec, meta)
        merged, managers = ssa.apply(rec.obj, body, rec.managers, manager=manager,
                                     api_version=res.api_version, now=now(), force=force,
                                     scope=scope, has_status=res.has_status)
        new = self._merge_system(res, rec.obj, merged, subresource)
        stored, _ = self._finish(res, ns, name, rec, new, ssa.prune(new, managers),
                                 dry_run=dry_run)
        return copy.deepcopy(stored), False

    def delete(self, res: ResourceType, ns: str | None, name: str, *,
               uid: str | None = None, resource_version: str | None = None,
               propagation: str = "Background", dry_run: bool = False) -> tuple[Obj, bool]:
        """DELETE: (last or current state, whether it is gone now)."""
        with self.lock:
            rec = self._require(res, ns, name)
            self._preconditions(res, rec, {"uid": uid, "resourceVersion": resource_version})
            if dry_run:
                return copy.deepcopy(rec.obj), True
            return self._delete(res, rec, propagation)

    def _delete(self, res: ResourceType, rec: Record, propagation: str) -> tuple[Obj, bool]:
        meta = rec.obj["metadata"]
        ns, name = meta.get("namespace"), meta["name"]
        if res.kind == "Namespace" and name in PROTECTED_NAMESPACES:
            raise ApiError(403, "Forbidden", f'namespaces "{name}" is forbidden: this '
                           "namespace may not be deleted", {"name": name, "kind": "namespaces"})
        if propagation == "Orphan":
            self._orphan(meta["uid"])
        elif propagation == "Foreground":
            self._delete_dependents(meta["uid"])
        if res.kind == "Namespace":
            return self._terminate_namespace(res, rec)
        if meta.get("finalizers"):
            if meta.get("deletionTimestamp"):
                return copy.deepcopy(rec.obj), False
            new = copy.deepcopy(rec.obj)
            new["metadata"]["deletionTimestamp"] = now()
            new["metadata"]["deletionGracePeriodSeconds"] = 0
            stored, _ = self._finish(res, ns, name, rec, new, rec.managers)
            return copy.deepcopy(stored), False
        return copy.deepcopy(self._drop(res, rec)), True

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


def _scope(subresource: str) -> str:
    return "status" if subresource == "status" else "main"


def _spec_of(obj: Obj) -> Obj:
    return {k: v for k, v in obj.items() if k not in ("metadata", "status")}


def _same_fields(a: ssa.Managers, b: ssa.Managers) -> bool:
    return {k: m.fields for k, m in a.items()} == {k: m.fields for k, m in b.items()}
