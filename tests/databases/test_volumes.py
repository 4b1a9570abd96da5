"""The reclaim policy of a Database's PersistentVolumes: the data is kept safe from the
moment a volume is bound, not only once a running router sees a deletion (a namespace
deleted while the router was down lost the data of Snapshot and Retain Databases, on a real
v1.24 API server: the claims went at once, and their Delete volumes with them)."""

from __future__ import annotations

from typing import Any

import pytest

from eventop.handlers.databases.volumes import RECLAIM_ANNOTATION
from tests.databases.test_deletion import servers_stopped
from tests.databases.test_lifecycle import created
from tests.databases.world import World, database

Obj = dict[str, Any]


def provisioned(world: World, replicas: int = 1) -> World:
    """Its data volumes (``pv-0``...) and backup volume (``pv-backups``) bound to
    dynamically provisioned PersistentVolumes (reclaim policy Delete)."""
    for i in range(replicas):
        world.provision(f"data-orders-pg16-{i}", f"pv-{i}")
    world.provision("orders-backups", "pv-backups")
    return world


def reclaim(world: World) -> dict[str, tuple[str, str | None]]:
    """Each PersistentVolume's (reclaim policy, eventop's annotation of what it was)."""
    return {name: (pv["spec"]["persistentVolumeReclaimPolicy"],
                   (pv["metadata"].get("annotations") or {}).get(RECLAIM_ANNOTATION))
            for name in world.names("PersistentVolume")
            for pv in [world.get("PersistentVolume", name)]}


KEPT = ("Retain", "Delete")  # Retain, and eventop's note that it was Delete
OWN = ("Delete", None)


@pytest.mark.parametrize("policy", ["Snapshot", "Retain"])
def test_a_live_database_that_keeps_its_data_sets_its_bound_volumes_to_retain(
        policy: str) -> None:
    world = provisioned(created(World(database(replicas=2, deletionPolicy=policy))), 2)
    world.converge()
    assert reclaim(world) == {"pv-0": KEPT, "pv-1": KEPT, "pv-backups": KEPT}
    before = world.snapshot()
    world.reconcile()
    assert world.last.patches == [] and world.snapshot() == before  # once, not every run


def test_under_delete_only_the_backup_volume_is_set_to_retain() -> None:
    world = provisioned(created(World(database(deletionPolicy="Delete"))))
    world.converge()
    assert reclaim(world) == {"pv-0": OWN, "pv-backups": KEPT}


def test_a_policy_switched_to_delete_gives_the_data_volumes_their_policy_back() -> None:
    world = provisioned(created(World(database(deletionPolicy="Snapshot"))))
    world.converge()
    assert reclaim(world)["pv-0"] == KEPT
    world.edit(deletionPolicy="Delete")
    world.converge()
    assert reclaim(world) == {"pv-0": OWN, "pv-backups": KEPT}
    world.edit(deletionPolicy="Retain")
    world.converge()
    assert reclaim(world) == {"pv-0": KEPT, "pv-backups": KEPT}


def test_a_volume_retain_of_its_own_is_never_changed() -> None:
    """A StorageClass with reclaimPolicy Retain: nothing to record, nothing to give back,
    whatever the policy becomes or the deletion does."""
    world = created(World(database(deletionPolicy="Snapshot")))
    world.provision("data-orders-pg16-0", "pv-0", reclaim="Retain")
    world.converge()
    world.edit(deletionPolicy="Delete")
    world.converge()
    assert reclaim(world) == {"pv-0": ("Retain", None)}
    world.delete()
    world.converge()
    servers_stopped(world)
    world.converge()
    assert world.db is None
    assert reclaim(world) == {"pv-0": ("Retain", None)}


def test_a_bound_claim_whose_volume_the_cache_has_not_seen_is_looked_at_again_soon() -> None:
    """No event of a PersistentVolume runs a Database: the volume the claim's binding named
    is looked for again shortly, not only at the next backup tick."""
    world = created(World(database()))
    world.provision("data-orders-pg16-0", "pv-0")
    pv = world.objects.pop(("PersistentVolume", "pv-0"))
    world.reconcile()
    assert world.last.requeue_after == 2.0 and world.last.patches == []
    world.objects[("PersistentVolume", "pv-0")] = pv
    world.reconcile()
    assert reclaim(world)["pv-0"] == KEPT
    assert world.last.requeue_after != 2.0


@pytest.mark.parametrize("policy", ["Snapshot", "Retain"])
def test_a_namespace_deleted_while_the_router_was_down_keeps_the_data(policy: str) -> None:
    """The namespace controller deletes the claims at once, and the volume controller
    reclaims their volumes before the router is back: only volumes set to Retain before
    survive. The router, back, sees the namespace terminating and lets the Database go."""
    world = provisioned(created(World(database(deletionPolicy=policy))))
    world.converge()  # (its runs while it lived)
    world.claims_deleted()  # no run: the router is down
    assert reclaim(world) == {"pv-0": KEPT, "pv-backups": KEPT}
    assert world.get("PersistentVolume", "pv-0")["status"] == {"phase": "Released"}
    world.terminating = True
    world.delete()
    world.converge()
    assert world.db is None
    assert reclaim(world) == {"pv-0": KEPT, "pv-backups": KEPT}


def test_a_namespace_deleted_while_the_router_was_down_under_delete_keeps_the_backups() -> None:
    world = provisioned(created(World(database(deletionPolicy="Delete"))))
    world.converge()
    world.claims_deleted()
    assert reclaim(world) == {"pv-backups": KEPT}  # the data volume went, as Delete says


def test_a_snapshot_deletion_gives_the_data_volumes_their_policy_back_before_the_claims_go(
        ) -> None:
    """Once the snapshots are ready, the data volumes get their own policy back in a run
    of its own, and only the next deletes the claims: deleting them reclaims the storage,
    no Released volume is left behind. The backup volume stays Retain."""
    world = provisioned(created(World(database(replicas=2))), 2)
    world.converge()
    world.delete()
    world.converge()
    servers_stopped(world)
    world.converge()
    assert reclaim(world) == {"pv-0": KEPT, "pv-1": KEPT, "pv-backups": KEPT}, \
        "given back before the snapshots were ready"
    for snapshot in world.names("VolumeSnapshot"):
        world.snapshot_done(snapshot)
    giving = world.reconcile()
    assert sorted(p["metadata"]["name"] for p in giving.patches) == ["pv-0", "pv-1"]
    assert giving.deletions == [] and not giving.finalize
    assert world.condition("Deleting")["reason"] == "RestoringReclaimPolicy"
    assert reclaim(world) == {"pv-0": OWN, "pv-1": OWN, "pv-backups": KEPT}
    deleting = world.reconcile()
    assert deleting.patches == [] and deleting.finalize
    assert {o["metadata"]["name"] for o in deleting.deletions} == {
        "data-orders-pg16-0", "data-orders-pg16-1"}
    assert world.db is None
    assert "Snapshotted" in [r for _, r, _ in world.events]


def test_a_final_backup_deletion_gives_the_data_volumes_their_policy_back_once_complete(
        ) -> None:
    world = provisioned(created(World(database(), snapshot_api=False)))
    world.converge()
    world.delete()
    world.converge()
    assert world.condition("Deleting")["reason"] == "FinalBackup"
    assert reclaim(world)["pv-0"] == KEPT
    world.job_done("orders-final-backup")
    world.converge()
    servers_stopped(world)
    giving = world.reconcile()
    assert [p["metadata"]["name"] for p in giving.patches] == ["pv-0"]
    assert giving.deletions == [] or all(o["kind"] == "StatefulSet" for o in giving.deletions)
    world.converge()
    assert world.db is None
    assert reclaim(world) == {"pv-0": OWN, "pv-backups": KEPT}
    assert ("PersistentVolumeClaim", "data-orders-pg16-0") not in world.objects


def test_a_delete_deletion_of_a_database_just_switched_gives_the_policy_back_first() -> None:
    """Switched from Snapshot to Delete and deleted before a live run gave the volumes
    back: the deletion does it before the claims go."""
    world = provisioned(created(World(database())))
    world.converge()
    world.edit(deletionPolicy="Delete")
    world.delete()
    first = world.reconcile()
    assert [p["metadata"]["name"] for p in first.patches] == ["pv-0"]
    assert reclaim(world)["pv-0"] == OWN
    servers_stopped(world)
    world.converge()
    assert world.db is None
    assert reclaim(world) == {"pv-0": OWN, "pv-backups": KEPT}


def test_a_retain_deletion_leaves_the_volumes_retain() -> None:
    """Retain keeps the claims; their volumes stay Retain too (deleting a kept claim later
    leaves its data on a Released volume)."""
    world = provisioned(created(World(database(deletionPolicy="Retain"))))
    world.converge()
    world.delete()
    world.converge()
    assert world.db is None
    assert reclaim(world) == {"pv-0": KEPT, "pv-backups": KEPT}


def test_a_snapshot_deletion_keeps_a_volume_whose_claim_went_before_it_was_snapshotted(
        ) -> None:
    """Its claim deleted by hand while the Database lived: no snapshot holds its data
    (only claims are snapshotted), so it is not given back Delete; it stays Released."""
    world = provisioned(created(World(database(replicas=2))), 2)
    world.converge()
    del world.objects[("PersistentVolumeClaim", "data-orders-pg16-1")]
    world.get("PersistentVolume", "pv-1")["status"] = {"phase": "Released"}
    world.delete()
    world.converge()
    servers_stopped(world)
    world.converge()
    (snapshot,) = world.names("VolumeSnapshot")
    world.snapshot_done(snapshot)
    world.converge()
    assert world.db is None
    assert reclaim(world) == {"pv-0": OWN, "pv-1": KEPT, "pv-backups": KEPT}


@pytest.mark.parametrize("policy", ["Delete", "Snapshot"])
def test_an_earlier_databases_released_volume_of_the_same_claim_name_is_never_given_back(
        policy: str) -> None:
    """Kept by an earlier Database of this name (its namespace deleted, say), found by its
    claimRef beside the volume the claim is bound to now: its data is nowhere else, so
    this Database's deletion leaves it Retain."""
    world = provisioned(created(World(database(deletionPolicy=policy))))
    world.converge()
    old = world.provision("data-orders-pg16-0", "pv-earlier")
    old["spec"]["persistentVolumeReclaimPolicy"] = "Retain"
    old["metadata"]["annotations"] = {RECLAIM_ANNOTATION: "Delete"}
    old["status"] = {"phase": "Released"}
    world.get("PersistentVolumeClaim", "data-orders-pg16-0")["spec"]["volumeName"] = "pv-0"
    world.converge()
    world.delete()
    world.converge()
    servers_stopped(world)
    world.converge()
    if policy == "Snapshot":
        for snapshot in world.names("VolumeSnapshot"):
            world.snapshot_done(snapshot)
        world.converge()
    assert world.db is None
    assert reclaim(world) == {"pv-0": OWN, "pv-backups": KEPT, "pv-earlier": KEPT}
