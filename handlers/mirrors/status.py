"""A RegistryMirror's status and Events, as pure functions of what the reconcile found.

Two conditions, as operators conventionally report a workload they run:

* ``Degraded``: True while something keeps the mirror from being what its spec asks for
  (a hostPort taken, a Secret missing, a refused resize, an invalid spec...), with the
  first problem's reason; False (``Reconciled``) once every object is applied;
* ``Ready``: whether a pull from ``localhost:<hostPort>`` works on every node as the spec
  says, from the StatefulSet's and DaemonSet's own status (written by their controllers):
  ``RollingOut`` while old-template pods still serve after a spec change. A generation held
  back (a hostPort taken, a Secret missing, an object in the way) is not Ready either, with
  the holding reason, even while the previous spec's objects still serve: ``kubectl wait
  --for=condition=Ready`` must not return for a spec that is not running.

``status.hostPort`` records the port the mirror holds (see :mod:`.desired`, decision 2).

A Warning Event is posted when a problem appears or changes, a Normal ``Recovered`` one when
it clears: on transitions only, so a mirror stuck on a problem does not post an Event per
event (the engine posts them only with a status change anyway).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from eventop.engine import Note
from eventop.handlers.mirrors import build
from eventop.handlers.mirrors.build import Names
from eventop.kube import get_condition, set_condition

Obj = dict[str, Any]

READY = "Ready"
DEGRADED = "Degraded"


@dataclass(frozen=True)
class Problem:
    """Why a mirror is Degraded. ``reason`` is the condition reason (CamelCase)."""

    reason: str
    message: str


def ready_condition(names: Names, sts: Obj | None, ds: Obj | None,
                    degraded: Obj | None, was_ready: bool = False) -> tuple[bool, str, str]:
    """(status, reason, message) of ``Ready`` from the workloads' own status.

    Ready means a pull from ``localhost:<hostPort>`` works on every node *as the spec now
    says*: the registry has a ready replica, both workloads have rolled out their current
    template (see :func:`rollout_waits`: until then only old-template pods serve, say the
    old upstream or the old hostPort, which is not what the spec promises) and the node
    proxy is ready on every node it is scheduled to. A DaemonSet scheduled nowhere (no
    schedulable node, or its status not computed yet) serves nothing, so that is not Ready
    either.
    """
    if sts is None or ds is None:
        missing = ", ".join(
            f"{kind} {name}" for kind, name, obj in (
                ("StatefulSet", names.statefulset, sts), ("DaemonSet", names.daemonset, ds))
            if obj is None)
        if degraded and degraded.get("status") == "True":
            return False, str(degraded.get("reason")), f"not created ({missing} missing): " + \
                str(degraded.get("message"))
        return False, "NotCreated", f"{missing} not created yet"
    deleting = [(kind, obj) for kind, obj in (("StatefulSet", sts), ("DaemonSet", ds))
                if obj["metadata"].get("deletionTimestamp")]
    if deleting:
        return False, "WorkloadDeleting", "; ".join(
            f"{kind} {obj['metadata']['name']} is being deleted, held by finalizer(s) "
            f"{', '.join(obj['metadata'].get('finalizers') or []) or 'none'}; it is created "
            "again once it is gone" for kind, obj in deleting)
    sts_status = sts.get("status") or {}
    ready_replicas = int(sts_status.get("readyReplicas") or 0)
    if ready_replicas < 1:
        if not was_ready:
            return False, "RegistryNotReady", \
                f"StatefulSet {names.statefulset} has no ready registry pod yet"
        rolling = [w for w in rollout_waits(names, sts, ds) if w.startswith("StatefulSet")]
        return False, "RegistryNotReady", (
            f"StatefulSet {names.statefulset} has no ready registry pod: " + (
                f"the pod of the current spec is not ready ({rolling[0]}); the registry was "
                "ready before the change, so see the new pod's events and logs (an image "
                "that can not be pulled, an upstream or Secret it can not use)" if rolling
                else "it was ready before; see the pod's events and logs"))
    ds_status = ds.get("status") or {}
    port = host_port(ds)
    if "observedGeneration" not in ds_status:
        return False, "NodeProxyPending", \
            f"DaemonSet {names.daemonset} has not been scheduled by its controller yet"
    desired = int(ds_status.get("desiredNumberScheduled") or 0)
    # Available (ready for minReadySeconds) is what kubectl waits for; the API server
    # omits a zero count, so a missing numberAvailable is none available.
    ready = min(int(ds_status.get("numberReady") or 0),
                int(ds_status.get("numberAvailable") or 0))
    if desired == 0:
        return False, "NoNodes", (f"DaemonSet {names.daemonset} runs on no node, so "
                                  f"localhost:{port} is served nowhere")
    waits = rollout_waits(names, sts, ds)
    if waits:
        return False, "RollingOut", (f"rolling out the current spec (localhost:{port}); "
                                     "waiting for " + "; ".join(waits))
    if ready < desired:
        return False, "NodeProxyNotReady", \
            f"node proxy ready on {ready} of {desired} nodes"
    return True, "Available", \
        f"registry ready; served at localhost:{port} on {desired} node(s)"


def rollout_waits(names: Names, sts: Obj, ds: Obj) -> list[str]:
    """What the workloads' rollouts still wait for (empty: both run their current template).

    Decided as ``kubectl rollout status`` does, from what the controllers report: a spec
    change not yet observed (``observedGeneration`` below ``generation``; the counts are
    then about the old template), replicas or node proxies not yet on the new template,
    a StatefulSet whose current revision is not yet its update revision (when it reports
    them); whether the node proxies are available is :func:`ready_condition`'s. A count
    the API server leaves out is zero (it omits zero counts), so a controller that has not
    written them yet is still waiting.
    """
    waits: list[str] = []
    sts_status = sts.get("status") or {}
    sts_generation = int(sts["metadata"].get("generation") or 0)
    replicas = int((sts.get("spec") or {}).get("replicas", 1))
    updated = int(sts_status.get("updatedReplicas") or 0)
    current_rev, update_rev = sts_status.get("currentRevision"), sts_status.get("updateRevision")
    if int(sts_status.get("observedGeneration") or 0) < sts_generation:
        waits.append(f"StatefulSet {names.statefulset} to observe generation {sts_generation}")
    elif updated < replicas:
        waits.append(f"StatefulSet {names.statefulset}: {updated} of {replicas} registry "
                     "pod(s) updated")
    elif current_rev and update_rev and current_rev != update_rev:
        waits.append(f"StatefulSet {names.statefulset} to finish its update to revision "
                     f"{update_rev}")
    ds_status = ds.get("status") or {}
    ds_generation = int(ds["metadata"].get("generation") or 0)
    desired = int(ds_status.get("desiredNumberScheduled") or 0)
    updated = int(ds_status.get("updatedNumberScheduled") or 0)
    if int(ds_status.get("observedGeneration") or 0) < ds_generation:
        waits.append(f"DaemonSet {names.daemonset} to observe generation {ds_generation}")
    elif updated < desired:
        waits.append(f"DaemonSet {names.daemonset}: {updated} of {desired} node proxies "
                     "updated")
    return waits


def host_port(ds: Obj) -> int | None:
    """The hostPort a node-proxy DaemonSet serves (what the mirror's endpoint is)."""
    for container in ds.get("spec", {}).get("template", {}).get("spec", {}).get(
            "containers") or []:
        for port in container.get("ports") or []:
            if port.get("hostPort"):
                return int(port["hostPort"])
    return None


#: Ready reasons under which the node proxies may not run at all (NoNodes is not one: the
#: DaemonSet counts its nodes whatever admission does with its pods).
_NODE_PROXY_WAITS = ("NodeProxyPending", "NodeProxyNotReady", "RollingOut")
POD_SECURITY = "PodSecurityForbidsHostPort"


def no_node_proxy_admitted(ds: Obj) -> bool:
    """Whether the DaemonSet reports no pod of its current template on any of its nodes.

    Pod Security admission refuses a pod at creation, so a refused DaemonSet never counts
    one (its ``FailedCreate`` Events are the only trace): not scheduled yet, or none of its
    nodes updated. A DaemonSet whose controller has not observed its generation yet still
    counts the old template's pods, which says nothing about admission of the new one.
    """
    ds_status = ds.get("status") or {}
    if "observedGeneration" not in ds_status:
        return True
    if int(ds_status["observedGeneration"]) < int(ds["metadata"].get("generation") or 0):
        return False
    return (int(ds_status.get("desiredNumberScheduled") or 0) > 0
            and int(ds_status.get("updatedNumberScheduled") or 0) == 0)


def compute_status(mirror: Obj, sts: Obj | None, ds: Obj | None, *,
                   problems: list[Problem], now: str, holds: int | None = None,
                   held_back: bool = False, pod_security: Problem | None = None) -> Obj:
    """The mirror's new status: ``problems`` found by the reconcile (empty: all good) and
    the workloads (None: not there, or not this mirror's). ``holds``: the port it holds
    (``status.hostPort``); ``held_back``: this generation was not applied (Ready=False with
    the holding reason, whatever the previous spec's objects do).

    ``pod_security``: the namespace's Pod Security label would refuse the node proxies'
    hostPort. The label alone is no problem (an exempted namespace, or an admission policy
    that lets the pods in, runs them fine), so it never makes the mirror Degraded: it only
    explains, in ``Ready``, node proxies that do not run (see :func:`no_node_proxy_admitted`).
    """
    old: Obj = mirror.get("status") or {}
    names = Names.of(mirror["metadata"]["name"])
    generation = mirror["metadata"].get("generation")
    conditions = [dict(c) for c in old.get("conditions") or []]
    if problems:
        conditions = set_condition(
            conditions, DEGRADED, True, problems[0].reason,
            "; ".join(p.message for p in problems), now, generation)
    else:
        conditions = set_condition(conditions, DEGRADED, False, "Reconciled",
                                   "all objects applied", now, generation)
    degraded = get_condition({"conditions": conditions}, DEGRADED)
    before = get_condition(old, READY) or {}
    # RollingOut is said only with a ready registry pod (the old template's): a new
    # template's pod that never gets ready is a registry that was ready, not one "not yet".
    was_ready = before.get("status") == "True" or before.get("reason") == "RollingOut" or (
        before.get("reason") == "RegistryNotReady"
        and "was ready before" in str(before.get("message")))
    ok, reason, message = ready_condition(names, sts, ds, degraded, was_ready)
    port = host_port(ds) if ds is not None else None
    if held_back and problems and sts is not None and ds is not None:
        serving = f" at localhost:{port}" if port else ""
        ok, reason, message = False, problems[0].reason, (
            f"generation {generation} is held back: {problems[0].message}; the objects of "
            f"the previous spec keep serving{serving} (their own readiness: {message})")
    if (not ok and pod_security is not None and ds is not None
            and reason in _NODE_PROXY_WAITS and no_node_proxy_admitted(ds)):
        reason, message = POD_SECURITY, f"no node proxy pod runs ({message}): " + \
            pod_security.message
    conditions = set_condition(conditions, READY, ok, reason, message, now, generation)
    return {
        "observedGeneration": generation,
        "hostPort": holds,
        "endpoint": f"localhost:{port}" if port else None,
        "serviceURL": build.service_url(mirror) if sts is not None else None,
        "conditions": conditions,
    }


def transition_notes(old: Obj, new: Obj) -> list[Note]:
    """A Warning Event when a problem appears or changes; a Normal one when it clears. A
    registry that was ready and has no ready pod any more (a crash, a rollout whose new pod
    never gets ready) is a Warning too, once: nothing in ``Degraded`` says it."""
    notes = _registry_lost(old, new)
    before = get_condition(old, DEGRADED) or {}
    after = get_condition(new, DEGRADED) or {}
    if after.get("status") == "True" and (
            before.get("status") != "True" or before.get("reason") != after.get("reason")
            or before.get("message") != after.get("message")):
        return [*notes, Note("Warning", str(after.get("reason")), str(after.get("message")))]
    if after.get("status") == "False" and before.get("status") == "True":
        return [*notes, Note("Normal", "Recovered", f"{before.get('reason')} resolved; all "
                                                    "objects applied")]
    return notes


def _registry_lost(old: Obj, new: Obj) -> list[Note]:
    before = get_condition(old, READY) or {}
    after = get_condition(new, READY) or {}
    lost = after.get("reason") == "RegistryNotReady" and "was ready" in str(after.get("message"))
    if lost and before.get("reason") != "RegistryNotReady":
        return [Note("Warning", "RegistryNotReady", str(after.get("message")))]
    return []
