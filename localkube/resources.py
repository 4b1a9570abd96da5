"""The resource table: which kinds localkube serves, where, and with which behaviours.

Built-in kinds are a fixed list (the ones eventop and its tests touch); custom kinds come
from CustomResourceDefinitions, read from ``crd_dir`` at start-up or created through the API.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

Obj = dict[str, Any]

VERBS = ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]


@dataclass
class ResourceType:
    group: str
    version: str
    kind: str
    plural: str
    namespaced: bool
    has_status: bool = False
    tracks_generation: bool = False
    singular: str = ""
    short_names: list[str] = field(default_factory=list)
    list_kind: str = ""
    schema: Obj | None = None  # openAPIV3Schema of a custom resource
    custom: bool = False
    categories: list[str] = field(default_factory=list)  # `kubectl get all`, `get eventop`
    printer_columns: list[Obj] | None = None  # a CRD version's additionalPrinterColumns

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def key(self) -> tuple[str, str]:
        """Storage key: objects of one (group, plural) share one collection."""
        return (self.group, self.plural)

    @property
    def qualified(self) -> str:
        """``plural.group`` as the API server names a resource in messages."""
        return f"{self.plural}.{self.group}" if self.group else self.plural

    def discovery(self) -> list[Obj]:
        """APIResourceList entries: the resource and its status subresource."""
        main: Obj = {"name": self.plural, "singularName": self.singular or self.kind.lower(),
                     "namespaced": self.namespaced, "kind": self.kind, "verbs": VERBS}
        if self.short_names:
            main["shortNames"] = self.short_names
        if self.categories:
            main["categories"] = self.categories
        out = [main]
        if self.has_status:
            out.append({"name": f"{self.plural}/status", "singularName": "",
                        "namespaced": self.namespaced, "kind": self.kind,
                        "verbs": ["get", "patch", "update"]})
        return out


def _b(api_version: str, kind: str, plural: str, *, namespaced: bool = True,
       status: bool = False, generation: bool = False, short: tuple[str, ...] = (),
       categories: tuple[str, ...] = ()) -> ResourceType:
    group, _, version = api_version.rpartition("/")
    return ResourceType(group, version, kind, plural, namespaced, has_status=status,
                        tracks_generation=generation, short_names=list(short),
                        list_kind=f"{kind}List", categories=list(categories))


def builtin_types() -> list[ResourceType]:
    """Built-in kinds; status/generation flags, short names and categories follow the real
    v1.24 registry strategies and discovery."""
    return [
        _b("v1", "Namespace", "namespaces", namespaced=False, status=True, short=("ns",)),
        _b("v1", "ConfigMap", "configmaps", short=("cm",)),
        _b("v1", "Secret", "secrets"),
        _b("v1", "Service", "services", status=True, short=("svc",), categories=("all",)),
        _b("v1", "PersistentVolumeClaim", "persistentvolumeclaims", status=True,
           short=("pvc",)),
        _b("v1", "PersistentVolume", "persistentvolumes", namespaced=False, status=True,
           short=("pv",)),
        _b("v1", "Event", "events", short=("ev",)),
        _b("v1", "Pod", "pods", status=True, short=("po",), categories=("all",)),
        _b("v1", "ServiceAccount", "serviceaccounts", short=("sa",)),
        _b("apps/v1", "StatefulSet", "statefulsets", status=True, generation=True,
           short=("sts",), categories=("all",)),
        _b("apps/v1", "DaemonSet", "daemonsets", status=True, generation=True, short=("ds",),
           categories=("all",)),
        _b("apps/v1", "Deployment", "deployments", status=True, generation=True,
           short=("deploy",), categories=("all",)),
        _b("batch/v1", "Job", "jobs", status=True, generation=True, categories=("all",)),
        _b("batch/v1", "CronJob", "cronjobs", status=True, generation=True, short=("cj",),
           categories=("all",)),
        _b("coordination.k8s.io/v1", "Lease", "leases"),
        # What platform operators write beside the above (a tenant's quota, limits, network
        # policy and role bindings): flags as discovery and generation on the real v1.24.
        _b("v1", "ResourceQuota", "resourcequotas", status=True, short=("quota",)),
        _b("v1", "LimitRange", "limitranges", short=("limits",)),
        _b("apps/v1", "ReplicaSet", "replicasets", status=True, generation=True, short=("rs",),
           categories=("all",)),
        _b("networking.k8s.io/v1", "NetworkPolicy", "networkpolicies", status=True,
           generation=True, short=("netpol",)),
        _b("networking.k8s.io/v1", "Ingress", "ingresses", status=True, generation=True,
           short=("ing",)),
        _b("policy/v1", "PodDisruptionBudget", "poddisruptionbudgets", status=True,
           generation=True, short=("pdb",)),
        _b("rbac.authorization.k8s.io/v1", "Role", "roles"),
        _b("rbac.authorization.k8s.io/v1", "RoleBinding", "rolebindings"),
        _b("rbac.authorization.k8s.io/v1", "ClusterRole", "clusterroles", namespaced=False),
        _b("rbac.authorization.k8s.io/v1", "ClusterRoleBinding", "clusterrolebindings",
           namespaced=False),
        _b("apiextensions.k8s.io/v1", "CustomResourceDefinition", "customresourcedefinitions",
           namespaced=False, status=True, generation=True, short=("crd", "crds"),
           categories=("api-extensions",)),
    ]


def types_from_crd(crd: Obj) -> list[ResourceType]:
    """One ResourceType per served version of a CRD (apiextensions.k8s.io/v1)."""
    spec = crd.get("spec") or {}
    names = spec.get("names") or {}
    out = []
    for ver in spec.get("versions") or []:
        if not ver.get("served", True):
            continue
        schema = ((ver.get("schema") or {}).get("openAPIV3Schema"))
        out.append(ResourceType(
            group=spec["group"], version=ver["name"], kind=names["kind"],
            plural=names["plural"], namespaced=spec.get("scope", "Namespaced") == "Namespaced",
            has_status="status" in (ver.get("subresources") or {}),
            tracks_generation=True, singular=names.get("singular", ""),
            short_names=list(names.get("shortNames") or []),
            list_kind=names.get("listKind") or f"{names['kind']}List",
            schema=schema, custom=True, categories=list(names.get("categories") or []),
            printer_columns=ver.get("additionalPrinterColumns")))
    return out


def load_crd_dir(crd_dir: str | Path | None) -> list[Obj]:
    """Every CustomResourceDefinition document in ``crd_dir/*.yaml`` (others are skipped)."""
    if not crd_dir:
        return []
    path = Path(crd_dir)
    if not path.is_dir():
        raise FileNotFoundError(
            f"CRD directory {path} does not exist; pass crd_dir=None to start without CRDs")
    crds = []
    for file in sorted([*path.glob("*.yaml"), *path.glob("*.yml")]):
        for doc in yaml.safe_load_all(file.read_text()):
            if isinstance(doc, dict) and doc.get("kind") == "CustomResourceDefinition":
                crds.append(doc)
    return crds


class ResourceTable:
    """Lookups by URL (group, version, plural) and by (apiVersion, kind)."""

    def __init__(self) -> None:
        self._by_path: dict[tuple[str, str, str], ResourceType] = {}
        self._by_kind: dict[tuple[str, str], ResourceType] = {}
        self._crd_types: dict[str, list[ResourceType]] = {}  # CRD name -> its types
        for res in builtin_types():
            self._add(res)

    def _add(self, res: ResourceType) -> None:
        self._by_path[(res.group, res.version, res.plural)] = res
        self._by_kind[(res.api_version, res.kind)] = res

    def _drop(self, res: ResourceType) -> None:
        self._by_path.pop((res.group, res.version, res.plural), None)
        self._by_kind.pop((res.api_version, res.kind), None)

    def install_crd(self, crd: Obj) -> list[ResourceType]:
        """Serve the kinds of ``crd`` (replacing an earlier version of the same CRD)."""
        name = crd["metadata"]["name"]
        for res in self._crd_types.pop(name, []):
            self._drop(res)
        types = types_from_crd(crd)
        for res in types:
            self._add(res)
        self._crd_types[name] = types
        return types

    def remove_crd(self, name: str) -> list[ResourceType]:
        types = self._crd_types.pop(name, [])
        for res in types:
            self._drop(res)
        return types

    def by_path(self, group: str, version: str, plural: str) -> ResourceType | None:
        return self._by_path.get((group, version, plural))

    def by_kind(self, api_version: str, kind: str) -> ResourceType | None:
        return self._by_kind.get((api_version, kind))

    def all(self) -> list[ResourceType]:
        return list(self._by_path.values())

    def group_versions(self) -> dict[str, list[str]]:
        """Group name -> versions served (core group is "")."""
        out: dict[str, list[str]] = {}
        for res in self._by_path.values():
            versions = out.setdefault(res.group, [])
            if res.version not in versions:
                versions.append(res.version)
        return out
