"""A RegistryMirror's status and Events, as pure functions of what the reconcile found.

Two conditions, as operators conventionally report a workload they run:

* ``Degraded``: True while something keeps the mirror from being what its spec asks for
  (a hostPort taken, a Secret missing, a refused resize, an invalid spec...), with the
  first problem's reason; False (``Reconciled``) once every object is applied;
* ``Ready``: whether a pull from ``localhost:<hostPort>`` works on every node, from the
  StatefulSet's and DaemonSet's own status (written by their controllers).

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
                    degraded: Obj | None) -> tuple[bool, str, str]:
    """(status, reason, message) of ``Ready`` from the workloads' own status.

    Ready means a pull from ``localhost:<hostPort>`` works on every node: the registry has
    a ready replica and the node proxy is ready on every node it is scheduled to. A
    DaemonSet scheduled nowhere (no schedulable node, or its status not computed yet)
    serves nothing, so that is not Ready either.
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
    sts_status = sts.get("status") or {}
    ready_replicas = int(sts_status.get("readyReplicas") or 0)
    if ready_replicas < 1:
        return False, "RegistryNotReady", \
            f"StatefulSet {names.statefulset} has no ready registry pod yet"
    ds_status = ds.get("status") or {}
    port = host_port(ds)
    if "observedGeneration" not in ds_status:
        return False, "NodeProxyPending", \
            f"DaemonSet {names.daemonset} has not been scheduled by its controller yet"
    desired = int(ds_status.get("desiredNumberScheduled") or 0)
    ready = int(ds_status.get("numberReady") or 0)
    if desired == 0:
        return False, "NoNodes", (f"DaemonSet {names.daemonset} runs on no node, so "
                                  f"localhost:{port} is served nowhere")
    if ready < desired:
        return False, "NodeProxyNotReady", \
            f"node proxy ready on {ready} of {desired} nodes"
    return True, "Available", \
        f"registry ready; served at localhost:{port} on {desired} node(s)"


def host_port(ds: Obj) -> int | None:
    """The hostPort a node-proxy DaemonSet serves (what the mirror's endpoint is)."""
    for container in ds.get("spec", {}).get("template", {}).get("spec", {}).get(
            "containers") or []:
        for port in container.get("ports") or []:
            if port.get("hostPort"):
                return int(port["hostPort"])
    return None


def compute_status(mirror: Obj, sts: Obj | None, ds: Obj | None, *,
                   problems: list[Problem], now: str) -> Obj:
    """The mirror's new status: ``problems`` found by the reconcile (empty: all good) and
    the workloads (None: not there, or not this mirror's)."""
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
    ok, reason, message = ready_condition(names, sts, ds, degraded)
    conditions = set_condition(conditions, READY, ok, reason, message, now, generation)
    port = host_port(ds) if ds is not None else None
    return {
        "observedGeneration": generation,
        "endpoint": f"localhost:{port}" if port else None,
        "serviceURL": build.service_url(mirror) if sts is not None else None,
        "conditions": conditions,
    }


def transition_notes(old: Obj, new: Obj) -> list[Note]:
    """A Warning Event when a problem appears or changes; a Normal one when it clears."""
    before = get_condition(old, DEGRADED) or {}
    after = get_condition(new, DEGRADED) or {}
    if after.get("status") == "True" and (
            before.get("status") != "True" or before.get("reason") != after.get("reason")
            or before.get("message") != after.get("message")):
        return [Note("Warning", str(after.get("reason")), str(after.get("message")))]
    if after.get("status") == "False" and before.get("status") == "True":
        return [Note("Normal", "Recovered", f"{before.get('reason')} resolved; all objects "
                                            "applied")]
    return []
