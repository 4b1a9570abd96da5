"""Playing the components a test API server lacks, for a Database's children.

The test cluster (``../shared/k8s``) runs the StatefulSet, Job, CronJob, PVC-protection and
garbage-collector controllers, but no kubelet, no scheduler and no snapshot controller; the
local API server runs none of the workload controllers. A test plays what is missing, and
writes only what those components would write:

* the kubelet: a server's pod is Running and Ready (its status). On the cluster the
  StatefulSet controller then counts it, rolls the next pod and makes the data claims; on
  the local API server the test plays that controller too (the claims made from the claim
  templates, the StatefulSet's status);
* the Job controller's verdict: a Job Complete or Failed (its status);
* the CronJob controller's run: a Job from the CronJob's template, owned by it (what
  ``kubectl create job --from=cronjob/...`` makes: the schedule is hours away);
* the snapshot controller: a VolumeSnapshot ``readyToUse``, or its error;
* a storage provisioner (the test cluster runs none; the local API server binds claims at
  once): a PersistentVolume for each data claim, which the cluster's own volume controller
  binds through its ``claimRef``. Labelled with the namespace, for the test to delete.
"""

from __future__ import annotations

from typing import Any

from demo.controllers import job_finished, rolled_out, stamp, statefulset_controller
from eventop.kube import Kube
from eventop.testing import Cluster

Obj = dict[str, Any]
SNAPSHOTS = "snapshot.storage.k8s.io/v1"
PLAYED_VOLUME = "eventop.dev/test-volume-for"  # label: the namespace a played volume serves


class Components:
    """The missing components of one test API server (``real``: the test cluster)."""

    def __init__(self, cluster: Cluster, *, real: bool, timeout: float = 60.0) -> None:
        self.cluster = cluster
        self.kube: Kube = cluster.kube
        self.real = real
        self.timeout = timeout

    def _status(self, api_version: str, kind: str, name: str, namespace: str,
                status: Obj) -> Obj:
        return self.kube.patch(api_version, kind, name, namespace, {"status": status},
                               subresource="status")

    # -- servers ---------------------------------------------------------------------------

    def servers_ready(self, name: str, namespace: str) -> None:
        """Every pod of StatefulSet ``name`` Ready, through rolling updates and scaling
        (to zero, too), until the StatefulSet reports them all ready on its current spec
        (or is gone)."""
        if not self.real:
            self._statefulset_controller(name, namespace)
            return

        def step() -> bool:
            sts = self.kube.get_or_none("apps/v1", "StatefulSet", name, namespace)
            if sts is None or rolled_out(sts):
                return True
            selector = ",".join(f"{k}={v}" for k, v in
                                sts["spec"]["selector"]["matchLabels"].items())
            for pod in self.kube.list("v1", "Pod", namespace, label_selector=selector):
                if not pod["metadata"].get("deletionTimestamp") and not _ready(pod):
                    self._pod_ready(pod)
            self._provision(name, namespace)
            return False
        self.cluster.wait_for(step, self.timeout, f"StatefulSet {name} ready")
        self._provision(name, namespace)

    def _provision(self, statefulset: str, namespace: str) -> None:
        """A volume for each data claim of the StatefulSet that has none (and no volume
        naming it already: a test may bring its own), bound by the volume controller."""
        claimed = {(ref.get("namespace"), ref.get("name")) for ref in (
            (pv.get("spec") or {}).get("claimRef") or {}
            for pv in self.kube.list("v1", "PersistentVolume"))}
        for claim in self.kube.list("v1", "PersistentVolumeClaim", namespace):
            meta, spec = claim["metadata"], claim.get("spec") or {}
            if not meta["name"].startswith(f"data-{statefulset}-") or spec.get("volumeName") \
                    or meta.get("deletionTimestamp") or (namespace, meta["name"]) in claimed:
                continue
            self.cluster.put({
                "apiVersion": "v1", "kind": "PersistentVolume",
                "metadata": {"name": f"pv-{meta['uid']}", "labels": {PLAYED_VOLUME: namespace}},
                "spec": {"capacity": dict((spec.get("resources") or {}).get("requests") or {}),
                         "accessModes": list(spec.get("accessModes") or ["ReadWriteOnce"]),
                         "storageClassName": spec.get("storageClassName") or "",
                         "persistentVolumeReclaimPolicy": "Retain",
                         "csi": {"driver": "disk.csi.example.com", "volumeHandle": meta["uid"]},
                         "claimRef": {"namespace": namespace, "name": meta["name"]}}})

    def volumes_bound(self, namespace: str) -> None:
        """Every data claim in ``namespace`` Bound (on the local API server they are)."""
        self.cluster.wait_for(lambda: all(
            (c.get("status") or {}).get("phase") == "Bound"
            for c in self.kube.list("v1", "PersistentVolumeClaim", namespace)
            if c["metadata"]["name"].startswith("data-")), self.timeout, "data claims bound")

    def _pod_ready(self, pod: Obj) -> None:
        now = stamp()
        meta = pod["metadata"]
        self._status("v1", "Pod", meta["name"], meta["namespace"], {
            "phase": "Running", "startTime": now,
            "conditions": [{"type": t, "status": "True", "lastTransitionTime": now}
                           for t in ("Initialized", "Ready", "ContainersReady",
                                     "PodScheduled")]})

    def _statefulset_controller(self, name: str, namespace: str) -> None:
        sts = self.kube.get_or_none("apps/v1", "StatefulSet", name, namespace)
        if sts is not None:
            statefulset_controller(self.kube, self.cluster.put, sts)

    # -- Jobs --------------------------------------------------------------------------------

    def job_finished(self, name: str, namespace: str, *, ok: bool = True) -> Obj:
        """The Job controller's verdict on Job ``name`` (waited for: its CronJob or the
        router makes it)."""
        self.cluster.wait_for(lambda: self.cluster.get("batch/v1/Job", name, namespace),
                              self.timeout, f"Job {name}")
        return job_finished(self.kube, name, namespace, ok=ok)

    def cronjob_runs(self, cronjob: str, namespace: str, job: str) -> Obj:
        """A Job from the CronJob's template, owned by it (``kubectl create job --from``)."""
        cj = self.cluster.wait_for(
            lambda: self.cluster.get("batch/v1/CronJob", cronjob, namespace), self.timeout,
            f"CronJob {cronjob}")
        template = cj["spec"]["jobTemplate"]
        return self.cluster.put({
            "apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": job, "namespace": namespace,
                         "labels": template["metadata"].get("labels") or {},
                         "annotations": {"cronjob.kubernetes.io/instantiate": "manual"},
                         "ownerReferences": [{
                             "apiVersion": "batch/v1", "kind": "CronJob", "name": cronjob,
                             "uid": cj["metadata"]["uid"], "controller": True}]},
            "spec": template["spec"]})

    # -- snapshots ---------------------------------------------------------------------------

    def snapshot_ready(self, name: str, namespace: str, *, error: str | None = None) -> Obj:
        """The snapshot controller's report on VolumeSnapshot ``name``."""
        self.cluster.wait_for(
            lambda: self.cluster.get(SNAPSHOTS, "VolumeSnapshot", name, namespace),
            self.timeout, f"VolumeSnapshot {name}")
        if error:
            status: Obj = {"readyToUse": False, "error": {"message": error, "time": stamp()}}
        else:
            status = {"readyToUse": True, "creationTime": stamp()}
        return self._status(SNAPSHOTS, "VolumeSnapshot", name, namespace, status)


def _ready(pod: Obj) -> bool:
    status = pod.get("status") or {}
    return status.get("phase") == "Running" and any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in status.get("conditions") or [])
