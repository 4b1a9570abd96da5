"""The Database handler on the reconcile engine: what it declares, what it reads, and how a
:class:`~eventop.handlers.databases.lifecycle.Plan` becomes the engine's ``Desired``.

Everything it decides is in :mod:`~eventop.handlers.databases.lifecycle` (live) and
:mod:`~eventop.handlers.databases.deletion` (while the finalizer holds it); this module only
gathers the children from the cache and hands the plan over:

* owned children (Services, ConfigMap, StatefulSets, Jobs, the CronJob) are garbage
  collected with the Database and pruned when no longer wanted;
* the credentials Secret, the backup volume and deletion snapshots are written
  ``owned=False`` (labelled with the Database's uid instead): they outlive it. A Database
  created again under the same name adopts a Secret and backup volume an earlier one left;
* Jobs are created once, never updated (their pod template is immutable);
* data volumes are made by the StatefulSets and labelled with the Database's uid through the
  volume claim template, so the deletion policy can delete exactly these;
* the PersistentVolumes bound to its claims are patched (reclaim policy, see
  :mod:`~eventop.handlers.databases.volumes`), never owned: found by the claims'
  ``volumeName`` while it lives, by their ``claimRef`` (a scan) once it or its namespace is
  being deleted and the claims may be gone;
* the snapshot API is optional: without it, deletion takes a final backup, and readiness
  never waits for it.
"""

from __future__ import annotations

import secrets
from datetime import UTC, datetime
from typing import Any

from eventop.engine import PARENT_UID_LABEL, Child, Controller, Desired, Kind, Note, Outcome, Reads
from eventop.handlers.databases import lifecycle
from eventop.handlers.databases.jobs import SNAPSHOT_API
from eventop.handlers.databases.lifecycle import Plan
from eventop.handlers.databases.observe import Observed, bound_volumes, claim_of
from eventop.handlers.databases.spec import API_VERSION, FINALIZER, KIND, Names
from eventop.handlers.databases.workload import APP_NAME
from eventop.handlers.registry import Registry
from eventop.kube import (
    MANAGED_BY,
    MANAGED_BY_LABEL,
    is_owned_by,
    is_terminating,
    label_value,
    now_rfc3339,
    set_condition,
)

Obj = dict[str, Any]

registry = Registry()

# Of the kinds users have many of, only eventop's objects are cached and watched (what a
# Database makes carries this label, the Jobs its CronJob makes and its data volumes too).
# Secrets and ConfigMaps are not narrowed: a Secret someone else made at a Database's name
# must be seen to be left alone, and copy rules read them all anyway.
MANAGED = f"{MANAGED_BY_LABEL}={MANAGED_BY}"


def _ours(kind: str, **options: Any) -> Kind:
    return Kind.of(kind, selector=MANAGED, **options)


SNAPSHOT = _ours(f"{SNAPSHOT_API}/VolumeSnapshot", optional=True)

databases = Controller(
    "databases",
    parent=f"{API_VERSION}/{KIND}",
    owns=["v1/Secret", "v1/ConfigMap", _ours("v1/Service"), _ours("v1/PersistentVolumeClaim"),
          _ours("apps/v1/StatefulSet"), _ours("batch/v1/Job"), _ours("batch/v1/CronJob"),
          SNAPSHOT],
    # A claim's deletion (a namespace's, which takes them all, even while no router runs)
    # reclaims its volume: the PersistentVolumes whose data must outlive it are set to
    # Retain while the Database lives (see volumes).
    reads=["v1/Namespace", "v1/PersistentVolume",
           # its Services too, for the patch that puts back a port edited by hand (see
           # guards.service_ports; patches are declared as reads), and its data volumes'
           # claims, for the patch that adopts an earlier Database's (lifecycle.keep_volumes)
           _ours("v1/Service"), _ours("v1/PersistentVolumeClaim")],
    finalizer=FINALIZER,
    registry=registry,
    module=__name__,
)


def new_password() -> str:
    return secrets.token_urlsafe(24)


def observe(db: Obj, reads: Reads, now: datetime | None = None) -> Observed:
    """The Database's children as the cache holds them (no API request)."""
    meta = db["metadata"]
    ns = meta["namespace"]
    instance = {"app.kubernetes.io/instance": label_value(meta["name"]),
                "app.kubernetes.io/name": APP_NAME, MANAGED_BY_LABEL: MANAGED_BY}
    names = Names.of(meta["name"])
    terminating = is_terminating(reads.get("v1/Namespace", ns))
    data_pvcs = reads.list("v1/PersistentVolumeClaim", ns, labels={
        **instance, "app.kubernetes.io/component": "server"})
    backup_pvc = reads.get("v1/PersistentVolumeClaim", names.backup_pvc, ns)
    deleting = bool(meta.get("deletionTimestamp"))
    if deleting or terminating:
        # by their claimRef: found even once the claims are gone (a scan of every
        # PersistentVolume, made only by a deletion)
        volumes = reads.list("v1/PersistentVolume")
    else:  # a live Database's: by the names its bound claims give (volumes.patches)
        volumes = [pv for pv in (reads.get("v1/PersistentVolume", name) for name in sorted({
            str(pvc["spec"]["volumeName"]) for pvc in [*data_pvcs, backup_pvc]
            if pvc and (pvc.get("spec") or {}).get("volumeName")})) if pv is not None]
    # servers labelled as its own that it does not own: its own orphaned by --cascade=orphan,
    # or an earlier Database's of its name (see Observed)
    foreign = [sts for sts in (reads.list("apps/v1/StatefulSet", ns, labels=instance)
                               if deleting else [])
               if not is_owned_by(sts, meta["uid"]) and not sts["metadata"].get(
                   "deletionTimestamp")]
    not_its_own: list[str] = []
    if deleting and not terminating:
        # A deletion acts only on the data volumes made for this very Database (their
        # claim template's uid): an earlier one's, kept and never adopted, or an orphaned
        # server's, are left as they are, with their PersistentVolumes.
        own = [p for p in data_pvcs
               if (p["metadata"].get("labels") or {}).get(PARENT_UID_LABEL) == meta["uid"]]
        not_its_own = sorted(p["metadata"]["name"] for p in data_pvcs if p not in own)
        data_pvcs = own
    # the CronJob's Jobs are owned by the CronJob: found by their labels
    jobs = reads.list("batch/v1/Job", ns, labels=instance)
    stale = next((j for j in jobs if j["metadata"]["name"] == names.init_job
                  and not is_owned_by(j, meta["uid"])), None)
    return Observed(
        now=now or datetime.now(UTC),
        secret=reads.get("v1/Secret", names.secret, ns),
        statefulsets=reads.children("apps/v1/StatefulSet"),
        jobs=[j for j in jobs if j is not stale],
        stale_init_job=stale,
        cronjob=next(iter(reads.children("batch/v1/CronJob")), None),
        data_pvcs=data_pvcs,
        backup_pvc=backup_pvc,
        snapshots=reads.list(SNAPSHOT, ns, labels=instance) if reads.served(SNAPSHOT)
        else None,
        volumes=[pv for pv in bound_volumes(volumes, ns, names)
                 if claim_of(pv) not in not_its_own],
        foreign_claims=not_its_own,
        foreign_servers=foreign,
        namespace_terminating=terminating,
        services=reads.children("v1/Service"),
        neighbours=[other for other in reads.list(f"{API_VERSION}/{KIND}", ns)
                    if other["metadata"]["name"] != meta["name"]],
        orphaned_servers=[sts for sts in foreign if made_for(sts, meta["uid"])],
    )


def made_for(sts: Obj, uid: str) -> bool:
    """A server StatefulSet made for the Database of this uid (its claim template carries
    the uid), not one an earlier Database of the same name left behind."""
    templates = (sts.get("spec") or {}).get("volumeClaimTemplates") or []
    return any(((t.get("metadata") or {}).get("labels") or {}).get(PARENT_UID_LABEL) == uid
               for t in templates)


def desired(result: Plan, observed: Observed, db: Obj) -> Desired:
    children: list[Child] = []
    for obj in result.children or []:
        job = obj["kind"] == "Job"
        if (obj["kind"], obj["metadata"]["name"]) in result.held:
            # its ports are being put back by a patch this run: an apply now would be
            # refused (see guards.service_ports); the next run applies it
            children.append(Child(obj, matches=lambda existing, desired: True))
        else:
            children.append(Child(obj, mode="create" if job else "apply", force=not job))
    children += [kept(obj, observed) for obj in result.kept]
    return Desired(
        children=children, prune=result.children is not None,
        status=(lambda outcome: with_outcome(result.status, outcome, backup_children(db)))
        if result.status is not None else None,
        # decided from the children as the cache held them before this run's writes (a
        # CronJob it creates is "not scheduled" yet): the run after its writes says more
        status_seen_before_writes=True,
        events=[Note(kind, reason, message, every_run=reason in lifecycle.ACTION_EVENTS)
                for kind, reason, message in result.events],
        delete=list(result.deletions),
        # its PersistentVolumes' reclaim policy (see volumes): a live Database's too
        patch=list(result.patches),
        requeue_after=result.requeue_after, done=result.finalize)


def backup_children(db: Obj) -> set[tuple[str, str]]:
    """(kind, name) of the children that do not serve clients, the backup CronJob and the
    backup volume's claim: a write of theirs refused (a claim that can not be resized) is
    about the backups, not about whether the servers serve."""
    names = Names.of(db["metadata"]["name"])
    return {("CronJob", names.backup_cronjob), ("PersistentVolumeClaim", names.backup_pvc)}


def with_outcome(status: Obj, outcome: Outcome,
                 backup: set[tuple[str, str]] | frozenset[tuple[str, str]] = frozenset()
                 ) -> Obj:
    """The status, with ``Ready`` False while a serving child could not be written: an
    object of someone else's at its name (a Service ``pay`` made by hand: the Database
    would report an endpoint that is not its own), or a write the API server refused.

    A backup child's (the backup CronJob, the backup volume's claim) is reported in
    ``BackupHealthy`` instead: the servers serve all the same, and a Database whose every
    server was ready read ``Ready=False``, phase Degraded, over a refused resize of its
    backup volume (found on a real v1.24 API server). The engine posts the Warning Event
    of each refused write."""
    problems = [*((c, "ChildConflict", f"{c.kind} {c} exists and is not this Database's: "
                   "left unchanged; delete or rename it to let eventop manage it")
                  for c in outcome.conflicts),
                *((r, "WriteRefused", f"the API server refused to {r}")
                  for r in outcome.refused)]
    backups = [p for p in problems if (p[0].kind, p[0].name) in backup]
    serving = [p for p in problems if (p[0].kind, p[0].name) not in backup]
    conditions = status.get("conditions")
    phase = status.get("phase")
    for found, type_, prefix in ((serving, "Ready", ""), (backups, "BackupHealthy", "Backup")):
        if not found:
            continue
        _, reason, message = found[0]
        if len(found) > 1:
            message += f" (and {len(found) - 1} more, see the Events)"
        conditions = set_condition(conditions, type_, "False", prefix + reason, message,
                                   now_rfc3339(), status.get("observedGeneration"))
        if type_ == "Ready" and phase == "Ready":
            phase = "Degraded"
    if conditions is status.get("conditions"):
        return status
    return {**status, "conditions": conditions, "phase": phase}


def kept(obj: Obj, observed: Observed) -> Child:
    """An object that outlives the Database. A credentials Secret this run generated
    passwords for is only ever created: if another router process (or a cache that has not
    seen it yet) made one meanwhile, that one stays, because a server may already have
    started with its passwords. An existing Secret is applied with the passwords it has."""
    fresh_secret = obj["kind"] == "Secret" and observed.secret is None
    return Child(obj, owned=False, force=True, mode="create" if fresh_secret else "apply")


@databases.reconcile
def reconcile(db: Obj, reads: Reads) -> Desired:
    observed = observe(db, reads)
    return desired(lifecycle.plan(db, observed, new_password), observed, db)


@databases.finalize
def finalize(db: Obj, reads: Reads) -> Desired:
    observed = observe(db, reads)
    return desired(lifecycle.plan(db, observed, new_password), observed, db)


@databases.adopts
def adopts(db: Obj, existing: Obj) -> bool:
    """A credentials Secret or backup volume an earlier Database of this name kept (Retain,
    Snapshot) is taken over, passwords and backups included; nothing else."""
    return existing.get("kind") in ("Secret", "PersistentVolumeClaim") and lifecycle.is_ours(
        existing, db)


@databases.maps("batch/v1/Job", selector=MANAGED)
@databases.maps("v1/PersistentVolumeClaim", selector=MANAGED)
def database_of(obj: Obj, reads: Reads) -> list[Obj]:
    """A backup Job the CronJob made, a data volume: the Database of their labels."""
    meta = obj.get("metadata") or {}
    instance = (meta.get("labels") or {}).get("app.kubernetes.io/instance")
    return [db for db in reads.list(f"{API_VERSION}/{KIND}", meta.get("namespace"))
            if label_value(db["metadata"]["name"]) == instance]


@databases.maps("v1/Namespace")
def databases_of_deleted_namespace(namespace: Obj, reads: Reads) -> list[Obj]:
    """A namespace being deleted: its Databases, at once (their volumes, see
    deletion._keep_volumes, mostly set to Retain already while they lived); any other
    namespace change concerns none."""
    if not is_terminating(namespace):
        return []
    return reads.list(f"{API_VERSION}/{KIND}", namespace["metadata"]["name"])


@databases.maps(SNAPSHOT)
def database_of_snapshot(obj: Obj, reads: Reads) -> list[Obj]:
    return database_of(obj, reads)
