"""A Database's life, walked through with the controllers played by the test (no API server):
creation, initialization, backups, scaling, minor and major upgrades, a refused downgrade."""

from __future__ import annotations

import base64

import pytest

from tests.databases.world import World, database


def created(world: World) -> World:
    world.converge()
    world.statefulset_ready(world.names("StatefulSet")[0])
    world.converge()
    world.job_done("orders-init")
    world.converge()
    return world


def secret_value(world: World, key: str) -> str:
    return base64.b64decode(world.get("Secret", "orders-credentials")["data"][key]).decode()


def test_a_new_database_gets_its_server_then_init_job_then_backups() -> None:
    world = World(database())
    world.converge()
    assert world.names("StatefulSet") == ["orders-pg16"]
    assert set(world.names("Service")) == {"orders", "orders-hl"}
    assert world.names("Job") == []  # nothing to initialize until the primary is ready
    assert world.names("CronJob") == []
    assert world.db["status"]["phase"] == "Creating"
    world.statefulset_ready("orders-pg16")
    world.converge()
    assert world.names("Job") == ["orders-init"]
    assert world.db["status"]["phase"] == "Initializing"
    world.job_done("orders-init")
    world.converge()
    assert world.names("CronJob") == ["orders-backup"]
    assert world.condition("Initialized")["status"] == "True"
    assert world.condition("Ready")["status"] == "True"
    assert world.db["status"]["phase"] == "Ready"
    assert world.db["status"]["version"] == "16.11"
    assert world.db["status"]["endpoint"] == "orders.shop.svc:5432"
    assert ("Normal", "Initialized") in [(t, r) for t, r, _ in world.events]


def test_the_backup_volume_and_the_secret_are_never_owned_and_the_rest_is() -> None:
    world = created(World(database()))
    for kept in (("PersistentVolumeClaim", "orders-backups"), ("Secret", "orders-credentials")):
        assert kept in world.objects and kept not in world.owned
    assert {("StatefulSet", "orders-pg16"), ("ConfigMap", "orders-config"),
            ("CronJob", "orders-backup"), ("Service", "orders")} <= world.owned


def test_passwords_are_generated_once_and_kept() -> None:
    world = created(World(database()))
    first = {k: secret_value(world, k) for k in ("password", "superuser-password",
                                                 "replication-password")}
    assert len(set(first.values())) == 3
    world.edit(port=6543, replicas=3)
    world.converge()
    assert {k: secret_value(world, k) for k in first} == first
    assert secret_value(world, "port") == "6543"
    assert world.generated == sorted(first.values())


def test_init_failure_is_reported_and_rerun_when_the_job_is_deleted() -> None:
    world = World(database())
    world.converge()
    world.statefulset_ready("orders-pg16")
    world.converge()
    world.job_done("orders-init", ok=False)
    world.converge()
    assert world.condition("Initialized")["reason"] == "InitFailed"
    assert ("Warning", "InitFailed") in [(t, r) for t, r, _ in world.events]
    assert world.names("CronJob") == []
    del world.objects[("Job", "orders-init")]
    world.converge()
    assert world.names("Job") == ["orders-init"]  # created again
    world.job_done("orders-init")
    world.converge()
    assert world.condition("Initialized")["status"] == "True"


def test_the_init_job_runs_once_per_database() -> None:
    world = created(World(database()))
    del world.objects[("Job", "orders-init")]  # e.g. removed by hand
    world.converge()
    assert world.names("Job") == []
    assert world.condition("Initialized")["status"] == "True"


def test_scaling_changes_replicas_and_readiness_follows_the_standbys() -> None:
    world = created(World(database()))
    world.edit(replicas=3)
    world.converge()
    assert world.get("StatefulSet", "orders-pg16")["spec"]["replicas"] == 3
    world.statefulset_ready("orders-pg16", ready=1)
    world.converge()
    assert world.condition("Ready")["reason"] == "StandbysNotReady"
    assert world.db["status"]["phase"] == "Degraded"
    world.statefulset_ready("orders-pg16")
    world.converge()
    assert world.db["status"]["phase"] == "Ready"
    assert world.db["status"]["readyReplicas"] == 3


def test_a_minor_upgrade_backs_up_first_then_rolls_the_servers() -> None:
    world = created(World(database(version="16.9")))
    assert world.db["status"]["version"] == "16.9"
    world.edit(version="16.11")
    world.converge()
    backup = [n for n in world.names("Job") if n.startswith("orders-backup-16-11-")]
    assert len(backup) == 1
    image = world.get("StatefulSet", "orders-pg16")["spec"]["template"]["spec"]["containers"][0]
    assert image["image"].endswith(":16.9"), "rolled before the backup finished"
    assert world.condition("Progressing")["reason"] == "BackingUp"
    assert world.db["status"]["phase"] == "Upgrading"
    world.job_done(backup[0])
    world.converge()
    sts = world.get("StatefulSet", "orders-pg16")
    assert sts["spec"]["template"]["spec"]["containers"][0]["image"].endswith(":16.11")
    world.statefulset_rolling("orders-pg16")
    world.converge()
    assert world.condition("Progressing")["reason"] == "RollingUpdate"
    assert world.db["status"]["version"] == "16.9"
    cron_image = world.get("CronJob", "orders-backup")["spec"]["jobTemplate"]["spec"][
        "template"]["spec"]["containers"][0]["image"]
    assert cron_image.endswith(":16.9")  # backs up the servers still running 16.9
    world.statefulset_ready("orders-pg16")
    world.converge()
    assert world.db["status"]["version"] == "16.11"
    assert world.condition("Progressing")["reason"] == "Stable"
    cron_image = world.get("CronJob", "orders-backup")["spec"]["jobTemplate"]["spec"][
        "template"]["spec"]["containers"][0]["image"]
    assert cron_image.endswith(":16.11")
    assert ("Normal", "Upgraded") in [(t, r) for t, r, _ in world.events]


def test_a_failed_backup_before_an_upgrade_stops_it() -> None:
    world = created(World(database(version="16.9")))
    world.edit(version="16.11")
    world.converge()
    backup = next(n for n in world.names("Job") if n.startswith("orders-backup-16-11-"))
    world.job_done(backup, ok=False)
    world.converge()
    assert world.condition("Progressing")["reason"] == "UpgradeBackupFailed"
    assert world.get("StatefulSet", "orders-pg16")["spec"]["template"]["spec"]["containers"][
        0]["image"].endswith(":16.9")
    assert ("Warning", "UpgradeBackupFailed") in [(t, r) for t, r, _ in world.events]


def test_a_major_upgrade_copies_into_new_volumes_then_switches() -> None:
    world = created(World(database()))
    world.edit(version="17")
    world.converge()
    backup = next(n for n in world.names("Job") if n.startswith("orders-backup-17-7-"))
    assert world.names("StatefulSet") == ["orders-pg16"]
    world.job_done(backup)
    world.converge()
    assert world.names("StatefulSet") == ["orders-pg16", "orders-pg17"]
    assert world.condition("Progressing")["reason"] == "StartingNewServer"
    assert "orders-upgrade-pg17" not in world.names("Job")
    world.statefulset_ready("orders-pg17")
    world.converge()
    job = world.get("Job", "orders-upgrade-pg17")
    container = job["spec"]["template"]["spec"]["containers"][0]
    assert container["image"].endswith(":17.7")
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["OLD_HOST"] == "orders-pg16-0.orders-hl"
    assert env["NEW_HOST"] == "orders-pg17-0.orders-hl"
    service = world.get("Service", "orders")
    assert service["spec"]["selector"]["statefulset.kubernetes.io/pod-name"] == "orders-pg16-0"
    assert world.db["status"]["version"] == "16.11"
    world.job_done("orders-upgrade-pg17")
    world.converge()
    assert world.names("StatefulSet") == ["orders-pg17"]
    assert world.get("Service", "orders")["spec"]["selector"][
        "statefulset.kubernetes.io/pod-name"] == "orders-pg17-0"
    assert world.db["status"]["version"] == "17.7"
    assert world.get("CronJob", "orders-backup")["spec"]["jobTemplate"]["spec"]["template"][
        "spec"]["containers"][0]["image"].endswith(":17.7")
    assert ("PersistentVolumeClaim", "data-orders-pg16-0") in world.objects  # a way back
    assert {"Upgraded", "OldVolumesKept"} <= {r for _, r, _ in world.events}


def test_a_failed_major_upgrade_keeps_the_old_server_serving() -> None:
    world = created(World(database()))
    world.edit(version="17")
    world.converge()
    world.backed_up_and_rolled("17", "orders-pg17")
    world.job_done("orders-upgrade-pg17", ok=False)
    world.converge()
    assert world.condition("Progressing")["reason"] == "UpgradeFailed"
    assert world.db["status"]["version"] == "16.11"
    assert world.get("Service", "orders")["spec"]["selector"][
        "statefulset.kubernetes.io/pod-name"] == "orders-pg16-0"


def test_lowering_the_version_is_refused_and_nothing_changes() -> None:
    world = created(World(database(version="17")))
    before = world.get("StatefulSet", "orders-pg17")["spec"]
    world.edit(version="16")
    world.converge()
    cond = world.condition("Progressing")
    assert (cond["status"], cond["reason"]) == ("False", "DowngradeRefused")
    assert "lower than the running 17.7" in cond["message"]
    assert world.names("StatefulSet") == ["orders-pg17"]
    assert world.get("StatefulSet", "orders-pg17")["spec"] == before
    assert world.db["status"]["phase"] == "Ready"
    assert ("Warning", "DowngradeRefused") in [(t, r) for t, r, _ in world.events]


def test_a_version_changed_before_anything_ran_needs_no_upgrade() -> None:
    world = World(database())
    world.converge()
    world.edit(version="17")
    world.converge()
    assert world.names("StatefulSet") == ["orders-pg17"]
    assert world.names("Job") == []


def test_an_invalid_spec_changes_no_child_and_says_why() -> None:
    world = created(World(database()))
    objects = dict(world.objects)
    world.edit(backup={"schedule": "61 * * * *", "retention": 7})
    world.converge()
    assert world.objects == objects
    ready = world.condition("Ready")
    assert (ready["status"], ready["reason"]) == ("False", "InvalidSchedule")
    assert "minute '61' is outside 0-59" in ready["message"]
    assert world.db["status"]["phase"] == "Failed"
    assert world.condition("Initialized")["status"] == "True"


@pytest.mark.parametrize(("edit", "reason", "says"), [
    ({"resources": {"requests": {"cpu": "abc"}}}, "InvalidResources",
     "spec.resources.requests.cpu 'abc' is not a Kubernetes quantity"),
    ({"resources": {"requests": {"memory": "2Gi"}, "limits": {"memory": "1Gi"}}},
     "InvalidResources", "spec.resources.requests.memory '2Gi' is above its limit '1Gi'"),
    ({"storage": {"size": "0"}}, "InvalidStorage", "spec.storage.size '0' must be more than"),
])
def test_sizes_and_resources_the_api_server_would_refuse_are_an_invalid_spec(
        edit: dict, reason: str, says: str) -> None:
    # The CRD's schema lets them through; the API server would refuse the StatefulSet or
    # its pods, which only the StatefulSet's own Events would show
    world = World(database(**edit))
    world.converge()
    assert world.names("StatefulSet") == []
    ready = world.condition("Ready")
    assert (ready["status"], ready["reason"]) == ("False", reason)
    assert says in ready["message"]


def test_someone_elses_secret_at_the_name_is_left_alone() -> None:
    world = World(database())
    world.objects[("Secret", "orders-credentials")] = {
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "orders-credentials", "labels": {}}, "data": {"password": "eA=="}}
    world.converge()
    assert world.get("Secret", "orders-credentials")["data"] == {"password": "eA=="}
    assert world.condition("Ready")["reason"] == "SecretConflict"
    assert world.names("StatefulSet") == []


@pytest.mark.parametrize("name", ["postgres", "replicator", "template1", "pg_monitor"])
def test_a_reserved_database_name_is_refused_before_anything_is_made(name: str) -> None:
    """The init Job would make the superuser or the replication role the application's
    (no longer superuser, a new password)."""
    world = World(database(databaseName=name))
    world.converge()
    assert world.names("Job") == [] and world.names("StatefulSet") == []
    ready = world.condition("Ready")
    assert (ready["status"], ready["reason"]) == ("False", "InvalidDatabaseName")
    assert f"spec.databaseName {name!r} is reserved" in ready["message"]


def test_a_database_named_like_a_reserved_role_gets_a_database_name_of_its_own() -> None:
    from eventop.handlers.databases.spec import parse_spec

    assert parse_spec(database("postgres")).database_name == "db_postgres"
    assert parse_spec(database("orders")).database_name == "orders"


def test_a_database_name_changed_after_initialization_is_refused_and_the_secret_kept() -> None:
    """The init Job made role and database ``orders`` once; the Secret naming another
    would make every application login fail while the status said Ready."""
    world = created(World(database()))
    uri = secret_value(world, "uri")
    world.edit(databaseName="shop_orders")
    world.converge()
    assert (secret_value(world, "username"), secret_value(world, "database")) == (
        "orders", "orders")
    assert secret_value(world, "uri") == uri
    progressing = world.condition("Progressing")
    assert (progressing["status"], progressing["reason"]) == ("False", "DatabaseNameRefused")
    assert "Set spec.databaseName back to 'orders'" in progressing["message"]
    assert world.db["status"]["phase"] == "Ready"
    assert [(t, r) for t, r, _ in world.events].count(("Warning", "DatabaseNameRefused")) == 1
    world.edit(databaseName="orders")
    world.converge()
    assert world.condition("Progressing")["reason"] == "Stable"
    world.edit(databaseName="shop_orders", deletionPolicy="Retain")
    world.delete()
    world.converge()
    assert world.db is None and secret_value(world, "database") == "orders"  # kept as made


def test_a_database_name_changed_before_initialization_is_applied() -> None:
    world = World(database())
    world.converge()
    world.edit(databaseName="shop_orders")
    world.converge()
    world.statefulset_ready("orders-pg16")
    world.converge()
    env = world.get("Job", "orders-init")["spec"]["template"]["spec"]["containers"][0]["env"]
    assert {"name": "APP_DB", "value": "shop_orders"} in env
    assert secret_value(world, "database") == "shop_orders"
