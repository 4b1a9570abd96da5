"""A Database's status, and the Events its changes deserve, from what the lifecycle decided
and what the children report. Pure: one place decides every condition, phase and Event.

Conditions: ``Ready`` (every replica serves, the initial configuration is applied;
``ServersDown`` when servers that were ready are not, outside a planned change),
``Initialized`` (the init Job completed, once), ``BackupHealthy`` (the last scheduled backup
did not fail, and one succeeded within two schedule periods), ``Progressing`` (an upgrade or
a rollout in flight, or why the requested version, database name or storage class is not
the running one), and ``Deleting`` while the finalizer waits for the data to be kept.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from eventop.handlers.databases import observe
from eventop.handlers.databases.jobs import SCHEDULED
from eventop.handlers.databases.observe import COMPLETE, FAILED, RUNNING, Observed
from eventop.handlers.databases.schedule import next_tick, two_periods_ago
from eventop.handlers.databases.spec import SpecError, Version, describe, image_version
from eventop.kube import get_condition, parse_rfc3339, set_condition

Obj = dict[str, Any]
Condition = tuple[str, str, str]  # status ("True", "False", "Unknown"), reason, message
Event = tuple[str, str, str]  # type (Normal, Warning), reason, message

# Reasons that are a problem someone must look at: entering one posts a Warning Event.
WARNING_REASONS = {
    "InvalidSpec", "SecretConflict", "InitFailed", "BackupFailed", "NoRecentBackup",
    "DowngradeRefused", "DatabaseNameRefused", "UpgradeBackupFailed", "UpgradeFailed",
    "SnapshotFailed", "SnapshotTimedOut", "FinalBackupFailed", "ServersNotStopping",
    "NameCollision", "StorageClassImmutable", "ServersDown",
}

# Reasons whose message names the failed object first ("..., Job X, failed: ...; more"):
# another one (the next backup Job failing too) is a new failure, and gets its Warning,
# where a problem that only goes on (or says more about what follows) does not.
NEW_FAILURE_EACH_MESSAGE = {"BackupFailed"}


def _failed_object(cond: Obj) -> str:
    return str(cond.get("message", "")).split(" failed:", 1)[0]


@dataclass
class Facts:
    """What the lifecycle decided for this reconcile, for the status to report."""

    version: str | None = None
    image: str | None = None
    endpoint: str | None = None
    secret: str | None = None
    serving: Obj | None = None  # the StatefulSet that serves
    replicas: int = 1
    initialized: Condition = ("False", "WaitingForServer", "the server has not started yet")
    progressing: Condition = ("False", "Stable", "")
    deleting: Condition | None = None
    ready: Condition | None = None  # set only to override (invalid spec, conflict)
    phase: str | None = None  # set only to override
    schedule: str | None = None
    events: list[Event] = field(default_factory=list)


def backup_fields(observed: Observed, old: Obj) -> Obj:
    """``lastBackup`` (the most recent finished backup Job) and ``lastSuccessfulBackup``
    (kept in the status once seen: the CronJob keeps only a few Jobs)."""
    fields: Obj = {}
    jobs = observe.backup_jobs(observed)
    remembered = old.get("lastBackup") or None
    if jobs:
        last = jobs[-1]
        fields["lastBackup"] = {
            "time": observe.format_time(observe.job_finished(last)),  # type: ignore[arg-type]
            "result": "Succeeded" if observe.job_state(last) == COMPLETE else "Failed",
            "job": last["metadata"]["name"]}
        # Never back in time: once the CronJob's history limit removed the newest Jobs'
        # elders, or the newest one was deleted, an older Job is all that is left (found on
        # a real v1.24 API server: lastBackup went back to an older Job).
        before = parse_rfc3339((remembered or {}).get("time"))
        if before is not None and before > observe.job_finished(last):  # type: ignore[operator]
            fields["lastBackup"] = remembered
    elif remembered:
        fields["lastBackup"] = remembered
    successes = [observe.job_finished(j) for j in jobs if observe.job_state(j) == COMPLETE]
    previous = parse_rfc3339(old.get("lastSuccessfulBackup"))
    best = max([t for t in [*successes, previous] if t is not None], default=None)
    if best is not None:
        fields["lastSuccessfulBackup"] = observe.format_time(best)
    return fields


def backup_health(observed: Observed, schedule: str, last_success: datetime | None
                  ) -> tuple[Condition, float | None]:
    """(BackupHealthy, seconds until it must be looked at again even if nothing changes)."""
    if observed.cronjob is None:
        return ("Unknown", "NotScheduled", "backups start once the database is initialized"), None
    now = observed.now
    recheck = (next_tick(schedule, now) - now).total_seconds() + 60
    scheduled = [j for j in observe.backup_jobs(observed) if observe.backup_kind(j) == SCHEDULED]
    since = two_periods_ago(schedule, now)
    running = sorted((j for j in observed.jobs
                      if observe.backup_kind(j) == SCHEDULED and observe.job_state(j) == RUNNING),
                     key=lambda j: j["metadata"]["name"])
    # A backup Job that hangs blocks every later one (concurrencyPolicy: Forbid): named, with
    # what to do, once it has run through the tick after its own (started two periods ago).
    blocking = (f"; Job {running[0]['metadata']['name']} is still running and the CronJob "
                "starts no other backup meanwhile (concurrencyPolicy Forbid): delete it if it "
                "hangs" if running and (observe.job_started(running[0]) or now) <= since
                else "")
    if scheduled and observe.job_state(scheduled[-1]) == FAILED:
        job = scheduled[-1]
        return ("False", "BackupFailed",
                f"the last scheduled backup, Job {job['metadata']['name']}, failed: "
                f"{observe.job_failure(job)}; see its logs{blocking}"), recheck
    meta = observed.cronjob["metadata"]
    name = meta["name"]
    suspended = (f"; CronJob {name} is suspended (spec.suspend, set by hand): no scheduled "
                 f"backup runs until it is resumed (kubectl -n {meta.get('namespace')} patch "
                 f"cronjob {name} -p '{{\"spec\":{{\"suspend\":false}}}}')"
                 if (observed.cronjob.get("spec") or {}).get("suspend") else "")
    if last_success is not None and last_success >= since:
        return ("True", "BackupSucceeded",
                f"last backup succeeded at {observe.format_time(last_success)}{suspended}"
                ), recheck
    started = parse_rfc3339(meta.get("creationTimestamp"))
    # the first backup only while there never was one: a CronJob made again (deleted by
    # hand) is new, but the Database's backups are not
    if started is not None and started > since and last_success is None and not suspended:
        if running:
            return ("Unknown", "AwaitingFirstBackup",
                    f"the first backup, Job {running[-1]['metadata']['name']}, is running"
                    ), recheck
        return ("Unknown", "AwaitingFirstBackup",
                f"no backup yet; the first one runs at "
                f"{observe.format_time(next_tick(schedule, now))}"), recheck
    return ("False", "NoRecentBackup",
            f"no backup succeeded since {observe.format_time(since)} (two schedule periods of "
            f"{schedule!r})" + (f"; the last one at {observe.format_time(last_success)}"
                                if last_success else "") + blocking + suspended), recheck


def ready_condition(facts: Facts, want: int) -> Condition:
    if facts.ready is not None:
        return facts.ready
    if facts.deleting is not None:
        return ("False", "Deleting", "the Database is being deleted")
    ready = observe.ready_replicas(facts.serving)
    if facts.serving is None:
        return ("False", "Creating", "the StatefulSet does not exist yet")
    if ready == 0:
        return ("False", "ServerNotReady", f"0 of {want} servers ready")
    if facts.initialized[0] != "True":
        return ("False", "NotInitialized", facts.initialized[2])
    if ready < want:
        return ("False", "StandbysNotReady", f"{ready} of {want} servers ready")
    return ("True", "Running", f"{ready} of {want} servers ready at {facts.endpoint}")


def servers_down(ready: Condition, facts: Facts, old: Obj) -> Condition:
    """``ready``, as ``ServersDown`` when servers that were ready no longer are: fewer ready
    than the status said, while the Database is initialized and nothing planned (an
    upgrade, a rollout) takes them down; kept while they are not all back. Then entering
    it posts a Warning and leaving it a Normal Event; a server going down posted nothing
    (found on a real v1.24 API server: "0 of 1 servers ready" without a Warning). Not for
    servers that were never ready yet (a Database being created, scaled up)."""
    if ready[1] not in ("ServerNotReady", "StandbysNotReady") or facts.progressing[0] == "True" \
            or observe.rolling_out(facts.serving) or facts.initialized[0] != "True":
        # (the rollout read from the StatefulSet itself: Progressing says RollingOut only
        # while nothing else is to be said, and a rollout under StorageClassImmutable or
        # DatabaseNameRefused read as a Warning about servers going down)
        return ready
    before = get_condition(old, "Ready") or {}
    now = observe.ready_replicas(facts.serving)
    if now < int(old.get("readyReplicas") or 0) or before.get("reason") == "ServersDown":
        return ("False", "ServersDown", f"{ready[2]}: servers that were ready are not; see "
                                        "their pods' events and logs")
    return ready


def phase_of(facts: Facts, ready: Condition) -> str:
    if facts.phase:
        return facts.phase
    if facts.deleting is not None:
        return "Deleting"
    if facts.progressing[0] == "True":
        return "Upgrading"
    if ready[0] == "True":
        return "Ready"
    if facts.initialized[0] == "True":
        return "Degraded"
    if observe.ready_replicas(facts.serving) > 0:
        return "Initializing"
    return "Creating"


def compute(db: Obj, facts: Facts, observed: Observed, want_replicas: int
            ) -> tuple[Obj, list[Event], float | None]:
    """(the new status, the Events to post, seconds until the next time-driven look)."""
    old = dict(db.get("status") or {})
    generation = (db.get("metadata") or {}).get("generation")
    now = observe.format_time(observed.now)
    ready = servers_down(ready_condition(facts, want_replicas), facts, old)
    status: Obj = {"observedGeneration": generation, "phase": phase_of(facts, ready)}
    for key, value in (("version", facts.version), ("image", facts.image),
                       ("endpoint", facts.endpoint), ("credentialsSecret", facts.secret)):
        if value is not None:
            status[key] = value
    sts_status = (facts.serving or {}).get("status") or {}
    status["replicas"] = want_replicas
    status["readyReplicas"] = int(sts_status.get("readyReplicas") or 0)
    status.update(backup_fields(observed, old))
    conditions = old.get("conditions")
    recheck = None
    wanted: list[tuple[str, Condition]] = [("Ready", ready), ("Initialized", facts.initialized),
                                           ("Progressing", facts.progressing)]
    if facts.schedule is not None:
        health, recheck = backup_health(
            observed, facts.schedule, parse_rfc3339(status.get("lastSuccessfulBackup")))
        wanted.append(("BackupHealthy", health))
    if facts.deleting is not None:
        wanted.append(("Deleting", facts.deleting))
    for type_, (state, reason, message) in wanted:
        conditions = set_condition(conditions, type_, state, reason, message, now, generation)
    status["conditions"] = conditions
    return status, facts.events + transition_events(old, status), recheck


def transition_events(old: Obj, new: Obj) -> list[Event]:
    """A Warning when a condition enters a problem (or another one); a Normal Event when a
    problem clears, when the initial configuration is applied and when the version changes.
    Only on transitions, so a Database stuck on one problem posts it once."""
    events: list[Event] = []
    for cond in new.get("conditions") or []:
        before = get_condition(old, cond["type"]) or {}
        reason = cond.get("reason", "")
        if reason in WARNING_REASONS and (
                before.get("reason") != reason or before.get("status") != cond.get("status")
                or (reason in NEW_FAILURE_EACH_MESSAGE
                    and _failed_object(before) != _failed_object(cond))):
            warning = ("Warning", reason, str(cond.get("message", "")))
            if warning not in events:  # (one problem in two conditions: NameCollision)
                events.append(warning)
        elif before.get("reason") in WARNING_REASONS and reason not in WARNING_REASONS:
            events.append(("Normal", "Recovered",
                           f"{cond['type']}: {before.get('reason')} resolved ({reason})"))
    init_before = get_condition(old, "Initialized") or {}
    init_now = get_condition(new, "Initialized") or {}
    if init_now.get("status") == "True" and init_before.get("status") != "True":
        events.append(("Normal", "Initialized", str(init_now.get("message", ""))))
    if old.get("version") and new.get("version") and (
            old["version"] != new["version"]
            or (old.get("image") and new.get("image") and old["image"] != new["image"])) \
            and not _tag_read(old, new):
        # (an image whose tag names no version is named: its version is only spec.version's)
        events.append(("Normal", "Upgraded",
                       f"PostgreSQL {describe(old['version'], old.get('image'))} -> "
                       f"{describe(new['version'], new.get('image'))} now serves"))
    return events


def _tag_read(old: Obj, new: Obj) -> bool:
    """The version changed only because the image's tag is read now: a release before
    reported ``postgres:16.4`` under spec.version as written (``16``), the same image
    reads ``16.4``. Nothing was upgraded: an Upgraded Event would say so wrongly."""
    try:
        before, after = Version.parse(old["version"]), Version.parse(new["version"])
    except SpecError:
        return False
    return (after.major == before.major and after.minor is not None
            and old.get("image") == new.get("image")
            and image_version(new.get("image") or "") == after)
