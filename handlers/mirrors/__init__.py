"""RegistryMirror: an in-cluster pull-through cache of one upstream registry.

Handlers registered here (Resource and Reference mode alike):

* RegistryMirror add/update/delete -> full reconcile of that mirror (see
  :mod:`eventop.handlers.mirrors.reconcile`), then of any mirror held back by a hostPort conflict
  that this change may have resolved. A deleted mirror needs nothing: every object carries
  an ownerReference, so the garbage collector removes them.
* StatefulSet / DaemonSet events (the watcher watches those labelled
  ``app.kubernetes.io/managed-by=eventop``) -> the owning mirror's status is recomputed
  from the workloads' own status; a deleted workload triggers a full reconcile, which
  re-creates it while the mirror still wants it.
* Secret events -> mirrors naming that Secret in ``credentialsSecretRef`` are reconciled,
  so creating a missing Secret (or rotating credentials) takes effect without touching
  the mirror.
"""

from __future__ import annotations

from typing import Any

from eventop.events import ANY_KUBE_CHANGE
from eventop.handlers.events import Event
from eventop.handlers.mirrors.build import API_VERSION, KIND, Names
from eventop.handlers.mirrors.reconcile import reconcile, reconcile_conflicted, refresh_status
from eventop.handlers.registry import Registry
from eventop.kube.objects import MANAGED_BY, MANAGED_BY_LABEL

#: This package's handlers; :func:`eventop.handlers.load` includes it in the router's.
registry = Registry()
MANAGED = f"{MANAGED_BY_LABEL}={MANAGED_BY}"


@registry.on(ANY_KUBE_CHANGE, api_version=API_VERSION, kind=KIND)
def on_registry_mirror(event: Event, kube: Any) -> str | None:
    ref = event.ref
    if ref is None or not ref.namespace:
        return None
    mirrors = kube.list(API_VERSION, KIND)
    results = [reconcile(kube, ref.namespace, ref.name, mirrors=mirrors)]
    results += reconcile_conflicted(kube, mirrors, skip_uid=_uid_of(mirrors, ref.namespace,
                                                                     ref.name))
    return "; ".join(results)


def _uid_of(mirrors: list[dict[str, Any]], namespace: str, name: str) -> str | None:
    for m in mirrors:
        meta = m.get("metadata") or {}
        if meta.get("namespace") == namespace and meta.get("name") == name:
            return str(meta.get("uid"))
    return None


def owning_mirror(kube: Any, event: Event) -> str | None:
    """The name of the RegistryMirror owning the event's StatefulSet/DaemonSet, if any.

    From the ownerReferences of the object (the event body in Resource mode, a read in
    Reference mode); for a workload already gone in Reference mode, by matching the
    names our mirrors give their workloads.
    """
    ref = event.ref
    if ref is None or not ref.namespace:
        return None
    obj = event.object
    if obj is None and event.change != "delete":
        obj = kube.get_or_none(ref.api_version, ref.kind, ref.name, ref.namespace)
    if obj is not None:
        for owner in (obj.get("metadata") or {}).get("ownerReferences") or []:
            if owner.get("apiVersion") == API_VERSION and owner.get("kind") == KIND:
                return str(owner.get("name"))
        return None
    for mirror in kube.list(API_VERSION, KIND, ref.namespace):
        names = Names.of(mirror["metadata"]["name"])
        if ref.name == (names.statefulset if ref.kind == "StatefulSet" else names.daemonset):
            return str(mirror["metadata"]["name"])
    return None


# Only the workloads eventop made (see build.labels) matter: the watcher watches only those.
@registry.on(ANY_KUBE_CHANGE, api_version="apps/v1", kind="StatefulSet", selector=MANAGED)
@registry.on(ANY_KUBE_CHANGE, api_version="apps/v1", kind="DaemonSet", selector=MANAGED)
def on_mirror_workload(event: Event, kube: Any) -> str | None:
    mirror = owning_mirror(kube, event)
    ref = event.ref
    if mirror is None or ref is None or ref.namespace is None:
        return None
    if event.change == "delete":
        return reconcile(kube, ref.namespace, mirror)
    return refresh_status(kube, ref.namespace, mirror)


@registry.on(ANY_KUBE_CHANGE, api_version="v1", kind="Secret")
def on_credentials_secret(event: Event, kube: Any) -> str | None:
    ref = event.ref
    if ref is None or not ref.namespace:
        return None
    results = []
    for mirror in kube.list(API_VERSION, KIND, ref.namespace):
        secret_ref = (mirror.get("spec") or {}).get("credentialsSecretRef") or {}
        if secret_ref.get("name") == ref.name:
            results.append(reconcile(kube, ref.namespace, mirror["metadata"]["name"]))
    return "; ".join(results) or None
