"""Backup history in the status, and BackupHealthy: false when the last scheduled backup
failed or none succeeded within two schedule periods."""

from __future__ import annotations

from tests.databases.test_lifecycle import created
from tests.databases.world import World, database


def health(world: World) -> tuple[str, str]:
    cond = world.condition("BackupHealthy")
    return cond["status"], cond["reason"]


def test_backups_start_once_initialized_and_are_awaited_for_two_periods() -> None:
    world = World(database())
    world.converge()
    assert health(world) == ("Unknown", "NotScheduled")
    world.statefulset_ready("orders-pg16")
    world.converge()
    world.job_done("orders-init")
    world.converge()
    assert health(world) == ("Unknown", "AwaitingFirstBackup")
    world.advance(days=1)
    world.converge()
    assert health(world) == ("Unknown", "AwaitingFirstBackup")
    world.advance(days=1)
    world.converge()
    assert health(world) == ("False", "NoRecentBackup")
    assert "two schedule periods" in world.condition("BackupHealthy")["message"]


def test_a_first_backup_under_way_is_said_to_be_running_not_still_to_come() -> None:
    world = created(World(database()))
    world.advance(hours=14)
    job = world.cron_run(finish=False)
    world.converge()
    assert health(world) == ("Unknown", "AwaitingFirstBackup")
    assert world.condition("BackupHealthy")["message"] == \
        f"the first backup, Job {job}, is running"


def test_each_backup_job_is_reflected_in_the_status() -> None:
    world = created(World(database()))
    world.advance(hours=14)  # 2026-11-21T00:00
    job = world.cron_run()
    world.converge()
    status = world.db["status"]
    assert status["lastBackup"] == {"time": "2026-11-21T00:00:00Z", "result": "Succeeded",
                                    "job": job}
    assert status["lastSuccessfulBackup"] == "2026-11-21T00:00:00Z"
    assert health(world) == ("True", "BackupSucceeded")
    world.advance(days=1)
    failed = world.cron_run(ok=False)
    world.converge()
    status = world.db["status"]
    assert status["lastBackup"]["result"] == "Failed" and status["lastBackup"]["job"] == failed
    assert status["lastSuccessfulBackup"] == "2026-11-21T00:00:00Z"
    assert health(world) == ("False", "BackupFailed")
    assert failed in world.condition("BackupHealthy")["message"]
    assert [r for t, r, _ in world.events if t == "Warning"] == ["BackupFailed"]
    world.advance(days=1)
    world.cron_run()
    world.converge()
    assert health(world) == ("True", "BackupSucceeded")
    assert ("Normal", "Recovered") in [(t, r) for t, r, _ in world.events]


def test_the_last_success_is_remembered_after_its_job_is_gone() -> None:
    world = created(World(database()))
    world.advance(hours=14)
    job = world.cron_run()
    world.converge()
    del world.objects[("Job", job)]  # the CronJob's history limit removed it
    world.advance(hours=12)
    world.converge()
    assert world.db["status"]["lastSuccessfulBackup"] == "2026-11-21T00:00:00Z"
    assert health(world) == ("True", "BackupSucceeded")


def test_a_success_older_than_two_periods_is_not_healthy() -> None:
    world = created(World(database(backup={"schedule": "@hourly", "retention": 3})))
    world.advance(hours=1)
    world.cron_run()
    world.converge()
    assert health(world) == ("True", "BackupSucceeded")
    world.advance(hours=2, minutes=30)
    world.converge()
    assert health(world) == ("False", "NoRecentBackup")


def test_a_time_driven_recheck_is_asked_for_the_next_tick() -> None:
    world = created(World(database(backup={"schedule": "30 2 * * *", "retention": 3})))
    plan = world.reconcile()
    # now 10:00, next tick 02:30 the next day: 16.5 hours, plus a minute of slack
    assert plan.requeue_after == 16.5 * 3600 + 60


def backup_claim_size(world: World) -> str:
    claim = world.get("PersistentVolumeClaim", "orders-backups")
    return str(claim["spec"]["resources"]["requests"]["storage"])


def test_a_changed_storage_size_leaves_the_backup_volume_as_it_is() -> None:
    """The backup volume's size defaults to storage.size only when it is made: re-applied
    with a new storage.size it was refused (a claim never shrinks; growing needs an
    expandable class), and a healthy Database turned Degraded every 30 seconds."""
    world = created(World(database()))
    assert backup_claim_size(world) == "5Gi"
    for size in ("50Gi", "1Gi"):
        world.edit(storage={"size": size})
        world.converge()
        assert backup_claim_size(world) == "5Gi"
    assert world.db["status"]["phase"] == "Ready"


def test_the_backup_volume_grows_only_when_backup_storage_size_asks_for_more() -> None:
    world = created(World(database()))
    world.edit(backup={"schedule": "0 0 * * *", "retention": 7, "storage": {"size": "20Gi"}})
    world.converge()
    assert backup_claim_size(world) == "20Gi"
    world.edit(backup={"schedule": "0 0 * * *", "retention": 7, "storage": {"size": "10Gi"}})
    world.converge()
    assert backup_claim_size(world) == "20Gi"  # never shrunk: the API server refuses that


def test_a_new_backup_volume_takes_backup_storage_size_else_storage_size() -> None:
    world = World(database(storage={"size": "3Gi"}))
    world.converge()
    assert backup_claim_size(world) == "3Gi"
    other = World(database(backup={"schedule": "0 0 * * *", "storage": {"size": "8Gi"}}))
    other.converge()
    assert backup_claim_size(other) == "8Gi"


def test_a_cronjob_deleted_by_hand_and_made_again_does_not_await_a_first_backup() -> None:
    """After the CronJob was deleted by hand (and made again), BackupHealthy said the first
    backup was still to come although lastSuccessfulBackup existed (found on a real v1.24
    API server)."""
    world = created(World(database()))
    world.advance(hours=14)
    job = world.cron_run()
    world.converge()
    del world.objects[("Job", job)]  # (its Jobs go with it)
    del world.objects[("CronJob", "orders-backup")]
    world.advance(days=2, hours=1)  # its successor made now: no backup in two periods
    world.converge()
    world.converge()
    assert "CronJob" in {k for k, _ in world.objects}
    assert health(world) == ("False", "NoRecentBackup")
    assert "the last one at 2026-11-21T00:00:00Z" in world.condition("BackupHealthy")["message"]


def test_the_last_backup_never_goes_back_to_an_older_job() -> None:
    world = created(World(database()))
    world.advance(hours=14)
    older = world.cron_run()
    world.advance(days=1)
    newer = world.cron_run()
    world.converge()
    assert world.db["status"]["lastBackup"]["job"] == newer
    del world.objects[("Job", newer)]  # deleted by hand, or by the history limit
    world.converge()
    assert world.db["status"]["lastBackup"]["job"] == newer
    assert world.db["status"]["lastBackup"]["time"] == "2026-11-22T00:00:00Z"
    assert older in world.names("Job")


def test_a_cronjob_suspended_by_hand_is_named_when_no_backup_is_recent() -> None:
    """The handler leaves a suspension alone (see the README) and says it is why."""
    world = created(World(database()))
    world.advance(hours=14)
    world.cron_run()
    world.converge()
    suspend(world)
    world.reconcile()
    assert health(world) == ("True", "BackupSucceeded")
    assert "CronJob orders-backup is suspended" in world.condition("BackupHealthy")["message"]
    world.advance(days=2, hours=1)
    suspend(world)
    world.reconcile()
    assert health(world) == ("False", "NoRecentBackup")
    message = world.condition("BackupHealthy")["message"]
    assert "CronJob orders-backup is suspended (spec.suspend, set by hand)" in message
    ns = world.db["metadata"]["namespace"]  # the hint runs as written, from any namespace
    assert f"(kubectl -n {ns} patch cronjob orders-backup -p " in message


def suspend(world: World) -> None:
    """``kubectl patch cronjob --patch '{"spec":{"suspend":true}}'``: another manager's field,
    which the handler's apply leaves (this World's apply replaces the object whole, so the
    test suspends it again before each run)."""
    world.get("CronJob", "orders-backup")["spec"]["suspend"] = True


def test_each_failed_backup_job_gets_its_own_warning_and_a_still_failed_one_none() -> None:
    """A trial: the second failed backup Job changed the status, but the only Warning, with
    count 1, named the first: someone alerting on Events saw one failure."""
    world = created(World(database()))
    world.advance(hours=14)
    first = world.cron_run(ok=False)
    world.converge()
    world.advance(days=1)
    second = world.cron_run(ok=False)
    world.converge()
    assert health(world) == ("False", "BackupFailed")
    warnings = [m for t, r, m in world.events if t == "Warning" and r == "BackupFailed"]
    assert [first in warnings[0], second in warnings[1]] == [True, True] and len(warnings) == 2
    world.advance(hours=1)  # no new Job: the same failure goes on, said once
    world.converge()
    assert len([r for t, r, _ in world.events if r == "BackupFailed"]) == 2


def test_a_backup_job_that_hangs_is_named_with_what_to_do() -> None:
    """A trial: a backup Job running for good blocked every later one (the CronJob's
    concurrencyPolicy is Forbid); NoRecentBackup said so on time, but never named the Job."""
    world = created(World(database()))
    world.advance(hours=14)
    world.cron_run()
    world.converge()
    world.advance(days=1)
    hung = world.cron_run(finish=False)
    world.converge()
    assert health(world) == ("True", "BackupSucceeded")  # one tick late is not a problem yet
    world.advance(days=2)
    world.converge()
    assert health(world) == ("False", "NoRecentBackup")
    assert world.condition("BackupHealthy")["message"].endswith(
        f"; Job {hung} is still running and the CronJob starts no other backup meanwhile "
        "(concurrencyPolicy Forbid): delete it if it hangs")



def test_a_failed_backup_saying_more_later_is_not_a_new_warning() -> None:
    """The same failed Job, its message grown by the next Job hanging: one Warning (a
    verification run saw a second one for the same Job)."""
    world = created(World(database()))
    world.advance(hours=14)
    failed = world.cron_run(ok=False)
    world.converge()
    world.advance(days=1)
    world.cron_run(finish=False)  # after the failure, the next Job hangs
    world.advance(days=2)
    world.converge()
    message = world.condition("BackupHealthy")["message"]
    assert health(world) == ("False", "BackupFailed") and "still running" in message
    [warning] = [m for _t, r, m in world.events if r == "BackupFailed"]
    assert failed in warning
