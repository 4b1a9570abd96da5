"""What deleting a Database does, one step per reconcile, while its finalizer holds it.

The finalizer is removed (``Plan.finalize``) only once the data is where
``spec.deletionPolicy`` says; until then the Database stays, with a ``Deleting`` condition
saying what it waits for. Nothing is ever deleted without its data kept first:

* ``Retain``: the data volumes were never owned by anything (StatefulSet volume claims are
  not, unless a ``persistentVolumeClaimRetentionPolicy`` says so, which eventop leaves at
  its Retain default, and which v1.24 does not even serve), so they stay; so does the
  credentials Secret, never owned (the kept data opens with its passwords, and a Database
  created again under the same name adopts it).
* ``Delete``: the servers are stopped (see below), then every data volume and the
  credentials Secret are deleted, then the finalizer goes.
* ``Snapshot`` with the snapshot API served: the servers are stopped first, so the
  snapshots are of a cleanly shut down data directory; then a VolumeSnapshot of every data
  volume is taken and awaited (``readyToUse``); then the volumes are deleted. A snapshot that
  reports an error, or is not ready within :data:`SNAPSHOT_TIMEOUT`, is reported
  (``Deleting``/``SnapshotFailed`` or ``SnapshotTimedOut``, a Warning Event) and the Database
  stays: delete the snapshot to try again, or change the policy.
* ``Snapshot`` without the snapshot API: a final backup Job (every database, on the running
  image) writes to the backup volume while the server still runs; then as with Delete. A
  failed or timed-out backup (the Job's deadline) is reported the same way.
* Deleted with ``--cascade=orphan``: the garbage collector takes the ownerReferences off
  its children first, so its servers are no longer its to stop, and they keep running on
  its data volumes: a snapshot would be of a live server and deleting the claims would
  take the volumes from under it. Whatever the policy, such a deletion keeps the data as
  ``Retain`` does (``Deleting``: ``Orphaning`` while the garbage collector's ``orphan``
  finalizer is there, nothing touched, then ``ServersOrphaned``, a Warning Event naming the
  servers);
  the orphans are the user's, as asked.
* Its **namespace being deleted**: the namespace controller deletes the volumes' claims
  with everything else, and the API server creates nothing in a terminating namespace: no
  snapshot, no backup Job, not even an Event. What keeps the data is the volumes
  themselves: their PersistentVolumes are ``persistentVolumeReclaimPolicy: Retain``
  already, set by the runs of the live Database (:mod:`volumes`), so a namespace deleted
  while no router runs loses nothing either; each then outlives its claim, ``Released``,
  data and all. The backup volume's under every policy (the backups outlive the Database,
  as they do outside a terminating namespace); the data volumes' under ``Snapshot`` and
  ``Retain``, while ``Delete`` then deletes them as usual. A volume not Retain yet (bound
  since the last run; found by its ``claimRef``, so even once its claim is gone) is set to
  Retain before the Database goes.

The data volumes' PersistentVolumes get their own reclaim policy back (the one
:data:`volumes.RECLAIM_ANNOTATION` recorded) when the policy deletes them: under
``Delete``, and under ``Snapshot`` once the snapshots are ready or the final backup is
complete, in a step of its own (``RestoringReclaimPolicy``) before the claims are deleted,
so their deletion reclaims the storage as before. The engine writes a run's patches and
deletions in parallel: in one run, a claim could be deleted while its volume is still
Retain, and the volume would stay ``Released`` until the patch reached it (Kubernetes'
volume controller then reclaims it, but not before). Under ``Retain`` they stay Retain.

Stopping the servers: each StatefulSet is scaled to zero and the handler waits until its
controller reports no pod left (PostgreSQL shuts down cleanly on the pod's SIGTERM, writing
a checkpoint), and only then deletes it. Deleting a StatefulSet at once would not wait for
anything: it goes at once and the garbage collector stops its pods afterwards, while the
snapshots were already being taken.

Snapshots, the backup volume and (except with Delete) the Secret have no owner: the
garbage collector can not take them with the Database. The backup volume is not made during
a deletion unless the final backup needs it (a Database deleted before it made anything
leaves nothing behind).

The spec a deletion works with is :func:`lifecycle.deletion_spec`: a field made invalid in
the meantime is replaced by what runs (or its default), so no edit can hold a Database.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime
from typing import Any

from eventop.handlers.databases import jobs, lifecycle, observe, status, volumes, workload
from eventop.handlers.databases.lifecycle import Plan
from eventop.handlers.databases.observe import COMPLETE, FAILED, Observed
from eventop.handlers.databases.spec import DatabaseSpec, Names, Version
from eventop.handlers.databases.status import Condition, Event, Facts
from eventop.handlers.databases.workload import Passwords
from eventop.kube import get_condition, parse_rfc3339

Obj = dict[str, Any]

SNAPSHOT_TIMEOUT = 30 * 60
POLL = 15.0  # seconds between looks while waiting for something no event announces


def _how_to_go_on(names: Names, what: str) -> str:
    return (f"delete the {what} to try again, or set spec.deletionPolicy to Retain (keeps the "
            f"data volumes data-{names.base}-pg*) or Delete (deletes them)")


def _sentence(text: str) -> str:
    """``text`` as a sentence: its first letter upper case, the rest as it is (field names
    and values such as spec.deletionPolicy or Retain are case-sensitive)."""
    return text[:1].upper() + text[1:]


#: The garbage collector's finalizer of a deletion with ``propagationPolicy: Orphan``.
ORPHAN_FINALIZER = "orphan"


#: The Deleting reasons of an orphaning deletion: once one is in the status, the deletion
#: stays one (the next run's caches may lag behind the garbage collector's work).
ORPHAN_REASONS = ("Orphaning", "ServersOrphaned")


def orphaning(db: Obj, observed: Observed) -> bool:
    """Deleted with ``--cascade=orphan``: the garbage collector's finalizer is there, or its
    work is done (servers made for this very Database that it no longer owns), or an earlier
    run found either."""
    if observed.namespace_terminating:
        return False
    deleting = get_condition(db.get("status"), "Deleting") or {}
    return (_orphan_finalizer(db) or bool(observed.orphaned_servers)
            or deleting.get("reason") in ORPHAN_REASONS)


def _orphan_finalizer(db: Obj) -> bool:
    """The garbage collector is still orphaning its children."""
    return ORPHAN_FINALIZER in ((db.get("metadata") or {}).get("finalizers") or [])


def plan(db: Obj, spec: DatabaseSpec, observed: Observed) -> Plan:
    names = Names.of(spec.name)
    orphaned = orphaning(db, observed)
    if orphaned:  # the data kept as under Retain (module docstring): Secret, volumes' policy
        spec = replace(spec, deletion_policy="Retain")
    version, image = lifecycle.serving(db, spec, observed)
    facts = Facts(version=str(version), image=image, endpoint=workload.endpoint(spec),
                  secret=names.secret, replicas=spec.replicas,
                  serving=observed.statefulset(version.major),
                  progressing=("False", "Deleting", "no upgrade while the Database is deleted"))
    facts.initialized = lifecycle._initialized_before(db)
    step = (_orphaned(db, observed, facts) if orphaned
            else _steps(db, spec, observed, (str(version), image), facts))
    facts.deleting = step.condition
    new, events_before, _ = status.compute(db, facts, observed, spec.replicas)
    # the backup volume as it is (its backups outlive the Database); made now only for a
    # final backup (see _final_backup)
    kept = [*([workload.backup_pvc(spec, observed.backup_pvc)] if observed.backup_pvc else []),
            *step.kept]
    # the reclaim policies of this moment (see volumes): the backup volume's Retain, the
    # data volumes' too until the policy deletes them; a step's own patches first
    patches = {p["metadata"]["name"]: p for p in volumes.patches(
        observed, names, keep_data=spec.deletion_policy != "Delete", releasing=step.releasing)}
    patches.update({p["metadata"]["name"]: p for p in step.patches})
    deletions = step.deletions
    events = list(step.events)
    if observed.secret is not None and lifecycle.is_ours(observed.secret, db):
        if spec.deletion_policy != "Delete" or observed.foreign_servers:
            # (a server it does not own still reads its passwords from it)
            kept.append(_kept_secret(spec, observed.secret))
        elif step.finalize:
            deletions = [*deletions, observed.secret]
    if step.finalize and not orphaned and (observed.foreign_claims or observed.foreign_servers):
        left = [*(f"PersistentVolumeClaim {c}" for c in observed.foreign_claims),
                *(f"StatefulSet {s['metadata']['name']}" for s in observed.foreign_servers)]
        events.append(("Warning", "NotItsOwnLeft",
                       f"left as they are, not made for this Database (an earlier Database of "
                       f"its name's, kept or orphaned): {', '.join(left)}"
                       + (f"; Secret {names.secret} kept: a server it does not own uses it"
                          if observed.foreign_servers and observed.secret is not None else "")))
    return Plan(children=None if step.leave_children else step.children, status=new,
                kept=kept, deletions=deletions,
                patches=sorted(patches.values(), key=lambda p: p["metadata"]["name"]),
                events=events_before + events, finalize=step.finalize,
                requeue_after=None if step.finalize else step.requeue_after)


class _Step:
    def __init__(self, condition: Condition, *, children: list[Obj] | None = None,
                 kept: list[Obj] | None = None, deletions: list[Obj] | None = None,
                 patches: list[Obj] | None = None, finalize: bool = False,
                 events: list[Event] | None = None, releasing: bool = False,
                 requeue_after: float | None = POLL, leave_children: bool = False) -> None:
        self.condition = condition
        #: the children are left exactly as they are: none applied, none pruned
        self.leave_children = leave_children
        self.children = children or []
        self.kept = kept or []
        self.deletions = deletions or []
        self.patches = patches or []
        self.finalize = finalize
        self.events = events or []
        #: the data volumes' claims are about to go (their data kept elsewhere, or the
        #: policy deletes it): their PersistentVolumes get their own reclaim policy back
        self.releasing = releasing
        self.requeue_after = requeue_after


def _kept_secret(spec: DatabaseSpec, secret: Obj) -> Obj:
    have = Passwords.from_secret(secret)
    return workload.credentials_secret(spec, Passwords(
        app=have.get("password", ""), superuser=have.get("superuser-password", ""),
        replication=have.get("replication-password", "")))


def _steps(db: Obj, spec: DatabaseSpec, observed: Observed, running: tuple[str, str],
           facts: Facts) -> _Step:
    policy = spec.deletion_policy
    if observed.namespace_terminating:
        keeping = _keep_volumes(db, policy, observed)
        if policy != "Delete" or not keeping.finalize:
            return keeping  # (under Delete, once the backup volume is kept: deleted as usual)
    if policy == "Retain":
        listed = ", ".join(observe.pvc_names(observed)) or "none"
        return _Step(("True", "Retained", f"data volumes kept: {listed}"), finalize=True,
                     events=[("Normal", "DataRetained",
                              f"data volumes ({listed}) and Secret {facts.secret} kept")])
    done: list[Obj] = []  # the completed final backup Job, kept until the end (its record)
    if policy == "Snapshot" and observed.snapshots is None:
        backup = _final_backup(spec, observed, running, facts)
        if backup is not None:
            return backup
        if observed.job(Names.of(spec.name).final_backup_job) is not None:
            done = [jobs.final_backup_job(spec, running)]
    stopping = _stop_servers(db, spec, observed)
    if stopping is not None:
        stopping.children += done
        return stopping
    stopped = list(observed.statefulsets)  # no pod left: deleted with the next step
    snapshots = None
    if policy == "Snapshot" and observed.snapshots is not None:
        snapshots = _snapshots(db, spec, observed)
        if not snapshots.finalize:
            snapshots.deletions = stopped
            return snapshots
    names = Names.of(spec.name)
    pending = volumes.to_give_back(observed, names)
    if pending:
        # before the claims go: a claim deleted in the same run could be reclaimed by its
        # volume's Retain (the engine writes a run's patches and deletions in parallel)
        given = ", ".join(p["metadata"]["name"] for p in pending)
        giving = _Step(("True", "RestoringReclaimPolicy",
                        f"giving the data volumes' PersistentVolumes ({given}) their own "
                        "reclaim policy back before their claims are deleted"),
                       children=done, deletions=stopped, patches=pending, releasing=True,
                       kept=snapshots.kept if snapshots is not None else None,
                       requeue_after=lifecycle.UNSEEN_VOLUME_RECHECK)
        return giving
    step = _delete_volumes(observed, policy)
    step.releasing = True
    step.children = done
    step.deletions = stopped + step.deletions
    if snapshots is not None:  # all ready: the volumes go, and the Event says where the data is
        step.condition = snapshots.condition
        step.kept = snapshots.kept
        step.events = snapshots.events + step.events
    if done:  # the snapshot policy kept by a final backup: say where, as Snapshotted does
        step.events.append(("Normal", "FinalBackupKept",
                            f"data kept in PersistentVolumeClaim {names.backup_pvc} (final "
                            f"backup Job {names.final_backup_job}); data volumes deleted: "
                            f"{_volume_list(observed)}"))
    elif policy == "Snapshot" and observed.snapshots is None:  # no data: say so, as above
        step.events.append(("Normal", "NoFinalBackup",
                            "no final backup: the Database was never initialized and no "
                            "data volume was ever bound, so no server held data; data "
                            f"volumes deleted: {_volume_list(observed)}"))
    return step


def _orphaned(db: Obj, observed: Observed, facts: Facts) -> _Step:
    """A deletion with ``--cascade=orphan`` (see the module docstring): its children are
    left exactly as they are, never applied nor pruned (until the garbage collector has
    taken their ownerReferences off they still look like its own, and a step would stop
    and delete the servers it orphans); once it has, the Database goes, its data kept."""
    if _orphan_finalizer(db):
        return _Step(("True", "Orphaning", "deleted with --cascade=orphan: waiting for the "
                      "garbage collector to orphan its children; nothing is stopped, "
                      "snapshotted or deleted"), leave_children=True)
    listed = ", ".join(observe.pvc_names(observed)) or "none"
    servers = ", ".join(s["metadata"]["name"] for s in observed.orphaned_servers)
    running = (f"its servers (StatefulSet {servers}) are left running on its data volumes"
               if servers else "no server of its own is left running")
    why = (f"deleted with --cascade=orphan: {running}; nothing more is stopped, snapshotted "
           f"or deleted; data volumes ({listed}) and Secret {facts.secret} kept, as with "
           "deletionPolicy Retain")
    return _Step(("True", "ServersOrphaned", why), finalize=True, leave_children=True,
                 events=[("Warning", "ServersOrphaned", _sentence(why))])


def _keep_volumes(db: Obj, policy: str, observed: Observed) -> _Step:
    """The namespace is going, claims included, and nothing can be created in it: the
    PersistentVolumes of the backup volume and (unless Delete) of the data volumes are set
    to Retain, recording the policy each had (see volumes); then the Database goes (under
    Delete, once its data volumes are deleted). Mostly set already: the runs of the live
    Database did (a namespace deleted while no router ran takes the claims before any run);
    what is left is a volume bound since the last run, or one the cache had not seen then."""
    ns = db["metadata"]["namespace"]
    keeps_data = volumes.keeps_data(db)  # (the policy read as written)
    unseen = volumes.unseen(observed, data=keeps_data)
    if unseen:  # bound to a volume the cache has not seen yet: not "nothing to keep"
        return _Step(("True", "RetainingVolumes", f"namespace {ns} is being deleted: waiting "
                      f"to see PersistentVolumes {', '.join(unseen)}"),
                     requeue_after=lifecycle.UNSEEN_VOLUME_RECHECK)
    backup = Names.of(db["metadata"]["name"]).backup_pvc
    keeping = [pv for pv in observed.volumes
               if keeps_data or observe.claim_of(pv) == backup]
    listed = ", ".join(pv["metadata"]["name"] for pv in keeping)
    which = "data volumes and backup volume" if keeps_data else "backup volume"
    why = (f"namespace {ns} is being deleted, with the volumes' claims, and nothing can be "
           f"created in it (deletionPolicy {policy}: "
           + ("no snapshot or backup)" if keeps_data else
              "the data volumes are deleted, the backup volume kept)"))
    patches = [patch for pv in keeping if (patch := volumes.retain(pv)) is not None]
    if patches:
        return _Step(("True", "RetainingVolumes", f"{why}; setting the PersistentVolumes of "
                      f"the {which} to reclaim policy Retain: {listed}"),
                     patches=patches)
    if not keeping:
        kept = (f"no PersistentVolume of its {which} was left to keep (none was bound, "
                "or a claim no pod was using went, and its volume with it, before this run)")
    else:
        kept = (f"the data stays on PersistentVolumes {listed} (reclaim policy Retain, "
                "Released once their claims are gone): bind a new claim to one to read it")
    return _Step(("True", "VolumesRetained", f"{why}; {kept}"), finalize=True,
                 events=[("Warning", "NamespaceDeleted", f"{why}; {kept}")])


def _stop_servers(db: Obj, spec: DatabaseSpec, observed: Observed) -> _Step | None:
    """Every StatefulSet scaled to zero, until its controller reports no pod left; None once
    they are all stopped (or there are none)."""
    running = [sts for sts in observed.statefulsets if not observe.stopped(sts)]
    if not running:
        return None
    none = replace(spec, replicas=0)
    scaled = []
    for sts in observed.statefulsets:
        major = int(sts["metadata"]["labels"][workload.MAJOR_LABEL])
        version = observe.sts_version(sts)
        image = observe.sts_image(sts)
        if version is None or image is None:  # not one eventop built: delete it as it is
            continue
        scaled.append(workload.statefulset(none, (str(version), image), major,
                                           claim_template=observe.claim_template(sts)))
    left = [f"{sts['metadata']['name']}-{i}" for sts in running
            for i in range(observe.pods(sts))]
    names = ", ".join(sts["metadata"]["name"] for sts in running)
    pods = ", ".join(left) or "none reported yet"
    since = _stopping_since(db, observed)
    waited = (observed.now - since).total_seconds() if since is not None else 0.0
    if left and waited >= STOP_WARNING:
        return _Step(("True", "ServersNotStopping",
                      f"the servers ({names}) were asked to stop {int(waited // 60)} minutes "
                      f"ago and pods are left: {pods}. A pod that stays Terminating is held "
                      "by finalizers or by a node that does not answer (kubectl -n "
                      f"{db['metadata']['namespace']} get pod {left[0]} -o "
                      "jsonpath='{.metadata.finalizers}'): remove the finalizer, or once "
                      "sure its server stopped, force-delete the pod (kubectl -n "
                      f"{db['metadata']['namespace']} delete pod {left[0]} --force "
                      "--grace-period=0). The snapshots wait: "
                      "a running server must not write while they are taken"),
                     children=scaled)
    return _Step(("True", "StoppingServers",
                  f"stopping the servers ({names}): {len(left)} pods left ({pods})"),
                 children=scaled)


#: Seconds the servers may take to stop (each pod has a 60-second grace period, and pods
#: stop one after another) before a Warning says what holds them.
STOP_WARNING = 5 * 60


def _stopping_since(db: Obj, observed: Observed) -> datetime | None:
    """When the servers were asked to stop: at the deletion, or once the final backup (taken
    while they still run) completed. Derived from what the cluster holds, so every run and
    every router replica agrees, with nothing remembered."""
    since = parse_rfc3339(db["metadata"].get("deletionTimestamp"))
    final = observed.job(Names.of(db["metadata"]["name"]).final_backup_job)
    finished = observe.job_finished(final) if final is not None else None
    if finished is not None and (since is None or finished > since):
        return finished
    return since


def _final_backup(spec: DatabaseSpec, observed: Observed, running: tuple[str, str],
                  facts: Facts) -> _Step | None:
    """The final backup while the server still runs; None once it completed, or when no
    server ever held data: never initialized and no data volume ever bound (the server
    never started), where a backup Job would wait its whole deadline for a server that
    never runs, then fail and hold the Database. An initialized Database is backed up
    whatever its claims say (a volume bound without eventop seeing it is still data)."""
    if facts.initialized[0] != "True" \
            and not any(observe.is_bound(pvc) for pvc in observed.data_pvcs):
        return None
    names = Names.of(spec.name)
    major = int(running[0].split(".")[0])
    job = jobs.final_backup_job(spec, running)
    found = observed.job(names.final_backup_job)
    state = observe.job_state(found)
    if state == COMPLETE:
        return None
    existing = observed.statefulset(major)
    label = observe.version_label(existing, Version.parse(running[0]), running[1])
    server = workload.statefulset(spec, (label, running[1]), major,
                                  claim_template=observe.claim_template(existing))
    children = [workload.config_map(spec), workload.headless_service(spec),
                workload.client_service(spec, major), server, job]
    made = [] if observed.backup_pvc else [workload.backup_pvc(spec)]  # where it writes
    if state == FAILED:
        return _Step(("True", "FinalBackupFailed",
                      f"the final backup, Job {names.final_backup_job}, failed "
                      f"({observe.job_failure(found or {})}); the Database stays. "
                      f"{_sentence(_how_to_go_on(names, 'Job'))}"), children=children,
                     kept=made, requeue_after=None)
    return _Step(("True", "FinalBackup", f"writing a final backup to {names.backup_pvc} "
                                         "(the snapshot API is not served)"),
                 children=children, kept=made)


def _snapshots(db: Obj, spec: DatabaseSpec, observed: Observed) -> _Step:
    names = Names.of(spec.name)
    wanted = observe.snapshot_names(observed, db["metadata"]["uid"], names)
    kept = [jobs.volume_snapshot(spec, pvc, db["metadata"]["uid"]) for pvc in wanted]
    states = {name: observe.snapshot_state(observed.snapshot(name), observed.now,
                                           SNAPSHOT_TIMEOUT) for name in wanted.values()}
    for reason, state in (("SnapshotFailed", "Failed"), ("SnapshotTimedOut", "TimedOut")):
        bad = [(name, detail) for name, (s, detail) in sorted(states.items()) if s == state]
        if bad:
            name, detail = bad[0]
            return _Step(("True", reason, f"VolumeSnapshot {name}: {detail}; the Database "
                                          f"stays: {_how_to_go_on(names, 'VolumeSnapshot')}"),
                         kept=kept, requeue_after=None)
    ready = sum(1 for s, _ in states.values() if s == "Ready")
    if ready < len(states):
        return _Step(("True", "Snapshotting",
                      f"{ready} of {len(states)} VolumeSnapshots ready"), kept=kept)
    done = ", ".join(sorted(wanted.values())) or "none (no data volume)"
    return _Step(("True", "Snapshotted", f"VolumeSnapshots ready: {done}"), kept=kept,
                 finalize=True,
                 events=[("Normal", "Snapshotted", f"data kept in VolumeSnapshots {done}; "
                                                   f"data volumes deleted: "
                                                   f"{_volume_list(observed)}")])


def _delete_volumes(observed: Observed, policy: str) -> _Step:
    listed = _volume_list(observed)
    # (None left: another replica's run deleted them, and said so.)
    events = ([("Normal", "DataDeleted", f"data volumes deleted: {listed}")]
              if policy == "Delete" and observed.data_pvcs else [])
    return _Step(("True", "DeletingVolumes", f"deleting data volumes: {listed}"),
                 deletions=list(observed.data_pvcs), finalize=True, events=events)


def _volume_list(observed: Observed) -> str:
    """The data volumes' claims, for a message: ``data-orders-pg16-0, ...`` or ``none``."""
    return ", ".join(observe.pvc_names(observed)) or "none"
