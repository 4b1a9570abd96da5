"""What a Database's children say about it: the few facts the lifecycle and the status are
computed from, read from the children's own status as their controllers write it.

Everything here is pure: :class:`Observed` is filled by the reconcile from the API (or the
engine's cache), and a test builds one by hand.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from eventop.handlers.databases.jobs import BACKUP_KIND_LABEL
from eventop.handlers.databases.spec import Names, Version, image_version
from eventop.handlers.databases.workload import MAJOR_LABEL, VERSION_LABEL
from eventop.kube import parse_rfc3339

Obj = dict[str, Any]

COMPLETE, FAILED, RUNNING = "Complete", "Failed", "Running"


@dataclass
class Observed:
    """A Database's children as they are now.

    ``snapshots`` is None when the API server does not serve ``snapshot.storage.k8s.io/v1``
    (deletion then takes a final backup instead). ``backup_pvc`` is the backup volume's
    claim (None: not made yet, or gone). ``volumes`` are the PersistentVolumes bound to its
    data volumes and its backup volume (their ``claimRef``): while it lives, those its bound
    claims name (``volumeName``); once it or its namespace is being deleted, every one
    whose ``claimRef`` names them, there even once the claims are gone.
    ``namespace_terminating``: its namespace is being deleted. ``neighbours``: the other
    Databases in its namespace.
    """

    now: datetime
    secret: Obj | None = None
    statefulsets: list[Obj] = field(default_factory=list)
    jobs: list[Obj] = field(default_factory=list)
    cronjob: Obj | None = None
    data_pvcs: list[Obj] = field(default_factory=list)
    backup_pvc: Obj | None = None
    snapshots: list[Obj] | None = None
    volumes: list[Obj] = field(default_factory=list)
    namespace_terminating: bool = False
    #: its Services as they are (a port edited by hand is put back, see lifecycle)
    services: list[Obj] = field(default_factory=list)
    #: the other Databases of its namespace (their Services' names may be its own)
    neighbours: list[Obj] = field(default_factory=list)
    #: StatefulSets labelled as its servers that it does not own and that are not being
    #: deleted: orphaned by ``kubectl delete --cascade=orphan`` (the garbage collector took
    #: their ownerReference), still running on its data volumes
    orphaned_servers: list[Obj] = field(default_factory=list)
    #: a Job at its init Job's name that it does not own (an earlier Database's, orphaned):
    #: not in ``jobs``, its completion says nothing of this Database
    stale_init_job: Obj | None = None
    #: while it is deleted: StatefulSets labelled as its servers that it does not own (its
    #: own orphaned, or an earlier Database's of its name), and the data claims labelled as
    #: its own that were not made for it (left out of ``data_pvcs`` and their volumes out of
    #: ``volumes``: a deletion leaves them as they are)
    foreign_servers: list[Obj] = field(default_factory=list)
    foreign_claims: list[str] = field(default_factory=list)

    def statefulset(self, major: int) -> Obj | None:
        for sts in self.statefulsets:
            if _labels(sts).get(MAJOR_LABEL) == str(major):
                return sts
        return None

    def job(self, name: str) -> Obj | None:
        return next((j for j in self.jobs if j["metadata"]["name"] == name), None)

    def snapshot(self, name: str) -> Obj | None:
        return next((s for s in self.snapshots or [] if s["metadata"]["name"] == name), None)


def _labels(obj: Obj) -> dict[str, str]:
    return (obj.get("metadata") or {}).get("labels") or {}


def format_time(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# -- Jobs ------------------------------------------------------------------------------


def _condition(obj: Obj, type_: str) -> Obj | None:
    for cond in (obj.get("status") or {}).get("conditions") or []:
        if cond.get("type") == type_ and cond.get("status") == "True":
            return dict(cond)
    return None


def job_state(job: Obj | None) -> str | None:
    """Complete, Failed or Running (None: no Job), as the Job controller reports it."""
    if job is None:
        return None
    if _condition(job, "Complete"):
        return COMPLETE
    if _condition(job, "Failed"):
        return FAILED
    return RUNNING


def job_started(job: Obj) -> datetime | None:
    """When the Job started (its creation, before the Job controller says)."""
    return parse_rfc3339((job.get("status") or {}).get("startTime")) or parse_rfc3339(
        job["metadata"].get("creationTimestamp"))


def job_finished(job: Obj) -> datetime | None:
    """When the Job completed or failed; None while it runs."""
    status = job.get("status") or {}
    if _condition(job, "Complete"):
        return parse_rfc3339(status.get("completionTime")) or parse_rfc3339(
            (_condition(job, "Complete") or {}).get("lastTransitionTime"))
    failed = _condition(job, "Failed")
    if failed:
        return parse_rfc3339(failed.get("lastTransitionTime")) or parse_rfc3339(
            status.get("startTime"))
    return None


def job_failure(job: Obj) -> str:
    """The Job controller's own words for why a Job failed."""
    failed = _condition(job, "Failed") or {}
    reason = failed.get("reason") or "Failed"
    message = failed.get("message") or "its pods failed"
    return f"{reason}: {message}"


def backup_jobs(observed: Observed) -> list[Obj]:
    """Every backup Job (scheduled, before an upgrade, final), oldest finish first."""
    found = [j for j in observed.jobs if _labels(j).get(BACKUP_KIND_LABEL)
             and job_finished(j) is not None]
    return sorted(found, key=lambda j: (job_finished(j), j["metadata"]["name"]))


def backup_kind(job: Obj) -> str:
    return _labels(job).get(BACKUP_KIND_LABEL, "")


# -- StatefulSets ----------------------------------------------------------------------


def sts_version(sts: Obj) -> Version | None:
    text = _labels(sts).get(VERSION_LABEL)
    try:
        return Version.parse(text) if text else None
    except ValueError:
        return None


def sts_image(sts: Obj) -> str | None:
    containers = ((((sts.get("spec") or {}).get("template") or {}).get("spec") or {})
                  .get("containers") or [])
    return next((c.get("image") for c in containers if c.get("name") == "postgres"), None)


def version_label(sts: Obj | None, version: Version, image: str) -> str:
    """The version label (``VERSION_LABEL``) a StatefulSet built to run ``version`` on
    ``image`` gets: ``version``, unless ``sts`` already runs that image and its tag names
    ``version`` (``postgres:16.4``): then the label it has. Releases before the tag was read
    labelled such servers with spec.version as written (``16``, or a ``17.9`` the tag
    ``17.7`` contradicts); the label is in the pod template, so writing the tag's version
    restarted every server onto the same binaries. The label stays until the image changes
    (a rollout then anyway)."""
    running = sts_version(sts) if sts is not None else None
    if (running is not None and running.major == version.major and version.minor is not None
            and sts_image(sts or {}) == image and image_version(image) == version):
        return str(running)
    return str(version)


def ready_replicas(sts: Obj | None) -> int:
    return int(((sts or {}).get("status") or {}).get("readyReplicas") or 0)


def rolled_out(sts: Obj | None) -> bool:
    """Every pod runs the StatefulSet's current template and is ready: the controller has
    seen the latest spec, updated every replica, and its revisions agree."""
    if sts is None:
        return False
    status = sts.get("status") or {}
    want = int((sts.get("spec") or {}).get("replicas", 1))
    return (int(status.get("observedGeneration") or 0) >= int(
        sts["metadata"].get("generation") or 0)
        and int(status.get("updatedReplicas") or 0) == want
        and int(status.get("readyReplicas") or 0) == want
        and status.get("currentRevision") == status.get("updateRevision"))


def pods(sts: Obj) -> int:
    """How many pods the StatefulSet controller reports it has (ready or not)."""
    return int(((sts.get("status") or {}).get("replicas")) or 0)


def stopped(sts: Obj) -> bool:
    """Scaled to zero and its controller, having seen that, reports no pod left."""
    status = sts.get("status") or {}
    return (int((sts.get("spec") or {}).get("replicas", 1)) == 0
            and int(status.get("observedGeneration") or 0) >= int(
                sts["metadata"].get("generation") or 0)
            and pods(sts) == 0)


# -- volumes and snapshots -------------------------------------------------------------


def snapshot_state(snapshot: Obj | None, now: datetime, timeout: float) -> tuple[str, str]:
    """(Ready | Failed | TimedOut | Pending | Missing, detail) of one VolumeSnapshot."""
    if snapshot is None:
        return "Missing", ""
    status = snapshot.get("status") or {}
    if status.get("readyToUse") is True:
        return "Ready", ""
    error = status.get("error") or {}
    if error.get("message"):
        return "Failed", str(error["message"])
    created = parse_rfc3339(snapshot["metadata"].get("creationTimestamp"))
    if created is not None and (now - created).total_seconds() > timeout:
        return "TimedOut", f"not ready after {int(timeout // 60)} minutes"
    return "Pending", ""


def is_data_claim(claim: str, names: Names) -> bool:
    """``data-<base>-pg<major>-<ordinal>``: the name the StatefulSets give its data volumes."""
    rest = claim.removeprefix(f"data-{names.base}-pg")
    major, _, ordinal = rest.partition("-")
    return rest != claim and major.isdigit() and ordinal.isdigit()


def claim_of(pv: Obj) -> str:
    """The name of the claim a PersistentVolume is (or was) bound to: its ``claimRef``."""
    return str(((pv.get("spec") or {}).get("claimRef") or {}).get("name") or "")


def bound_volumes(volumes: list[Obj], namespace: str, names: Names) -> list[Obj]:
    """The PersistentVolumes whose claim is one of this Database's data volumes or its
    backup volume (both hold what a deletion must not lose)."""
    found = []
    for pv in volumes:
        ref = (pv.get("spec") or {}).get("claimRef") or {}
        claim = claim_of(pv)
        if ref.get("namespace") == namespace and (is_data_claim(claim, names)
                                                  or claim == names.backup_pvc):
            found.append(pv)
    return sorted(found, key=lambda pv: pv["metadata"]["name"])


def is_bound(pvc: Obj) -> bool:
    """A claim bound to a volume (a provisioner made it, or a volume's claimRef named it)."""
    return (pvc.get("status") or {}).get("phase") == "Bound"


def pvc_names(observed: Observed) -> list[str]:
    return sorted(p["metadata"]["name"] for p in observed.data_pvcs)


def snapshot_names(observed: Observed, db_uid: str, names: Names) -> dict[str, str]:
    """Data volume -> the name of its deletion snapshot. Only bound claims: one never bound
    (a Database deleted before its pod was scheduled, a WaitForFirstConsumer class) holds
    no data, and the CSI snapshotter never snapshots it (the deletion would wait out the
    snapshot timeout, then stay until the user changed its policy)."""
    return {p["metadata"]["name"]: names.snapshot(p["metadata"]["name"], db_uid)
            for p in sorted(observed.data_pvcs, key=lambda p: p["metadata"]["name"])
            if is_bound(p)}

def claim_template(sts: Obj | None) -> Obj | None:
    """The existing data volume template (immutable once the StatefulSet exists)."""
    templates = ((sts or {}).get("spec") or {}).get("volumeClaimTemplates") or []
    if not templates:
        return None
    template = templates[0]
    return {"metadata": {k: v for k, v in (template.get("metadata") or {}).items()
                         if k in ("name", "labels")},
            "spec": {k: v for k, v in (template.get("spec") or {}).items()
                     if k in ("accessModes", "resources", "storageClassName")}}


def rolling_out(sts: Obj | None) -> bool:
    """The StatefulSet controller is moving the pods to a new template (a changed port,
    resources, a scale): it has not seen the latest spec yet, or its current and update
    revisions differ (they agree again only once every pod is updated and ready). The pods
    it restarts are planned downtime, not a problem: reported as progressing (``RollingOut``),
    not Degraded. A StatefulSet its controller never reported on (just made) is not."""
    status = (sts or {}).get("status") or {}
    if sts is None or not status.get("currentRevision"):
        return False
    return (int(status.get("observedGeneration") or 0) < int(
        sts["metadata"].get("generation") or 0)
        or status.get("updateRevision") != status.get("currentRevision"))


def rollout_progress(sts: Obj | None) -> str:
    status = (sts or {}).get("status") or {}
    want = int(((sts or {}).get("spec") or {}).get("replicas", 1))
    return (f"{int(status.get('updatedReplicas') or 0)} of {want} updated, "
            f"{int(status.get('readyReplicas') or 0)} ready")

