"""Stand-ins for the workload controllers the embedded local API server does not run.

``localkube`` stores and validates objects but runs no kubelet, no StatefulSet controller and
no Job controller, so a StatefulSet never reports a ready pod and a Job never finishes. The
demo (to show a Database past its first step) and the tests (to walk a Database through its
life) play these controllers by writing only what the real ones would write: the claims a
StatefulSet's templates make and its status, a Job's verdict in its status. Nothing runs:
no pod, no PostgreSQL, no SQL. One home for both, as for the rates stand-in
(:mod:`demo.provider`).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from eventop.kube import Kube

Obj = dict[str, Any]


def stamp(moment: datetime | None = None) -> str:
    """A Kubernetes timestamp (``metav1.Time``: seconds, UTC)."""
    return (moment or datetime.now(UTC)).strftime("%Y-%m-%dT%H:%M:%SZ")


def rolled_out(sts: Obj | None) -> bool:
    """Every replica of the StatefulSet's current spec ready, as its controller reports."""
    if sts is None:
        return False
    want, status = sts["spec"].get("replicas", 1), sts.get("status") or {}
    return (status.get("observedGeneration", 0) >= sts["metadata"]["generation"]
            and status.get("readyReplicas", 0) == want
            and status.get("updatedReplicas", 0) == want
            and status.get("currentRevision") == status.get("updateRevision"))


def statefulset_controller(kube: Kube, put: Callable[[Obj], Obj], sts: Obj) -> list[str]:
    """What the StatefulSet controller and the kubelet together make of ``sts``: a claim per
    replica and claim template (labelled with the template's labels and the selector's), and
    every replica ready on the current revision. ``put`` stores a new object. Returns the
    names of the claims it made."""
    meta, spec = sts["metadata"], sts["spec"]
    name, namespace = meta["name"], meta["namespace"]
    replicas = spec.get("replicas", 1)
    made: list[str] = []
    for template in spec.get("volumeClaimTemplates") or []:
        for i in range(replicas):
            claim = f"{template['metadata']['name']}-{name}-{i}"
            if kube.get_or_none("v1", "PersistentVolumeClaim", claim, namespace) is None:
                put({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                     "metadata": {"name": claim, "namespace": namespace, "labels": {
                         **(template["metadata"].get("labels") or {}),
                         **spec["selector"]["matchLabels"]}},
                     "spec": template["spec"]})
                made.append(claim)
    revision = f"{name}-" + hashlib.sha256(json.dumps(
        spec["template"], sort_keys=True).encode()).hexdigest()[:10]
    kube.patch("apps/v1", "StatefulSet", name, namespace, {"status": {
        "observedGeneration": meta["generation"], "replicas": replicas,
        "readyReplicas": replicas, "currentReplicas": replicas, "updatedReplicas": replicas,
        "availableReplicas": replicas, "currentRevision": revision,
        "updateRevision": revision}}, subresource="status")
    return made


def job_verdict(ok: bool = True, now: datetime | None = None) -> Obj:
    """The status the Job controller gives a Job that completed (``ok``) or failed."""
    moment = now or datetime.now(UTC)
    started, finished = stamp(moment - timedelta(seconds=30)), stamp(moment)
    if ok:
        return {"startTime": started, "completionTime": finished, "succeeded": 1,
                "conditions": [{"type": "Complete", "status": "True",
                                "lastProbeTime": finished, "lastTransitionTime": finished}]}
    return {"startTime": started, "failed": 3, "conditions": [{
        "type": "Failed", "status": "True", "lastProbeTime": finished,
        "lastTransitionTime": finished, "reason": "BackoffLimitExceeded",
        "message": "Job has reached the specified backoff limit"}]}


def job_finished(kube: Kube, name: str, namespace: str, *, ok: bool = True) -> Obj:
    """The Job controller's verdict on Job ``name``, written to its status."""
    return kube.patch("batch/v1", "Job", name, namespace, {"status": job_verdict(ok)},
                      subresource="status")
