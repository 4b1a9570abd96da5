"""Where each kind lives in the API: group, version, plural, scope; and the URL paths.

A static table covers every kind eventop itself reads or writes, so no discovery round
trip is needed on the hot path. Kinds it does not know (a user's own handler) are looked up
once through API discovery by :class:`eventop.kube.client.Kube` and added here.
"""

from __future__ import annotations

from dataclasses import dataclass

from eventop.kube import errors

# What the API server refuses in any object's name (apimachinery's IsValidPathSegmentName),
# plus what would end the path of a URL: such a name, from an event body, would otherwise
# address another path ("x/status", "", "..": the collection, a subresource, a parent).
_NOT_IN_NAMES = ("/", "%", "?", "#")


def is_path_segment(value: str) -> bool:
    """Can an object have this name or namespace? (What the API server refuses in any name,
    plus what would end the path of a URL; kinds refuse more, each its own way.)"""
    return value not in (".", "..") and not any(c in value for c in _NOT_IN_NAMES)


def _segment(what: str, value: str) -> str:
    if not is_path_segment(value):
        raise errors.NotFound(f"no object can have the {what} {value!r}: Kubernetes names "
                              "never contain '/', '%', '?' or '#', nor are '.' or '..'",
                              reason="NotFound")
    return value


@dataclass(frozen=True)
class Resource:
    group: str  # "" for the core group
    version: str
    kind: str
    plural: str
    namespaced: bool

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    def path(self, namespace: str | None = None, name: str | None = None,
             subresource: str | None = None) -> str:
        """The URL path of the collection, or of one object (and its subresource)."""
        base = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        if self.namespaced and namespace:
            base += f"/namespaces/{_segment('namespace', namespace)}"
        base += f"/{self.plural}"
        if name:
            base += f"/{_segment('name', name)}"
            if subresource:
                base += f"/{subresource}"
        return base


def _r(api_version: str, kind: str, plural: str, namespaced: bool = True) -> Resource:
    group, _, version = api_version.rpartition("/")
    return Resource(group, version, kind, plural, namespaced)


BUILTIN: tuple[Resource, ...] = (
    _r("v1", "Namespace", "namespaces", namespaced=False),
    _r("v1", "ConfigMap", "configmaps"),
    _r("v1", "Secret", "secrets"),
    _r("v1", "Service", "services"),
    _r("v1", "PersistentVolumeClaim", "persistentvolumeclaims"),
    _r("v1", "PersistentVolume", "persistentvolumes", namespaced=False),
    _r("v1", "Event", "events"),
    _r("v1", "Pod", "pods"),
    _r("v1", "ServiceAccount", "serviceaccounts"),
    _r("apps/v1", "StatefulSet", "statefulsets"),
    _r("apps/v1", "DaemonSet", "daemonsets"),
    _r("apps/v1", "Deployment", "deployments"),
    _r("batch/v1", "Job", "jobs"),
    _r("batch/v1", "CronJob", "cronjobs"),
    _r("snapshot.storage.k8s.io/v1", "VolumeSnapshot", "volumesnapshots"),
    _r("coordination.k8s.io/v1", "Lease", "leases"),
    _r("v1", "ResourceQuota", "resourcequotas"),
    _r("v1", "LimitRange", "limitranges"),
    _r("apps/v1", "ReplicaSet", "replicasets"),
    _r("networking.k8s.io/v1", "NetworkPolicy", "networkpolicies"),
    _r("networking.k8s.io/v1", "Ingress", "ingresses"),
    _r("policy/v1", "PodDisruptionBudget", "poddisruptionbudgets"),
    _r("rbac.authorization.k8s.io/v1", "Role", "roles"),
    _r("rbac.authorization.k8s.io/v1", "RoleBinding", "rolebindings"),
    _r("rbac.authorization.k8s.io/v1", "ClusterRole", "clusterroles", namespaced=False),
    _r("rbac.authorization.k8s.io/v1", "ClusterRoleBinding", "clusterrolebindings",
       namespaced=False),
    _r("apiextensions.k8s.io/v1", "CustomResourceDefinition", "customresourcedefinitions",
       namespaced=False),
    _r("eventop.dev/v1", "RegistryMirror", "registrymirrors"),
    _r("eventop.dev/v1", "CopyRule", "copyrules", namespaced=False),
    _r("eventop.dev/v1", "ExchangeRate", "exchangerates"),
    _r("eventop.dev/v1", "Database", "databases"),
)


def is_custom(api_version: str) -> bool:
    """A custom resource's group: dotted, and not one of Kubernetes' own (``*.k8s.io``)."""
    group = api_version.rpartition("/")[0]
    return "." in group and not group.endswith(".k8s.io")


def is_builtin_group(api_version: str) -> bool:
    """A dotless group (core ``v1``, ``apps``, ``batch``...): one of Kubernetes' own, to which
    no CustomResourceDefinition can add a kind (a CRD's group always has a dot). A kind of
    it that the API server does not serve is a typo, not a CRD still to install."""
    return "." not in api_version.rpartition("/")[0]


class ResourceTable:
    """Lookup by (apiVersion, kind) and by (group, plural)."""

    def __init__(self, resources: tuple[Resource, ...] = BUILTIN) -> None:
        self._by_kind: dict[tuple[str, str], Resource] = {}
        self._by_plural: dict[tuple[str, str], Resource] = {}
        for res in resources:
            self.add(res)

    def add(self, res: Resource) -> None:
        self._by_kind[(res.api_version, res.kind)] = res
        self._by_plural[(res.group, res.plural)] = res

    def by_kind(self, api_version: str, kind: str) -> Resource | None:
        return self._by_kind.get((api_version, kind))

    def by_plural(self, group: str, plural: str) -> Resource | None:
        return self._by_plural.get((group, plural))
