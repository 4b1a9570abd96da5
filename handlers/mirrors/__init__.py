"""RegistryMirror: an in-cluster pull-through cache of one upstream registry.

One desired-state controller, ``mirrors`` (see ``docs/ENGINE.md``): for each mirror, the
pure function of :mod:`.desired` says which five objects of :mod:`.build` should exist and
what the status is; the engine writes the differences. What starts a run of a mirror:

* the mirror itself changed; a deleted mirror needs nothing (every object carries an
  ownerReference, so the garbage collector removes them);
* one of its objects changed (the engine maps an owned object to its owner; a workload
  deleted and seen in Reference mode, a bare reference, by its name): a StatefulSet's or
  DaemonSet's status written by its controller recomputes ``Ready`` (without a write when
  nothing else changed); a deleted workload is created again;
* a Secret named in a mirror's ``credentialsSecretRef`` changed, so creating a missing
  Secret, or rotating credentials, takes effect without touching the mirror;
* another mirror changed (deleted, or moved to another hostPort): every mirror held back by
  a ``HostPortConflict`` is reconciled, since that change may have freed its port and no
  event of its own would tell it;
* its Namespace changed: the ``pod-security.kubernetes.io/enforce`` label decides whether
  the node proxies' hostPort is admitted at all (read as metadata only).

Modules: ``spec`` (what a mirror asks for, validated), ``build`` (its objects), ``desired``
(the decisions and the function the engine calls), ``status`` (conditions and Events).
"""

from __future__ import annotations

from typing import Any

from eventop.engine import Controller, Kind, Reads
from eventop.handlers.mirrors.build import Names
from eventop.handlers.mirrors.desired import (
    DAEMONSET,
    MIRROR,
    NAMESPACE,
    PVC,
    SECRET,
    SERVICE,
    STATEFULSET,
    desired,
    held_back_by_host_port,
    made_for,
)
from eventop.handlers.registry import Registry
from eventop.kube import MANAGED_BY, MANAGED_BY_LABEL

#: This package's handlers; :func:`eventop.handlers.load` includes it in the router's.
registry = Registry()

Obj = dict[str, Any]
#: Only the workloads eventop made (see build.labels) matter: cached and watched alone.
MANAGED = f"{MANAGED_BY_LABEL}={MANAGED_BY}"

mirrors = Controller(
    "mirrors", parent=MIRROR,
    owns=[PVC, SERVICE, Kind.of(STATEFULSET, selector=MANAGED),
          Kind.of(DAEMONSET, selector=MANAGED)],
    # The Namespace's Pod Security label says whether a hostPort is admitted (its labels
    # only: metadata is enough).
    reads=[SECRET, Kind(NAMESPACE, metadata_only=True)],
    registry=registry,
    # A name taken by someone else's object is a NameConflict the status reports itself.
    conflict_events=False,
    degraded_condition="Degraded",
)
mirrors.reconcile(desired)
mirrors.adopts(made_for)


@mirrors.maps(SECRET)
def mirrors_using(secret: Obj, reads: Reads) -> list[Obj]:
    """The mirrors of the Secret's namespace that name it in ``credentialsSecretRef``."""
    meta = secret["metadata"]
    return [m for m in reads.list(MIRROR, meta.get("namespace"))
            if ((m.get("spec") or {}).get("credentialsSecretRef") or {}).get("name")
            == meta["name"]]


@mirrors.maps(NAMESPACE, metadata_only=True)
def mirrors_in_namespace(namespace: Obj, reads: Reads) -> list[Obj]:
    """The namespace's mirrors: a changed Pod Security label admits or refuses their node
    proxies."""
    return reads.list(MIRROR, namespace["metadata"]["name"])


@mirrors.maps(STATEFULSET, selector=MANAGED)
@mirrors.maps(DAEMONSET, selector=MANAGED)
def mirror_of_workload_name(workload: Obj, reads: Reads) -> list[Obj]:
    """The mirror whose workload has this name, for a workload without owners: one deleted,
    seen in Reference mode as a bare reference (an owned one maps to its owner by its
    ownerReference)."""
    meta = workload["metadata"]
    if meta.get("ownerReferences"):
        return []
    kind, name = workload.get("kind"), meta["name"]
    return [m for m in reads.list(MIRROR, meta.get("namespace"))
            if name == (Names.of(m["metadata"]["name"]).statefulset if kind == "StatefulSet"
                        else Names.of(m["metadata"]["name"]).daemonset)]


@mirrors.maps(MIRROR)
def mirrors_held_back(mirror: Obj, reads: Reads) -> list[Obj]:
    """Every other mirror held back by a HostPortConflict: this change (a deletion, another
    port) may have freed its port."""
    uid = mirror["metadata"].get("uid")
    return [m for m in reads.list(MIRROR)
            if m["metadata"].get("uid") != uid and held_back_by_host_port(m)]


__all__ = ["mirrors", "registry"]
