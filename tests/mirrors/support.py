"""Helpers shared by the RegistryMirror tests."""

from __future__ import annotations

from typing import Any

Obj = dict[str, Any]


def container(workload: Obj) -> Obj:
    """The one container of a StatefulSet's or DaemonSet's pod template."""
    (c,) = workload["spec"]["template"]["spec"]["containers"]
    return c


def env_of(workload: Obj) -> dict[str, Obj]:
    """The container's environment, by variable name."""
    return {e["name"]: e for e in container(workload)["env"]}


def rolled_out_statefulset_status(sts: Obj, ready: int = 1) -> Obj:
    """The status the StatefulSet controller writes once its current template runs (one
    replica, ``ready`` of it Ready): counts for its generation, one revision."""
    return {"observedGeneration": sts["metadata"].get("generation", 1), "replicas": 1,
            "readyReplicas": ready, "availableReplicas": ready, "currentReplicas": 1,
            "updatedReplicas": 1, "currentRevision": "mirror-rev-1",
            "updateRevision": "mirror-rev-1"}


def rolled_out_daemonset_status(ds: Obj, nodes: int, ready: int | None = None) -> Obj:
    """The status the DaemonSet controller writes once its current template runs on
    ``nodes`` nodes, ``ready`` (default all) of them Ready and available."""
    ready = nodes if ready is None else ready
    return {"observedGeneration": ds["metadata"].get("generation", 1),
            "desiredNumberScheduled": nodes, "currentNumberScheduled": nodes,
            "updatedNumberScheduled": nodes, "numberReady": ready, "numberAvailable": ready,
            "numberMisscheduled": 0}
