"""The Database scenarios of the router's RBAC derivation (``scenarios.py``): what a
Database's life makes the router ask the API server."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from eventop.testing import wait_until
from tests.install.rbac import KubeRecorder

if TYPE_CHECKING:
    from tests.install.scenarios import RouterScenarios


class DatabaseScenarios:
    """A Database's life through the router (the scenarios' events posted by hand): created,
    its server ready (the StatefulSet controller played: claims, status), initialized, a
    scheduled backup, a minor and a major upgrade, deleted under each policy with the
    snapshot API served, a Retain'd Database's Secret adopted by the next, a Secret another
    router process made between our read and our create. What this reaches is what the
    router needs for Databases (its verbs on their Jobs, CronJobs, claims, snapshots,
    finalizers and status)."""

    def __init__(self, scenarios: RouterScenarios, recorder: KubeRecorder) -> None:
        self.s = scenarios
        self.local_kube = scenarios.local_kube
        self.recorder = recorder
        self.ns = "rbac-db"

    def get(self, api_version: str, kind: str, name: str) -> dict:
        found = self.local_kube.get(api_version, kind, name, self.ns)
        assert found is not None, f"the router made no {kind} {name}"
        return dict(found)

    def status(self, api_version: str, kind: str, name: str, status: dict) -> dict:
        """Write what a controller would (a Job's verdict, a StatefulSet's pods)."""
        obj = self.get(api_version, kind, name)
        obj["status"] = status
        return self.s.put(obj)

    def servers(self, name: str) -> None:
        """The StatefulSet controller: claims from the template, every replica ready (or
        none left, once scaled to zero)."""
        sts = self.get("apps/v1", "StatefulSet", name)
        spec = sts["spec"]
        for i in range(spec["replicas"]):
            template = spec["volumeClaimTemplates"][0]
            claim = f"{template['metadata']['name']}-{name}-{i}"
            if self.local_kube.get("v1", "PersistentVolumeClaim", claim, self.ns) is None:
                self.s.put({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                            "metadata": {"name": claim, "namespace": self.ns, "labels": {
                                **template["metadata"]["labels"],
                                **spec["selector"]["matchLabels"]}},
                            "spec": template["spec"]}, change="add")
        n = spec["replicas"]
        self.status("apps/v1", "StatefulSet", name, {
            "observedGeneration": sts["metadata"]["generation"], "replicas": n,
            "readyReplicas": n, "updatedReplicas": n, "currentRevision": f"{name}-r",
            "updateRevision": f"{name}-r"})

    def job_done(self, name: str) -> None:
        self.status("batch/v1", "Job", name, {
            "startTime": "2026-11-20T10:00:00Z", "completionTime": "2026-11-20T10:01:00Z",
            "succeeded": 1, "conditions": [{"type": "Complete", "status": "True",
                                            "lastTransitionTime": "2026-11-20T10:01:00Z"}]})

    def job_named(self, prefix: str) -> str:
        (name,) = [j["metadata"]["name"] for j in self.local_kube.list("batch/v1", "Job",
                                                                         self.ns)
                   if j["metadata"]["name"].startswith(prefix)]
        return str(name)

    def delete(self, name: str) -> None:
        """The user deletes it: the finalizer holds it (an update event)."""
        db = self.get("eventop.dev/v1", "Database", name)
        self.local_kube.remove("eventop.dev/v1", "Database", name, self.ns)
        held = self.local_kube.get("eventop.dev/v1", "Database", name, self.ns)
        self.s.post("update", held or db)

    def database(self, name: str, **spec: Any) -> dict:
        return self.s.put({"apiVersion": "eventop.dev/v1", "kind": "Database",
                           "metadata": {"name": name, "namespace": self.ns},
                           "spec": {"engine": "postgres", "storage": {"size": "1Gi"}, **spec}},
                          change="add")

    def run(self) -> None:
        self.s.put({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": self.ns}},
                   change="add")
        self.life()
        self.policies()
        self.secret_made_by_another_router()
        self.namespace_deleted()

    def life(self) -> None:
        self.database("orders", version="16.10")
        self.servers("orders-pg16")
        self.job_done("orders-init")
        cron = self.get("batch/v1", "CronJob", "orders-backup")
        template = cron["spec"]["jobTemplate"]
        self.s.put({"apiVersion": "batch/v1", "kind": "Job", "metadata": {
            "name": "orders-backup-1", "namespace": self.ns,
            "labels": template["metadata"]["labels"], "ownerReferences": [{
                "apiVersion": "batch/v1", "kind": "CronJob", "name": "orders-backup",
                "uid": cron["metadata"]["uid"], "controller": True}]},
            "spec": template["spec"]}, change="add")
        self.job_done("orders-backup-1")
        for version, sts in (("16.11", "orders-pg16"), ("17", "orders-pg17")):
            db = self.get("eventop.dev/v1", "Database", "orders")
            db["spec"]["version"] = version
            self.s.put(db)
            self.job_done(self.job_named(f"orders-backup-{version.replace('.', '-')}"))
            self.servers(sts)
        self.job_done("orders-upgrade-pg17")
        assert self.get("eventop.dev/v1", "Database", "orders")["status"]["version"] == "17.7"
        self.delete("orders")
        self.scaled_down("orders-pg17")
        for snapshot in self.local_kube.list("snapshot.storage.k8s.io/v1", "VolumeSnapshot",
                                             self.ns):
            self.status("snapshot.storage.k8s.io/v1", "VolumeSnapshot",
                        snapshot["metadata"]["name"], {"readyToUse": True})
        assert self.local_kube.get("eventop.dev/v1", "Database", "orders", self.ns) is None

    def scaled_down(self, name: str) -> None:
        assert self.get("apps/v1", "StatefulSet", name)["spec"]["replicas"] == 0
        self.servers(name)

    def policies(self) -> None:
        for name, policy in (("keep", "Retain"), ("scratch", "Delete")):
            self.database(name, version="16", deletionPolicy=policy)
            self.servers(f"{name}-pg16")
            self.delete(name)
        self.scaled_down("scratch-pg16")
        assert self.local_kube.get("v1", "Secret", "scratch-credentials", self.ns) is None
        self.database("keep", version="16", deletionPolicy="Retain")  # adopts the Secret
        secret = self.get("v1", "Secret", "keep-credentials")
        assert secret["metadata"]["labels"]["eventop.dev/parent-uid"] == self.get(
            "eventop.dev/v1", "Database", "keep")["metadata"]["uid"]

    def secret_made_by_another_router(self) -> None:
        """Between this router's read and its create, another router process made the
        Secret: the create's 409 is answered by a read, and the Secret is left as it is."""
        theirs: dict[str, Any] = {}

        def another_router_first(call: Any) -> None:
            if call.method == "POST" and call.path.endswith(f"/namespaces/{self.ns}/secrets"):
                self.recorder.interceptors.remove(another_router_first)
                body = json.loads(json.dumps(call.body))
                body["data"] = {**body["data"], "password": "dGhlaXJz"}
                theirs.update(self.local_kube.put(body))

        self.recorder.interceptors.append(another_router_first)
        self.database("race", version="16")
        assert theirs, "the router made no Secret"
        assert self.get("v1", "Secret", "race-credentials")["data"]["password"] == "dGhlaXJz"

    def namespace_deleted(self) -> None:
        """Its namespace deleted, content and all: the data volume's PersistentVolume is
        set to Retain (a patch of an object the router did not make) before it goes."""
        ns, self.ns = self.ns, "rbac-db-gone"
        try:
            self.s.put({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": self.ns}},
                       change="add")
            self.local_kube.put({
                "apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": "pv-vault"},
                "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
                         "persistentVolumeReclaimPolicy": "Delete",
                         "csi": {"driver": "disk.csi.example.com", "volumeHandle": "vault"},
                         "claimRef": {"namespace": self.ns, "name": "data-vault-pg16-0"}}})
            self.database("vault", version="16")
            self.servers("vault-pg16")
            claim = self.get("v1", "PersistentVolumeClaim", "data-vault-pg16-0")
            claim["spec"]["volumeName"] = "pv-vault"  # bound, as the volume binder would
            claim["status"] = {"phase": "Bound"}
            self.s.put(claim)
            self.local_kube.remove("v1", "Namespace", self.ns)
            held = self.local_kube.get("eventop.dev/v1", "Database", "vault", self.ns)
            assert held is not None, "the finalizer did not hold the Database"
            self.s.post("update", held)

            def retained_and_gone() -> bool:  # (the run after the patch lets it go)
                pv = self.local_kube.get("v1", "PersistentVolume", "pv-vault", None)
                return (pv["spec"]["persistentVolumeReclaimPolicy"] == "Retain" and
                        self.local_kube.get("eventop.dev/v1", "Database", "vault", self.ns)
                        is None)
            assert wait_until(retained_and_gone, 30), (
                "the volume was not kept, or the Database not let go",
                self.local_kube.get("v1", "PersistentVolume", "pv-vault", None),
                self.local_kube.get("eventop.dev/v1", "Database", "vault", self.ns))
        finally:
            self.ns = ns
