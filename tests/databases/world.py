"""A Database and its children as plain data, for testing the pure lifecycle.

:class:`World` plays the engine (applies a plan: owned children, kept objects, deletions,
status, finalizer) and the controllers a real cluster runs (a StatefulSet becomes ready, a
Job completes or fails, the CronJob starts a Job, a snapshot becomes ready), so a test can
walk a Database through its life without an API server. The cluster suite runs the same
plans against a real one.
"""

from __future__ import annotations

import copy
import itertools
from datetime import UTC, datetime, timedelta
from typing import Any

from eventop.handlers.databases import FINALIZER, Observed, plan
from eventop.handlers.databases.lifecycle import Plan
from eventop.handlers.databases.observe import bound_volumes
from eventop.handlers.databases.spec import Names
from eventop.handlers.databases.workload import MAJOR_LABEL

Obj = dict[str, Any]
START = datetime(2026, 11, 20, 10, 0, tzinfo=UTC)
UID = "6f1c2a9e-0d4b-4c52-9f0e-6d1c7e3a2b10"


def database(name: str = "orders", **spec: Any) -> Obj:
    """A Database as the API server stores it (defaults filled in)."""
    spec.setdefault("engine", "postgres")
    spec.setdefault("version", "16")
    spec.setdefault("storage", {"size": "5Gi"})
    spec.setdefault("replicas", 1)
    spec.setdefault("port", 5432)
    spec.setdefault("deletionPolicy", "Snapshot")
    spec.setdefault("backup", {"schedule": "0 0 * * *", "retention": 7})
    return {"apiVersion": "eventop.dev/v1", "kind": "Database",
            "metadata": {"name": name, "namespace": "shop", "uid": UID, "generation": 1,
                         "creationTimestamp": "2026-11-20T10:00:00Z",
                         "finalizers": [FINALIZER]},
            "spec": spec}


def merge_patch(target: Obj, patch: Obj) -> Obj:
    """A JSON merge patch (RFC 7386), as the API server applies ``Desired.patch``: maps
    merged, ``None`` removes a key."""
    for key, value in patch.items():
        if value is None:
            target.pop(key, None)
        elif isinstance(value, dict):
            merged = target.get(key) if isinstance(target.get(key), dict) else {}
            target[key] = merge_patch(merged, value)
        else:
            target[key] = copy.deepcopy(value)
    return target


def stamp(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


class World:
    def __init__(self, db: Obj, *, snapshot_api: bool = True) -> None:
        self.db: Obj | None = copy.deepcopy(db)
        self.snapshot_api = snapshot_api
        self.terminating = False  # its namespace is being deleted
        self.neighbours: list[Obj] = []  # the other Databases of its namespace
        self.now = START
        self.objects: dict[tuple[str, str], Obj] = {}
        self.owned: set[tuple[str, str]] = set()
        self.events: list[tuple[str, str, str]] = []
        self.counter = itertools.count(1)
        self.generated: list[str] = []
        self.last: Plan | None = None
        #: what ``kubectl delete --cascade=orphan`` leaves: its StatefulSets no longer owned
        self.orphaned_servers: list[Obj] = []
        self.stale_init_job: Obj | None = None  # an earlier Database's, orphaned

    # -- the engine's part -------------------------------------------------------------

    def new_password(self) -> str:
        self.generated.append(f"generated-{next(self.counter)}")
        return self.generated[-1]

    def observed(self) -> Observed:
        objs = list(self.objects.values())

        def kind(k: str) -> list[Obj]:
            return [copy.deepcopy(o) for o in objs if o["kind"] == k]
        name = self.db["metadata"]["name"] if self.db else ""
        secrets = [o for o in kind("Secret") if o["metadata"]["name"] == f"{name}-credentials"]
        return Observed(
            now=self.now, secret=secrets[0] if secrets else None,
            statefulsets=kind("StatefulSet"), jobs=kind("Job"),
            cronjob=next(iter(kind("CronJob")), None),
            data_pvcs=[p for p in kind("PersistentVolumeClaim")
                       if p["metadata"]["labels"].get("app.kubernetes.io/component") == "server"],
            backup_pvc=next((p for p in kind("PersistentVolumeClaim")
                             if p["metadata"]["name"] == Names.of(name).backup_pvc), None),
            snapshots=kind("VolumeSnapshot") if self.snapshot_api else None,
            volumes=bound_volumes(kind("PersistentVolume"), "shop", Names.of(name)),
            namespace_terminating=self.terminating,
            neighbours=copy.deepcopy(self.neighbours),
            orphaned_servers=copy.deepcopy(self.orphaned_servers),
            stale_init_job=copy.deepcopy(self.stale_init_job))

    def reconcile(self) -> Plan:
        assert self.db is not None, "the Database is gone"
        result = plan(copy.deepcopy(self.db), self.observed(), self.new_password)
        self.last = result
        if result.children is not None:
            wanted = {self.key(c) for c in result.children}
            for key in sorted(self.owned - wanted):
                self.objects.pop(key, None)
                self.owned.discard(key)
            for child in result.children:
                self._apply(child, owned=True)
        for obj in result.kept:
            self._apply(obj, owned=False)
        for obj in result.deletions:
            self.objects.pop(self.key(obj), None)
            self.owned.discard(self.key(obj))
        for obj in result.patches:  # (merged into what exists; nothing is created)
            current = self.objects[self.key(obj)]
            meta = {k: v for k, v in obj["metadata"].items() if k in ("labels", "annotations")}
            merge_patch(current, {**{k: v for k, v in obj.items()
                                     if k not in ("apiVersion", "kind", "metadata")},
                                  "metadata": meta})
        self.db["status"] = copy.deepcopy(result.status)
        self.events += result.events
        if result.finalize:
            self.db = None
            for key in sorted(self.owned):  # the garbage collector
                self.objects.pop(key, None)
            self.owned.clear()
        return result

    def converge(self, limit: int = 6) -> Plan:
        """Reconcile until a reconcile changes nothing; fails if that takes over ``limit``."""
        for _ in range(limit):
            before = self.snapshot()
            result = self.reconcile()
            if self.db is None or (self.snapshot() == before and not result.events):
                return result
        raise AssertionError(f"no fixed point after {limit} reconciles: {self.last}")

    def snapshot(self) -> Any:
        return copy.deepcopy((self.db, self.objects, sorted(self.owned)))

    @staticmethod
    def key(obj: Obj) -> tuple[str, str]:
        return obj["kind"], obj["metadata"]["name"]

    def _apply(self, obj: Obj, *, owned: bool) -> None:
        key = self.key(obj)
        current = self.objects.get(key)
        stored = copy.deepcopy(obj)
        stored["metadata"].setdefault("creationTimestamp", stamp(self.now))
        generation = 1
        if current is not None:
            stored["metadata"]["creationTimestamp"] = current["metadata"]["creationTimestamp"]
            if "status" in current:
                stored["status"] = current["status"]
            generation = current["metadata"].get("generation", 1)
            if current.get("spec") != stored.get("spec"):
                generation += 1  # as the API server does on a spec change
        stored["metadata"]["generation"] = generation
        self.objects[key] = stored
        if owned:
            self.owned.add(key)
        else:
            self.owned.discard(key)

    # -- the controllers' part ---------------------------------------------------------

    def get(self, kind: str, name: str) -> Obj:
        return self.objects[(kind, name)]

    def names(self, kind: str) -> list[str]:
        return sorted(n for k, n in self.objects if k == kind)

    def advance(self, **delta: float) -> None:
        self.now += timedelta(**delta)

    def statefulset_ready(self, name: str, ready: int | None = None) -> None:
        """The StatefulSet controller rolled every pod to the current template and the
        kubelet reports ``ready`` of them ready (all by default); PVCs made per pod (a claim
        made before is left as it is: bound to its volume)."""
        sts = self.get("StatefulSet", name)
        want = sts["spec"]["replicas"]
        ready = want if ready is None else ready
        sts["status"] = {"observedGeneration": sts["metadata"]["generation"], "replicas": want,
                         "readyReplicas": ready, "updatedReplicas": want,
                         "currentRevision": "r", "updateRevision": "r"}
        template = sts["spec"]["volumeClaimTemplates"][0]["metadata"]
        for i in range(want):
            if ("PersistentVolumeClaim", f"data-{name}-{i}") in self.objects:
                continue
            self.objects[("PersistentVolumeClaim", f"data-{name}-{i}")] = {
                "apiVersion": "v1", "kind": "PersistentVolumeClaim",
                "metadata": {"name": f"data-{name}-{i}", "labels": {
                    **template["labels"], **sts["spec"]["selector"]["matchLabels"]}},
                "spec": {}, "status": {"phase": "Bound"}}  # (a provisioner bound it)

    def provision(self, claim: str, volume: str, reclaim: str = "Delete") -> Obj:
        """A provisioner made PersistentVolume ``volume`` for ``claim`` (reclaim policy
        ``reclaim``: Delete is dynamic provisioning's default) and the volume controller
        bound them."""
        pv = {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": volume},
              "spec": {"persistentVolumeReclaimPolicy": reclaim,
                       "claimRef": {"namespace": "shop", "name": claim}},
              "status": {"phase": "Bound"}}
        self.objects[self.key(pv)] = pv
        self.bind(claim, volume)
        return pv

    def bind(self, claim: str, volume: str) -> None:
        """The volume controller bound ``claim`` to PersistentVolume ``volume`` (which this
        World may not hold yet: a cache that has not seen it)."""
        pvc = self.get("PersistentVolumeClaim", claim)
        pvc["spec"] = {**pvc.get("spec", {}), "volumeName": volume}
        pvc["status"] = {"phase": "Bound"}

    def claims_deleted(self) -> None:
        """Every claim deleted behind the handler's back (the namespace controller, while no
        router runs), and the volume controller reclaiming their volumes as their policy
        says: Delete deletes the volume and its data, Retain keeps it Released."""
        for key in [k for k in self.objects if k[0] == "PersistentVolumeClaim"]:
            del self.objects[key]
            self.owned.discard(key)
        for key, pv in list(self.objects.items()):
            if key[0] != "PersistentVolume":
                continue
            if pv["spec"]["persistentVolumeReclaimPolicy"] == "Delete":
                del self.objects[key]
            else:
                pv["status"] = {"phase": "Released"}

    def statefulset_rolling(self, name: str) -> None:
        sts = self.get("StatefulSet", name)
        sts.setdefault("status", {}).update(updateRevision="r2", updatedReplicas=0)

    def job_done(self, name: str, ok: bool = True, reason: str = "BackoffLimitExceeded") -> None:
        job = self.get("Job", name)
        when = stamp(self.now)
        if ok:
            job["status"] = {"succeeded": 1, "completionTime": when, "conditions": [
                {"type": "Complete", "status": "True", "lastTransitionTime": when}]}
        else:
            job["status"] = {"failed": 1, "conditions": [
                {"type": "Failed", "status": "True", "reason": reason,
                 "message": "Job has reached the specified backoff limit",
                 "lastTransitionTime": when}]}

    def backed_up_and_rolled(self, backup: str, statefulset: str) -> None:
        """The pre-upgrade backup Job whose name starts with ``orders-backup-<backup>``
        completes, then ``statefulset`` reports its pods ready: converged after each, as
        the controllers would take an upgrade from its backup to its new servers."""
        self.job_done(next(n for n in self.names("Job")
                           if n.startswith(f"orders-backup-{backup}")))
        self.converge()
        self.statefulset_ready(statefulset)
        self.converge()

    def cron_run(self, ok: bool = True, *, finish: bool = True) -> str:
        """The CronJob controller starts a Job from the template; it finishes now (unless
        not ``finish``: it is running)."""
        cron = next(o for o in self.objects.values() if o["kind"] == "CronJob")
        name = f"{cron['metadata']['name']}-{int(self.now.timestamp()) // 60}"
        template = cron["spec"]["jobTemplate"]
        self.objects[("Job", name)] = {
            "apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": name, "labels": dict(template["metadata"]["labels"]),
                         "creationTimestamp": stamp(self.now)},
            "spec": copy.deepcopy(template["spec"])}
        if finish:
            self.job_done(name, ok)
        return name

    def snapshot_done(self, name: str, error: str | None = None) -> None:
        snap = self.get("VolumeSnapshot", name)
        snap["status"] = ({"readyToUse": False, "error": {"message": error}} if error
                          else {"readyToUse": True})

    def delete(self) -> None:
        assert self.db is not None
        self.db["metadata"]["deletionTimestamp"] = stamp(self.now)

    def edit(self, **spec: Any) -> None:
        assert self.db is not None
        self.db["spec"].update(spec)
        self.db["metadata"]["generation"] += 1

    def condition(self, type_: str) -> Obj:
        assert self.db is not None
        return next(c for c in self.db["status"]["conditions"] if c["type"] == type_)

    def sts_of_major(self, major: int) -> list[str]:
        return [o["metadata"]["name"] for o in self.objects.values()
                if o["kind"] == "StatefulSet"
                and o["metadata"]["labels"].get(MAJOR_LABEL) == str(major)]
