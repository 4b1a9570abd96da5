"""A Database's life through the real pipeline, written once for both API servers.

The test changes the cluster as a user would (create, scale, upgrade, delete a Database)
and plays the components the test API server lacks (:mod:`tests.databases.play`); the
watcher sees every change and the router's Database handler does the rest. Each step waits
(polling, never sleeping) for what must follow and asserts it: the objects eventop writes,
the Database's status, its Events, and what outlives it. The default suite runs these on
the local API server; the cluster suite on the real one (its garbage collector, StatefulSet
and Job controllers, admission, Pod Security).
"""

from __future__ import annotations

import base64
from collections.abc import Callable
from typing import Any

from eventop.engine import PARENT_UID_LABEL
from eventop.handlers.databases.spec import PINNED_MINOR, Names, Version
from eventop.testing import Cluster
from tests.databases.play import SNAPSHOTS, Components

Obj = dict[str, Any]
DB = "eventop.dev/v1/Database"
OWNED = (("v1/Service", "{n}"), ("v1/Service", "{n}-hl"), ("v1/ConfigMap", "{n}-config"),
         ("batch/v1/CronJob", "{n}-backup"), ("batch/v1/Job", "{n}-init"))


class Life:
    """One Database in one namespace, and the verbs of its life."""

    def __init__(self, cluster: Cluster, play: Components, namespace: str, name: str,
                 timeout: float = 60.0) -> None:
        self.cluster, self.play = cluster, play
        self.namespace, self.name = namespace, name
        self.names = Names.of(name)
        self.timeout = timeout
        self.spec: Obj = {}
        self.uid = ""

    # -- the user's side -----------------------------------------------------------------

    def create(self, **spec: Any) -> Obj:
        self.spec = {"engine": "postgres", "storage": {"size": "1Gi"}, **spec}
        db = self.cluster.put({"apiVersion": "eventop.dev/v1", "kind": "Database",
                               "metadata": {"name": self.name, "namespace": self.namespace},
                               "spec": self.spec})
        self.uid = db["metadata"]["uid"]
        return db

    def edit(self, **spec: Any) -> Obj:
        """Change the spec as ``kubectl patch`` does (the status is the router's)."""
        self.spec = {**self.spec, **spec}
        return self.cluster.kube.patch("eventop.dev/v1", "Database", self.name,
                                       self.namespace, {"spec": spec})

    def delete(self) -> None:
        """Ask for the deletion (the finalizer holds the Database until its data is kept)."""
        self.cluster.kube.delete("eventop.dev/v1", "Database", self.name, self.namespace)

    # -- reading -----------------------------------------------------------------------------

    def get(self, kind: str, name: str) -> Obj | None:
        return self.cluster.get(kind, name, self.namespace)

    def wait(self, what: str, check: Callable[[], Any]) -> Any:
        return self.cluster.wait_for(check, self.timeout, f"{self.name}: {what}")

    def object(self, kind: str, name: str) -> Obj:
        found: Obj = self.wait(f"{kind} {name}", lambda: self.get(kind, name))
        return found

    def gone(self, kind: str, name: str) -> None:
        self.wait(f"{kind} {name} gone", lambda: self.get(kind, name) is None)

    def status(self, what: str, check: Callable[[Obj], Any]) -> Obj:
        """Wait until the Database's status passes ``check``; the last status if not."""
        seen: list[Obj] = []

        def look() -> Any:
            db = self.get(DB, self.name) or {}
            seen[:] = [db.get("status") or {}]
            try:
                return db if check(db.get("status") or {}) else None
            except (KeyError, TypeError, StopIteration):
                return None
        try:
            found: Obj = self.wait(what, look)
        except TimeoutError as exc:
            raise AssertionError(f"{exc}; the status was {seen[-1] if seen else None}") \
                from None
        return found

    def events(self, reason: str) -> list[Obj]:
        return [e for e in self.cluster.list("v1/Event", self.namespace)
                if e["involvedObject"].get("name") == self.name
                and e["involvedObject"].get("kind") == "Database" and e["reason"] == reason]

    def image(self, kind: str, name: str) -> str:
        obj = self.object(kind, name)
        spec = obj["spec"]["jobTemplate"]["spec"] if kind.endswith("CronJob") else obj["spec"]
        return str(spec["template"]["spec"]["containers"][0]["image"])

    def password(self) -> str:
        secret = self.object("v1/Secret", self.names.secret)
        return base64.b64decode(secret["data"]["password"]).decode()


def condition(status: Obj, type_: str) -> Obj:
    return next(c for c in status.get("conditions") or [] if c["type"] == type_)


def pinned(major: int) -> str:
    return f"{major}.{PINNED_MINOR[major]}"


# -- the steps of a life -------------------------------------------------------------------

def serve(life: Life, **spec: Any) -> None:
    """Created, its server ready, initialized once, its backups scheduled: Ready."""
    life.create(**spec)
    major = Version.parse(str(spec["version"])).major
    sts = life.names.statefulset(major)
    for kind, name in (("v1/Secret", life.names.secret), ("v1/ConfigMap", f"{life.name}-config"),
                       ("v1/Service", life.name), ("v1/Service", life.names.headless),
                       ("v1/PersistentVolumeClaim", life.names.backup_pvc),
                       ("apps/v1/StatefulSet", sts)):
        life.object(kind, name)
    life.status("Creating, waiting for its server",
                lambda s: s["phase"] == "Creating" and condition(s, "Ready")["status"] == "False")
    assert life.get("batch/v1/Job", life.names.init_job) is None, "init ran before the server"
    life.play.servers_ready(sts, life.namespace)
    life.play.job_finished(life.names.init_job, life.namespace)
    life.status("Ready and initialized", lambda s: s["phase"] == "Ready"
                and condition(s, "Initialized")["status"] == "True"
                and s["readyReplicas"] == spec.get("replicas", 1))
    assert life.image("batch/v1/CronJob", life.names.backup_cronjob) == \
        life.image("apps/v1/StatefulSet", sts), "backups must run the server's own image"


def backups(life: Life) -> None:
    """Scheduled backups: a success, then a failure (BackupHealthy False, a Warning Event),
    then a success again; the history in the status comes from the Jobs."""
    cron, ns = life.names.backup_cronjob, life.namespace
    life.play.cronjob_runs(cron, ns, f"{life.name}-backup-1")
    life.play.job_finished(f"{life.name}-backup-1", ns)
    life.status("a successful backup", lambda s: s["lastBackup"]["result"] == "Succeeded"
                and s["lastBackup"]["job"] == f"{life.name}-backup-1"
                and condition(s, "BackupHealthy")["status"] == "True")
    life.play.cronjob_runs(cron, ns, f"{life.name}-backup-2")
    life.play.job_finished(f"{life.name}-backup-2", ns, ok=False)
    failed = life.status("a failed backup", lambda s: s["lastBackup"]["result"] == "Failed"
                         and condition(s, "BackupHealthy")["reason"] == "BackupFailed")
    assert condition(failed["status"], "BackupHealthy")["status"] == "False"
    succeeded = life.object("batch/v1/Job", f"{life.name}-backup-1")["status"]
    assert failed["status"]["lastSuccessfulBackup"] == succeeded["completionTime"]
    life.wait("a Warning Event about the failed backup",
              lambda: [e for e in life.events("BackupFailed") if e["type"] == "Warning"])
    life.play.cronjob_runs(cron, ns, f"{life.name}-backup-3")
    life.play.job_finished(f"{life.name}-backup-3", ns)
    life.status("healthy again", lambda s: condition(s, "BackupHealthy")["status"] == "True"
                and s["lastBackup"]["job"] == f"{life.name}-backup-3")


def scale(life: Life, replicas: int) -> None:
    major = Version.parse(str(life.spec["version"])).major
    sts = life.names.statefulset(major)
    life.edit(replicas=replicas)
    life.wait(f"{sts} scaled to {replicas}", lambda: (life.get("apps/v1/StatefulSet", sts)
                                                      or {}).get("spec", {}).get("replicas")
              == replicas)
    life.play.servers_ready(sts, life.namespace)
    life.status(f"{replicas} servers ready", lambda s: s["readyReplicas"] == replicas
                and s["phase"] == "Ready")


def minor_upgrade(life: Life, version: str) -> None:
    """A backup Job on the running image first; then the servers roll; then the backups
    follow the new image."""
    target = Version.parse(version)
    sts = life.names.statefulset(target.major)
    before = life.image("apps/v1/StatefulSet", sts)
    life.edit(version=version)
    backup = life.names.pre_upgrade_job(target, f"docker.io/library/postgres:{version}")
    assert life.image("batch/v1/Job", backup) == before, "the backup runs the old server's image"
    life.status("backing up before the upgrade",
                lambda s: condition(s, "Progressing")["reason"] == "BackingUp")
    assert life.image("apps/v1/StatefulSet", sts) == before, "rolled before the backup"
    life.play.job_finished(backup, life.namespace)
    life.wait("the servers on the new image",
              lambda: life.image("apps/v1/StatefulSet", sts).endswith(f":{version}"))
    life.play.servers_ready(sts, life.namespace)
    life.status(f"running {version}", lambda s: s["version"] == version
                and condition(s, "Progressing")["reason"] == "Stable")
    assert life.image("batch/v1/CronJob", life.names.backup_cronjob).endswith(f":{version}")


def major_upgrade(life: Life, major: int) -> None:
    """Backup, a new major's server beside the old one, the copy Job, then the switch."""
    old = Version.parse(str(life.spec["version"])).major
    version = pinned(major)
    life.edit(version=str(major))
    backup = life.names.pre_upgrade_job(Version.parse(version),
                                        f"docker.io/library/postgres:{version}")
    life.play.job_finished(backup, life.namespace)
    new_sts = life.names.statefulset(major)
    life.object("apps/v1/StatefulSet", new_sts)
    life.play.servers_ready(new_sts, life.namespace)
    copy_job = life.names.upgrade_job(major)
    assert life.image("batch/v1/Job", copy_job).endswith(f":{version}")
    service = life.object("v1/Service", life.name)
    assert service["spec"]["selector"]["statefulset.kubernetes.io/pod-name"] == \
        life.names.primary(old), "switched before the copy"
    life.play.job_finished(copy_job, life.namespace)
    life.status(f"running {version}", lambda s: s["version"] == version)
    life.gone("apps/v1/StatefulSet", life.names.statefulset(old))
    life.wait("the client Service on the new primary", lambda: life.object(
        "v1/Service", life.name)["spec"]["selector"]["statefulset.kubernetes.io/pod-name"]
        == life.names.primary(major))
    assert life.image("batch/v1/CronJob", life.names.backup_cronjob).endswith(f":{version}")


def service_port_edited_by_hand(life: Life) -> None:
    """A client Service port changed by hand (``kubectl patch --type=json``) is put back,
    its clusterIP kept. Server-side apply merges a Service's ports by port number: the
    desired 5432 was added beside the hand-edited 1234 under the same name and refused as a
    duplicate, and the Database stayed Ready=False WriteRefused until the Service was
    deleted (found on a real v1.24 API server; the local one replaces lists whole)."""
    before = life.object("v1/Service", life.name)
    kube = life.cluster.kube
    kube.request("PATCH", kube.resource("v1", "Service").path(life.namespace, life.name),
                 verb="patch", body=[{"op": "replace", "path": "/spec/ports/0/port",
                                      "value": 1234}],
                 content_type="application/json-patch+json",
                 query=[("fieldManager", "kubectl-patch")])
    life.wait("the port put back", lambda: [
        (p["name"], p["port"]) for p in life.object("v1/Service", life.name)["spec"]["ports"]]
        == [("postgres", 5432)])
    assert life.object("v1/Service", life.name)["spec"]["clusterIP"] == \
        before["spec"]["clusterIP"]
    life.status("Ready again", lambda s: condition(s, "Ready")["status"] == "True")
    assert not [e for e in life.cluster.list("v1/Event", life.namespace)
                if e["reason"] == "WriteRefused"]


def data_volumes(life: Life) -> list[str]:
    return sorted(p["metadata"]["name"] for p in life.cluster.list(
        "v1/PersistentVolumeClaim", life.namespace)
        if p["metadata"]["name"].startswith(f"data-{life.names.base}-pg"))


def owned_gone(life: Life) -> None:
    """The garbage collector took what the Database owned."""
    for kind, pattern in OWNED:
        life.gone(kind, pattern.format(n=life.name))


def kept(life: Life) -> None:
    """What outlives every Database: its backups (and, unless Delete, its Secret)."""
    life.object("v1/PersistentVolumeClaim", life.names.backup_pvc)


def servers(life: Life) -> list[str]:
    return sorted(s["metadata"]["name"] for s in life.cluster.list("apps/v1/StatefulSet",
                                                                    life.namespace)
                  if s["metadata"]["name"].startswith(f"{life.names.base}-pg"))


def servers_stop(life: Life, names: list[str]) -> None:
    """The router scales every server to zero; its pods stop (played); then it deletes the
    StatefulSets. Nothing is snapshotted or deleted before."""
    volumes = data_volumes(life)
    for name in names:
        life.wait(f"{name} scaled to zero", lambda name=name: (
            life.get("apps/v1/StatefulSet", name) or {"spec": {"replicas": 0}})["spec"][
            "replicas"] == 0)
    if not life.play.real:
        # Here the test stops the pods (on a cluster its controller does, at once, as the
        # pods never ran): until it has, nothing may be snapshotted or deleted.
        if not life.cluster.kube.missing_kinds([(SNAPSHOTS, "VolumeSnapshot")]):
            assert not life.cluster.list(f"{SNAPSHOTS}/VolumeSnapshot", life.namespace), \
                "snapshots of running servers"
        assert data_volumes(life) == volumes, "data deleted while the servers ran"
    for name in names:
        life.play.servers_ready(name, life.namespace)
        life.gone("apps/v1/StatefulSet", name)


def replaced(life: Life, kind: str, old: Obj) -> Obj:
    """Wait until the router made ``old`` (deleted by the user to retry) again."""
    name, uid = old["metadata"]["name"], old["metadata"]["uid"]
    found: Obj = life.wait(f"{kind} {name} made again", lambda: (
        life.get(kind, name) or {"metadata": {"uid": uid}})["metadata"]["uid"] != uid
        and life.get(kind, name))
    return found


def delete_with_snapshots(life: Life) -> list[str]:
    """Servers stopped, a VolumeSnapshot of every data volume (every major's) awaited, one
    failing first (reported; the Database stays until it is retaken), then the volumes
    deleted and the Database gone; the snapshots, Secret and backups stay."""
    volumes = data_volumes(life)
    assert volumes, "no data volumes to snapshot"
    life.play.volumes_bound(life.namespace)  # a claim never bound holds nothing to snapshot
    password = life.password()
    running = servers(life)
    life.delete()
    servers_stop(life, running)
    snapshots = [life.names.snapshot(v, life.uid) for v in volumes]
    first = life.play.snapshot_ready(snapshots[0], life.namespace,
                                     error="the CSI driver failed")
    failed = life.status("a failed snapshot reported", lambda s: condition(
        s, "Deleting")["reason"] == "SnapshotFailed")
    assert snapshots[0] in condition(failed["status"], "Deleting")["message"]
    assert life.get(DB, life.name) is not None, "deleted without its data"
    life.cluster.kube.delete(SNAPSHOTS, "VolumeSnapshot", snapshots[0], life.namespace)
    replaced(life, f"{SNAPSHOTS}/VolumeSnapshot", first)
    for snapshot in snapshots:
        life.play.snapshot_ready(snapshot, life.namespace)
    life.gone(DB, life.name)
    for volume in volumes:
        life.gone("v1/PersistentVolumeClaim", volume)
    owned_gone(life)
    kept(life)
    for snapshot in snapshots:
        assert life.get(f"{SNAPSHOTS}/VolumeSnapshot", snapshot), snapshot
    assert life.password() == password
    # where the data went, in the Database's Events (it is gone, they stay)
    said = life.wait("a Snapshotted Event", lambda: life.events("Snapshotted"))
    assert all(name in said[0]["message"] for name in snapshots + volumes), said[0]["message"]
    return snapshots


def delete_with_a_final_backup(life: Life) -> None:
    """Without the snapshot API: a final backup Job while the server runs; it fails first
    (reported, the Database stays), the user deletes it, the retry succeeds; then the
    volumes go and the backup volume stays."""
    volumes = data_volumes(life)
    assert volumes
    life.delete()
    final = life.names.final_backup_job
    life.play.job_finished(final, life.namespace, ok=False)
    life.status("the failed final backup reported", lambda s: condition(
        s, "Deleting")["reason"] == "FinalBackupFailed")
    life.wait("a Warning Event about it", lambda: [
        e for e in life.events("FinalBackupFailed") if e["type"] == "Warning"])
    assert life.get(DB, life.name) is not None, "deleted without its data"
    assert data_volumes(life) == volumes
    failed = life.object("batch/v1/Job", final)
    life.cluster.kube.delete("batch/v1", "Job", final, life.namespace)
    replaced(life, "batch/v1/Job", failed)
    running = servers(life)
    life.play.job_finished(final, life.namespace)
    servers_stop(life, running)
    life.gone(DB, life.name)
    for volume in volumes:
        life.gone("v1/PersistentVolumeClaim", volume)
    owned_gone(life)
    kept(life)
    life.object("v1/Secret", life.names.secret)


def delete_retained_then_adopted(life: Life) -> None:
    """Retain: the data volumes and the Secret stay; a Database created again under the
    name takes both over, passwords included."""
    volumes = data_volumes(life)
    assert volumes
    password = life.password()
    life.delete()
    life.gone(DB, life.name)
    owned_gone(life)
    kept(life)
    assert data_volumes(life) == volumes
    life.create(**life.spec)
    life.wait("the kept Secret adopted", lambda: (life.get("v1/Secret", life.names.secret)
                                                  or {}).get("metadata", {}).get("labels", {})
              .get("eventop.dev/parent-uid") == life.uid)
    assert life.password() == password
    life.object("apps/v1/StatefulSet", life.names.statefulset(
        Version.parse(str(life.spec["version"])).major))
    # The kept data volumes are its own now (labelled with its uid), so its own deletion
    # applies its policy to them: a claim an earlier Database made was reported deleted,
    # not deleted, and its volume given back a Delete policy (a user's trial).
    life.wait("the kept data volumes adopted", lambda: all(
        (life.get("v1/PersistentVolumeClaim", v) or {}).get("metadata", {}).get(
            "labels", {}).get(PARENT_UID_LABEL) == life.uid for v in volumes))


def delete_deleting_the_data(life: Life) -> None:
    """Delete: the servers stopped, the data volumes and the Secret deleted, backups kept."""
    volumes = data_volumes(life)
    assert volumes
    running = servers(life)
    life.delete()
    servers_stop(life, running)
    life.gone(DB, life.name)
    for volume in volumes:
        life.gone("v1/PersistentVolumeClaim", volume)
    life.gone("v1/Secret", life.names.secret)
    owned_gone(life)
    kept(life)


def delete_orphaning(life: Life) -> None:
    """``kubectl delete --cascade=orphan`` under the Snapshot policy: the garbage collector
    takes the ownerReferences off the children first, so the server is no longer the
    Database's and still runs on its data volume. Nothing is stopped, snapshotted or deleted:
    the data is kept as under Retain, and the orphans stay. Created again, the Database does
    not take the orphaned, Complete init Job for its own."""
    volumes = life.wait("its data volume", lambda: data_volumes(life))
    server = life.names.statefulset(16)
    life.cluster.kube.delete("eventop.dev/v1", "Database", life.name, life.namespace,
                             propagation="Orphan")
    life.gone(DB, life.name)
    sts = life.object("apps/v1/StatefulSet", server)
    assert not sts["metadata"].get("ownerReferences")
    left_running_and_kept(life, server, volumes)
    event = only_event(life, "ServersOrphaned")
    assert event["type"] == "Warning" and server in event["message"]
    life.create(**life.spec)
    status = life.status("Initialized not taken from the orphaned Job", lambda s: condition(
        s, "Initialized")["reason"] == "InitJobNotOurs")
    assert condition(status["status"], "Initialized")["status"] == "False"
    # Deleted in turn (Snapshot): the orphans are not its own. The running server, its
    # data volume and the Secret it reads stay; nothing is snapshotted.
    life.delete()
    life.gone(DB, life.name)
    left_running_and_kept(life, server, volumes)
    left = only_event(life, "NotItsOwnLeft")
    assert server in left["message"] and volumes[0] in left["message"]


def left_running_and_kept(life: Life, server: str, volumes: list[str]) -> None:
    """The server runs on, its data volumes and the Secret it reads stay, and nothing was
    snapshotted."""
    assert life.get("apps/v1/StatefulSet", server)["spec"]["replicas"] == 1
    assert data_volumes(life) == volumes
    life.object("v1/Secret", life.names.secret)
    if not life.cluster.kube.missing_kinds([(SNAPSHOTS, "VolumeSnapshot")]):
        assert not life.cluster.list(f"{SNAPSHOTS}/VolumeSnapshot", life.namespace)


def only_event(life: Life, reason: str) -> Obj:
    """The one Event of ``reason`` in the life's namespace."""
    [event] = [e for e in life.cluster.list("v1/Event", life.namespace)
               if e["reason"] == reason]
    return event
