"""Properties over random lives of a Database: whatever the controllers and the user do in
between, reconciling reaches a state where reconciling again changes nothing (no write, no
Event), and neither the generated passwords nor, once initialized, the Secret's database name
ever change."""

from __future__ import annotations

import base64
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from eventop.handlers.databases.workload import Passwords
from tests.databases.world import World, database

ACTIONS = st.lists(st.one_of(
    st.tuples(st.just("ready"), st.integers(0, 3)),
    st.tuples(st.just("job"), st.booleans()),
    st.tuples(st.just("cron"), st.booleans()),
    st.tuples(st.just("advance"), st.integers(1, 60 * 50)),
    st.tuples(st.just("version"), st.sampled_from(["16", "16.9", "16.11", "17", "18", "15"])),
    st.tuples(st.just("replicas"), st.integers(1, 3)),
    st.tuples(st.just("schedule"), st.sampled_from(["@hourly", "0 0 * * *", "61 * * * *"])),
    st.tuples(st.just("database-name"), st.sampled_from(["orders", "shop_orders"])),
    st.tuples(st.just("storage"), st.sampled_from(["1Gi", "5Gi", "50Gi", "0"])),
    st.tuples(st.just("delete-secret"), st.none()),
    st.tuples(st.just("rolling"), st.none()),
), max_size=25)


def passwords(world: World) -> dict[str, str]:
    secret = world.objects.get(("Secret", "orders-credentials"))
    return Passwords.from_secret(secret) if secret else {}


def act(world: World, action: str, arg: Any) -> None:
    sts = world.names("StatefulSet")
    running_jobs = [n for n in world.names("Job") if "status" not in world.get("Job", n)]
    if action == "ready" and sts:
        world.statefulset_ready(sts[-1], ready=min(arg, world.get("StatefulSet", sts[-1])[
            "spec"]["replicas"]))
    elif action == "rolling" and sts:
        world.statefulset_rolling(sts[-1])
    elif action == "job" and running_jobs:
        world.job_done(running_jobs[0], ok=arg)
    elif action == "cron" and world.names("CronJob"):
        world.cron_run(ok=arg)
    elif action == "advance":
        world.advance(minutes=arg)
    elif action == "version":
        world.edit(version=arg)
    elif action == "replicas":
        world.edit(replicas=arg)
    elif action == "schedule":
        world.edit(backup={"schedule": arg, "retention": 7})
    elif action == "database-name":
        world.edit(databaseName=arg)
    elif action == "storage":
        world.edit(storage={"size": arg})
    elif action == "delete-secret":
        world.objects.pop(("Secret", "orders-credentials"), None)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ACTIONS, st.sampled_from(["Snapshot", "Retain", "Delete"]), st.booleans())
def test_reconciling_converges_and_passwords_and_database_name_never_change(
        actions: list[tuple[str, Any]], policy: str, snapshots: bool) -> None:
    world = World(database(deletionPolicy=policy), snapshot_api=snapshots)
    world.converge()
    first = passwords(world)
    assert set(first) == {"password", "superuser-password", "replication-password"}
    secret_lost = False
    initialized_as = None  # the database name the Secret had when first initialized
    for action, arg in actions:
        act(world, action, arg)
        secret_lost |= action == "delete-secret"
        settled = world.converge()
        again = world.snapshot()
        repeat = world.reconcile()
        assert world.snapshot() == again, f"a second reconcile changed something after {action}"
        assert repeat.events == [] and not repeat.deletions
        assert settled.children is None or all(
            world.objects[world.key(c)]["metadata"]["labels"]["app.kubernetes.io/managed-by"]
            == "eventop" for c in settled.children)
        if not secret_lost:
            assert passwords(world) == first
            if world.condition("Initialized")["status"] == "True":
                name = world.get("Secret", "orders-credentials")["data"]["database"]
                initialized_as = initialized_as or name
                assert name == initialized_as, "the Secret's database changed after init"
    data_before = {n for n in world.names("PersistentVolumeClaim") if n.startswith("data-")}
    world.delete()
    for _ in range(20):
        if world.db is None:
            break
        world.reconcile()
        for name in world.names("VolumeSnapshot"):
            world.snapshot_done(name)
        for name in world.names("StatefulSet"):  # scaled to zero: its pods stop
            if world.get("StatefulSet", name)["spec"]["replicas"] == 0:
                world.statefulset_ready(name)
        for name in world.names("Job"):
            if "status" not in world.get("Job", name):
                world.job_done(name)
    assert world.db is None, world.db and world.db["status"].get("conditions")
    assert ("PersistentVolumeClaim", "orders-backups") in world.objects
    data_after = {n for n in world.names("PersistentVolumeClaim") if n.startswith("data-")}
    kept = world.objects.get(("Secret", "orders-credentials"))
    if policy == "Retain":
        assert data_after == data_before
    else:
        assert data_after == set()
    if policy == "Snapshot" and snapshots:
        sources = {world.get("VolumeSnapshot", n)["spec"]["source"]["persistentVolumeClaimName"]
                   for n in world.names("VolumeSnapshot")}
        assert sources == data_before
    if policy == "Delete":
        assert kept is None
    elif not secret_lost:
        assert kept is not None and Passwords.from_secret(kept) == first


def test_base64_round_trip_of_generated_passwords() -> None:
    world = World(database())
    world.converge()
    data = world.get("Secret", "orders-credentials")["data"]
    assert base64.b64decode(data["password"]).decode() == world.generated[0]
