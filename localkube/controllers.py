"""The controllers a real cluster runs beside its API server, as mixed into the store.

Garbage collector (ownerReferences), namespace controller (Terminating, content deleted,
then the namespace), root CA publisher (``kube-root-ca.crt`` in every namespace) and the
CRD controller (serving the kinds a CustomResourceDefinition declares). They run inside the
write that triggers them (under the store lock) unless ``namespace_delay`` defers the
namespace controller to a background thread.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import TYPE_CHECKING

from eventop.localkube import apply as ssa
from eventop.localkube.objects import now
from eventop.localkube.resources import ResourceType
from eventop.localkube.schema import SchemaValidator

if TYPE_CHECKING:
    from eventop.localkube.store import Key, Obj, Record, Store

    _Base = Store
else:
    _Base = object

PROTECTED_NAMESPACES = ("default", "kube-system", "kube-public")
ROOT_CA_DESCRIPTION = (
    "Contains a CA bundle that can be used to verify the kube-apiserver when using internal "
    "endpoints such as the internal service IP or kubernetes.default.svc. No other usage is "
    "guaranteed across distributions of Kubernetes clusters.")
NS_DONE_CONDITIONS = [
    ("NamespaceDeletionDiscoveryFailure", "ResourcesDiscovered",
     "All resources successfully discovered"),
    ("NamespaceDeletionGroupVersionParsingFailure", "ParsedGroupVersions",
     "All legacy kube types successfully parsed"),
    ("NamespaceDeletionContentFailure", "ContentDeleted",
     "All content successfully deleted, may be waiting on finalization"),
    ("NamespaceContentRemaining", "ContentRemoved", "All content successfully removed"),
    ("NamespaceFinalizersRemaining", "ContentHasNoFinalizers",
     "All content-preserving finalizers finished"),
]


class Controllers(_Base):
    """Mixin of :class:`eventop.localkube.store.Store`."""

    def _after_removal(self, res: ResourceType, last: Obj) -> None:
        """Garbage collection, namespace completion and CRD clean-up after a removal."""
        meta = last["metadata"]
        self._collect(meta.get("uid", ""))
        ns = meta.get("namespace")
        if ns:
            nsobj = self._namespace(ns)
            if nsobj is not None and nsobj["metadata"].get("deletionTimestamp"):
                self._finish_namespace(ns)
        if res.kind == "CustomResourceDefinition" and res.group == "apiextensions.k8s.io":
            self._uninstall_crd(last)

    def _dependents_of(self, owner_uid: str, *, forget: bool
                       ) -> Iterator[tuple[ResourceType, Record]]:
        """The owner's dependents still stored, in uid order; ``forget`` drops the index entry.

        Lazy on purpose: handling one dependent may delete others (a cascade), and each is
        looked up only when its turn comes, so a dependent gone meanwhile is skipped.
        """
        index = self._dependents
        uids = index.pop(owner_uid, set()) if forget else index.get(owner_uid, set())
        for dep_uid in sorted(uids):
            loc = self._by_uid.get(dep_uid)
            if loc is None:
                continue
            res = self._type_for(loc[0])
            rec = self._data.get(loc[0], {}).get(loc[1], {}).get(loc[2])
            if res is not None and rec is not None:
                yield res, rec

    def _collect(self, owner_uid: str) -> None:
        for res, rec in self._dependents_of(owner_uid, forget=True):
            self._check_owners(res, rec)

    def _check_owners(self, res: ResourceType, rec: Record) -> None:
        """Delete a dependent whose owners are all gone; drop references to gone owners."""
        refs = rec.obj["metadata"].get("ownerReferences") or []
        alive = [r for r in refs if self._owner_alive(rec.obj, r)]
        if not alive:
            self._delete(res, rec, "Background")
        elif len(alive) < len(refs):
            self._set_owner_refs(res, rec, alive)

    def _owner_alive(self, dependent: Obj, ref: Obj) -> bool:
        """The owner exists with that uid, kind and name, where the dependent can see it
        (a namespaced owner only in the dependent's own namespace)."""
        loc = self._by_uid.get(str(ref.get("uid")))
        if loc is None:
            return False
        key, ns, name = loc
        owner_type = self._type_for(key)
        if owner_type is None or owner_type.kind != ref.get("kind") or name != ref.get("name"):
            return False
        return not ns or ns == dependent["metadata"].get("namespace")

    def _delete_dependents(self, owner_uid: str) -> None:
        """Foreground deletion: dependents with no other live owner go first (simplified:
        the owner does not wait for dependents that are held by finalizers)."""
        for res, rec in self._dependents_of(owner_uid, forget=False):
            others = [r for r in rec.obj["metadata"].get("ownerReferences") or []
                      if r.get("uid") != owner_uid and self._owner_alive(rec.obj, r)]
            if not others:
                self._delete(res, rec, "Foreground")

    def _orphan(self, owner_uid: str) -> None:
        for res, rec in self._dependents_of(owner_uid, forget=True):
            refs = [r for r in rec.obj["metadata"].get("ownerReferences") or []
                    if r.get("uid") != owner_uid]
            self._set_owner_refs(res, rec, refs)

    def _set_owner_refs(self, res: ResourceType, rec: Record, refs: list[Obj]) -> None:
        new = copy.deepcopy(rec.obj)
        if refs:
            new["metadata"]["ownerReferences"] = refs
        else:
            new["metadata"].pop("ownerReferences", None)
        managers = ssa.record_update(rec.obj, new, rec.managers,
                                     manager="kube-controller-manager",
                                     api_version=res.api_version, now=now(), scope="main",
                                     has_status=res.has_status)
        meta = new["metadata"]
        self._finish(res, meta.get("namespace"), meta["name"], rec, new, managers)

    def _type_for(self, key: Key) -> ResourceType | None:
        for res in self.table.all():
            if res.key == key:
                return res
        return None

    def _terminate_namespace(self, res: ResourceType, rec: Record) -> tuple[Obj, bool]:
        name = rec.obj["metadata"]["name"]
        if not rec.obj["metadata"].get("deletionTimestamp"):
            new = copy.deepcopy(rec.obj)
            new["metadata"]["deletionTimestamp"] = now()
            new["status"] = {"phase": "Terminating"}
            self._finish(res, None, name, rec, new, rec.managers)
        first = copy.deepcopy(self._require(res, None, name).obj)
        if self.namespace_delay is None:
            self._clean_namespace(name)
        else:
            self.deferred.schedule(self.namespace_delay, lambda: self._clean_namespace(name))
        return first, False

    def _clean_namespace(self, name: str) -> None:
        """The namespace controller: delete everything in it, then the namespace."""
        with self.lock:
            for key, by_ns in list(self._data.items()):
                ctype = self._type_for(key)
                if ctype is None or not ctype.namespaced:
                    continue
                for item in list((by_ns.get(name) or {}).values()):
                    current = self._record(ctype, name, item.obj["metadata"]["name"])
                    if current is not None:
                        self._delete(ctype, current, "Background")
            self._finish_namespace(name)

    def _finish_namespace(self, name: str) -> None:
        if any(by_ns.get(name) for by_ns in self._data.values()):
            return
        res = self.resource("v1", "Namespace")
        rec = self._record(res, None, name)
        if rec is None:
            return
        stamp = now()
        new = copy.deepcopy(rec.obj)
        new["status"] = {"phase": "Terminating", "conditions": [
            {"type": t, "status": "False", "lastTransitionTime": stamp, "reason": r,
             "message": m} for t, r, m in NS_DONE_CONDITIONS]}
        managers = ssa.record_update(rec.obj, new, rec.managers,
                                     manager="kube-controller-manager", api_version="v1",
                                     now=stamp, scope="status", has_status=True)
        self._finish(res, None, name, rec, new, managers)
        self._drop(res, self._require(res, None, name))

    def _install_crd(self, crd: Obj) -> None:
        for res in self.table.install_crd(crd):
            if res.schema:
                self._schemas[res.key] = SchemaValidator(res.schema)

    def _uninstall_crd(self, crd: Obj) -> None:
        types = self.table.remove_crd(crd["metadata"]["name"])
        for res in types[:1]:
            for by_name in list(self._data.get(res.key, {}).values()):
                for rec in list(by_name.values()):
                    self._drop(res, rec)
            self._schemas.pop(res.key, None)
        self.changed.notify_all()  # its watches end (localkube.watch), objects or none

    def _publish_root_ca(self, ns: str) -> None:
        namespace = self._namespace(ns)
        if namespace is None or namespace["metadata"].get("deletionTimestamp"):
            return  # gone or going already (a dangling owner collected at once, gc_dangling)
        res = self.resource("v1", "ConfigMap")
        if self._record(res, ns, "kube-root-ca.crt") is None:
            self.create(res, ns, {
                "metadata": {"name": "kube-root-ca.crt",
                             "annotations": {"kubernetes.io/description": ROOT_CA_DESCRIPTION}},
                "data": {"ca.crt": ""}}, manager="kube-controller-manager")
