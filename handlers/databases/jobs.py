"""The Database's Jobs, as pure functions: initial configuration, scheduled backups, the
backup before an upgrade or a deletion, the major-upgrade copy, and deletion snapshots.

Every Job runs the image of the server it talks to (the backup CronJob follows the server
through upgrades, never left on an old image), as the image's non-root user, with a deadline
so that a Job that can not finish fails visibly instead of hanging.
"""

from __future__ import annotations

from typing import Any

from eventop.handlers.databases import scripts
from eventop.handlers.databases.spec import DatabaseSpec, Names
from eventop.handlers.databases.workload import (
    SUPERUSER,
    container_security,
    meta,
    pod_security,
    secret_env,
)

Obj = dict[str, Any]

BACKUP_KIND_LABEL = "eventop.dev/backup"
SCHEDULED, PRE_UPGRADE, FINAL = "scheduled", "pre-upgrade", "final"

INIT_DEADLINE = 30 * 60
BACKUP_DEADLINE = 4 * 3600  # also the time a final backup may take before it is reported
UPGRADE_DEADLINE = 6 * 3600
JOB_RESOURCES: Obj = {"requests": {"cpu": "50m", "memory": "64Mi"},
                      "limits": {"memory": "512Mi"}}
SNAPSHOT_API = "snapshot.storage.k8s.io/v1"


def _connection_env(spec: DatabaseSpec, host: str) -> list[Obj]:
    return [{"name": "PGHOST", "value": host}, {"name": "PGPORT", "value": str(spec.port)},
            {"name": "PGUSER", "value": SUPERUSER},
            secret_env("PGPASSWORD", Names.of(spec.name).secret, "superuser-password")]


def _pod(image: str, script: str, env: list[Obj], labels: dict[str, str], *,
         backups_claim: str | None = None) -> Obj:
    mounts = [{"name": "tmp", "mountPath": "/tmp"}]
    volumes: list[Obj] = [{"name": "tmp", "emptyDir": {}}]
    if backups_claim:
        mounts.append({"name": "backups", "mountPath": scripts.BACKUP_DIR})
        volumes.append({"name": "backups",
                        "persistentVolumeClaim": {"claimName": backups_claim}})
    return {
        "metadata": {"labels": labels},
        "spec": {
            "restartPolicy": "Never",
            "enableServiceLinks": False,
            "automountServiceAccountToken": False,
            "securityContext": pod_security(),
            "containers": [{
                "name": "job", "image": image, "imagePullPolicy": "IfNotPresent",
                "command": ["bash", "-c", script], "env": env,
                "resources": JOB_RESOURCES, "securityContext": container_security(),
                "volumeMounts": mounts,
            }],
            "volumes": volumes,
        },
    }


def _job(spec: DatabaseSpec, name: str, component: str, pod: Obj, *, deadline: int,
         retries: int, extra_labels: dict[str, str] | None = None) -> Obj:
    return {
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": meta(spec, name, component, **(extra_labels or {})),
        "spec": {"backoffLimit": retries, "activeDeadlineSeconds": deadline, "template": pod},
    }


def init_job(spec: DatabaseSpec, version_image: tuple[str, str], major: int) -> Obj:
    """Creates the application role and database (and the standbys' replication role) on
    the primary; idempotent, run once per Database (its completion is ``Initialized``)."""
    names = Names.of(spec.name)
    env = [*_connection_env(spec, names.primary_host(major)),
           {"name": "APP_USER", "value": spec.user},
           {"name": "APP_DB", "value": spec.database_name},
           secret_env("APP_PASSWORD", names.secret, "password"),
           secret_env("REPLICATION_PASSWORD", names.secret, "replication-password")]
    labels = meta(spec, names.init_job, "init")["labels"]
    pod = _pod(version_image[1], scripts.INIT, env, labels)
    return _job(spec, names.init_job, "init", pod, deadline=INIT_DEADLINE, retries=6)


def _backup_pod(spec: DatabaseSpec, image: str, major: int, kind: str) -> Obj:
    names = Names.of(spec.name)
    env = [*_connection_env(spec, names.primary_host(major)),
           {"name": "BACKUP_KIND", "value": kind},
           {"name": "RETENTION", "value": str(spec.retention)},
           {"name": "BACKUP_DIR", "value": scripts.BACKUP_DIR}]
    labels = {**meta(spec, "", "backup")["labels"], BACKUP_KIND_LABEL: kind}
    return _pod(image, scripts.BACKUP, env, labels, backups_claim=names.backup_pvc)


def backup_cronjob(spec: DatabaseSpec, version_image: tuple[str, str], major: int) -> Obj:
    """Scheduled backups of the serving major, on its image. One at a time (Forbid); the
    three latest successful and failed Jobs stay, as the backup history in the status."""
    names = Names.of(spec.name)
    pod = _backup_pod(spec, version_image[1], major, SCHEDULED)
    job_labels = {**meta(spec, "", "backup")["labels"], BACKUP_KIND_LABEL: SCHEDULED}
    return {
        "apiVersion": "batch/v1", "kind": "CronJob",
        "metadata": meta(spec, names.backup_cronjob, "backup"),
        "spec": {
            "schedule": spec.schedule,
            "concurrencyPolicy": "Forbid",
            "startingDeadlineSeconds": 3600,
            "successfulJobsHistoryLimit": 3,
            "failedJobsHistoryLimit": 3,
            "jobTemplate": {
                "metadata": {"labels": job_labels},
                "spec": {"backoffLimit": 2, "activeDeadlineSeconds": BACKUP_DEADLINE,
                         "template": pod},
            },
        },
    }


def backup_job(spec: DatabaseSpec, name: str, version_image: tuple[str, str], major: int,
               kind: str) -> Obj:
    """A one-off backup (before an upgrade, or the final one before deletion), on the image
    of the server it dumps."""
    pod = _backup_pod(spec, version_image[1], major, kind)
    return _job(spec, name, "backup", pod, deadline=BACKUP_DEADLINE, retries=2,
                extra_labels={BACKUP_KIND_LABEL: kind})


def pre_upgrade_job(spec: DatabaseSpec, running: tuple[str, str]) -> Obj:
    """The backup before upgrading to what the spec asks, of the server that runs now."""
    major = int(running[0].split(".")[0])
    return backup_job(spec, Names.of(spec.name).pre_upgrade_job(spec.version, spec.image),
                      running, major, PRE_UPGRADE)


def final_backup_job(spec: DatabaseSpec, running: tuple[str, str]) -> Obj:
    major = int(running[0].split(".")[0])
    return backup_job(spec, Names.of(spec.name).final_backup_job, running, major, FINAL)


def upgrade_job(spec: DatabaseSpec, old_major: int, new: tuple[str, str]) -> Obj:
    """Copies every role and database from the old major's primary into the new one's, on
    the new image (see :data:`scripts.UPGRADE`)."""
    names = Names.of(spec.name)
    new_major = int(new[0].split(".")[0])
    env = [{"name": "OLD_HOST", "value": names.primary_host(old_major)},
           {"name": "NEW_HOST", "value": names.primary_host(new_major)},
           *_connection_env(spec, names.primary_host(new_major))]
    name = names.upgrade_job(new_major)
    labels = meta(spec, name, "upgrade")["labels"]
    pod = _pod(new[1], scripts.UPGRADE, env, labels)
    return _job(spec, name, "upgrade", pod, deadline=UPGRADE_DEADLINE, retries=0)


def volume_snapshot(spec: DatabaseSpec, pvc_name: str, db_uid: str) -> Obj:
    """A snapshot of one data volume, taken on deletion. Never owned: it outlives the
    Database (restore it with a PersistentVolumeClaim whose dataSource names it)."""
    names = Names.of(spec.name)
    body: Obj = {"source": {"persistentVolumeClaimName": pvc_name}}
    if spec.snapshot_class:
        body["volumeSnapshotClassName"] = spec.snapshot_class
    return {
        "apiVersion": SNAPSHOT_API, "kind": "VolumeSnapshot",
        "metadata": meta(spec, names.snapshot(pvc_name, db_uid), "snapshot"),
        "spec": body,
    }
