"""Deleting a Database under each deletionPolicy, with and without the snapshot API: the
finalizer goes only once the data is where the policy says; failures keep the Database."""

from __future__ import annotations

from typing import Any

import pytest

from tests.databases.test_lifecycle import created
from tests.databases.world import World, database

Obj = dict[str, Any]
KEPT_SECRET = ("Secret", "orders-credentials")
BACKUPS = ("PersistentVolumeClaim", "orders-backups")
DATA = ("PersistentVolumeClaim", "data-orders-pg16-0")


def servers_stopped(world: World) -> None:
    """The StatefulSet controller, scaled to zero, reports every pod gone."""
    for name in world.names("StatefulSet"):
        assert world.get("StatefulSet", name)["spec"]["replicas"] == 0
        world.statefulset_ready(name)


def reasons(world: World) -> list[str]:
    return [r for _, r, _ in world.events]


def test_retain_keeps_the_data_volumes_and_the_secret_and_lets_go_at_once() -> None:
    world = created(World(database(deletionPolicy="Retain")))
    world.delete()
    world.reconcile()
    assert world.db is None
    assert {DATA, BACKUPS, KEPT_SECRET} <= set(world.objects)
    assert KEPT_SECRET not in world.owned
    assert world.names("StatefulSet") == [] and world.names("CronJob") == []
    assert "DataRetained" in reasons(world)


def test_delete_stops_the_servers_then_deletes_the_data_volumes_but_not_the_backups() -> None:
    world = created(World(database(deletionPolicy="Delete")))
    world.delete()
    world.converge()
    assert world.db is not None, "the finalizer went before the servers stopped"
    assert world.get("StatefulSet", "orders-pg16")["spec"]["replicas"] == 0
    assert world.condition("Deleting")["reason"] == "StoppingServers"
    assert DATA in world.objects, "data deleted under a running server"
    servers_stopped(world)
    world.converge()
    assert world.db is None and world.names("StatefulSet") == []
    assert DATA not in world.objects and KEPT_SECRET not in world.objects
    assert BACKUPS in world.objects
    assert "DataDeleted" in reasons(world)


def test_a_server_that_does_not_stop_is_named_and_warned_about_after_five_minutes() -> None:
    """A pod held by a finalizer kept the deletion at "1 pods left" for good, naming no pod
    and posting no Warning (found on a real v1.24 API server). The snapshots still wait: a
    server that runs must not write while they are taken."""
    world = created(World(database()))
    world.delete()
    world.converge()
    assert world.condition("Deleting")["message"] == \
        "stopping the servers (orders-pg16): 1 pods left (orders-pg16-0)"
    world.advance(minutes=4)
    world.converge()
    assert world.condition("Deleting")["reason"] == "StoppingServers"
    assert not [r for t, r, _ in world.events if t == "Warning"]
    world.advance(minutes=1)
    world.converge()
    deleting = world.condition("Deleting")
    assert deleting["reason"] == "ServersNotStopping"
    assert "orders-pg16-0" in deleting["message"] and "finalizer" in deleting["message"]
    assert "force-delete" in deleting["message"]
    assert world.last.requeue_after  # still looking: its pod's going sends no event here
    world.advance(minutes=10)
    world.converge()
    assert [r for t, r, _ in world.events if t == "Warning"] == ["ServersNotStopping"]
    assert world.names("VolumeSnapshot") == [], "snapshots of a running server"
    servers_stopped(world)
    world.converge()
    assert world.names("VolumeSnapshot") == ["data-orders-pg16-0-6f1c2a9e"]


def test_the_servers_stop_warning_counts_from_the_final_backup_not_the_deletion() -> None:
    """Without the snapshot API the servers run the final backup first (it may take
    hours): they are asked to stop only once it completed."""
    world = created(World(database(), snapshot_api=False))
    world.delete()
    world.converge()
    world.advance(minutes=30)
    world.job_done("orders-final-backup")
    world.converge()
    assert world.condition("Deleting")["reason"] == "StoppingServers"
    world.advance(minutes=5)
    world.converge()
    assert world.condition("Deleting")["reason"] == "ServersNotStopping"


def test_snapshot_stops_the_servers_snapshots_every_volume_and_waits_until_ready() -> None:
    world = created(World(database(replicas=2)))
    world.delete()
    world.converge()
    assert world.names("VolumeSnapshot") == [], "snapshots of running servers"
    assert world.condition("Deleting")["message"] == \
        "stopping the servers (orders-pg16): 2 pods left (orders-pg16-0, orders-pg16-1)"
    servers_stopped(world)
    world.converge()
    snapshots = world.names("VolumeSnapshot")
    assert snapshots == ["data-orders-pg16-0-6f1c2a9e", "data-orders-pg16-1-6f1c2a9e"]
    assert world.names("StatefulSet") == []
    assert world.db is not None and world.condition("Deleting")["reason"] == "Snapshotting"
    assert world.last.requeue_after  # no event announces a snapshot turning ready
    world.snapshot_done(snapshots[0])
    world.converge()
    assert world.db is not None
    world.snapshot_done(snapshots[1])
    world.converge()
    assert world.db is None
    assert set(world.names("VolumeSnapshot")) == set(snapshots)
    assert not any(("VolumeSnapshot", s) in world.owned for s in snapshots)
    assert DATA not in world.objects and KEPT_SECRET in world.objects and BACKUPS in world.objects
    source = world.get("VolumeSnapshot", snapshots[0])["spec"]["source"]
    assert source == {"persistentVolumeClaimName": "data-orders-pg16-0"}
    # where the data went, said once in the Database's Events
    kept = [m for _, r, m in world.events if r == "Snapshotted"]
    assert kept == ["data kept in VolumeSnapshots data-orders-pg16-0-6f1c2a9e, "
                    "data-orders-pg16-1-6f1c2a9e; data volumes deleted: data-orders-pg16-0, "
                    "data-orders-pg16-1"]


def test_a_claim_never_bound_is_not_snapshotted_but_deleted() -> None:
    """Deleted before its pod was ever scheduled (a WaitForFirstConsumer class): the claim
    holds no data and the CSI snapshotter would never snapshot it. Waiting for that
    snapshot kept the Database for the 30 minutes of the timeout, then for good."""
    world = created(World(database(replicas=2)))
    world.get(*DATA)["status"] = {"phase": "Pending"}
    world.delete()
    world.converge()
    servers_stopped(world)
    world.converge()
    assert world.names("VolumeSnapshot") == ["data-orders-pg16-1-6f1c2a9e"]
    world.snapshot_done("data-orders-pg16-1-6f1c2a9e")
    world.converge()
    assert world.db is None and DATA not in world.objects


@pytest.mark.parametrize("failure", ["error", "timeout"])
def test_a_failed_or_late_snapshot_keeps_the_database_and_its_data(failure: str) -> None:
    world = created(World(database()))
    world.delete()
    world.converge()
    servers_stopped(world)
    world.converge()
    (snapshot,) = world.names("VolumeSnapshot")
    if failure == "error":
        world.snapshot_done(snapshot, error="Failed to check and update snapshot content")
        expected = "SnapshotFailed"
    else:
        world.advance(minutes=31)
        expected = "SnapshotTimedOut"
    for _ in range(3):
        world.reconcile()
    assert world.db is not None
    deleting = world.condition("Deleting")
    assert deleting["reason"] == expected
    assert "set spec.deletionPolicy to Retain" in deleting["message"]
    assert DATA in world.objects
    assert reasons(world).count(expected) == 1  # one Warning, not one per reconcile
    # The way out the message names: delete the snapshot, it is taken again.
    del world.objects[("VolumeSnapshot", snapshot)]
    world.converge()
    world.snapshot_done(snapshot)
    world.converge()
    assert world.db is None


def test_without_the_snapshot_api_a_final_backup_runs_while_the_server_still_runs() -> None:
    world = created(World(database(), snapshot_api=False))
    world.delete()
    world.converge()
    assert world.names("StatefulSet") == ["orders-pg16"]
    job = world.get("Job", "orders-final-backup")
    container = job["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == "docker.io/library/postgres:16.11"
    assert {"name": "BACKUP_KIND", "value": "final"} in container["env"]
    assert world.condition("Deleting")["reason"] == "FinalBackup"
    assert world.names("CronJob") == []  # no scheduled backup competes for the volume
    world.job_done("orders-final-backup")
    world.converge()
    assert world.condition("Deleting")["reason"] == "StoppingServers"
    servers_stopped(world)
    world.converge()
    assert world.db is None
    assert DATA not in world.objects and BACKUPS in world.objects
    kept = [m for _, r, m in world.events if r == "FinalBackupKept"]
    assert kept == ["data kept in PersistentVolumeClaim orders-backups (final backup Job "
                    "orders-final-backup); data volumes deleted: data-orders-pg16-0"]


def test_a_final_backup_that_times_out_is_reported_and_the_database_stays() -> None:
    world = created(World(database(), snapshot_api=False))
    world.delete()
    world.converge()
    world.job_done("orders-final-backup", ok=False, reason="DeadlineExceeded")
    world.converge()
    assert world.db is not None
    deleting = world.condition("Deleting")
    assert deleting["reason"] == "FinalBackupFailed" and "DeadlineExceeded" in deleting["message"]
    # the way out, in the field's and the values' own spelling (not lower-cased)
    assert deleting["message"].endswith(
        "the Database stays. Delete the Job to try again, or set spec.deletionPolicy to Retain "
        "(keeps the data volumes data-orders-pg*) or Delete (deletes them)")
    assert DATA in world.objects and world.names("StatefulSet") == ["orders-pg16"]
    assert "FinalBackupFailed" in reasons(world)
    world.edit(deletionPolicy="Retain")  # the user decides to keep the volumes instead
    world.converge()
    assert world.db is None and DATA in world.objects


def test_a_database_that_never_had_data_goes_at_once() -> None:
    world = World(database(), snapshot_api=False)
    world.delete()
    world.converge()
    assert world.db is None


def test_a_database_deleted_before_it_made_anything_leaves_no_backup_volume_behind() -> None:
    """The backup volume is kept as it is, not made by the deletion: nothing would ever
    delete an ownerless, empty claim."""
    world = World(database())
    world.delete()
    world.converge()
    assert world.db is None and world.objects == {}


def test_without_the_snapshot_api_a_server_that_never_started_needs_no_final_backup() -> None:
    """Its claim never bound (the pod never scheduled): no data, as the snapshot path
    knows. A final backup Job waited 4 hours for that server, failed, and held the
    Database."""
    world = World(database(), snapshot_api=False)
    world.converge()
    world.statefulset_ready("orders-pg16", ready=0)
    world.get(*DATA)["status"] = {"phase": "Pending"}
    world.delete()
    world.converge()
    assert "orders-final-backup" not in world.names("Job")
    assert world.condition("Deleting")["reason"] == "StoppingServers"
    servers_stopped(world)
    world.converge()
    assert world.db is None and DATA not in world.objects
    assert [m for _, r, m in world.events if r == "NoFinalBackup"] == [
        "no final backup: the Database was never initialized and no data volume was ever "
        "bound, so no server held data; data volumes deleted: data-orders-pg16-0"]


@pytest.mark.parametrize("edit", [
    {"storage": {"size": "0"}},
    {"resources": {"requests": {"memory": "2Gi"}, "limits": {"memory": "1Gi"}}},
    {"backup": {"schedule": "61 * * * *", "storage": {"size": "0"}}},
    {"deletionPolicy": "Archive"},
])
def test_a_spec_made_invalid_does_not_keep_the_database_from_being_deleted(edit: Obj) -> None:
    """The deletion goes on with what runs: the StatefulSet is stopped as it is (not rolled
    with other resources first), the snapshots taken, then it goes."""
    world = created(World(database()))
    server = world.get("StatefulSet", "orders-pg16")["spec"]["template"]["spec"]["containers"]
    world.edit(**edit)
    world.converge()
    assert world.db["status"]["phase"] == "Failed"
    world.delete()
    world.converge()
    assert world.condition("Deleting")["reason"] == "StoppingServers"
    assert world.get("StatefulSet", "orders-pg16")["spec"]["template"]["spec"][
        "containers"] == server
    servers_stopped(world)
    world.converge()
    (snapshot,) = world.names("VolumeSnapshot")
    world.snapshot_done(snapshot)
    world.converge()
    assert world.db is None and DATA not in world.objects and BACKUPS in world.objects


def volume(name: str, claim: str, namespace: str = "shop", reclaim: str = "Delete") -> Obj:
    return {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": name},
            "spec": {"persistentVolumeReclaimPolicy": reclaim,
                     "claimRef": {"namespace": namespace, "name": claim}}}


@pytest.mark.parametrize("policy", ["Snapshot", "Retain"])
def test_in_a_namespace_being_deleted_the_data_volumes_are_set_to_retain_then_it_goes(
        policy: str) -> None:
    """Nothing can be created in a terminating namespace (no snapshot, no backup Job) and
    the namespace controller takes the claims: the PersistentVolumes keep the data."""
    world = created(World(database(replicas=2, deletionPolicy=policy)))
    for pv in (volume("pv-0", "data-orders-pg16-0"), volume("pv-1", "data-orders-pg16-1"),
               volume("pv-kept", "data-orders-pg15-0", reclaim="Retain"),  # an old major's
               volume("pv-other-db", "data-orders-archive-pg16-0"),
               volume("pv-other-ns", "data-orders-pg16-0", namespace="shop-2")):
        world.objects[world.key(pv)] = pv
    world.terminating = True
    world.delete()
    first = world.reconcile()
    assert world.db is not None
    assert [p["metadata"]["name"] for p in first.patches] == ["pv-0", "pv-1"]
    assert world.condition("Deleting")["reason"] == "RetainingVolumes"
    assert not [o for o in first.kept if o["kind"] == "VolumeSnapshot"]
    world.converge()
    assert world.db is None
    reclaim = {name: world.get("PersistentVolume", name)["spec"]["persistentVolumeReclaimPolicy"]
               for name in world.names("PersistentVolume")}
    assert reclaim == {"pv-0": "Retain", "pv-1": "Retain", "pv-kept": "Retain",
                       "pv-other-db": "Delete", "pv-other-ns": "Delete"}
    (message,) = [m for _, r, m in world.events if r == "NamespaceDeleted"]
    assert "pv-0, pv-1, pv-kept" in message and "Retain" in message


@pytest.mark.parametrize("policy", ["Snapshot", "Retain", "Delete"])
def test_in_a_namespace_being_deleted_the_backup_volume_is_kept_under_every_policy(
        policy: str) -> None:
    """The namespace controller deletes the backup claim too: its PersistentVolume is set
    to Retain, else the scheduled, pre-upgrade and final backups went with it."""
    world = created(World(database(deletionPolicy=policy)))
    for pv in (volume("pv-data", "data-orders-pg16-0"), volume("pv-backups", "orders-backups")):
        world.objects[world.key(pv)] = pv
    world.terminating = True
    world.delete()
    first = world.reconcile()
    patched = {p["metadata"]["name"] for p in first.patches}
    assert patched == ({"pv-backups"} if policy == "Delete" else {"pv-data", "pv-backups"})
    for _ in range(6):
        if world.db is None:
            break
        if world.names("StatefulSet"):
            servers_stopped(world)
        world.reconcile()
    assert world.db is None
    reclaim = {name: world.get("PersistentVolume", name)["spec"]["persistentVolumeReclaimPolicy"]
               for name in world.names("PersistentVolume")}
    assert reclaim == {"pv-backups": "Retain",
                       "pv-data": "Delete" if policy == "Delete" else "Retain"}


def test_in_a_namespace_being_deleted_delete_still_deletes() -> None:
    world = created(World(database(deletionPolicy="Delete")))
    world.objects[("PersistentVolume", "pv-0")] = volume("pv-0", "data-orders-pg16-0")
    world.terminating = True
    world.delete()
    first = world.reconcile()
    assert first.patches == []
    servers_stopped(world)
    world.converge()
    assert world.db is None and DATA not in world.objects
    assert world.get("PersistentVolume", "pv-0")["spec"]["persistentVolumeReclaimPolicy"] == \
        "Delete"


def test_in_a_namespace_being_deleted_no_bound_volume_means_nothing_to_keep() -> None:
    world = created(World(database()))
    world.terminating = True
    world.delete()
    world.converge()
    assert world.db is None
    (message,) = [m for _, r, m in world.events if r == "NamespaceDeleted"]
    assert ("no PersistentVolume of its data volumes and backup volume was left to keep"
            in message)


def test_in_a_namespace_being_deleted_a_claim_bound_to_an_unseen_volume_is_waited_for() -> None:
    """A claim says it is bound to a PersistentVolume the cache does not hold yet: that is
    not "no data to keep"; the Database waits for it, then keeps it."""
    world = created(World(database()))
    world.bind("data-orders-pg16-0", "pv-0")
    world.terminating = True
    world.delete()
    first = world.reconcile()
    assert world.db is not None and first.patches == [] and first.requeue_after == 2.0
    assert "waiting to see PersistentVolumes pv-0" in world.condition("Deleting")["message"]
    world.objects[("PersistentVolume", "pv-0")] = volume("pv-0", "data-orders-pg16-0")
    world.converge()
    assert world.db is None
    assert world.get("PersistentVolume", "pv-0")["spec"]["persistentVolumeReclaimPolicy"] == \
        "Retain"


def test_in_a_namespace_being_deleted_under_delete_an_unseen_backup_volume_is_waited_for(
        ) -> None:
    """Delete deletes the data volumes, but not before the backup volume's PersistentVolume,
    once the cache holds it, is set to Retain."""
    world = created(World(database(deletionPolicy="Delete")))
    world.bind("orders-backups", "pv-backups")
    world.terminating = True
    world.delete()
    first = world.reconcile()
    assert world.db is not None and first.patches == [] and first.requeue_after == 2.0
    assert DATA in world.objects
    world.objects[("PersistentVolume", "pv-backups")] = volume("pv-backups", "orders-backups")
    world.converge()
    assert world.db is None and DATA not in world.objects
    assert world.get("PersistentVolume", "pv-backups")["spec"][
        "persistentVolumeReclaimPolicy"] == "Retain"


@pytest.mark.parametrize("policy", ["Snapshot", "Delete"])
def test_a_database_deleted_with_cascade_orphan_keeps_its_data_as_retain_does(
        policy: str) -> None:
    """The garbage collector took the ownerReferences off its children first: its server
    still ran, and it was snapshotted live and its data volume deleted under it (a user's
    trial, on a real API server)."""
    world = created(World(database(deletionPolicy=policy)))
    orphans = [world.objects.pop(("StatefulSet", n)) for n in world.names("StatefulSet")]
    world.owned -= {("StatefulSet", o["metadata"]["name"]) for o in orphans}
    world.orphaned_servers = orphans
    world.delete()
    world.reconcile()
    assert world.db is None
    assert {DATA, BACKUPS, KEPT_SECRET} <= set(world.objects)
    assert world.names("VolumeSnapshot") == []
    [(kind, _, message)] = [e for e in world.events if e[1] == "ServersOrphaned"]
    assert kind == "Warning"
    assert message.startswith("Deleted with --cascade=orphan: its servers (StatefulSet "
                              "orders-pg16) are left running on its data volumes")
    assert "data-orders-pg16-0" in message and "orders-credentials" in message


def test_an_orphaning_deletion_stays_one_when_a_run_sees_neither_finalizer_nor_orphans() -> None:
    """The garbage collector removes the ownerReferences, then its finalizer: a run whose
    StatefulSet cache lagged saw neither, and took the policy's steps on the orphaned
    server (a reviewer's finding). What an earlier run recorded keeps it an orphaning."""
    world = created(World(database(deletionPolicy="Delete")))
    world.db["metadata"]["finalizers"] = ["eventop.dev/database-data", "orphan"]
    world.delete()
    world.reconcile()
    assert world.condition("Deleting")["reason"] == "Orphaning"
    world.db["metadata"]["finalizers"] = ["eventop.dev/database-data"]  # the GC's work done
    result = world.reconcile()  # its cache still shows the server owned: no orphans seen
    assert result.finalize and result.children is None  # left as they are, none pruned
    assert [d["kind"] for d in result.deletions] == []
    assert world.db is None and {DATA, KEPT_SECRET} <= set(world.objects)


def test_a_server_left_by_an_earlier_database_of_the_name_is_no_orphan_of_this_one() -> None:
    """A plain deletion under Delete kept the data of a Database re-created next to the
    leftover StatefulSet of an earlier one of its name, taken for an orphan of its own (a
    reviewer's finding): only a server made for this uid is."""
    from eventop.handlers.databases.controller import made_for

    world = created(World(database()))
    server = world.get("StatefulSet", "orders-pg16")
    uid = world.db["metadata"]["uid"]
    assert made_for(server, uid)
    assert not made_for(server, "another-uid")
    assert not made_for({"spec": {}}, uid)


def test_a_new_database_does_not_take_an_orphaned_init_job_for_its_own() -> None:
    """Created again after a --cascade=orphan deletion, a Database read the old, Complete
    init Job as its own initialization: Initialized=True on an empty volume."""
    world = World(database())
    world.stale_init_job = {"apiVersion": "batch/v1", "kind": "Job",
                            "metadata": {"name": "orders-init", "namespace": "shop"},
                            "status": {"succeeded": 1, "conditions": [
                                {"type": "Complete", "status": "True"}]}}
    world.converge()
    for name in world.names("StatefulSet"):
        world.statefulset_ready(name)
    world.converge()
    initialized = world.condition("Initialized")
    assert (initialized["status"], initialized["reason"]) == ("False", "InitJobNotOurs")
    assert "delete it to let this Database's own init Job run" in initialized["message"]


def test_while_the_garbage_collector_orphans_its_children_nothing_is_stopped() -> None:
    """On a real API server the router's first run of an orphaning deletion came before the
    garbage collector's work: the servers still looked its own, were scaled to zero and
    deleted."""
    world = created(World(database(deletionPolicy="Snapshot")))
    world.db["metadata"]["finalizers"] = ["eventop.dev/database-data", "orphan"]
    before = {n: world.get("StatefulSet", n)["spec"]["replicas"]
              for n in world.names("StatefulSet")}
    world.delete()
    world.converge()
    assert world.db is not None
    assert world.condition("Deleting")["reason"] == "Orphaning"
    assert {n: world.get("StatefulSet", n)["spec"]["replicas"]
            for n in world.names("StatefulSet")} == before
    assert DATA in world.objects and world.names("VolumeSnapshot") == []
