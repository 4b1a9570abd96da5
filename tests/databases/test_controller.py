"""The Database handler on the engine (eventop.engine.testing.World: the engine's own
planning and writing against an in-memory API server): children created once, nothing
written by a second run, kept objects labelled instead of owned, the finalizer honoured."""

from __future__ import annotations

import copy
from typing import Any

from eventop.engine import PARENT_UID_LABEL
from eventop.engine.testing import World
from eventop.handlers.databases.controller import databases
from eventop.handlers.databases.spec import FINALIZER
from tests.databases.world import database

Obj = dict[str, Any]
DB = "eventop.dev/v1/Database"


def fresh(**spec: Any) -> World:
    db = database(**spec)
    db["metadata"].pop("uid")
    db["metadata"].pop("finalizers")
    return World([db])


def mark(world: World, kind: str, name: str, status: Obj) -> None:
    obj = copy.deepcopy(world.get(kind, name, "shop"))
    obj["status"] = status
    world.put(obj)


def job_complete(world: World, name: str) -> None:
    mark(world, "batch/v1/Job", name, {"succeeded": 1, "completionTime": "2026-11-20T10:05:00Z",
                                       "conditions": [{"type": "Complete", "status": "True"}]})


def ready(world: World, name: str) -> None:
    sts = world.get("apps/v1/StatefulSet", name, "shop")
    want = sts["spec"]["replicas"]
    mark(world, "apps/v1/StatefulSet", name, {
        "observedGeneration": sts["metadata"]["generation"], "replicas": want,
        "readyReplicas": want, "updatedReplicas": want, "currentRevision": "a",
        "updateRevision": "a"})


def test_a_database_converges_and_a_second_run_writes_nothing() -> None:
    world = fresh()
    world.converge(databases)
    db = world.get(DB, "orders", "shop")
    assert db["metadata"]["finalizers"] == [FINALIZER]
    assert world.get("apps/v1/StatefulSet", "orders-pg16", "shop") is not None
    secret = world.get("v1/Secret", "orders-credentials", "shop")
    assert not secret["metadata"].get("ownerReferences")
    assert secret["metadata"]["labels"][PARENT_UID_LABEL] == db["metadata"]["uid"]
    ready(world, "orders-pg16")
    world.converge(databases)
    job_complete(world, "orders-init")
    world.converge(databases)
    assert world.get("batch/v1/CronJob", "orders-backup", "shop") is not None
    db = world.get(DB, "orders", "shop")
    assert db["status"]["phase"] == "Ready"
    password = secret["data"]["password"]
    before = list(world.writes)
    world.reconcile(databases, "orders", "shop")
    assert world.writes == before
    assert world.get("v1/Secret", "orders-credentials", "shop")["data"]["password"] == password


def test_a_deleted_credentials_secret_is_noticed_made_again_and_said_so_in_a_warning() -> None:
    # The Secret outlives the Database, so it has no ownerReference: its deletion maps to
    # the Database by the parent-uid label, and the run that makes it again posts the
    # Warning although the status stays the same.
    world = fresh()
    world.converge(databases)
    ready(world, "orders-pg16")
    world.converge(databases)
    job_complete(world, "orders-init")
    world.converge(databases)
    old = world.get("v1/Secret", "orders-credentials", "shop")
    world.delete("v1/Secret", "orders-credentials", "shop")
    [result] = world.changed(databases, old)
    new = world.get("v1/Secret", "orders-credentials", "shop")
    assert new is not None and new["data"]["password"] != old["data"]["password"]
    assert not result.status_written
    assert [(n.type, n.reason) for _name, n in world.events[-1:]] == [
        ("Warning", "CredentialsRecreated")]


def put_data_claim(world: World, spec: Obj) -> None:
    """The claim the StatefulSet controller makes for orders-pg16's pod 0, bound."""
    sts = world.get("apps/v1/StatefulSet", "orders-pg16", "shop")
    template = sts["spec"]["volumeClaimTemplates"][0]["metadata"]
    world.put({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
               "metadata": {"name": "data-orders-pg16-0", "namespace": "shop",
                            "labels": {**template["labels"],
                                       **sts["spec"]["selector"]["matchLabels"]}},
               "spec": spec, "status": {"phase": "Bound"}})


def test_deleting_snapshots_then_lets_go_and_keeps_what_outlives_it() -> None:
    world = fresh(deletionPolicy="Snapshot")
    world.converge(databases)
    ready(world, "orders-pg16")
    put_data_claim(world, {})
    world.converge(databases)
    world.delete(DB, "orders", "shop")
    world.converge(databases)
    assert world.get(DB, "orders", "shop") is not None
    assert world.get("apps/v1/StatefulSet", "orders-pg16", "shop")["spec"]["replicas"] == 0
    ready(world, "orders-pg16")  # its controller: no pod left
    world.converge(databases)
    assert world.get("apps/v1/StatefulSet", "orders-pg16", "shop") is None
    (snapshot,) = world.list("snapshot.storage.k8s.io/v1/VolumeSnapshot", "shop")
    mark(world, "snapshot.storage.k8s.io/v1/VolumeSnapshot", snapshot["metadata"]["name"],
         {"readyToUse": True})
    world.converge(databases)
    assert world.get(DB, "orders", "shop") is None
    assert world.get("v1/PersistentVolumeClaim", "data-orders-pg16-0", "shop") is None
    assert world.get("v1/PersistentVolumeClaim", "orders-backups", "shop") is not None
    assert world.get("v1/Secret", "orders-credentials", "shop") is not None
    assert world.list("snapshot.storage.k8s.io/v1/VolumeSnapshot", "shop")


def test_a_database_created_again_adopts_the_kept_secret_and_its_passwords() -> None:
    world = fresh(deletionPolicy="Retain")
    world.converge(databases)
    password = world.get("v1/Secret", "orders-credentials", "shop")["data"]["password"]
    world.delete(DB, "orders", "shop")
    world.converge(databases)
    assert world.get(DB, "orders", "shop") is None
    again = database()
    again["metadata"].pop("uid")
    again["metadata"].pop("finalizers")
    world.put(again)
    world.converge(databases)
    secret = world.get("v1/Secret", "orders-credentials", "shop")
    assert secret["data"]["password"] == password
    new_uid = world.get(DB, "orders", "shop")["metadata"]["uid"]
    assert secret["metadata"]["labels"][PARENT_UID_LABEL] == new_uid


def test_a_replica_that_has_not_seen_the_secret_yet_never_changes_the_passwords(
        monkeypatch: Any) -> None:
    """Two router processes reconcile the same new Database: one creates the Secret, the
    other, whose cache has not seen it yet, generates passwords of its own. Its create is
    refused (409) and must leave the Secret as it is: a server may already have started
    with the first passwords."""
    from eventop.engine.reads import Reads

    world = fresh()
    world.converge(databases)
    secret = world.get("v1/Secret", "orders-credentials", "shop")
    seen = Reads.get

    def not_yet(self: Reads, kind: Any, name: str, namespace: str | None = None) -> Any:
        return None if str(kind) == "v1/Secret" else seen(self, kind, name, namespace)
    monkeypatch.setattr(Reads, "get", not_yet)
    before = len(world.writes)
    world.reconcile(databases, "orders", "shop")
    assert [w for w in world.writes[before:] if w[1] == "Secret"] == []
    assert world.get("v1/Secret", "orders-credentials", "shop")["data"] == secret["data"]


def test_a_service_of_someone_elses_at_its_name_makes_the_database_not_ready() -> None:
    """Else it reported Ready with an endpoint that is not its own (found on a real API
    server: only a Warning Event, which expires, told)."""
    from eventop.engine.testing import World as EngineWorld
    from eventop.handlers.databases.controller import databases
    from tests.databases.world import database

    foreign = {"apiVersion": "v1", "kind": "Service",
               "metadata": {"name": "orders", "namespace": "shop", "uid": "someone"},
               "spec": {"selector": {"app": "orders"}, "ports": [{"port": 5432}]}}
    world = EngineWorld([database(), foreign])
    world.converge(databases)
    status = world.get("eventop.dev/v1/Database", "orders", "shop")["status"]
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "ChildConflict")
    assert ready["message"].startswith("Service shop/orders exists and is not this Database's")
    assert world.get("v1/Service", "orders", "shop")["metadata"]["uid"] == "someone"


def test_its_namespace_being_deleted_sets_its_volumes_to_retain_before_it_is_deleted() -> None:
    """The namespace controller deletes everything at once, and a claim no pod uses goes at
    once: a Database not yet deleted itself keeps its volumes as soon as its namespace is
    terminating (the Namespace's change runs it); under Delete only its backup volume (kept
    under every policy)."""
    world = fresh()
    world.put(copy.deepcopy(database("scratch", deletionPolicy="Delete")) | {
        "metadata": {"name": "scratch", "namespace": "shop"}})
    world.converge(databases)
    for name, claim in (("pv-orders", "data-orders-pg16-0"), ("pv-scratch",
                                                              "data-scratch-pg16-0"),
                        ("pv-scratch-backups", "scratch-backups")):
        world.put({"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": name},
                   "spec": {"persistentVolumeReclaimPolicy": "Delete",
                            "claimRef": {"namespace": "shop", "name": claim}}})
    namespace = world.put({"apiVersion": "v1", "kind": "Namespace", "metadata": {
        "name": "shop", "deletionTimestamp": "2026-11-20T11:00:00Z"},
        "status": {"phase": "Terminating"}})
    world.changed(databases, namespace)
    reclaim = {pv: world.get("v1/PersistentVolume", pv)["spec"]["persistentVolumeReclaimPolicy"]
               for pv in ("pv-orders", "pv-scratch", "pv-scratch-backups")}
    assert reclaim == {"pv-orders": "Retain", "pv-scratch": "Delete",
                       "pv-scratch-backups": "Retain"}
    assert world.get(DB, "orders", "shop")["metadata"].get("deletionTimestamp") is None


def test_a_changed_storage_size_leaves_the_backup_volume_as_the_cluster_holds_it() -> None:
    """The reconcile reads the backup claim (observe) so its size is kept: re-applied with
    a new storage.size it was refused, and the Database reported Degraded."""
    world = fresh()
    world.converge(databases)
    db = copy.deepcopy(world.get(DB, "orders", "shop"))
    db["spec"]["storage"] = {"size": "50Gi"}
    world.put(db)
    world.converge(databases)
    claim = world.get("v1/PersistentVolumeClaim", "orders-backups", "shop")
    assert claim["spec"]["resources"]["requests"]["storage"] == "5Gi"


def test_a_live_database_sets_the_volumes_its_claims_are_bound_to_to_retain() -> None:
    """Found by the claims' volumeName (no scan of every PersistentVolume per run), set to
    Retain with the policy they had recorded, given it back when the policy becomes
    Delete; a volume no claim of its names is left alone."""
    from eventop.handlers.databases.volumes import RECLAIM_ANNOTATION

    world = fresh(deletionPolicy="Snapshot")
    world.converge(databases)
    ready(world, "orders-pg16")
    put_data_claim(world, {"volumeName": "pv-data"})
    backups = copy.deepcopy(world.get("v1/PersistentVolumeClaim", "orders-backups", "shop"))
    backups["spec"]["volumeName"] = "pv-backups"
    backups["status"] = {"phase": "Bound"}
    world.put(backups)
    for name, claim in (("pv-data", "data-orders-pg16-0"), ("pv-backups", "orders-backups"),
                        ("pv-stranger", "data-orders-pg16-1")):
        world.put({"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": name},
                   "spec": {"persistentVolumeReclaimPolicy": "Delete",
                            "claimRef": {"namespace": "shop", "name": claim}}})
    world.converge(databases)

    def reclaim() -> dict[str, tuple[str, Any]]:
        return {name: (pv["spec"]["persistentVolumeReclaimPolicy"],
                       (pv["metadata"].get("annotations") or {}).get(RECLAIM_ANNOTATION))
                for name in ("pv-data", "pv-backups", "pv-stranger")
                for pv in [world.get("v1/PersistentVolume", name)]}
    assert reclaim() == {"pv-data": ("Retain", "Delete"), "pv-backups": ("Retain", "Delete"),
                         "pv-stranger": ("Delete", None)}
    db = copy.deepcopy(world.get(DB, "orders", "shop"))
    db["spec"]["deletionPolicy"] = "Delete"
    world.put(db)
    world.converge(databases)
    assert reclaim() == {"pv-data": ("Delete", None), "pv-backups": ("Retain", "Delete"),
                         "pv-stranger": ("Delete", None)}


def test_a_database_named_as_anothers_headless_service_gives_way_and_names_it() -> None:
    """Databases ``a`` and ``a-hl`` fought over Service ``a-hl`` (a's headless, a-hl's
    client Service): the newer one's ChildConflict said to delete or rename the Service,
    and its Secret's host named the other Database's Service (found on a real API
    server)."""
    older, newer = database("a"), database("a-hl")
    for db in (older, newer):
        db["metadata"].pop("uid")
        db["metadata"].pop("finalizers")
    newer["metadata"]["creationTimestamp"] = "2026-11-20T10:05:00Z"
    world = World([older, newer])
    world.converge(databases)
    status = world.get(DB, "a-hl", "shop")["status"]
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "NameCollision")
    assert ready["message"].startswith(
        "Database a's headless Service is named a-hl, the name of this Database's client "
        "Service; rename one of the two")
    assert world.get("v1/Secret", "a-hl-credentials", "shop") is None
    assert world.get("apps/v1/StatefulSet", "a-hl-pg16", "shop") is None
    service = world.get("v1/Service", "a-hl", "shop")
    assert service["spec"]["clusterIP"] == "None"  # a's headless Service, left as it is
    theirs = world.get(DB, "a", "shop")["status"]
    assert next(c for c in theirs["conditions"] if c["type"] == "Ready")["reason"] != \
        "ChildConflict"


def test_a_database_that_gives_way_keeps_its_passwords_but_no_address() -> None:
    """A Secret the newer Database made before this check existed (while the two fought)
    keeps its passwords, but no longer points clients at the other Database's Service."""
    older, newer = database("a"), database("a-hl")
    for db in (older, newer):
        db["metadata"].pop("uid")
        db["metadata"].pop("finalizers")
    newer["metadata"]["creationTimestamp"] = "2026-11-20T10:05:00Z"
    world = World([newer])  # (as if the older one were not seen: its Secret is made)
    world.converge(databases)
    password = world.get("v1/Secret", "a-hl-credentials", "shop")["data"]["password"]
    world.put(older)
    world.converge(databases)
    secret = world.get("v1/Secret", "a-hl-credentials", "shop")
    assert "host" not in secret["data"] and "uri" not in secret["data"]
    assert secret["data"]["password"] == password
