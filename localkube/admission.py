"""Admission of built-in kinds and custom resources: defaults, then validation.

Mixed into the store. Custom resources get their CRD schema's defaults, pruning and
validation; built-in kinds get the few defaults the real registry fills in (Namespaces,
Secrets, Services, PVCs, Pods, CRDs, Jobs and CronJobs: :mod:`eventop.localkube.batch`)
and :func:`eventop.localkube.validation.admit`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from eventop.localkube import batch, errors, validation
from eventop.localkube.objects import now
from eventop.localkube.resources import ResourceType

if TYPE_CHECKING:
    from eventop.localkube.store import Obj, Store

    _Base = Store
else:
    _Base = object


class Admission(_Base):
    """Mixin of :class:`eventop.localkube.store.Store`."""

    def _admit(self, res: ResourceType, new: Obj, old: Obj | None) -> Obj:
        """Kind-specific defaults, then validation (422 on failure)."""
        new["apiVersion"], new["kind"] = res.api_version, res.kind
        if res.custom:
            validator = self._schemas.get(res.key)
            if validator is not None:
                new = validator.prepare(new)
                causes = validator.causes(new)
                if old is None:
                    causes = validation.validate_name(res, new["metadata"]["name"]) + causes
                causes += validation.validate_meta(new["metadata"])
                if causes:
                    raise errors.invalid(res.kind, res.group, new["metadata"]["name"], causes)
            return new
        kind = res.kind if res.group in ("", "apps", "apiextensions.k8s.io", "batch") else ""
        if kind == "Job":
            batch.default_job(new, old)
        elif kind == "CronJob":
            batch.default_cronjob(new)
        elif kind == "Namespace":
            name = new["metadata"]["name"]
            new["metadata"].setdefault("labels", {})["kubernetes.io/metadata.name"] = name
            new.setdefault("spec", {}).setdefault("finalizers", ["kubernetes"])
            new.setdefault("status", {}).setdefault("phase", "Active")
        elif kind == "Secret":
            validation.prepare_secret(new)
        elif kind == "Service":
            self._default_service(new, old)
        elif kind == "PersistentVolumeClaim":
            spec = new.setdefault("spec", {})
            spec.setdefault("volumeMode", "Filesystem")
            status = new.setdefault("status", {})
            status.setdefault("phase", "Pending")
            if old is None and self.bind_pvcs and status["phase"] == "Pending":
                spec.setdefault("volumeName", f"pvc-{new['metadata']['uid']}")
                new["status"] = {"phase": "Bound",
                                 "accessModes": list(spec.get("accessModes") or []),
                                 "capacity": dict((spec.get("resources") or {})
                                                  .get("requests") or {})}
        elif kind == "Pod":
            new.setdefault("status", {}).setdefault("phase", "Pending")
        elif kind == "CustomResourceDefinition":
            _crd_status(new, old)
        validation.admit(res, new, old)
        return new

    def _default_service(self, new: Obj, old: Obj | None) -> None:
        spec = new.setdefault("spec", {})
        spec.setdefault("type", "ClusterIP")
        old_ip = ((old or {}).get("spec") or {}).get("clusterIP")
        if old_ip and not spec.get("clusterIP"):
            spec["clusterIP"] = old_ip
        if spec["type"] != "ExternalName" and not spec.get("clusterIP"):
            self._next_ip += 1
            spec["clusterIP"] = f"10.96.{self._next_ip // 250}.{self._next_ip % 250 + 1}"
        if spec.get("clusterIP"):
            spec["clusterIPs"] = [spec["clusterIP"]]
        spec.setdefault("sessionAffinity", "None")
        for port in spec.get("ports") or []:
            port.setdefault("protocol", "TCP")
            port.setdefault("targetPort", port.get("port"))
        new.setdefault("status", {"loadBalancer": {}})


def _crd_status(crd: Obj, old: Obj | None) -> None:
    """Established at once; condition times kept across updates so no-ops stay no-ops."""
    names = (crd.get("spec") or {}).get("names") or {}
    old_conditions = ((old or {}).get("status") or {}).get("conditions") or []
    stamp = old_conditions[0]["lastTransitionTime"] if old_conditions else now()
    crd["status"] = {
        "conditions": [
            {"type": "NamesAccepted", "status": "True", "lastTransitionTime": stamp,
             "reason": "NoConflicts", "message": "no conflicts found"},
            {"type": "Established", "status": "True", "lastTransitionTime": stamp,
             "reason": "InitialNamesAccepted", "message": "the initial names have been accepted"},
        ],
        "acceptedNames": names,
        "storedVersions": [v["name"] for v in (crd.get("spec") or {}).get("versions") or []
                           if v.get("storage")],
    }
