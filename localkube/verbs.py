"""The API verbs over the store: create, update (PUT), patch of every type and server-side
apply, delete, each with the real server's preconditions and the fields a client may not set.

Mixed into the store (:class:`eventop.localkube.store.Store`): each verb checks and shapes the
request, then hands the new object to the store's write pipeline (``_finish``), which admits,
versions and commits it.
"""

from __future__ import annotations

import copy
import uuid
from typing import TYPE_CHECKING, Any

from eventop.localkube import apply as ssa
from eventop.localkube import errors
from eventop.localkube.controllers import PROTECTED_NAMESPACES
from eventop.localkube.errors import ApiError
from eventop.localkube.objects import now
from eventop.localkube.patches import json_patch, merge_patch
from eventop.localkube.resources import ResourceType

if TYPE_CHECKING:
    from eventop.localkube.store import Obj, Record, Store

    _Base = Store
else:
    _Base = object


class Verbs(_Base):
    """Mixin of :class:`eventop.localkube.store.Store`."""

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
            if res.custom and not meta.get("resourceVersion"):
                # A custom resource has no unconditional update (its strategy's
                # AllowUnconditionalUpdate is false); built-in kinds such as ConfigMaps have.
                raise errors.invalid(res.plural, res.group, name, [errors.cause(
                    "FieldValueInvalid", "metadata.resourceVersion",
                    "Invalid value: 0x0: must be specified for an update")])
            self._preconditions(res, rec, meta)
            base = _given_managers(rec, body, subresource)
            new = self._merge_system(res, rec.obj, copy.deepcopy(body), subresource)
            managers = ssa.record_update(rec.obj, new, base, manager=manager,
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
            base = _given_managers(rec, patched, subresource)
            new = self._merge_system(res, rec.obj, patched, subresource)
            managers = ssa.record_update(rec.obj, new, base, manager=manager,
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


def _given_managers(rec: Record, new: Obj, subresource: str) -> ssa.Managers:
    """The field managers a write starts from: those it sets in ``metadata.managedFields``
    when it changes them (how clients such as client-go's ``csaupgrade`` hand fields from an
    Update entry to an Apply entry), else the object's own. Not through a subresource, and
    not for an empty list, as the real server."""
    given = (new.get("metadata") or {}).get("managedFields")
    if subresource or not isinstance(given, list) or not given \
            or given == rec.obj["metadata"].get("managedFields"):
        return rec.managers
    return ssa.parse(given)


def _scope(subresource: str) -> str:
    return "status" if subresource == "status" else "main"
